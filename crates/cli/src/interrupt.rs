//! Ctrl-C (SIGINT), SIGTERM and SIGHUP for commands that start processes of
//! their own (`bench soak`'s server and node managers, `bench node`'s node
//! manager). Those commands kill their children when they end, but a signal
//! ends the process without running that clean-up, and the children (a
//! server, node managers reconnecting forever) would be left behind. Here a
//! signal kills every process this one started, with their own children,
//! says so, and exits 130 like a shell's interrupted command.

use std::collections::HashMap;

/// Installs the handler; `what` names the command in the message.
pub fn kill_children_on_signal(what: &'static str) {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            let sig = rt.block_on(wait_for_signal());
            let Some(sig) = sig else { return };
            let killed = kill_descendants();
            eprintln!("{what}: interrupted by {sig}; stopped {killed} process(es) it had started");
            std::process::exit(130);
        })
        .expect("spawning the signal thread");
}

async fn wait_for_signal() -> Option<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).ok()?;
    let mut term = signal(SignalKind::terminate()).ok()?;
    let mut hup = signal(SignalKind::hangup()).ok()?;
    tokio::select! {
        _ = int.recv() => Some("SIGINT"),
        _ = term.recv() => Some("SIGTERM"),
        _ = hup.recv() => Some("SIGHUP"),
    }
}

/// Parent of every process, from /proc.
fn parents() -> HashMap<u32, u32> {
    let mut map = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return map;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
            map.insert(pid, ppid);
        }
    }
    map
}

/// Kills (SIGKILL, as the commands' own clean-up does) every descendant of
/// this process and reaps the direct children; returns how many were killed.
fn kill_descendants() -> usize {
    let me = std::process::id();
    let mut killed = 0;
    // The whole tree is taken before anything is killed (a killed node
    // manager's workers are reparented away); more passes catch a process
    // forked meanwhile.
    for _ in 0..5 {
        let parents = parents();
        let mut tree = vec![me];
        let mut found = Vec::new();
        while let Some(p) = tree.pop() {
            for (&c, &pp) in &parents {
                if pp == p {
                    found.push(c);
                    tree.push(c);
                }
            }
        }
        if found.is_empty() {
            break;
        }
        for &pid in &found {
            // SAFETY: kill(2) with a pid read from /proc; no memory involved.
            if unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
        for &pid in found.iter().filter(|p| parents.get(p) == Some(&me)) {
            // SAFETY: reaping our own child; a null status pointer is allowed.
            unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
        }
    }
    killed
}

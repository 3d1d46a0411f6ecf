//! `corefarm top` driven in a real terminal (tmux, on a private socket)
//! against a live `corefarm local` under load from the benchmarking user:
//! the screen shows both nodes and the user with a non-zero throughput, and
//! `q` quits.

use crate::support;
use crate::tools;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{local_cluster, Proc, BIN};
use tools::Tool;

const LIMIT: Duration = Duration::from_secs(30);

/// A tmux server on its own socket, killed (with everything in it) on drop.
struct Tmux(String);

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.0])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

/// The RESULTS/S column of the bench user's row, if the row is on screen.
fn user_rate(screen: &str) -> Option<f64> {
    let line = screen.lines().find(|l| l.contains("corefarm-bench"))?;
    let cells: Vec<&str> = line.split_whitespace().collect();
    let i = cells.iter().position(|c| *c == "corefarm-bench")?;
    // NAME, NODES, FUNCTION, RESULTS/S: the user's function is shown.
    (cells.get(i + 2) == Some(&"bench")).then_some(())?;
    cells.get(i + 3)?.parse().ok()
}

#[test]
fn top_shows_nodes_and_a_busy_user_and_quits_on_q() {
    if !tools::available(&[Tool::Tmux], "driving corefarm top in a terminal") {
        return;
    }
    let (_cluster, users) = local_cluster(2, &["--name", "tn"]);
    // Load for longer than the test needs; killed when the test ends.
    let _load = Proc(
        Command::new(BIN)
            .args(["bench", "user", "--server", &users, "--quiet"])
            .args(["--duration", "120", "--warmup", "0"])
            .args(["--input-size", "64", "--output-size", "64"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm bench user"),
    );
    let tmux = Tmux(format!("corefarm-top-test-{}", std::process::id()));
    let top = format!("{BIN} top --server {users}");
    let o = tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "40",
        &top,
    ]);
    assert!(
        o.status.success(),
        "tmux: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    let deadline = Instant::now() + LIMIT;
    let screen = loop {
        let screen = tmux.screen();
        let nodes = screen.contains("tn-0") && screen.contains("tn-1");
        if nodes && user_rate(&screen).is_some_and(|r| r > 0.0) && screen.contains("bench") {
            break screen;
        }
        assert!(
            Instant::now() < deadline,
            "corefarm top never showed both nodes and a busy user:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Both nodes run the bench function and are busy.
    for n in ["tn-0", "tn-1"] {
        let line = screen.lines().find(|l| l.contains(n)).unwrap();
        assert!(
            line.contains("ready") && line.contains("bench") && line.contains('█'),
            "{line}"
        );
    }

    let o = tmux.cmd(&["send-keys", "-t", "top", "q"]);
    assert!(o.status.success());
    // The session ends with its only program.
    let deadline = Instant::now() + LIMIT;
    while tmux.cmd(&["has-session", "-t", "top"]).status.success() {
        assert!(
            Instant::now() < deadline,
            "q did not quit:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn without_a_terminal_top_says_what_to_use_instead() {
    // Before any connection: the address need not answer.
    let o = Command::new(BIN)
        .args(["top", "--server", "127.0.0.1:1"])
        .stdin(Stdio::null())
        .output()
        .expect("run corefarm top");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("terminal") && err.contains("corefarm status"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

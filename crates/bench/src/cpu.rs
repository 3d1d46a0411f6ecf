//! CPU time other processes spend during a benchmark's measurement window.
//!
//! The suite runs `corefarm server` (or the echo server) as a separate
//! process and wants its CPU cost per byte forwarded. Only the benchmark
//! itself knows when its window opens and closes (after connecting,
//! configuring and warming up), so the benchmark samples the server's
//! `utime + stime` from `/proc/<pid>/stat` at both ends of the window, on a
//! thread of its own so the sampling instants are not delayed by the
//! measured loops.
//!
//! A process is counted with its descendants (a wrapper script's child does
//! the work) and with the CPU of descendants it already reaped (`cutime`,
//! `cstime`), so a child that exits inside the window is not lost.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// A process to watch, named for the report (`server=1234`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuTarget {
    pub label: String,
    pub pid: u32,
}

/// A `--cpu-pid` value that is not `LABEL=PID` (clap prints the text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuTargetError {
    #[error("`{0}`: expected LABEL=PID")]
    NotAPid(String),
    #[error("`{0}`: expected LABEL=PID with a non-empty label and a non-zero pid")]
    Empty(String),
}

impl std::str::FromStr for CpuTarget {
    type Err = CpuTargetError;

    /// `LABEL=PID`, or a bare PID (labelled with itself).
    fn from_str(s: &str) -> Result<Self, CpuTargetError> {
        let (label, pid) = match s.split_once('=') {
            Some((l, p)) => (l.trim().to_string(), p.trim()),
            None => (s.trim().to_string(), s.trim()),
        };
        let pid: u32 = pid
            .parse()
            .map_err(|_| CpuTargetError::NotAPid(s.to_string()))?;
        if label.is_empty() || pid == 0 {
            return Err(CpuTargetError::Empty(s.to_string()));
        }
        Ok(CpuTarget { label, pid })
    }
}

/// CPU a watched process (tree) used inside the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    pub label: String,
    pub pid: u32,
    /// User + system CPU seconds, the process and its descendants.
    pub cpu_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    /// Wall seconds between the two samples (the measurement window).
    pub wall_s: f64,
    /// `cpu_s / wall_s`: CPUs kept busy on average.
    pub cpus: f64,
    /// Processes in the tree at the end of the window.
    pub processes: usize,
}

/// Cumulative CPU ticks of a process tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ticks {
    pub user: u64,
    pub sys: u64,
    pub processes: usize,
}

/// The fields of `/proc/<pid>/stat` this module needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    ppid: u32,
    /// utime + cutime
    user: u64,
    /// stime + cstime
    sys: u64,
}

/// Parses one `/proc/<pid>/stat` line. The command name is in parentheses
/// and may itself contain spaces and parentheses, so fields are counted
/// from the last `)`.
fn parse_stat(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17).
    let n = |field: usize| -> Option<u64> { f.get(field - 3)?.parse().ok() };
    Some(Stat {
        ppid: n(4)? as u32,
        user: n(14)? + n(16)?,
        sys: n(15)? + n(17)?,
    })
}

fn read_stat(pid: u32) -> io::Result<Stat> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&s).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable stat"))
}

/// The CPU ticks of `pid` and every live descendant.
pub fn tree_ticks(pid: u32) -> io::Result<Ticks> {
    let root = read_stat(pid)?;
    // One pass over /proc builds the parent map; processes that vanish
    // between listing and reading are skipped.
    let mut by_parent: HashMap<u32, Vec<(u32, Stat)>> = HashMap::new();
    for e in fs::read_dir("/proc")?.flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if p == pid {
            continue;
        }
        if let Ok(st) = read_stat(p) {
            by_parent.entry(st.ppid).or_default().push((p, st));
        }
    }
    Ok(sum_tree(pid, root, &by_parent))
}

fn sum_tree(pid: u32, root: Stat, by_parent: &HashMap<u32, Vec<(u32, Stat)>>) -> Ticks {
    let mut t = Ticks {
        user: root.user,
        sys: root.sys,
        processes: 1,
    };
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        for &(child, st) in by_parent.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            t.user += st.user;
            t.sys += st.sys;
            t.processes += 1;
            stack.push(child);
        }
    }
    t
}

/// Clock ticks per second of the `/proc` CPU counters.
pub fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions; it returns -1 on error.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// Why no CPU figures: reported beside the benchmark's own figures, which
/// stand without them.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("could not start the CPU sampling thread")]
    NoThread,
    #[error("the CPU sampling thread panicked")]
    Panicked,
    /// The run ended before the measurement window closed.
    #[error("the run ended before the measurement window closed")]
    EndedEarly,
    /// A watched process's /proc entries could not be read (it is gone?).
    #[error("reading the CPU time of {label} (pid {pid}): {error}")]
    Read {
        label: String,
        pid: u32,
        error: io::Error,
    },
}

/// Samples the targets' CPU at `start` and at `end` on its own thread.
pub struct CpuWatch {
    stop: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<Result<Vec<CpuUse>, CpuError>>>,
}

impl CpuWatch {
    /// Starts watching; with no targets nothing is started.
    pub fn start(targets: &[CpuTarget], start: Instant, end: Instant) -> CpuWatch {
        if targets.is_empty() {
            return CpuWatch {
                stop: None,
                handle: None,
            };
        }
        let (tx, rx) = mpsc::channel::<()>();
        let targets = targets.to_vec();
        let handle = thread::Builder::new()
            .name("bench-cpu".into())
            .spawn(move || watch(&targets, start, end, &rx))
            .ok();
        CpuWatch {
            stop: Some(tx),
            handle,
        }
    }

    /// Waits for the second sample (it is taken at the window's end) and
    /// returns the CPU used, or why there is none: the run ended before the
    /// window closed, or a process could not be read.
    pub fn finish(mut self) -> Result<Vec<CpuUse>, CpuError> {
        let Some(h) = self.handle.take() else {
            return if self.stop.is_some() {
                Err(CpuError::NoThread)
            } else {
                Ok(Vec::new())
            };
        };
        // Only a run that ends early gets here before the window's end.
        drop(self.stop.take());
        h.join().unwrap_or(Err(CpuError::Panicked))
    }
}

/// Sleeps until `t` unless the stop channel closes first; true if `t` was reached.
fn sleep_until(t: Instant, stop: &mpsc::Receiver<()>) -> bool {
    let now = Instant::now();
    if now >= t {
        return true;
    }
    match stop.recv_timeout(t - now) {
        Err(mpsc::RecvTimeoutError::Timeout) => true,
        // On a loaded machine this thread can wake after the run has already
        // passed `t` and hung up: that is a window that closed, not an early end.
        _ => Instant::now() >= t,
    }
}

fn sample(targets: &[CpuTarget]) -> Result<Vec<Ticks>, CpuError> {
    targets
        .iter()
        .map(|t| {
            tree_ticks(t.pid).map_err(|error| CpuError::Read {
                label: t.label.clone(),
                pid: t.pid,
                error,
            })
        })
        .collect()
}

fn watch(
    targets: &[CpuTarget],
    start: Instant,
    end: Instant,
    stop: &mpsc::Receiver<()>,
) -> Result<Vec<CpuUse>, CpuError> {
    let early = || Err(CpuError::EndedEarly);
    if !sleep_until(start, stop) {
        return early();
    }
    let (t0, a) = (Instant::now(), sample(targets)?);
    if !sleep_until(end, stop) {
        return early();
    }
    let (t1, b) = (Instant::now(), sample(targets)?);
    Ok(usage(
        targets,
        &a,
        &b,
        (t1 - t0).as_secs_f64(),
        ticks_per_s(),
    ))
}

fn usage(targets: &[CpuTarget], a: &[Ticks], b: &[Ticks], wall_s: f64, hz: f64) -> Vec<CpuUse> {
    targets
        .iter()
        .zip(a.iter().zip(b))
        .map(|(t, (a, b))| {
            // A descendant that started inside the window can only make the
            // difference larger; one that was reaped moved into cutime.
            let user_s = b.user.saturating_sub(a.user) as f64 / hz;
            let sys_s = b.sys.saturating_sub(a.sys) as f64 / hz;
            let cpu_s = user_s + sys_s;
            CpuUse {
                label: t.label.clone(),
                pid: t.pid,
                cpu_s,
                user_s,
                sys_s,
                wall_s,
                cpus: if wall_s > 0.0 { cpu_s / wall_s } else { 0.0 },
                processes: b.processes,
            }
        })
        .collect()
}

/// One line per watched process: CPU seconds in the window and per decimal
/// GB of payload moved (`bytes_per_s`: echoed, or forwarded in + out).
pub fn summary(cpu: &[CpuUse], bytes_per_s: f64) -> String {
    let mut out = String::new();
    for c in cpu {
        let per_gb = if bytes_per_s > 0.0 {
            format!("{:.3} CPU-s/GB", c.cpus / (bytes_per_s / 1e9))
        } else {
            "-".into()
        };
        out += &format!(
            "cpu {} (pid {}): {:.2} s over {:.2} s = {:.2} CPUs (user {:.2} s, sys {:.2} s), {per_gb}\n",
            c.label, c.pid, c.cpu_s, c.wall_s, c.cpus, c.user_s, c.sys_s
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (a (weird) name) S 17 4242 4242 0 -1 4194560 1 0 0 0 \
                    250 40 7 3 20 0 9 0 100 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                ppid: 17,
                user: 257,
                sys: 43
            })
        );
        assert_eq!(parse_stat("1 (x) S 0 1"), None);
    }

    #[test]
    fn targets_parse_as_label_equals_pid() {
        let t: CpuTarget = "server=123".parse().unwrap();
        assert_eq!((t.label.as_str(), t.pid), ("server", 123));
        assert_eq!("77".parse::<CpuTarget>().unwrap().label, "77");
        assert_eq!(
            "server=x".parse::<CpuTarget>(),
            Err(CpuTargetError::NotAPid("server=x".into()))
        );
        assert_eq!(
            "=5".parse::<CpuTarget>(),
            Err(CpuTargetError::Empty("=5".into()))
        );
        assert_eq!(
            "s=0".parse::<CpuTarget>(),
            Err(CpuTargetError::Empty("s=0".into()))
        );
    }

    #[test]
    fn a_tree_sums_descendants_but_not_strangers() {
        let st = |ppid, user, sys| Stat { ppid, user, sys };
        let mut m: HashMap<u32, Vec<(u32, Stat)>> = HashMap::new();
        m.entry(10).or_default().push((11, st(10, 5, 1)));
        m.entry(11).or_default().push((12, st(11, 7, 2)));
        m.entry(1).or_default().push((99, st(1, 1000, 1000)));
        let t = sum_tree(10, st(1, 3, 4), &m);
        assert_eq!(
            t,
            Ticks {
                user: 15,
                sys: 7,
                processes: 3
            }
        );
    }

    #[test]
    fn usage_is_the_difference_over_the_window() {
        let t = vec![CpuTarget {
            label: "s".into(),
            pid: 1,
        }];
        let a = [Ticks {
            user: 100,
            sys: 50,
            processes: 1,
        }];
        let b = [Ticks {
            user: 250,
            sys: 100,
            processes: 2,
        }];
        let u = &usage(&t, &a, &b, 2.0, 100.0)[0];
        assert_eq!((u.user_s, u.sys_s, u.cpu_s, u.cpus), (1.5, 0.5, 2.0, 1.0));
        assert_eq!(u.processes, 2);
    }

    /// This process burns CPU inside the window; the watch must see it.
    #[test]
    fn the_watch_sees_a_busy_process() {
        let me = CpuTarget {
            label: "me".into(),
            pid: std::process::id(),
        };
        let start = Instant::now();
        let end = start + Duration::from_millis(300);
        let w = CpuWatch::start(std::slice::from_ref(&me), start, end);
        let mut x = 0u64;
        while Instant::now() < end + Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        let u = w.finish().unwrap();
        assert_eq!(u.len(), 1);
        // The loop kept a CPU busy for the whole window: any share of it
        // shows as at least one 10 ms tick (the counters' resolution).
        assert!(u[0].cpu_s > 0.0 && u[0].user_s > 0.0, "{:?}", u[0]);
        assert!(u[0].wall_s > 0.0 && u[0].processes >= 1, "{:?}", u[0]);
    }

    #[test]
    fn a_run_that_ends_early_reports_why() {
        let me = CpuTarget {
            label: "me".into(),
            pid: std::process::id(),
        };
        let now = Instant::now();
        let w = CpuWatch::start(&[me], now, now + Duration::from_secs(3600));
        let e = w.finish().unwrap_err();
        assert!(matches!(e, CpuError::EndedEarly), "{e}");
        assert_eq!(CpuWatch::start(&[], now, now).finish().unwrap(), Vec::new());
    }

    #[test]
    fn a_missing_process_is_an_error() {
        let ghost = CpuTarget {
            label: "ghost".into(),
            pid: u32::MAX - 1,
        };
        let now = Instant::now();
        let e = CpuWatch::start(&[ghost], now, now).finish().unwrap_err();
        assert!(
            matches!(&e, CpuError::Read { label, .. } if label == "ghost"),
            "{e}"
        );
    }
}

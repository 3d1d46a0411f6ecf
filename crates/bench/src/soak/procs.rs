//! The soak's processes: one `corefarm server` and N `corefarm node`s on
//! loopback with OS-assigned ports, nodes killed and restarted at will,
//! everything killed when the [`Cluster`] is dropped.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub struct Cluster {
    bin: PathBuf,
    logs: PathBuf,
    server: Child,
    pub nodes_addr: String,
    pub users_addr: String,
    /// The server's metrics endpoint (`--metrics-listen`).
    pub metrics_addr: String,
    /// Extra flags of every node (its secret, with authentication).
    node_args: Vec<String>,
    /// Slot i: the running node process of that slot, if any.
    nodes: Vec<Option<Child>>,
    /// Start counter per slot, so each incarnation logs to its own file.
    starts: Vec<u32>,
}

impl Cluster {
    /// Starts the server (its extra flags in `server_args`) and waits for
    /// its `listening` line; every node started later gets `node_args`.
    pub fn start(
        bin: &Path,
        logs: &Path,
        server_args: &[String],
        node_args: &[String],
    ) -> anyhow::Result<Cluster> {
        let err = File::create(server_log(logs))?;
        let mut server = Command::new(bin)
            .args(["server", "--nodes-listen", "127.0.0.1:0"])
            .args(["--users-listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(server_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {} server", bin.display()))?;
        let stdout = server.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let line = match lines.next() {
            Some(Ok(l)) => l,
            _ => {
                let _ = server.kill();
                let _ = server.wait();
                bail!(
                    "the server exited before listening (log: {})",
                    logs.display()
                );
            }
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .map(str::to_string)
        };
        let (Some(nodes_addr), Some(users_addr), Some(metrics_addr)) =
            (field("nodes="), field("users="), field("metrics="))
        else {
            bail!("unexpected first line from the server: {line:?}");
        };
        Ok(Cluster {
            bin: bin.to_path_buf(),
            logs: logs.to_path_buf(),
            server,
            nodes_addr,
            users_addr,
            metrics_addr,
            node_args: node_args.to_vec(),
            nodes: Vec::new(),
            starts: Vec::new(),
        })
    }

    pub fn server_pid(&self) -> u32 {
        self.server.id()
    }

    /// Whether the server process is still running.
    pub fn server_alive(&mut self) -> bool {
        matches!(self.server.try_wait(), Ok(None))
    }

    /// Starts the node of slot `i` (a new slot when `i` is the slot count).
    pub fn start_node(&mut self, i: usize) -> anyhow::Result<()> {
        if i == self.nodes.len() {
            self.nodes.push(None);
            self.starts.push(0);
        }
        self.starts[i] += 1;
        let log = File::create(self.logs.join(format!("node{i}.{}.log", self.starts[i])))?;
        let child = Command::new(&self.bin)
            .args(["node", "--server", &self.nodes_addr])
            .args(["--name", &format!("soak-{i}")])
            .args(&self.node_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting a node manager")?;
        self.nodes[i] = Some(child);
        Ok(())
    }

    /// SIGKILLs the node of slot `i` (no goodbye: the server must notice).
    pub fn kill_node(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn live_nodes(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_some())
            .collect()
    }

    pub fn dead_nodes(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_none())
            .collect()
    }

    /// Pid of the node in slot `i`, if it runs.
    pub fn node_pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].as_ref().map(Child::id)
    }

    /// Node processes that exited on their own (a crash: the soak never
    /// asks a node to stop other than by SIGKILL).
    pub fn crashed_nodes(&mut self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (i, slot) in self.nodes.iter_mut().enumerate() {
            if let Some(c) = slot {
                if let Ok(Some(status)) = c.try_wait() {
                    out.push((i, status.to_string()));
                    *slot = None;
                }
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill_node(i);
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// The server's log in the soak's log directory.
pub fn server_log(logs: &Path) -> PathBuf {
    logs.join("server.log")
}

/// The value of the sample `series` (name and labels, as printed) in the
/// server's `/metrics`; `None` when the endpoint does not answer. A series
/// not printed yet counts 0.
pub fn metric(metrics_addr: &str, series: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(metrics_addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    Some(
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0),
    )
}

/// Resident set size of `pid` in KiB (`VmRSS` of /proc/PID/status).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Open file descriptors of `pid` (sockets included): a leaked connection
/// or task holding one shows up here.
pub fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Threads of `pid`.
pub fn threads(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Polls `check` until it holds or `timeout` passes; returns whether it held.
/// The soak waits on the server's own answers (status queries), never on a
/// fixed sleep.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

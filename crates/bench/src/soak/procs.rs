//! The soak's processes: one `corefarm server` (two with a standby) and N
//! `corefarm node`s on loopback, nodes and servers killed, stopped and
//! restarted at will, everything killed when the [`Cluster`] is dropped.
//! A server's ports are OS-assigned at its first start and kept when it is
//! started again, so its peers find it where it was.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// One server process and where it listens.
pub struct Server {
    child: Option<Child>,
    pub nodes_addr: String,
    pub users_addr: String,
    /// The server's metrics endpoint (`--metrics-listen`).
    pub metrics_addr: String,
    pub log: PathBuf,
}

pub struct Cluster {
    bin: PathBuf,
    logs: PathBuf,
    server_args: Vec<String>,
    pub servers: Vec<Server>,
    /// Extra flags of every node (its secret, with authentication).
    node_args: Vec<String>,
    /// Slot i: the running node process of that slot, if any.
    nodes: Vec<Option<Child>>,
    /// Slot i's `--server` (the servers' node ports, or its proxies').
    node_servers: Vec<String>,
    /// Start counter per slot, so each incarnation logs to its own file.
    starts: Vec<u32>,
}

impl Cluster {
    /// Starts `servers` servers (1, or 2 for an active one and a standby;
    /// their extra flags in `server_args`) and waits for each one's
    /// `listening` line; every node started later gets `node_args`.
    pub fn start(
        bin: &Path,
        logs: &Path,
        server_args: &[String],
        node_args: &[String],
        servers: usize,
    ) -> anyhow::Result<Cluster> {
        let mut c = Cluster {
            bin: bin.to_path_buf(),
            logs: logs.to_path_buf(),
            server_args: server_args.to_vec(),
            servers: Vec::new(),
            node_args: node_args.to_vec(),
            nodes: Vec::new(),
            node_servers: Vec::new(),
            starts: Vec::new(),
        };
        for k in 0..servers {
            let log = if k == 0 {
                server_log(logs)
            } else {
                logs.join(format!("server{k}.log"))
            };
            let s = c.spawn_server(&log, None)?;
            c.servers.push(s);
        }
        Ok(c)
    }

    fn spawn_server(&self, log: &Path, on: Option<&Server>) -> anyhow::Result<Server> {
        // Appended to: a restarted server's log follows its predecessor's.
        let err = OpenOptions::new().create(true).append(true).open(log)?;
        let any = "127.0.0.1:0";
        let (n, u, m) = on.map_or((any, any, any), |s| {
            (
                s.nodes_addr.as_str(),
                s.users_addr.as_str(),
                s.metrics_addr.as_str(),
            )
        });
        let mut server = Command::new(&self.bin)
            .args(["server", "--nodes-listen", n])
            .args(["--users-listen", u])
            .args(["--metrics-listen", m])
            .args(&self.server_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {} server", self.bin.display()))?;
        let stdout = server.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let line = match lines.next() {
            Some(Ok(l)) => l,
            _ => {
                let _ = server.kill();
                let _ = server.wait();
                bail!(
                    "the server exited before listening (log: {})",
                    log.display()
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
        Ok(Server {
            child: Some(server),
            nodes_addr,
            users_addr,
            metrics_addr,
            log: log.to_path_buf(),
        })
    }

    pub fn server_pid(&self, k: usize) -> Option<u32> {
        self.servers[k].child.as_ref().map(Child::id)
    }

    /// SIGKILLs server `k` (its peers see their connections reset).
    pub fn kill_server(&mut self, k: usize) {
        if let Some(mut c) = self.servers[k].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts server `k` again on the ports it had.
    pub fn restart_server(&mut self, k: usize) -> anyhow::Result<()> {
        self.kill_server(k);
        let old = &self.servers[k];
        let s = self.spawn_server(&old.log.clone(), Some(old))?;
        self.servers[k] = s;
        Ok(())
    }

    /// Server processes that exited on their own, taken out of the
    /// cluster (the campaign kills a server only by [`Self::kill_server`]).
    pub fn crashed_servers(&mut self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (k, s) in self.servers.iter_mut().enumerate() {
            if let Some(c) = &mut s.child {
                if let Ok(Some(status)) = c.try_wait() {
                    out.push((k, status.to_string()));
                    s.child = None;
                }
            }
        }
        out
    }

    /// The `--server` of the node in slot `i` (from its next start on).
    pub fn set_node_server(&mut self, i: usize, addrs: String) {
        while self.node_servers.len() <= i {
            self.node_servers.push(String::new());
        }
        self.node_servers[i] = addrs;
    }

    /// Starts the node of slot `i` (a new slot when `i` is the slot count).
    pub fn start_node(&mut self, i: usize) -> anyhow::Result<()> {
        if i == self.nodes.len() {
            self.nodes.push(None);
            self.starts.push(0);
        }
        let server = match self.node_servers.get(i) {
            Some(s) if !s.is_empty() => s.clone(),
            _ => self
                .servers
                .iter()
                .map(|s| s.nodes_addr.as_str())
                .collect::<Vec<_>>()
                .join(","),
        };
        self.starts[i] += 1;
        let log = File::create(self.logs.join(format!("node{i}.{}.log", self.starts[i])))?;
        let child = Command::new(&self.bin)
            .args(["node", "--server", &server])
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

    /// Sends `sig` (SIGSTOP, SIGCONT) to the node of slot `i`; whether it
    /// runs to receive it.
    pub fn signal_node(&self, i: usize, sig: libc::c_int) -> bool {
        let Some(pid) = self.node_pid(i) else {
            return false;
        };
        // SAFETY: kill(2) on a child of ours not yet reaped (its `Child`
        // is held), so the pid is not another process's.
        unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
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
        for k in 0..self.servers.len() {
            self.kill_server(k);
        }
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

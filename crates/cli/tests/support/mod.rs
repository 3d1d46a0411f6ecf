//! What the real-binary tests share: a child process that is always killed,
//! an embedded cluster on OS-assigned ports, and images built with the
//! `corefarm image build` command itself.
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use bytes::Bytes;

pub const BIN: &str = env!("CARGO_BIN_EXE_corefarm");

/// A child process killed (and reaped) when dropped, so no test leaves one behind.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `corefarm server` (plus `extra` flags) on 127.0.0.1 port 0: the process
/// and the node and user addresses of its first line.
pub fn server(extra: &[&str]) -> (Proc, std::net::SocketAddr, std::net::SocketAddr) {
    let mut child = Command::new(BIN)
        .args(["server", "--nodes-listen", "127.0.0.1:0"])
        .args(["--users-listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start corefarm server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "listening nodes=IP:PORT users=IP:PORT"
    let addr = |key: &str| -> std::net::SocketAddr {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
            .parse()
            .unwrap()
    };
    let (nodes, users) = (addr("nodes="), addr("users="));
    (Proc(child), nodes, users)
}

/// `corefarm local --nodes N` (plus `extra` flags) on 127.0.0.1 port 0;
/// returns it with its `listening ...` line. Its stdout keeps being read,
/// so it never writes into a closed pipe.
fn start_local(nodes: u32, extra: &[&str]) -> (Proc, String) {
    let mut child = Command::new(BIN)
        .args(["local", "--nodes", &nodes.to_string()])
        .args([
            "--nodes-listen",
            "127.0.0.1:0",
            "--users-listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start corefarm local");
    let stdout = child.stdout.take().unwrap();
    let proc = Proc(child);
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    // "listening nodes=IP:PORT users=IP:PORT [metrics=IP:PORT]" follows the greeting line.
    let line = lines
        .find(|l| l.starts_with("listening "))
        .expect("corefarm local prints its addresses");
    std::thread::spawn(move || lines.for_each(drop));
    (proc, line)
}

/// The value of `key` (e.g. "users=") in a `listening ...` line.
fn field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        .to_string()
}

/// `corefarm local --nodes N` (plus `extra` flags) on 127.0.0.1 port 0;
/// returns it with the user address it printed.
pub fn local_cluster(nodes: u32, extra: &[&str]) -> (Proc, String) {
    let (proc, line) = start_local(nodes, extra);
    (proc, field(&line, "users="))
}

/// `corefarm local --nodes N --metrics-listen 127.0.0.1:0` (plus `extra`);
/// returns it with its user, node and metrics addresses.
pub fn local_cluster_with_metrics(nodes: u32, extra: &[&str]) -> (Proc, [String; 3]) {
    let (proc, line) = start_local(
        nodes,
        &[&["--metrics-listen", "127.0.0.1:0"][..], extra].concat(),
    );
    let addrs = ["users=", "nodes=", "metrics="].map(|k| field(&line, k));
    (proc, addrs)
}

/// `GET path` over plain HTTP/1.1; returns the status code and the body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics port");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the HTTP answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP head");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    (code, body.to_string())
}

/// Builds an image from an HLS component of `cores/` with `corefarm image
/// build` into `dir`; `args` adds flags (entry, sizes, cores).
pub fn hls_image(dir: &Path, source: &str, args: &[&str]) -> Bytes {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../cores")
        .join(source);
    let out = dir.join("image.cfimg");
    let st = Command::new(BIN)
        .args(["image", "build", "--hls"])
        .arg(&src)
        .args(args)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run corefarm image build");
    assert!(st.success(), "corefarm image build {source} failed");
    Bytes::from(std::fs::read(out).unwrap())
}

/// Builds an image with streaming handlers into `dir`: the HLS component
/// `echo_src` (C++ text, entry `echo`), the handler sets `sets_json`, and
/// the handlers' C `sources`.
pub fn handler_image(
    dir: &Path,
    name: &str,
    echo_src: &str,
    sets_json: &str,
    sources: &[std::path::PathBuf],
) -> Bytes {
    let (echo, sets) = (dir.join("echo.cpp"), dir.join("sets.json"));
    std::fs::write(&echo, echo_src).unwrap();
    std::fs::write(&sets, sets_json).unwrap();
    let out = dir.join(format!("{name}.cfimg"));
    let st = Command::new(BIN)
        .args(["image", "build", "--hls"])
        .arg(&echo)
        .args(["--entry", "echo", "--name", name, "--handlers"])
        .arg(&sets)
        .arg("--handler-source")
        .args(sources)
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run corefarm image build");
    assert!(st.success(), "corefarm image build {name} failed");
    Bytes::from(std::fs::read(out).unwrap())
}

/// Asks `ask` until `cond` holds on its answer, for at most `limit`; fails
/// with `what` and the last answer. The pause between questions only spares
/// the CPU: the condition is the synchronisation.
pub fn poll_until<T: std::fmt::Debug>(
    what: &str,
    limit: std::time::Duration,
    mut ask: impl FnMut() -> T,
    cond: impl Fn(&T) -> bool,
) -> T {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let answer = ask();
        if cond(&answer) {
            return answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: {answer:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A file only its owner may read (a secret, an auth file).
pub fn private(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// `corefarm status --json` with `extra` as named user `user`, its answer
/// as JSON (the environment's user left out).
pub fn status_json(users: &str, user: &str, secret: &Path, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["status", "--json", "--server", users])
        .args(extra)
        .args(["--user", user, "--secret-file"])
        .arg(secret)
        .env_remove("COREFARM_USER")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `corefarm status --accounting --json` as `user`.
pub fn accounting(
    users: &str,
    user: &str,
    secret: &Path,
) -> (f64, Vec<corefarm_smp::AccountStatus>) {
    let v = status_json(users, user, secret, &["--accounting"]);
    let accounts = serde_json::from_value(v["accounts"].clone()).unwrap();
    (v["uptime_seconds"].as_f64().unwrap(), accounts)
}

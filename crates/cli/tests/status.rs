//! `corefarm status` against a real `corefarm server` and `corefarm node`
//! processes on 127.0.0.1 with OS-assigned ports: it shows every node and
//! computing user, as a table or JSON, and takes no node itself.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};
use corefarm_smp::{ClusterStatus, NodeState, UserPhase};

const BIN: &str = env!("CARGO_BIN_EXE_corefarm");
/// Longest any wait may take before the test fails.
const LIMIT: Duration = Duration::from_secs(30);

/// A child process killed (and reaped) when dropped; holds the read end of
/// its stdout so a late write cannot fail on a closed pipe.
struct Proc(Child, #[allow(dead_code)] Option<BufReader<ChildStdout>>);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `corefarm server` on port 0; returns it with its user and node addresses
/// read from its "listening nodes=A users=B" line.
fn server() -> (Proc, String, String) {
    let mut child = Command::new(BIN)
        .args(["server", "--nodes-listen", "127.0.0.1:0"])
        .args(["--users-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start corefarm server");
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line)
        .expect("read the server's first line");
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
            .to_string()
    };
    let (nodes, users) = (field("nodes="), field("users="));
    (Proc(child, Some(out)), users, nodes)
}

fn status_cmd(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("status")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run corefarm status")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "corefarm status failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).expect("UTF-8 output")
}

/// Asks `corefarm status --json` until `cond` holds (the condition is the
/// signal; the pause between questions only spares the CPU).
fn wait_for(users: &str, what: &str, cond: impl Fn(&ClusterStatus) -> bool) -> ClusterStatus {
    let deadline = Instant::now() + LIMIT;
    loop {
        let s: ClusterStatus =
            serde_json::from_str(&stdout(&status_cmd(&["--server", users, "--json"])))
                .expect("--json prints a ClusterStatus");
        if cond(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn status_shows_nodes_and_users_of_a_real_cluster_and_takes_no_node() {
    let (_server, users, nodes) = server();
    let _nodes = Proc(
        Command::new(BIN)
            .args(["node", "--server", &nodes, "--count", "2", "--name", "st"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm node"),
        None,
    );
    wait_for(&users, "two named free nodes", |s| {
        s.count_nodes(NodeState::Free) == 2 && s.nodes.iter().all(|n| n.name.is_some())
    });

    // A computing user on one node, 5 results delivered.
    let opts = ClientOptions {
        nodes: Some(1),
        name: Some("prog".into()),
        io_timeout: Some(LIMIT),
        ..ClientOptions::default()
    };
    let c = Client::connect(&users, opts).expect("user connects");
    c.configure_benchmark(16, 16, 0).expect("configure");
    for _ in 0..5 {
        c.submit(Bytes::from(vec![7u8; 16])).unwrap();
    }
    for _ in 0..5 {
        c.recv(Some(LIMIT)).expect("a result");
    }

    // JSON: the server's own answer; the asking observer holds no node.
    let s: ClusterStatus =
        serde_json::from_str(&stdout(&status_cmd(&["--server", &users, "--json"]))).unwrap();
    let me = s.user(s.you.expect("you")).expect("the observer is listed");
    assert!(me.nodes.is_empty(), "the observer took no node: {s:#?}");
    assert_eq!(me.name.as_deref(), Some("corefarm status"));
    assert_eq!(s.count_nodes(NodeState::Ready), 1);
    assert_eq!(s.count_nodes(NodeState::Free), 1, "{s:#?}");
    let prog = s
        .users
        .iter()
        .find(|u| u.name.as_deref() == Some("prog"))
        .expect("the computing user");
    assert_eq!(
        (prog.phase, prog.nodes.len(), prog.results, prog.outstanding),
        (UserPhase::Routing, 1, 5, 0)
    );

    // The table: one row per node (name@address) and per computing user.
    let table = stdout(&status_cmd(&["--server", &users]));
    let ready = s
        .nodes
        .iter()
        .find(|n| n.state == NodeState::Ready)
        .unwrap();
    let free = s.nodes.iter().find(|n| n.state == NodeState::Free).unwrap();
    let row = |label: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.contains(label))
            .unwrap_or_else(|| panic!("no row for {label} in:\n{table}"))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    let label = |n: &corefarm_smp::NodeStatus| format!("{}@{}", n.name.clone().unwrap(), n.addr);
    // Busy seconds (the last column) keep growing between two answers.
    let ready_row = row(&label(ready));
    assert_eq!(
        ready_row[..10],
        [
            ready.id.to_string(),
            label(ready),
            "ready".into(),
            ready
                .function
                .clone()
                .expect("a configured node has a function"),
            ready.cores.to_string(),
            prog.id.to_string(),
            "0".into(),
            "5".into(),
            "5".into(),
            "0".into(),
        ]
    );
    assert!(ready_row[10].parse::<f64>().is_ok(), "{ready_row:?}");
    assert_eq!(
        row(&label(free)),
        [
            free.id.to_string(),
            label(free),
            "free".into(),
            "-".into(),
            "0".into(),
            "-".into(),
            "0".into(),
            "0".into(),
            "0".into(),
            "0".into(),
            "0.0".into(),
        ]
    );
    // Then failures and the latency percentiles (measured, so only parsed).
    let prog_row = row(" prog ");
    assert_eq!(
        prog_row[..9],
        [
            prog.id.to_string(),
            prog.addr.clone(),
            "prog".into(),
            "routing".into(),
            ready.id.to_string(),
            "0".into(),
            "0".into(),
            "5".into(),
            "0".into(),
        ]
    );
    assert!(
        prog_row[9..]
            .iter()
            .all(|v| v.parse::<f64>().is_ok_and(|ms| ms > 0.0)),
        "{prog_row:?}"
    );
    assert!(table.contains("nodes: 2\n"), "{table}");
    assert!(
        table.contains("users: 1\n"),
        "the observer is left out:\n{table}"
    );
    c.close();
}

#[test]
fn status_of_an_unreachable_server_fails_naming_the_address() {
    // A port just released: nothing listens there.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let o = status_cmd(&["--server", &addr, "--timeout", "5"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&addr), "{err}");
}

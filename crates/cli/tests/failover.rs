//! Server failures with real processes: a standby server that the nodes
//! move to when the active one is killed, and a node that keeps its loaded
//! function across a server restart. Tests wait on the servers' status and
//! the node's own metrics, never on sleeps or log text.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use corefarm_smp::ClusterStatus;

use crate::cluster_harness::*;
use crate::support::{http_get, Proc, BIN};

/// `corefarm node --server <list> --count N --metrics-listen 127.0.0.1:0`;
/// returns it with its metrics address.
fn nodes_on(servers: &str, count: usize) -> (Proc, String) {
    let mut child = Command::new(BIN)
        .args(["node", "--server", servers, "--count", &count.to_string()])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start corefarm node");
    let stdout = child.stdout.take().unwrap();
    let proc_ = Proc(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let metrics = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("metrics="))
        .unwrap_or_else(|| panic!("no metrics= in {line:?}"))
        .to_string();
    (proc_, metrics)
}

/// Kills a server as a crash would (SIGKILL) and reaps it.
fn kill(srv: &mut ServerProc) {
    srv.proc_.0.kill().unwrap();
    srv.proc_.0.wait().unwrap();
}

fn node_count(s: &ClusterStatus) -> usize {
    s.nodes.len()
}

/// The value of one sample in a Prometheus text page (0 if absent).
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Two servers side by side, nodes given both addresses: all on the first
/// while it lives; when it is killed every node moves to the standby, which
/// then serves a user.
#[test]
fn nodes_move_to_the_standby_when_the_active_server_is_killed() {
    let mut a = server(&[]);
    let b = server(&[]);
    let list = format!("{},{}", a.nodes, b.nodes);
    let (_nodes, _) = nodes_on(&list, 3);
    let mut on_a = Observer::new(&a);
    on_a.wait("3 nodes on a", |s| node_count(s) == 3);
    let mut on_b = Observer::new(&b);
    assert_eq!(
        node_count(&on_b.get()),
        0,
        "no node on the standby while a lives"
    );

    // a serves a user before it dies.
    let (mut u, _) = User::hello(a.users, Some(3));
    assert_eq!(u.configure(&bench(64, 32, 0)), 0);
    assert_exactly_once(&stream(&mut u, 0..100, 1, 64, 32), 0..100);

    kill(&mut a);
    on_b.wait("3 nodes on the standby", |s| node_count(s) == 3);
    let (mut u, _) = User::hello(b.users, Some(3));
    assert_eq!(u.configure(&bench(64, 32, 0)), 0);
    assert_exactly_once(&stream(&mut u, 0..300, 2, 64, 32), 0..300);
}

/// `corefarm server` on the given node and user ports.
fn server_at(nodes: SocketAddr, users: SocketAddr) -> ServerProc {
    let mut child = Command::new(BIN)
        .args(["server", "--node-wait", "10"])
        .args(["--nodes-listen", &nodes.to_string()])
        .args(["--users-listen", &users.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start corefarm server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("listening "), "{line:?}");
    ServerProc {
        proc_: Proc(child),
        nodes,
        users,
    }
}

/// A server killed and started again on the same ports: its node comes
/// back by itself and answers the user's configuration, the same one as
/// before, with the function it kept (counted as reused, not loaded).
#[test]
fn a_node_answers_a_restarted_server_with_the_function_it_kept() {
    let mut srv = server(&[]);
    let (_node, metrics) = nodes_on(&srv.nodes.to_string(), 1);
    let mut obs = Observer::new(&srv);
    obs.wait("the node", |s| node_count(s) == 1);
    let (mut u, _) = User::hello(srv.users, Some(1));
    let cfg = bench(32, 32, 0);
    assert_eq!(u.configure(&cfg), 0);
    assert_exactly_once(&stream(&mut u, 0..50, 1, 32, 32), 0..50);

    kill(&mut srv);
    let srv = server_at(srv.nodes, srv.users);
    let mut obs = Observer::new(&srv);
    obs.wait("the node back", |s| node_count(s) == 1);
    let (mut u, _) = User::hello(srv.users, Some(1));
    assert_eq!(u.configure(&cfg), 0);
    assert_exactly_once(&stream(&mut u, 50..100, 1, 32, 32), 50..100);

    let (code, text) = http_get(&metrics, "/metrics");
    assert_eq!(code, 200, "{text}");
    let outcome = |o: &str| {
        let name =
            format!(r#"corefarm_node_manager_configurations_total{{node="node",outcome="{o}"}}"#);
        sample(&text, &name)
    };
    assert_eq!((outcome("loaded"), outcome("reused")), (1.0, 1.0), "{text}");
}

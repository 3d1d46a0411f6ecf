//! `corefarm local` as a newcomer meets it: its first line says where users
//! connect, its default user port is the clients' default, and `--help`
//! offers only what applies to a cluster inside one process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions, DEFAULT_USER_PORT};
use corefarm_smp::NodeState;

use crate::support;
use support::{Proc, BIN};

fn help() -> String {
    let o = Command::new(BIN)
        .args(["local", "--help"])
        .output()
        .expect("run corefarm local --help");
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn help_lists_only_what_applies_to_an_in_process_cluster() {
    let h = help();
    for flag in [
        "--nodes ",
        "--users-listen",
        "--nodes-listen",
        "--backends",
        "--core-timeout",
        "--policy",
    ] {
        assert!(h.contains(flag), "{flag} missing from:\n{h}");
    }
    // Reaching a remote server, a board, or being a seed node: not here.
    for flag in [
        "--once",
        "--no-hello",
        "--fpga",
        "--server ",
        "--count",
        "possible values: native, rtl, fpga",
    ] {
        assert!(!h.contains(flag), "{flag} offered by:\n{h}");
    }
    assert!(h.contains("[possible values: native, rtl]"), "{h}");
    let refused = Command::new(BIN)
        .args(["local", "--once"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!refused.status.success(), "--once must be refused");
}

/// `corefarm local`, `corefarm.connect()` (Python) and the Rust client agree
/// on the user port.
#[test]
fn default_user_port_is_the_clients_default() {
    assert!(
        help().contains(&format!("[default: 127.0.0.1:{DEFAULT_USER_PORT}]")),
        "{}",
        help()
    );
    let init = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../python/corefarm/__init__.py"
    );
    let src = std::fs::read_to_string(init).expect("the Python package's __init__.py");
    let python_port: u16 = src
        .lines()
        .find_map(|l| l.trim().strip_prefix("DEFAULT_PORT = "))
        .expect("DEFAULT_PORT in python/corefarm/__init__.py")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(python_port, DEFAULT_USER_PORT);
}

fn observer_opts() -> ClientOptions {
    ClientOptions {
        nodes: Some(0),
        io_timeout: Some(Duration::from_secs(30)),
        ..ClientOptions::default()
    }
}

/// `corefarm local --nodes N` on port 0; returns it, its first two stdout
/// lines, and an observer connected once all N nodes are free.
fn local(nodes: usize, extra: &[&str]) -> (Proc, String, String, Client) {
    let mut child = Proc(
        Command::new(BIN)
            .args(["local", "--nodes", &nodes.to_string()])
            .args(["--users-listen", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm local"),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let (mut first, mut second) = (String::new(), String::new());
    out.read_line(&mut first).unwrap();
    out.read_line(&mut second).unwrap();
    let addr = first
        .strip_prefix("corefarm local: users connect to ")
        .unwrap_or_else(|| panic!("first line {first:?}"))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    // The address is printed only once every node has joined: a user who
    // connects at once finds them all free (an observer asks).
    let observer = Client::connect(&addr, observer_opts()).expect("connect to the printed address");
    assert_eq!(
        observer.status().unwrap().count_nodes(NodeState::Free),
        nodes,
        "every node joined before the address was printed"
    );
    (child, first, second, observer)
}

#[test]
fn first_line_is_the_address_users_connect_to() {
    let (_local, first, second, _observer) = local(2, &[]);
    let rest = first
        .strip_prefix("corefarm local: users connect to ")
        .unwrap();
    let addr = rest.split_whitespace().next().unwrap();
    assert!(
        rest.trim_end().ends_with("(2 simulated nodes)"),
        "{first:?}"
    );
    // The machine-readable line follows, with the same user address.
    assert!(
        second.starts_with("listening nodes=")
            && second.trim_end().ends_with(&format!("users={addr}")),
        "{second:?}"
    );
    let opts = ClientOptions {
        io_timeout: Some(Duration::from_secs(30)),
        ..ClientOptions::default()
    };
    let c = Client::connect(addr, opts).expect("connect to the printed address");
    c.configure_benchmark(16, 16, 0).unwrap();
    let id = c.submit(Bytes::from(vec![1u8; 16])).unwrap();
    let r = c.recv(Some(Duration::from_secs(30))).unwrap();
    assert_eq!((r.id, r.data.len()), (id, 16));
    let s = c.status().unwrap();
    assert_eq!(s.count_nodes(NodeState::Ready), 2, "{s:#?}");
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    c.close();
}

/// The server's "fewer nodes than asked" warning reaches the Rust client as
/// a configuration warning, and the session goes on.
#[test]
fn a_client_that_asks_for_more_nodes_than_exist_gets_a_warning() {
    let (_local, first, _, _observer) = local(2, &["--node-wait", "0.2"]);
    let addr = first.split_whitespace().nth(5).unwrap();
    let opts = ClientOptions {
        nodes: Some(3),
        io_timeout: Some(Duration::from_secs(30)),
        ..ClientOptions::default()
    };
    let c = Client::connect(addr, opts).unwrap();
    assert_eq!(c.nodes(), Some(2));
    c.configure_benchmark(16, 16, 0).unwrap();
    assert_eq!(
        c.warnings(),
        ["asked for 3 nodes, 2 assigned (2 connected)"]
    );
    let id = c.submit(Bytes::from(vec![1u8; 16])).unwrap();
    assert_eq!(c.recv(Some(Duration::from_secs(30))).unwrap().id, id);
    c.close();
}

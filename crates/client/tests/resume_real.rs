//! A session survives its server being killed and restarted, with the real
//! `corefarm` binary: a server and a node manager as separate processes;
//! the server is SIGKILLed while a `map` streams, and a new one is started
//! on the same ports. The node reconnects by itself, the client resumes,
//! and the `map` ends with every result correct and in its place. The
//! binary is found as in real_server.rs.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};
use corefarm_smp::BenchmarkConfig;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `corefarm server` on the given listen addresses; returns it with the
/// addresses it reports (port 0 becomes the port it took).
fn server(nodes: &str, users: &str) -> (Proc, String, String) {
    let bin = support::binary().expect("checked by the caller");
    let mut child = Command::new(bin)
        .args(["server", "--nodes-listen", nodes, "--users-listen", users])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("corefarm server starts");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let line = loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("users=") => break l,
            Some(Ok(_)) => {}
            _ => {
                let _ = child.kill();
                panic!("corefarm server exited without a 'listening' line");
            }
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
            .to_string()
    };
    let (n, u) = (field("nodes="), field("users="));
    (Proc(child), n, u)
}

fn input(k: u64) -> Bytes {
    let mut v = vec![0x5Au8; 64];
    v[..8].copy_from_slice(&k.to_le_bytes());
    v[8..16].copy_from_slice(&(!k).to_le_bytes());
    Bytes::from(v)
}

#[test]
fn a_map_survives_a_server_killed_and_restarted_on_its_port() {
    if support::binary().is_none() {
        return;
    }
    let (mut first, nodes, users) = server("127.0.0.1:0", "127.0.0.1:0");
    let bin = support::binary().expect("found");
    let _node = Proc(
        Command::new(bin)
            .args(["node", "--server", &nodes])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("corefarm node starts"),
    );
    let opts = ClientOptions {
        io_timeout: Some(Duration::from_secs(30)),
        reconnect_timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    let c = Client::connect(&users, opts).unwrap();
    // 2 ms per input keeps a window of them in flight at the kill.
    c.configure(
        &BenchmarkConfig {
            input_size: 64,
            output_size: 64,
            delay_us: 2000,
        }
        .to_configuration(),
    )
    .unwrap();
    let total = 300u64;
    let mut restarted = None;
    let mut results = c.map((0..total).map(input), 16);
    for k in 0..total {
        if k == 100 {
            // SIGKILL: no goodbye to the client or the node.
            first.0.kill().unwrap();
            first.0.wait().unwrap();
            restarted = Some(server(&nodes, &users));
        }
        let out = results
            .next()
            .expect("a result per input")
            .unwrap_or_else(|e| panic!("input {k}: {e}"));
        // The benchmarking core echoes each input's first 16 bytes.
        assert_eq!(out.len(), 64, "result {k}");
        assert_eq!(
            out[..16],
            input(k)[..16],
            "result {k} in its place and correct"
        );
    }
    assert!(results.next().is_none(), "one result per input, no more");
    drop(results);
    assert!(restarted.is_some());
    assert_eq!(c.resumes(), 1);
}

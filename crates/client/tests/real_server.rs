//! The client against the real `corefarm` binary (`corefarm local`: a server
//! and simulated nodes in one process). The binary is looked up at
//! $COREFARM_BIN, the one built beside the test, then $CARGO_TARGET_DIR or
//! target/{release,debug}.
//! Without one they are skipped with a notice on a developer's machine and
//! fail, saying what to build, under `COREFARM_REQUIRE_TOOLS=1` (CI).

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::{Client, ClientError, ClientOptions};

/// `corefarm local` on OS-assigned ports; killed on drop.
struct Cluster {
    child: Child,
    users: String,
}

impl Cluster {
    fn start(nodes: u32) -> Option<Cluster> {
        let bin = support::binary()?;
        let mut child = Command::new(bin)
            .args(["local", "--nodes", &nodes.to_string()])
            .args([
                "--nodes-listen",
                "127.0.0.1:0",
                "--users-listen",
                "127.0.0.1:0",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("corefarm local starts");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let users = loop {
            match lines.next() {
                Some(Ok(l)) => {
                    if let Some(u) = l.split_whitespace().find_map(|w| w.strip_prefix("users=")) {
                        break u.to_string();
                    }
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("corefarm local exited without a 'listening' line");
                }
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Some(Cluster { child, users })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn opts(nodes: Option<u32>) -> ClientOptions {
    ClientOptions {
        nodes,
        io_timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    }
}

fn tagged(k: u64, input: usize) -> Bytes {
    let mut v = vec![0xA5u8; input];
    v[..8].copy_from_slice(&k.to_le_bytes());
    v[8..16].copy_from_slice(&(!k).to_le_bytes());
    Bytes::from(v)
}

#[test]
fn hello_credit_session_with_reconfiguration() {
    let Some(cl) = Cluster::start(2) else { return };
    let c = Client::connect(&cl.users, opts(Some(2))).unwrap();
    assert_eq!(c.nodes(), Some(2));
    assert!(c.credit_mode());
    c.configure_benchmark(16, 16, 0).unwrap();
    let out: Vec<Bytes> = c
        .map((0..400).map(|k| tagged(k, 16)), 16)
        .collect::<Result<_, _>>()
        .unwrap();
    for (k, o) in out.iter().enumerate() {
        assert_eq!(o[..], tagged(k as u64, 16)[..]);
    }
    // Unused credits carry over to the new configuration; grants resume.
    c.configure_benchmark(64, 32, 20).unwrap();
    let out: Vec<Bytes> = c
        .map((0..50).map(|k| tagged(k, 64)), 8)
        .collect::<Result<_, _>>()
        .unwrap();
    for (k, o) in out.iter().enumerate() {
        assert_eq!(o.len(), 32);
        assert_eq!(o[..16], tagged(k as u64, 64)[..16]);
    }
}

#[test]
fn seed_mode_session_and_split_loops() {
    let Some(cl) = Cluster::start(2) else { return };
    // A hello session asking for both nodes waits until they are registered.
    drop(Client::connect(&cl.users, opts(Some(2))).unwrap());
    let c = Client::connect(
        &cl.users,
        ClientOptions {
            legacy: true,
            ..opts(None)
        },
    )
    .unwrap();
    c.configure_benchmark(32, 16, 0).unwrap();
    let (tx, rx) = c.split();
    const N: u64 = 300;
    let sender = std::thread::spawn(move || {
        for k in 0..N {
            let mut v = tagged(k, 32).to_vec();
            v.extend_from_slice(&tagged(k + 1000, 32));
            tx.submit(Bytes::from(v)).unwrap();
        }
        tx
    });
    let mut seen = vec![false; N as usize];
    for _ in 0..N {
        let o = rx.recv(Some(Duration::from_secs(30))).unwrap();
        assert_eq!(o.count, 2);
        let k = u64::from_le_bytes(o.data[..8].try_into().unwrap());
        assert_eq!(k, u64::from(o.id));
        assert_eq!(o.data[16..24], (k + 1000).to_le_bytes());
        seen[k as usize] = true;
    }
    assert!(seen.iter().all(|&s| s));
    drop(sender.join().unwrap());
}

#[test]
fn four_threads_map_on_one_client() {
    let Some(cl) = Cluster::start(2) else { return };
    let c = std::sync::Arc::new(Client::connect(&cl.users, opts(Some(2))).unwrap());
    c.configure_benchmark(32, 16, 0).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let inputs = (0..200).map(|k| tagged(t << 32 | k, 32));
                let out: Vec<Bytes> = c.map(inputs, 8).collect::<Result<_, _>>().unwrap();
                assert_eq!(out.len(), 200);
                for (k, o) in out.iter().enumerate() {
                    assert_eq!(o[..], tagged(t << 32 | k as u64, 32)[..16], "thread {t}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn unloadable_configuration_reports_the_servers_reason() {
    let Some(cl) = Cluster::start(1) else { return };
    let c = Client::connect(&cl.users, opts(Some(1))).unwrap();
    let cfg = corefarm_smp::Configuration {
        input_size: 64,
        output_size: 64,
        cores: corefarm_client::default_core_table(1, 64, 64).unwrap(),
        bitstream: Bytes::from_static(b"definitely not a bitstream"),
    };
    match c.configure(&cfg).unwrap_err() {
        ClientError::Configuration { reason, .. } => {
            assert!(reason.is_some_and(|r| !r.is_empty()), "no reason given")
        }
        other => panic!("expected a configuration error, got {other}"),
    }
}

#[test]
fn status_from_a_real_server_and_an_observer_takes_no_node() {
    let Some(cl) = Cluster::start(2) else { return };
    let c = Client::connect(&cl.users, opts(Some(2))).unwrap();
    assert!(c.has_status());
    c.configure_benchmark(16, 16, 0).unwrap();
    let n = c
        .map((0..40).map(|k| tagged(k, 16)), 8)
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
        .len();
    assert_eq!(n, 40);
    let s = c.status().unwrap();
    let me = s.user(s.you.expect("the asker's id")).expect("listed");
    assert_eq!((me.results, me.outstanding), (40, 0));
    assert_eq!(me.nodes.len(), 2);
    assert_eq!(s.count_nodes(corefarm_smp::NodeState::Ready), 2);
    // An observer (nodes = 0) sees the same cluster and takes nothing.
    let watcher = Client::connect(&cl.users, opts(Some(0))).unwrap();
    assert_eq!(watcher.nodes(), Some(0));
    let w = watcher.status().unwrap();
    assert_eq!(w.users.len(), 2);
    assert_eq!(w.count_nodes(corefarm_smp::NodeState::Ready), 2);
}

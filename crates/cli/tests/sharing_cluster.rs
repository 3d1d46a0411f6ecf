//! Shared nodes (`corefarm server --sharing shared`) with real
//! processes on 127.0.0.1: a server, node managers (`corefarm node`,
//! benchmarking configurations, optionally `--reconfigure-delay-ms`), and
//! users speaking SMP directly. Waiting is on the server's status (asked by
//! an observer that takes no node) or on results, never on sleeps.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::{
    hello::features, BenchmarkConfig, ClusterStatus, Configuration, ConfigurationResponse, Credit,
    Data, ErrorMsg, Frame, FunctionStatus, Hello, MsgType, OutFrame,
};

use crate::support;
use support::{Proc, BIN};

struct Cluster {
    _server: Proc,
    nodes: SocketAddr,
    users: SocketAddr,
}

fn shared_server(extra: &[&str]) -> Cluster {
    let args = [
        &["--sharing", "shared", "--monitor-period", "10"][..],
        extra,
    ]
    .concat();
    let (_server, nodes, users) = support::server(&args);
    Cluster {
        nodes,
        users,
        _server,
    }
}

fn node(c: &Cluster, extra: &[&str]) -> Proc {
    Proc(
        Command::new(BIN)
            .args(["node", "--server", &c.nodes.to_string()])
            .args(extra)
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm node"),
    )
}

fn bench(input: u32, delay_us: u32) -> Configuration {
    BenchmarkConfig {
        input_size: input,
        output_size: 16,
        delay_us,
    }
    .to_configuration()
}

/// The short id the server gives a configuration (SHA-256 of its payload).
fn function<'a>(s: &'a ClusterStatus, cfg: &Configuration) -> Option<&'a FunctionStatus> {
    s.function(&corefarm_server::sched::FnId::of(&cfg.encode_payload()).short())
}

struct User {
    w: TcpStream,
    r: FrameReader<TcpStream>,
    credit: u64,
}

impl User {
    /// A hello user (error, credit, status) or a seed-format one.
    fn connect(addr: SocketAddr, hello: bool) -> User {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut u = User {
            w: s.try_clone().unwrap(),
            r: FrameReader::new(s, 1 << 30),
            credit: 0,
        };
        if hello {
            let mut h = Hello::new("user");
            h.features = [features::ERROR, features::CREDIT, features::STATUS]
                .map(String::from)
                .to_vec();
            u.send(h.to_frame());
            assert_eq!(u.recv().expect("hello reply").ty, MsgType::Hello);
        }
        u
    }

    fn send(&mut self, f: OutFrame) {
        write_frame(&mut self.w, f).unwrap();
    }

    /// Next frame; credit grants are counted and skipped.
    fn recv(&mut self) -> Option<Frame> {
        loop {
            match self.r.read_frame() {
                Ok(Some(f)) if f.ty == MsgType::Credit => {
                    self.credit += Credit::parse(&f.payload).unwrap().messages as u64;
                }
                Ok(f) => return f,
                Err(_) => return None,
            }
        }
    }

    fn configure(&mut self, cfg: &Configuration) -> u8 {
        self.send(cfg.to_frame().unwrap());
        loop {
            let f = self.recv().expect("configuration response");
            match f.ty {
                MsgType::ConfigurationResponse => {
                    return ConfigurationResponse::parse(&f.payload).unwrap().status
                }
                MsgType::Error => eprintln!("server: {}", ErrorMsg::parse(&f.payload).unwrap()),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn status(&mut self) -> ClusterStatus {
        self.send(ClusterStatus::request_frame());
        let f = self.recv().expect("status");
        assert_eq!(f.ty, MsgType::Status);
        ClusterStatus::decode(&f.payload).unwrap()
    }

    /// Streams one-input messages with ids `ids` (at most 8 outstanding, and
    /// within credit when granted); `at(id)` runs before sending `id`.
    /// Returns how often each id's result came back, after checking that it
    /// echoes its own input (the benchmarking node copies 16 bytes).
    fn stream(
        &mut self,
        ids: std::ops::Range<u32>,
        input: usize,
        hello: bool,
        mut at: impl FnMut(u32),
    ) -> HashMap<u32, usize> {
        let mut seen = HashMap::new();
        let (total, mut got, mut out) = (ids.len(), 0, 0);
        let mut next = ids.start;
        while got < total {
            while next < ids.end && out < 8 && (!hello || self.credit > 0) {
                at(next);
                let mut body = vec![0xAB; input];
                body[..4].copy_from_slice(&next.to_le_bytes());
                self.send(OutFrame::data(next, Bytes::from(body)).unwrap());
                self.credit = self.credit.saturating_sub(1);
                (next, out) = (next + 1, out + 1);
            }
            let f = match self.r.read_frame() {
                Ok(Some(f)) => f,
                other => panic!("connection ended waiting for results: {other:?}"),
            };
            match f.ty {
                MsgType::Credit => {
                    self.credit += Credit::parse(&f.payload).unwrap().messages as u64
                }
                MsgType::Data => {
                    let d = Data::parse(f.payload).unwrap();
                    assert_eq!(d.data.len(), 16);
                    assert_eq!(&d.data[..4], &d.id.to_le_bytes(), "result of id {}", d.id);
                    *seen.entry(d.id).or_default() += 1;
                    (got, out) = (got + 1, out - 1);
                }
                MsgType::Error => panic!("server error: {}", ErrorMsg::parse(&f.payload).unwrap()),
                other => panic!("unexpected {other:?}"),
            }
        }
        seen
    }
}

fn exactly_once(seen: &HashMap<u32, usize>, ids: std::ops::Range<u32>) {
    for id in ids {
        assert_eq!(seen.get(&id), Some(&1), "result for id {id} exactly once");
    }
}

/// Asks the server until `cond` holds; fails with the last answer.
fn wait(c: &Cluster, what: &str, cond: impl Fn(&ClusterStatus) -> bool) -> ClusterStatus {
    let mut observer = User::connect(c.users, true);
    support::poll_until(what, Duration::from_secs(30), || observer.status(), cond)
}

#[test]
fn two_users_share_one_function_across_processes() {
    let c = shared_server(&[]);
    let _nodes = node(&c, &["--count", "2"]);
    wait(&c, "two nodes", |s| s.nodes.len() == 2);
    let cfg = bench(64, 200);
    let (users, c2) = (c.users, cfg.clone());
    // The seed-format user streams only once both users are seen on the
    // function: streaming at once, it could finish and leave before.
    let (go, wait_go) = std::sync::mpsc::channel::<()>();
    let seed_user = std::thread::spawn(move || {
        let mut u = User::connect(users, false);
        assert_eq!(u.configure(&c2), 0);
        wait_go.recv().expect("the test ends before streaming");
        u.stream(0..150, 64, false, |_| {})
    });
    let mut a = User::connect(c.users, true);
    assert_eq!(a.configure(&cfg), 0);
    let s = wait(&c, "both users on one function", |s| {
        function(s, &cfg).is_some_and(|f| f.users.len() == 2)
    });
    go.send(()).unwrap();
    assert_eq!(s.sharing, "shared");
    assert_eq!(s.functions.len(), 1, "one function for both: {s:#?}");
    exactly_once(&a.stream(0..150, 64, true, |_| {}), 0..150);
    exactly_once(&seed_user.join().unwrap(), 0..150);
    // `corefarm status` shows the function, its replicas and both users.
    let out = Command::new(BIN)
        .args(["status", "--server", &c.users.to_string()])
        .output()
        .expect("run corefarm status");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let id = corefarm_server::sched::FnId::of(&cfg.encode_payload()).short();
    assert!(
        text.contains("sharing shared") && text.contains("functions: 1\n"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with(&id))
        .expect("a row for the function");
    assert!(row.split_whitespace().count() >= 9, "{row}");
}

#[test]
fn a_replica_killed_mid_stream_loses_and_duplicates_nothing() {
    let c = shared_server(&[]);
    let _a = node(&c, &[]);
    let mut victim = node(&c, &[]);
    wait(&c, "two nodes", |s| s.nodes.len() == 2);
    let cfg = bench(64, 2000);
    let mut u = User::connect(c.users, true);
    assert_eq!(u.configure(&cfg), 0);
    let seen = u.stream(0..300, 64, true, |id| {
        if id == 60 {
            // The function is on both nodes (the fair share of the only
            // function in use, or Algorithm 1 replicating for the backlog).
            wait(&c, "a second replica", |s| {
                function(s, &cfg).is_some_and(|f| f.replicas == 2)
            });
            victim.0.kill().unwrap();
        }
    });
    exactly_once(&seen, 0..300);
    let s = wait(&c, "the dead node gone", |s| s.nodes.len() == 1);
    assert_eq!(function(&s, &cfg).unwrap().replicas, 1);
}

#[test]
fn alternating_functions_keep_their_nodes_when_programming_is_slow() {
    let c = shared_server(&[]);
    // 500 ms to program a node against the 1 s horizon (100 periods).
    let _nodes = node(&c, &["--count", "2", "--reconfigure-delay-ms", "500"]);
    wait(&c, "two nodes", |s| s.nodes.len() == 2);
    let (fa, fb) = (bench(64, 2000), bench(80, 2000));
    let mut a = User::connect(c.users, true);
    let mut b = User::connect(c.users, true);
    assert_eq!(a.configure(&fa), 0);
    assert_eq!(b.configure(&fb), 0);
    for round in 0..3 {
        let ids = round * 60..round * 60 + 60;
        exactly_once(&a.stream(ids.clone(), 64, true, |_| {}), ids.clone());
        exactly_once(&b.stream(ids.clone(), 80, true, |_| {}), ids);
    }
    let s = a.status();
    let loads: u64 = s.functions.iter().map(|f| f.reconfigurations).sum();
    // Both users said hello before either configured, so each function
    // takes one spare node (its fair share); then nothing is traded.
    assert_eq!(loads, 2, "one load per node, never traded: {s:#?}");
}

//! Integration tests of the server and node managers as real processes on
//! 127.0.0.1 with OS-assigned ports: normal sessions, reconfiguration,
//! concurrent users, node failures and bad input (issue 2, items 2–4), and the
//! hostile cases of the hardening issue (impossible sizes, idle users). Tests
//! wait on the server's own account of itself (the status extension, asked
//! by an observer that takes no node), never on sleeps or log text.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::{
    hello::features, BenchmarkConfig, ClusterStatus, Configuration, ConfigurationResponse, Credit,
    Data, ErrorCode, ErrorMsg, Frame, Hello, MsgType, NodeState, OutFrame,
};

mod support;
use support::{Proc, BIN};

struct ServerProc {
    proc_: Proc,
    nodes: SocketAddr,
    users: SocketAddr,
}

fn server(extra: &[&str]) -> ServerProc {
    let wait: &[&str] = if extra.contains(&"--node-wait") {
        &[]
    } else {
        &["--node-wait", "10"]
    };
    let (proc_, nodes, users) = support::server(&[wait, extra].concat());
    ServerProc {
        proc_,
        nodes,
        users,
    }
}

fn nodes(srv: &ServerProc, count: usize) -> Proc {
    Proc(
        Command::new(BIN)
            .args([
                "node",
                "--server",
                &srv.nodes.to_string(),
                "--count",
                &count.to_string(),
            ])
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm node"),
    )
}

/// A hello user asking for no node (`nodes: 0`) and the status feature: it
/// watches the server without taking anything from the users under test.
struct Observer(User);

impl Observer {
    fn new(srv: &ServerProc) -> Observer {
        let mut u = User::connect(srv.users);
        let mut h = Hello::new("user");
        h.name = Some("observer".into());
        h.features = vec![features::ERROR.into(), features::STATUS.into()];
        h.nodes = Some(0);
        u.send(h.to_frame());
        let reply = Hello::decode(&u.recv().expect("hello reply").payload).unwrap();
        assert!(reply.has(features::STATUS), "the server offers status");
        assert_eq!(reply.nodes, Some(0), "an observer takes no node");
        Observer(u)
    }

    fn get(&mut self) -> ClusterStatus {
        self.0.send(ClusterStatus::request_frame());
        let f = self.0.recv().expect("status answer");
        assert_eq!(f.ty, MsgType::Status);
        ClusterStatus::decode(&f.payload).unwrap()
    }

    /// Asks until `cond` holds (the pause between questions is not the
    /// synchronisation: the condition is). Fails with the last answer.
    fn wait(&mut self, what: &str, cond: impl Fn(&ClusterStatus) -> bool) -> ClusterStatus {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.get();
            if cond(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; status: {s:#?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_free(&mut self, n: usize) -> ClusterStatus {
        self.wait(&format!("{n} free node(s)"), |s| {
            s.count_nodes(NodeState::Free) == n
        })
    }
}

/// A user speaking SMP directly, so tests control every byte.
struct User {
    w: TcpStream,
    r: FrameReader<TcpStream>,
    credit: u64,
}

impl User {
    fn connect(addr: SocketAddr) -> User {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        User {
            w: s.try_clone().unwrap(),
            r: FrameReader::new(s, 1 << 30),
            credit: 0,
        }
    }

    fn hello(addr: SocketAddr, nodes: Option<u32>) -> (User, Hello) {
        let mut u = User::connect(addr);
        let mut h = Hello::new("user");
        h.features = vec![features::ERROR.into(), features::CREDIT.into()];
        h.nodes = nodes;
        u.send(h.to_frame());
        let f = u.recv().expect("hello reply");
        assert_eq!(f.ty, MsgType::Hello);
        let reply = Hello::decode(&f.payload).unwrap();
        (u, reply)
    }

    fn send(&mut self, f: OutFrame) {
        write_frame(&mut self.w, f).unwrap();
    }

    /// Next frame other than a credit grant (credits are counted).
    fn recv(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.step()? {
                return Some(f);
            }
        }
    }

    /// Reads one frame: `Some(None)` if it was a credit grant (counted), `None` at the end.
    fn step(&mut self) -> Option<Option<Frame>> {
        match self.r.read_frame() {
            Ok(Some(f)) if f.ty == MsgType::Credit => {
                self.credit += Credit::parse(&f.payload).unwrap().messages as u64;
                Some(None)
            }
            Ok(Some(f)) => Some(Some(f)),
            Ok(None) | Err(_) => None,
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

    fn wait_credit(&mut self) {
        while self.credit == 0 {
            if let Some(f) = self.step().expect("credit") {
                panic!("unexpected {:?} while waiting for credit", f.ty);
            }
        }
        self.credit -= 1;
    }

    /// Reads until the connection closes; returns the first error message, if any.
    fn expect_error(&mut self) -> Option<ErrorMsg> {
        let mut first = None;
        while let Some(f) = self.recv() {
            if f.ty == MsgType::Error && first.is_none() {
                first = Some(ErrorMsg::parse(&f.payload).unwrap());
            }
        }
        first
    }
}

fn bench(input: u32, output: u32, delay_us: u32) -> Configuration {
    BenchmarkConfig {
        input_size: input,
        output_size: output,
        delay_us,
    }
    .to_configuration()
}

/// `count` inputs of `size` bytes whose first 16 bytes identify (id, input index).
fn payload(id: u32, count: usize, size: usize) -> Bytes {
    let mut v = vec![0xEEu8; count * size];
    for i in 0..count {
        v[i * size..i * size + 4].copy_from_slice(&id.to_le_bytes());
        v[i * size + 4..i * size + 8].copy_from_slice(&(i as u32).to_le_bytes());
    }
    Bytes::from(v)
}

/// Checks a result against what the benchmarking node must return.
fn check_result(d: &Data, count: usize, out_size: usize, expected_id: Option<u32>) {
    if let Some(e) = expected_id {
        assert_eq!(d.id, e);
    }
    assert_eq!(
        d.data.len(),
        count * out_size,
        "result size for id {}",
        d.id
    );
    for i in 0..count {
        let o = &d.data[i * out_size..];
        assert_eq!(
            &o[..4],
            &d.id.to_le_bytes(),
            "echoed id in output {i} of id {}",
            d.id
        );
        assert_eq!(
            &o[4..8],
            &(i as u32).to_le_bytes(),
            "echoed index in output {i} of id {}",
            d.id
        );
    }
}

/// Sends `n` messages (respecting credit) and collects every result by id.
fn stream(
    u: &mut User,
    ids: std::ops::Range<u32>,
    count: usize,
    isz: usize,
    osz: usize,
) -> HashMap<u32, usize> {
    let mut seen = HashMap::new();
    let total = ids.len();
    let mut got = 0;
    for id in ids {
        u.wait_credit_or_results(&mut seen, &mut got, count, osz);
        u.send(OutFrame::data(id, payload(id, count, isz)).unwrap());
    }
    while got < total {
        let f = u.recv().expect("result");
        u.take_result(f, &mut seen, &mut got, count, osz);
    }
    seen
}

impl User {
    fn take_result(
        &mut self,
        f: Frame,
        seen: &mut HashMap<u32, usize>,
        got: &mut usize,
        count: usize,
        osz: usize,
    ) {
        match f.ty {
            MsgType::Data => {
                let d = Data::parse(f.payload).unwrap();
                check_result(&d, count, osz, None);
                *seen.entry(d.id).or_default() += 1;
                *got += 1;
            }
            MsgType::Error => panic!("server error: {}", ErrorMsg::parse(&f.payload).unwrap()),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn wait_credit_or_results(
        &mut self,
        seen: &mut HashMap<u32, usize>,
        got: &mut usize,
        count: usize,
        osz: usize,
    ) {
        while self.credit == 0 {
            if let Some(f) = self.step().expect("credit or result") {
                self.take_result(f, seen, got, count, osz);
            }
        }
        self.credit -= 1;
    }
}

fn assert_exactly_once(seen: &HashMap<u32, usize>, ids: std::ops::Range<u32>) {
    for id in ids {
        assert_eq!(
            seen.get(&id),
            Some(&1),
            "result for id {id} must arrive exactly once"
        );
    }
}

#[test]
fn user_and_nodes_across_a_reconfiguration() {
    let srv = server(&[]);
    let _n = nodes(&srv, 3);
    let (mut u, reply) = User::hello(srv.users, Some(3));
    assert_eq!(reply.nodes, Some(3));
    assert!(reply.has(features::CREDIT));
    assert_eq!(u.configure(&bench(64, 32, 0)), 0);
    let seen = stream(&mut u, 0..300, 2, 64, 32);
    assert_exactly_once(&seen, 0..300);
    // New configuration with different sizes: old results all arrived, new ones use the new sizes.
    assert_eq!(u.configure(&bench(16, 48, 10)), 0);
    let seen = stream(&mut u, 1000..1100, 3, 16, 48);
    assert_exactly_once(&seen, 1000..1100);
}

#[test]
fn seed_format_user_without_hello() {
    let srv = server(&[]);
    let _n = nodes(&srv, 2);
    let mut u = User::connect(srv.users);
    assert_eq!(u.configure(&bench(32, 32, 0)), 0);
    // No credit without hello: the user just writes; TCP paces it.
    let mut w = u.w.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for id in 0..200u32 {
            write_frame(&mut w, OutFrame::data(id, payload(id, 1, 32)).unwrap()).unwrap();
        }
    });
    let mut seen = HashMap::new();
    for _ in 0..200 {
        let f = u.recv().unwrap();
        assert_eq!(
            f.ty,
            MsgType::Data,
            "a seed user only ever receives data after configuring"
        );
        let d = Data::parse(f.payload).unwrap();
        check_result(&d, 1, 32, None);
        *seen.entry(d.id).or_insert(0) += 1;
    }
    sender.join().unwrap();
    assert_exactly_once(&seen, 0..200);
}

#[test]
fn two_users_at_once_share_the_pool() {
    let srv = server(&[]);
    let _n = nodes(&srv, 4);
    let (mut a, ra) = User::hello(srv.users, Some(2));
    let (mut b, rb) = User::hello(srv.users, Some(2));
    assert_eq!((ra.nodes, rb.nodes), (Some(2), Some(2)));
    assert_eq!(a.configure(&bench(32, 16, 50)), 0);
    assert_eq!(b.configure(&bench(48, 64, 0)), 0);
    let ta = std::thread::spawn(move || stream(&mut a, 0..200, 1, 32, 16));
    let tb = std::thread::spawn(move || stream(&mut b, 0..400, 2, 48, 64));
    assert_exactly_once(&ta.join().unwrap(), 0..200);
    assert_exactly_once(&tb.join().unwrap(), 0..400);
}

#[test]
fn nodes_return_to_the_pool_when_a_user_leaves() {
    let srv = server(&[]);
    let _n = nodes(&srv, 2);
    Observer::new(&srv).wait_free(2);
    {
        let (mut a, ra) = User::hello(srv.users, Some(2));
        assert_eq!(ra.nodes, Some(2));
        assert_eq!(a.configure(&bench(16, 16, 0)), 0);
        assert_exactly_once(&stream(&mut a, 0..10, 1, 16, 16), 0..10);
    }
    // The departed user's nodes go back to the pool; the server says when.
    Observer::new(&srv).wait_free(2);
    let (mut b, rb) = User::hello(srv.users, None);
    assert_eq!(
        rb.nodes,
        Some(2),
        "both nodes are free again after the first user left"
    );
    assert_eq!(b.configure(&bench(16, 16, 0)), 0);
    assert_exactly_once(&stream(&mut b, 0..10, 1, 16, 16), 0..10);
}

#[test]
fn node_killed_mid_stream_every_result_arrives_once() {
    let srv = server(&[]);
    let _a = nodes(&srv, 1);
    let _b = nodes(&srv, 1);
    let mut victim = nodes(&srv, 1);
    let (mut u, reply) = User::hello(srv.users, Some(3));
    assert_eq!(reply.nodes, Some(3));
    assert_eq!(u.configure(&bench(64, 64, 2000)), 0);
    let mut seen = HashMap::new();
    let mut got = 0;
    let total = 300u32;
    for id in 0..total {
        if id == 60 {
            victim.0.kill().unwrap();
        }
        u.wait_credit_or_results(&mut seen, &mut got, 1, 64);
        u.send(OutFrame::data(id, payload(id, 1, 64)).unwrap());
    }
    while got < total as usize {
        let f = u.recv().expect("result after node loss");
        u.take_result(f, &mut seen, &mut got, 1, 64);
    }
    assert_exactly_once(&seen, 0..total);
}

/// A node written against the byte format that misbehaves in a chosen way
/// after configuring. Runs in a thread; returns when the server closes it.
fn fake_node(addr: SocketAddr, behaviour: &'static str) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let s = TcpStream::connect(addr).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = FrameReader::new(s, 1 << 30);
        while let Ok(Some(f)) = r.read_frame() {
            match f.ty {
                MsgType::Configuration if behaviour == "silent" => {}
                MsgType::Configuration => {
                    write_frame(&mut w, ConfigurationResponse { status: 0 }.to_frame()).unwrap();
                }
                MsgType::Data => {
                    let d = Data::parse(f.payload).unwrap();
                    let r = match behaviour {
                        "short" => write_frame(
                            &mut w,
                            OutFrame::data(d.id, Bytes::from(vec![0u8; 3])).unwrap(),
                        ),
                        "garbage" => w.write_all(&[0x77; 64]),
                        "wrong-id" => write_frame(
                            &mut w,
                            OutFrame::data(d.id ^ 0x5555, Bytes::from(vec![0u8; 64])).unwrap(),
                        ),
                        _ => Ok(()),
                    };
                    if r.is_err() {
                        return;
                    }
                }
                _ => {}
            }
        }
    })
}

#[test]
fn misbehaving_nodes_are_dropped_and_their_work_redispatched() {
    for behaviour in ["short", "garbage", "wrong-id"] {
        let srv = server(&[]);
        let bad = fake_node(srv.nodes, behaviour);
        let _good = nodes(&srv, 1);
        let (mut u, reply) = User::hello(srv.users, Some(2));
        assert_eq!(reply.nodes, Some(2), "{behaviour}");
        assert_eq!(u.configure(&bench(64, 64, 0)), 0);
        let seen = stream(&mut u, 0..100, 1, 64, 64);
        assert_exactly_once(&seen, 0..100);
        bad.join().unwrap();
    }
}

#[test]
fn node_without_configuration_response_times_out_and_is_dropped() {
    let srv = server(&["--config-timeout", "1"]);
    let silent = fake_node(srv.nodes, "silent");
    let _good = nodes(&srv, 1);
    let (mut u, reply) = User::hello(srv.users, Some(2));
    assert_eq!(reply.nodes, Some(2));
    let t = Instant::now();
    assert_eq!(
        u.configure(&bench(16, 16, 0)),
        0,
        "one node configured is enough"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "the server waited for the silent node"
    );
    assert_exactly_once(&stream(&mut u, 0..20, 1, 16, 16), 0..20);
    drop(u);
    silent.join().unwrap();
}

#[test]
fn no_node_left_gives_the_user_an_error_not_a_hang() {
    let srv = server(&[]);
    let bad = fake_node(srv.nodes, "short");
    let (mut u, reply) = User::hello(srv.users, Some(1));
    assert_eq!(reply.nodes, Some(1));
    assert_eq!(u.configure(&bench(16, 16, 0)), 0);
    u.wait_credit();
    u.send(OutFrame::data(5, payload(5, 1, 16)).unwrap());
    let e = u.expect_error().expect("an error message before the close");
    assert_eq!(e.code(), Some(ErrorCode::NoNodes), "{e}");
    assert_eq!(e.id, 5, "the pending input is named");
    bad.join().unwrap();
}

#[test]
fn configuration_with_no_free_node_is_refused() {
    let srv = server(&["--node-wait", "0.2"]);
    let (mut u, _) = User::hello(srv.users, None);
    assert_ne!(u.configure(&bench(16, 16, 0)), 0);
    // Seed user: same answer, as a negative response.
    let mut legacy = User::connect(srv.users);
    assert_ne!(legacy.configure(&bench(16, 16, 0)), 0);
}

/// Bad input from a user: a clear error and a closed connection; the server
/// keeps serving everyone else.
#[test]
fn bad_user_input_is_refused_with_a_reason() {
    let srv = server(&["--max-message", "4096"]);
    let _n = nodes(&srv, 1);
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        (
            "unknown type",
            vec![9, 0, 0, 0, 0, 0, 0, 0],
            ErrorCode::Malformed,
        ),
        (
            "oversize",
            {
                let mut v = vec![3, 0, 0, 0];
                v.extend_from_slice(&(1u32 << 31).to_le_bytes());
                v
            },
            ErrorCode::TooLarge,
        ),
        (
            "data before configuration",
            OutFrame::data(1, Bytes::from_static(&[0; 16]))
                .unwrap()
                .to_vec(),
            ErrorCode::NotConfigured,
        ),
        (
            "core table longer than payload",
            {
                let mut p = Vec::new();
                for x in [16u32, 16, 5, 0] {
                    p.extend_from_slice(&x.to_le_bytes());
                }
                OutFrame::new(MsgType::Configuration, Bytes::from(p))
                    .unwrap()
                    .to_vec()
            },
            ErrorCode::Malformed,
        ),
    ];
    for (name, bytes, code) in cases {
        let (mut u, _) = User::hello(srv.users, Some(1));
        u.w.write_all(&bytes).unwrap();
        let e = u
            .expect_error()
            .unwrap_or_else(|| panic!("{name}: no error message"));
        assert_eq!(e.code(), Some(code), "{name}: {e}");
    }
    // Data not a whole number of inputs, after a good configuration.
    let (mut u, _) = User::hello(srv.users, Some(1));
    assert_eq!(u.configure(&bench(16, 16, 0)), 0);
    u.wait_credit();
    u.send(OutFrame::data(7, Bytes::from(vec![0u8; 17])).unwrap());
    let e = u.expect_error().unwrap();
    assert_eq!((e.code(), e.id), (Some(ErrorCode::BadDataSize), 7), "{e}");
    // A truncated message followed by a close: the server just drops that session.
    let mut t = TcpStream::connect(srv.users).unwrap();
    t.write_all(&[3, 0, 0, 0, 100, 0, 0, 0, 1, 2, 3]).unwrap();
    drop(t);
    // Everyone else still gets served.
    let (mut ok, _) = User::hello(srv.users, Some(1));
    assert_eq!(ok.configure(&bench(16, 16, 0)), 0);
    assert_exactly_once(&stream(&mut ok, 0..50, 1, 16, 16), 0..50);
}

#[test]
fn seed_user_with_invalid_first_message_gets_a_negative_response() {
    let srv = server(&[]);
    let _n = nodes(&srv, 1);
    let mut u = User::connect(srv.users);
    u.send(OutFrame::data(1, Bytes::from_static(&[0; 16])).unwrap());
    let f = u.recv().expect("a response before the close");
    assert_eq!(f.ty, MsgType::ConfigurationResponse);
    assert_ne!(ConfigurationResponse::parse(&f.payload).unwrap().status, 0);
    assert!(u.recv().is_none(), "connection closed");
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn user_that_stops_reading_gets_everything_intact_with_bounded_memory() {
    let srv = server(&[]);
    let _n = nodes(&srv, 4);
    // A seed-format user (no credit) that writes 64 MiB of inputs while not
    // reading: back-pressure must hold the server's memory down.
    const SIZE: usize = 64 * 1024;
    let total = 1024u32;
    let mut u = User::connect(srv.users);
    assert_eq!(u.configure(&bench(SIZE as u32, SIZE as u32, 0)), 0);
    let rss_before = rss_kib(srv.proc_.0.id());
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut w = u.w.try_clone().unwrap();
    let progress = written.clone();
    let sender = std::thread::spawn(move || {
        for id in 0..total {
            if write_frame(&mut w, OutFrame::data(id, payload(id, 1, SIZE)).unwrap()).is_err() {
                return false;
            }
            progress.store(id + 1, std::sync::atomic::Ordering::Release);
        }
        true
    });
    // The signal: the writer is blocked because nothing downstream takes
    // more. Its count stops moving well before the stream is done (64 MiB do
    // not fit the socket buffers on the way).
    let mut last = (0, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = written.load(std::sync::atomic::Ordering::Acquire);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_millis(500) {
            break;
        }
        assert!(Instant::now() < deadline, "the writer never stalled");
        assert!(now < total, "64 MiB went in while the user read nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stalled_at = last.0 as u64 * SIZE as u64;
    let grown = rss_kib(srv.proc_.0.id()).saturating_sub(rss_before) * 1024;
    let mut seen = HashMap::new();
    for _ in 0..total {
        let f = u.recv().expect("result");
        let d = Data::parse(f.payload).unwrap();
        check_result(&d, 1, SIZE, None);
        *seen.entry(d.id).or_insert(0) += 1;
    }
    assert!(sender.join().unwrap());
    assert_exactly_once(&seen, 0..total);
    // Relative, not absolute: what the server holds is bounded by its
    // windows (messages in flight per node, kept for re-dispatch) and its
    // allocator's granularity, not by the stream: a quarter of it at most.
    let stream = total as u64 * SIZE as u64;
    assert!(
        grown < stream / 4,
        "server memory grew by {grown} B while the user pushed a {stream} B stream \
         ({stalled_at} B written when it stalled) and read nothing"
    );
}

#[test]
fn node_port_rejects_garbage_and_keeps_serving() {
    let srv = server(&[]);
    let mut g = TcpStream::connect(srv.nodes).unwrap();
    g.write_all(&[0xFF; 32]).unwrap();
    let mut buf = [0u8; 8];
    g.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(g.read(&mut buf).unwrap_or(0), 0, "connection closed");
    let _n = nodes(&srv, 1);
    let (mut u, reply) = User::hello(srv.users, Some(1));
    assert_eq!(reply.nodes, Some(1));
    assert_eq!(u.configure(&bench(16, 16, 0)), 0);
    assert_exactly_once(&stream(&mut u, 0..10, 1, 16, 16), 0..10);
}

#[test]
fn data_beyond_the_granted_credit_is_refused() {
    // One credit for the user, room for four messages on the node: the
    // second message arrives while the first is still being processed.
    let srv = server(&["--user-window", "1"]);
    let _n = nodes(&srv, 1);
    let (mut u, _) = User::hello(srv.users, Some(1));
    assert_eq!(u.configure(&bench(16, 16, 500_000)), 0);
    u.wait_credit();
    u.send(OutFrame::data(0, payload(0, 1, 16)).unwrap());
    u.send(OutFrame::data(1, payload(1, 1, 16)).unwrap());
    let e = u.expect_error().expect("an error before the close");
    assert_eq!(e.code(), Some(ErrorCode::UnexpectedMessage), "{e}");
    assert!(e.reason.contains("credit"), "{e}");
}

#[test]
fn a_node_joining_mid_session_is_configured_and_takes_over() {
    let srv = server(&[]);
    let mut first = nodes(&srv, 1);
    Observer::new(&srv).wait_free(1);
    let (mut u, reply) = User::hello(srv.users, None);
    assert_eq!(reply.nodes, Some(1));
    assert_eq!(u.configure(&bench(32, 32, 100)), 0);
    assert_exactly_once(&stream(&mut u, 0..20, 1, 32, 32), 0..20);
    // A second node connects while the user is routing: the server configures
    // it with the user's configuration and adds it to the rotation.
    let _second = nodes(&srv, 1);
    Observer::new(&srv).wait("the newcomer configured", |s| {
        s.count_nodes(NodeState::Ready) == 2
    });
    // With the first node gone, only the newcomer can produce these results.
    first.0.kill().unwrap();
    let _ = first.0.wait();
    assert_exactly_once(&stream(&mut u, 100..160, 2, 32, 32), 100..160);
}

#[test]
fn a_tight_memory_guard_slows_the_node_but_loses_nothing() {
    let srv = server(&[]);
    // 100 KB of budget for 64 KiB inputs + 64 KiB outputs: at most one job at
    // a time fits (an oversize job takes the whole budget and runs alone).
    let _n = Proc(
        Command::new(BIN)
            .args([
                "node",
                "--server",
                &srv.nodes.to_string(),
                "--memory-limit",
                "100000",
            ])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (mut u, _) = User::hello(srv.users, Some(1));
    assert_eq!(u.configure(&bench(64 * 1024, 64 * 1024, 0)), 0);
    assert_exactly_once(&stream(&mut u, 0..200, 1, 64 * 1024, 64 * 1024), 0..200);
}

/// A configuration whose results cannot travel (a benchmarking output of
/// 0xFFFFFFF0 bytes) is refused with a reason before any node sees it; the
/// session stays usable and every node serves the next user normally.
#[test]
fn impossible_sizes_are_refused_and_every_node_serves_the_next_user() {
    let srv = server(&[]);
    let _n = nodes(&srv, 2);
    let mut obs = Observer::new(&srv);
    obs.wait_free(2);
    {
        let (mut a, reply) = User::hello(srv.users, None);
        assert_eq!(reply.nodes, Some(2));
        a.send(bench(32, 0xFFFF_FFF0, 0).to_frame().unwrap());
        let e = a.recv().expect("an error with the reason");
        assert_eq!(e.ty, MsgType::Error);
        let e = ErrorMsg::parse(&e.payload).unwrap();
        assert_eq!(e.code(), Some(ErrorCode::TooLarge), "{e}");
        assert!(e.reason.contains("output size"), "{e}");
        let r = a.recv().expect("a negative response");
        assert_eq!(r.ty, MsgType::ConfigurationResponse);
        assert_ne!(ConfigurationResponse::parse(&r.payload).unwrap().status, 0);
        // A core configuration without output is refused too.
        let zero_out = Configuration {
            input_size: 16,
            output_size: 0,
            cores: corefarm_smp::default_core_table(1, 16, 16).unwrap(),
            bitstream: Bytes::from_static(b"not a bitstream"),
        };
        assert_ne!(a.configure(&zero_out), 0);
        // Neither reached a node: both are still connected and usable.
        let s = obs.get();
        assert_eq!(s.nodes.len(), 2, "no node was dropped: {s:#?}");
        // The same connection works with a sane configuration.
        assert_eq!(a.configure(&bench(16, 16, 0)), 0);
        assert_exactly_once(&stream(&mut a, 0..20, 1, 16, 16), 0..20);
    }
    obs.wait_free(2);
    let (mut b, reply) = User::hello(srv.users, None);
    assert_eq!(reply.nodes, Some(2));
    assert_eq!(b.configure(&bench(16, 16, 200)), 0);
    assert_exactly_once(&stream(&mut b, 0..200, 1, 16, 16), 0..200);
    let s = obs.get();
    assert_eq!(s.nodes.len(), 2);
    assert!(
        s.nodes.iter().all(|n| n.results > 0),
        "every node served the second user: {s:#?}"
    );
}

/// A user that configures and then goes silent gives its nodes back once
/// another user waits for them (--user-idle-timeout).
#[test]
fn an_idle_user_gives_its_nodes_to_a_waiting_one() {
    let srv = server(&["--user-idle-timeout", "1", "--node-wait", "30"]);
    let _n = nodes(&srv, 2);
    Observer::new(&srv).wait_free(2);
    let (mut idle, reply) = User::hello(srv.users, None);
    assert_eq!(reply.nodes, Some(2));
    assert_eq!(idle.configure(&bench(16, 16, 0)), 0);
    // The second user's hello waits (--node-wait) until the idle one is ended.
    let (mut b, reply) = User::hello(srv.users, None);
    // It is served as soon as the first node comes back; the other follows.
    assert!(
        reply.nodes.is_some_and(|n| n >= 1),
        "nodes came back from the idle user: {reply:?}"
    );
    let e = idle.expect_error().expect("the idle user is told why");
    assert_eq!(e.code(), Some(ErrorCode::Timeout), "{e}");
    assert_eq!(b.configure(&bench(16, 16, 0)), 0);
    assert_exactly_once(&stream(&mut b, 0..20, 1, 16, 16), 0..20);
}

/// The node checks sizes against its own limit too: a configuration the
/// server could carry but the node cannot is refused by the node with the
/// reason, and the user's session stays usable.
#[test]
fn a_node_refuses_sizes_beyond_its_own_limit() {
    let srv = server(&[]);
    let _n = Proc(
        Command::new(BIN)
            .args(["node", "--server", &srv.nodes.to_string()])
            .args(["--name", "small", "--node-max-message", "65536"])
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm node"),
    );
    Observer::new(&srv).wait("the named node", |s| {
        s.nodes.iter().any(|n| n.name.as_deref() == Some("small"))
    });
    let (mut u, reply) = User::hello(srv.users, None);
    assert_eq!(reply.nodes, Some(1));
    u.send(bench(16, 100_000, 0).to_frame().unwrap());
    let mut reasons = Vec::new();
    let status = loop {
        let f = u.recv().expect("a response");
        match f.ty {
            MsgType::Error => reasons.push(ErrorMsg::parse(&f.payload).unwrap().reason),
            MsgType::ConfigurationResponse => {
                break ConfigurationResponse::parse(&f.payload).unwrap().status
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_ne!(status, 0);
    let all = reasons.join("; ");
    assert!(
        all.contains("small") && all.contains("output size"),
        "{all}"
    );
    assert_eq!(u.configure(&bench(16, 16, 0)), 0);
    assert_exactly_once(&stream(&mut u, 0..10, 1, 16, 16), 0..10);
}

/// Issue 11: a server with chunks on its node link (1 KiB) serving a node
/// that negotiates them and a seed-format node (`--no-hello`) at once:
/// messages and results of 4 KiB and 8 KiB travel as chunks to and from the
/// first, whole to and from the second, and every result is correct, once.
#[test]
fn chunking_and_seed_format_nodes_side_by_side() {
    let srv = server(&["--node-chunk-size", "1024"]);
    let spawn = |extra: &[&str]| {
        Proc(
            Command::new(BIN)
                .args(["node", "--server", &srv.nodes.to_string()])
                .args(extra)
                .stderr(Stdio::null())
                .spawn()
                .expect("start corefarm node"),
        )
    };
    let _chunky = spawn(&["--name", "chunky"]);
    let _seed = spawn(&["--no-hello"]);
    let mut obs = Observer::new(&srv);
    obs.wait_free(2);
    let (mut u, reply) = User::hello(srv.users, Some(2));
    assert_eq!(reply.nodes, Some(2));
    assert_eq!(u.configure(&bench(1024, 2048, 200)), 0);
    let seen = stream(&mut u, 0..200, 4, 1024, 2048);
    assert_exactly_once(&seen, 0..200);
    let s = obs.get();
    assert_eq!(s.nodes.len(), 2);
    for n in &s.nodes {
        assert!(n.results > 0, "node {:?} served nothing: {s:?}", n.name);
    }
}

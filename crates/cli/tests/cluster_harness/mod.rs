//! The cluster tests' harness: a server and node managers as real
//! processes, an observer that asks the server what it is doing, and a user
//! speaking SMP byte by byte.
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::blocking::{write_frame, FrameReader};
use corefarm_smp::{
    hello::features, BenchmarkConfig, ClusterStatus, Configuration, ConfigurationResponse, Credit,
    Data, ErrorMsg, Frame, Hello, MsgType, NodeState, OutFrame,
};

use crate::support::{self, Proc, BIN};

pub struct ServerProc {
    pub proc_: Proc,
    pub nodes: SocketAddr,
    pub users: SocketAddr,
}

pub fn server(extra: &[&str]) -> ServerProc {
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

pub fn nodes(srv: &ServerProc, count: usize) -> Proc {
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
pub struct Observer(pub User);

impl Observer {
    pub fn new(srv: &ServerProc) -> Observer {
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

    pub fn get(&mut self) -> ClusterStatus {
        self.0.send(ClusterStatus::request_frame());
        let f = self.0.recv().expect("status answer");
        assert_eq!(f.ty, MsgType::Status);
        ClusterStatus::decode(&f.payload).unwrap()
    }

    /// Asks until `cond` holds (the pause between questions is not the
    /// synchronisation: the condition is). Fails with the last answer.
    pub fn wait(&mut self, what: &str, cond: impl Fn(&ClusterStatus) -> bool) -> ClusterStatus {
        support::poll_until(what, Duration::from_secs(30), || self.get(), cond)
    }

    pub fn wait_free(&mut self, n: usize) -> ClusterStatus {
        self.wait(&format!("{n} free node(s)"), |s| {
            s.count_nodes(NodeState::Free) == n
        })
    }
}

/// A user speaking SMP directly, so tests control every byte.
pub struct User {
    pub w: TcpStream,
    pub r: FrameReader<TcpStream>,
    pub credit: u64,
}

impl User {
    pub fn connect(addr: SocketAddr) -> User {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        User {
            w: s.try_clone().unwrap(),
            r: FrameReader::new(s, 1 << 30),
            credit: 0,
        }
    }

    pub fn hello(addr: SocketAddr, nodes: Option<u32>) -> (User, Hello) {
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

    pub fn send(&mut self, f: OutFrame) {
        write_frame(&mut self.w, f).unwrap();
    }

    /// Next frame other than a credit grant (credits are counted).
    pub fn recv(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.step()? {
                return Some(f);
            }
        }
    }

    /// Reads one frame: `Some(None)` if it was a credit grant (counted), `None` at the end.
    pub fn step(&mut self) -> Option<Option<Frame>> {
        match self.r.read_frame() {
            Ok(Some(f)) if f.ty == MsgType::Credit => {
                self.credit += Credit::parse(&f.payload).unwrap().messages as u64;
                Some(None)
            }
            Ok(Some(f)) => Some(Some(f)),
            Ok(None) | Err(_) => None,
        }
    }

    pub fn configure(&mut self, cfg: &Configuration) -> u8 {
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

    pub fn wait_credit(&mut self) {
        while self.credit == 0 {
            if let Some(f) = self.step().expect("credit") {
                panic!("unexpected {:?} while waiting for credit", f.ty);
            }
        }
        self.credit -= 1;
    }

    /// Reads until the connection closes; returns the first error message, if any.
    pub fn expect_error(&mut self) -> Option<ErrorMsg> {
        let mut first = None;
        while let Some(f) = self.recv() {
            if f.ty == MsgType::Error && first.is_none() {
                first = Some(ErrorMsg::parse(&f.payload).unwrap());
            }
        }
        first
    }
}

pub fn bench(input: u32, output: u32, delay_us: u32) -> Configuration {
    BenchmarkConfig {
        input_size: input,
        output_size: output,
        delay_us,
    }
    .to_configuration()
}

/// `count` inputs of `size` bytes whose first 16 bytes identify (id, input index).
pub fn payload(id: u32, count: usize, size: usize) -> Bytes {
    let mut v = vec![0xEEu8; count * size];
    for i in 0..count {
        v[i * size..i * size + 4].copy_from_slice(&id.to_le_bytes());
        v[i * size + 4..i * size + 8].copy_from_slice(&(i as u32).to_le_bytes());
    }
    Bytes::from(v)
}

/// Checks a result against what the benchmarking node must return.
pub fn check_result(d: &Data, count: usize, out_size: usize, expected_id: Option<u32>) {
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
pub fn stream(
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
    pub fn take_result(
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

    pub fn wait_credit_or_results(
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

pub fn assert_exactly_once(seen: &HashMap<u32, usize>, ids: std::ops::Range<u32>) {
    for id in ids {
        assert_eq!(
            seen.get(&id),
            Some(&1),
            "result for id {id} must arrive exactly once"
        );
    }
}

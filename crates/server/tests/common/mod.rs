//! In-process test harness: a `Server` on 127.0.0.1 port 0 in a tokio task,
//! scripted fake nodes and fake users speaking SMP over real TCP. Waiting is
//! always on a signal — a frame, a closed connection, a status condition —
//! never on a fixed sleep; `LIMIT` only turns a hang into a failure.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use corefarm_server::{Server, ServerOptions, StatusHandle};
use corefarm_smp::auth::{AuthChallenge, AuthResponse, Secret};
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::{
    hello::features, BenchmarkConfig, ClusterStatus, Configuration, ConfigurationResponse, Credit,
    Data, ErrorMsg, Frame, Hello, MsgType, Notification, OutFrame,
};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Longest any single wait may take before the test fails.
pub const LIMIT: Duration = Duration::from_secs(15);

/// Server options for tests: loopback, port 0, short node wait.
pub fn opts() -> ServerOptions {
    ServerOptions {
        nodes_listen: "127.0.0.1:0".into(),
        users_listen: "127.0.0.1:0".into(),
        node_wait: Duration::from_millis(200),
        ..ServerOptions::default()
    }
}

/// A running server; stopped when dropped.
pub struct TestServer {
    pub users: SocketAddr,
    pub nodes: SocketAddr,
    pub status: StatusHandle,
    stop: CancellationToken,
    _task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn start(opts: ServerOptions) -> TestServer {
    let server = Server::bind(opts).await.expect("bind on loopback");
    let stop = CancellationToken::new();
    TestServer {
        users: server.users_addr(),
        nodes: server.nodes_addr(),
        status: server.status_handle(),
        stop: stop.clone(),
        _task: tokio::spawn(server.run(stop)),
    }
}

impl TestServer {
    /// Polls the status until `cond` holds (the poll interval is not a
    /// synchronisation: the condition is). Fails with the last status.
    pub async fn wait_status(
        &self,
        what: &str,
        cond: impl Fn(&ClusterStatus) -> bool,
    ) -> ClusterStatus {
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let s = self.status.get();
            if cond(&s) {
                return s;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("timed out waiting for {what}; status: {s:#?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn wait_free_nodes(&self, n: usize) -> ClusterStatus {
        self.wait_status(&format!("{n} free node(s)"), |s| {
            s.count_nodes(corefarm_smp::NodeState::Free) == n
        })
        .await
    }
}

pub fn bench(input: u32, output: u32) -> Configuration {
    BenchmarkConfig {
        input_size: input,
        output_size: output,
        delay_us: 0,
    }
    .to_configuration()
}

// ---------------------------------------------------------------- fake nodes

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers configurations with success and every data message with
    /// `count × output_size` bytes whose first byte is the node's tag.
    Echo,
    /// Like `Echo` for `n` data messages, then sends bytes that are no SMP header.
    GarbageAfter(usize),
    /// Answers the first data message with an id it never received.
    UnknownId,
    /// Configures, then holds data until `FakeNode::release` is called.
    Hold,
    /// Sends a hello, then 3 bytes of a header, then nothing.
    TrickleHeader,
    /// Like `Echo`, after [`NOTES`] handler notifications (set 1) for each
    /// data message, when the server agreed `spin-notify`.
    Notify,
    /// Sends a notification for an id it never received (then echoes).
    NotifyUnknownId,
    /// Answers every data message with a per-input error of this code.
    FailWith(u32),
}

/// Handler set index of the `Notify` node's notifications.
pub const NOTE_SET: u8 = 1;

/// The notifications a `Notify` node sends for a data message whose data
/// starts with `first`.
pub fn notes(first: u8) -> [Bytes; 2] {
    [
        Bytes::from(format!("head:{first}")),
        Bytes::from(vec![first; 4096]),
    ]
}

pub struct FakeNode {
    /// Every configuration the node received, in order.
    pub configs: mpsc::UnboundedReceiver<Configuration>,
    release: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl FakeNode {
    /// Connects a node with a hello naming it `name`; `tag` marks its results.
    pub async fn spawn(addr: SocketAddr, name: &str, tag: u8, behaviour: Behaviour) -> FakeNode {
        FakeNode::spawn_full(addr, name, tag, behaviour, &[], None).await
    }

    /// [`FakeNode::spawn`] announcing `targets` in its hello.
    pub async fn spawn_with_targets(
        addr: SocketAddr,
        name: &str,
        tag: u8,
        behaviour: Behaviour,
        targets: &[&str],
    ) -> FakeNode {
        FakeNode::spawn_full(addr, name, tag, behaviour, targets, None).await
    }

    /// Like [`FakeNode::spawn`], answering the server's challenge with
    /// `secret` (a server with an auth file).
    pub async fn spawn_with(
        addr: SocketAddr,
        name: &str,
        tag: u8,
        behaviour: Behaviour,
        secret: Option<Secret>,
    ) -> FakeNode {
        FakeNode::spawn_full(addr, name, tag, behaviour, &[], secret).await
    }

    async fn spawn_full(
        addr: SocketAddr,
        name: &str,
        tag: u8,
        behaviour: Behaviour,
        targets: &[&str],
        secret: Option<Secret>,
    ) -> FakeNode {
        let s = TcpStream::connect(addr).await.expect("connect node port");
        let (rd, mut w) = s.into_split();
        let mut hello = Hello::new("node");
        hello.name = Some(name.into());
        hello.targets = targets.iter().map(|t| t.to_string()).collect();
        hello.features = vec![features::ERROR.into()];
        if matches!(behaviour, Behaviour::Notify | Behaviour::NotifyUnknownId) {
            hello.features.push(features::SPIN_NOTIFY.into());
        }
        if secret.is_some() {
            hello.features.push(features::AUTH.into());
        }
        let auth = secret.map(|s| (s, hello.encode()));
        write_frame(&mut w, hello.to_frame()).await.unwrap();
        let (cfg_tx, configs) = mpsc::unbounded_channel();
        let (release, released) = oneshot::channel();
        let task = tokio::spawn(node_loop(rd, w, tag, behaviour, cfg_tx, released, auth));
        FakeNode {
            configs,
            release: Some(release),
            task,
        }
    }

    /// `Hold`: answer the data held so far, and everything after.
    pub fn release(&mut self) {
        if let Some(r) = self.release.take() {
            let _ = r.send(());
        }
    }

    /// Waits until the server closes the node's connection.
    pub async fn closed(self) {
        tokio::time::timeout(LIMIT, self.task)
            .await
            .expect("the server should have closed the node")
            .unwrap();
    }
}

async fn node_loop(
    rd: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    tag: u8,
    behaviour: Behaviour,
    cfg_tx: mpsc::UnboundedSender<Configuration>,
    mut released: oneshot::Receiver<()>,
    auth: Option<(Secret, Vec<u8>)>,
) {
    let mut r = FrameReader::new(rd, 1 << 30);
    if behaviour == Behaviour::TrickleHeader {
        w.write_all(&[3, 0, 0]).await.unwrap();
    }
    let mut output = 0u32;
    let mut answered = 0usize;
    let mut held: Vec<Data> = Vec::new();
    let mut holding = behaviour == Behaviour::Hold;
    let mut notify = false;
    loop {
        let f = tokio::select! {
            f = r.read_frame() => f,
            _ = &mut released, if holding => {
                holding = false;
                for d in std::mem::take(&mut held) {
                    let _ = write_frame(&mut w, result(tag, output, &d)).await;
                }
                continue;
            }
        };
        let Ok(Some(f)) = f else { return };
        match f.ty {
            MsgType::AuthChallenge => {
                let (secret, hello) = auth.as_ref().expect("challenged without a secret");
                let ch = AuthChallenge::parse(&f.payload).unwrap();
                let a = AuthResponse::answer(secret, &ch, "node", hello);
                let _ = write_frame(&mut w, a.to_frame()).await;
            }
            MsgType::Hello => {
                notify = Hello::decode(&f.payload)
                    .unwrap()
                    .has(features::SPIN_NOTIFY);
            }
            MsgType::Configuration => {
                let c = Configuration::parse(f.payload).unwrap();
                output = c.output_size;
                let _ = cfg_tx.send(c);
                let ok = ConfigurationResponse {
                    status: ConfigurationResponse::OK,
                };
                let _ = write_frame(&mut w, ok.to_frame()).await;
            }
            MsgType::Data => {
                let d = Data::parse(f.payload).unwrap();
                let reply = match behaviour {
                    Behaviour::GarbageAfter(n) if answered >= n => {
                        let _ = w.write_all(&[0xEE; 16]).await;
                        continue;
                    }
                    Behaviour::UnknownId => {
                        let bogus = Data {
                            id: d.id.wrapping_add(1000),
                            data: d.data.clone(),
                        };
                        result(tag, output, &bogus)
                    }
                    _ if holding => {
                        held.push(d);
                        continue;
                    }
                    Behaviour::FailWith(code) => ErrorMsg {
                        id: d.id,
                        code,
                        reason: format!("input {} refused", d.id),
                    }
                    .to_frame(),
                    Behaviour::Notify if notify => {
                        for data in notes(d.data[0]) {
                            let n = Notification {
                                id: d.id,
                                set: NOTE_SET,
                                data,
                            };
                            let _ = write_frame(&mut w, n.to_frame().unwrap()).await;
                        }
                        result(tag, output, &d)
                    }
                    Behaviour::NotifyUnknownId if notify => {
                        let n = Notification {
                            id: d.id.wrapping_add(1000),
                            set: 0,
                            data: Bytes::from_static(b"who?"),
                        };
                        let _ = write_frame(&mut w, n.to_frame().unwrap()).await;
                        result(tag, output, &d)
                    }
                    _ => result(tag, output, &d),
                };
                answered += 1;
                if write_frame(&mut w, reply).await.is_err() {
                    return;
                }
            }
            _ => {}
        }
    }
}

/// One output (the tests send one input per message), first byte = tag.
fn result(tag: u8, output: u32, d: &Data) -> OutFrame {
    let mut out = vec![0u8; output as usize];
    out[0] = tag;
    OutFrame::data(d.id, Bytes::from(out)).unwrap()
}

// ---------------------------------------------------------------- fake users

pub struct FakeUser {
    w: OwnedWriteHalf,
    r: FrameReader<OwnedReadHalf>,
    pub credit: u64,
}

impl FakeUser {
    pub async fn connect(addr: SocketAddr) -> FakeUser {
        let s = TcpStream::connect(addr).await.expect("connect user port");
        let (rd, w) = s.into_split();
        FakeUser {
            w,
            r: FrameReader::new(rd, 1 << 30),
            credit: 0,
        }
    }

    /// A hello user with the given features; returns the server's first answer.
    pub async fn hello_with(
        addr: SocketAddr,
        name: &str,
        nodes: Option<u32>,
        feats: &[&str],
    ) -> (FakeUser, Frame) {
        let mut u = FakeUser::connect(addr).await;
        let mut h = Hello::new("user");
        h.name = Some(name.into());
        h.nodes = nodes;
        h.features = feats.iter().map(|f| f.to_string()).collect();
        u.send(h.to_frame()).await;
        let f = u.recv().await.expect("an answer to the hello");
        (u, f)
    }

    /// A hello user with error, credit and status; panics unless the server
    /// answers with a hello.
    pub async fn hello(addr: SocketAddr, nodes: Option<u32>) -> (FakeUser, Hello) {
        let all = [features::ERROR, features::CREDIT, features::STATUS];
        let (u, f) = FakeUser::hello_with(addr, "test-user", nodes, &all).await;
        assert_eq!(f.ty, MsgType::Hello, "expected a hello reply");
        (u, Hello::decode(&f.payload).unwrap())
    }

    pub async fn send(&mut self, f: OutFrame) {
        write_frame(&mut self.w, f).await.expect("write to server");
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).await.expect("write to server");
    }

    /// Next frame; `None` once the server closed the connection.
    pub async fn recv(&mut self) -> Option<Frame> {
        tokio::time::timeout(LIMIT, self.r.read_frame())
            .await
            .expect("no frame from the server in time")
            .ok()
            .flatten()
    }

    /// Next frame that is not a credit (credits are counted).
    pub async fn recv_skip_credit(&mut self) -> Option<Frame> {
        loop {
            let f = self.recv().await?;
            if f.ty == MsgType::Credit {
                self.credit += Credit::parse(&f.payload).unwrap().messages as u64;
                continue;
            }
            return Some(f);
        }
    }

    /// Sends a configuration; returns the response status and the errors before it.
    pub async fn configure(&mut self, cfg: &Configuration) -> (u8, Vec<ErrorMsg>) {
        self.send(cfg.to_frame().unwrap()).await;
        let mut errors = Vec::new();
        loop {
            let f = self
                .recv_skip_credit()
                .await
                .expect("configuration response");
            match f.ty {
                MsgType::Error => errors.push(ErrorMsg::parse(&f.payload).unwrap()),
                MsgType::ConfigurationResponse => {
                    let r = ConfigurationResponse::parse(&f.payload).unwrap();
                    return (r.status, errors);
                }
                other => panic!("unexpected {} while configuring", other.name()),
            }
        }
    }

    /// Next error message (credits skipped); `None` if the connection closed first.
    pub async fn expect_error(&mut self) -> Option<ErrorMsg> {
        loop {
            let f = self.recv_skip_credit().await?;
            if f.ty == MsgType::Error {
                return Some(ErrorMsg::parse(&f.payload).unwrap());
            }
        }
    }

    /// Waits for the server to close the connection (frames before it are ignored).
    pub async fn closed(&mut self) {
        while self.recv().await.is_some() {}
    }

    pub async fn status(&mut self) -> ClusterStatus {
        self.send(ClusterStatus::request_frame()).await;
        loop {
            let f = self.recv_skip_credit().await.expect("status answer");
            if f.ty == MsgType::Status {
                return ClusterStatus::decode(&f.payload).unwrap();
            }
            assert_eq!(f.ty, MsgType::Data, "unexpected {}", f.ty.name());
        }
    }

    /// Streams one-input data messages with the given ids (respecting
    /// credit when `credit` is on) and returns each id's result bytes;
    /// panics on an error or a duplicate.
    pub async fn stream(
        &mut self,
        ids: std::ops::Range<u32>,
        input: usize,
        credit: bool,
    ) -> HashMap<u32, Bytes> {
        let mut results = HashMap::new();
        let total = ids.len();
        let mut next = ids.start;
        while results.len() < total {
            while next < ids.end && (!credit || self.credit > 0) {
                let body = Bytes::from(vec![next as u8; input]);
                self.send(OutFrame::data(next, body).unwrap()).await;
                self.credit = self.credit.saturating_sub(1);
                next += 1;
            }
            let f = self.recv().await.expect("results");
            match f.ty {
                MsgType::Credit => {
                    self.credit += Credit::parse(&f.payload).unwrap().messages as u64;
                }
                MsgType::Data => {
                    let d = Data::parse(f.payload).unwrap();
                    assert!(ids.contains(&d.id), "result for id {} never sent", d.id);
                    assert!(
                        results.insert(d.id, d.data).is_none(),
                        "result {} twice",
                        d.id
                    );
                }
                MsgType::Error => panic!("server error: {}", ErrorMsg::parse(&f.payload).unwrap()),
                other => panic!("unexpected {}", other.name()),
            }
        }
        results
    }
}

/// How many results each node tag produced.
pub fn by_tag(results: &HashMap<u32, Bytes>) -> HashMap<u8, usize> {
    let mut m = HashMap::new();
    for d in results.values() {
        *m.entry(d[0]).or_insert(0) += 1;
    }
    m
}

//! A fake server scripting SMP against the node manager, and scripted cores
//! plugged in through `NodeOptions::loader`.

use std::future::Future;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use corefarm_cores::{Core, CoreError, Loaded};
use corefarm_node::{CoreLoader, NodeError, NodeOptions};
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::hello::features;
use corefarm_smp::stream::{Chunk, Chunks, Reassembler};
use corefarm_smp::{
    default_core_table, BenchmarkConfig, Configuration, ConfigurationResponse, ErrorCode, ErrorMsg,
    Frame, Hello, MsgType, OutFrame,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Guards against a hang turning into a stuck test run; never a timing
/// assertion (under paused time it fires only when every task is idle).
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .unwrap_or_else(|_| panic!("stalled: {what}"))
}

/// The server's side of one node connection.
pub struct FakeServer<R, W> {
    pub reader: FrameReader<R>,
    pub writer: W,
}

pub type TcpServer = FakeServer<tokio::net::tcp::OwnedReadHalf, tokio::net::tcp::OwnedWriteHalf>;

/// A running node manager: its task and the token that stops it.
pub struct Node {
    pub task: JoinHandle<Result<(), NodeError>>,
    pub stop: CancellationToken,
}

impl Node {
    /// Waits for the node manager to return.
    pub async fn ended(mut self) -> Result<(), NodeError> {
        within("node manager to return", &mut self.task)
            .await
            .unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Node options for tests: no reconnect, small limits where a test wants them.
pub fn options() -> NodeOptions {
    NodeOptions {
        name: "test-node".into(),
        reconnect: false,
        ..NodeOptions::default()
    }
}

/// Starts `corefarm_node::run` against a fresh listener on 127.0.0.1:0 and
/// accepts its connection.
pub async fn start(mut opts: NodeOptions) -> (TcpServer, Node) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    opts.server = l.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let task = tokio::spawn(corefarm_node::run(opts, stop.clone()));
    let (s, _) = within("node to connect", l.accept()).await.unwrap();
    let (rd, wr) = s.into_split();
    let srv = FakeServer {
        reader: FrameReader::new(rd, 1 << 30),
        writer: wr,
    };
    (srv, Node { task, stop })
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> FakeServer<R, W> {
    pub async fn send(&mut self, f: OutFrame) {
        write_frame(&mut self.writer, f).await.unwrap();
    }

    pub async fn send_raw(&mut self, b: &[u8]) {
        self.writer.write_all(b).await.unwrap();
    }

    pub async fn data(&mut self, id: u32, body: Vec<u8>) {
        self.send(OutFrame::data(id, Bytes::from(body)).unwrap())
            .await;
    }

    /// Next frame from the node; panics at the end of the stream.
    pub async fn recv(&mut self) -> Frame {
        within("a frame from the node", self.reader.read_frame())
            .await
            .unwrap()
            .expect("the node closed the connection")
    }

    /// The node closes the connection (cleanly or not) without sending more.
    pub async fn closed(&mut self) {
        if let Ok(Some(f)) = within("the node to close", self.reader.read_frame()).await {
            panic!("expected the end of the connection, got {f:?}");
        }
    }

    pub async fn expect_error(&mut self) -> ErrorMsg {
        let f = self.recv().await;
        assert_eq!(f.ty, MsgType::Error, "expected an error, got {f:?}");
        ErrorMsg::parse(&f.payload).unwrap()
    }

    pub async fn expect_response(&mut self) -> bool {
        let f = self.recv().await;
        assert_eq!(f.ty, MsgType::ConfigurationResponse, "got {f:?}");
        ConfigurationResponse::parse(&f.payload).unwrap().ok()
    }

    /// Reads a data message: (id, body).
    pub async fn expect_data(&mut self) -> (u32, Bytes) {
        let f = self.recv().await;
        assert_eq!(f.ty, MsgType::Data, "expected data, got {f:?}");
        let d = corefarm_smp::Data::parse(f.payload).unwrap();
        (d.id, d.data)
    }

    /// Reads the node's hello and answers as a corefarm server (with error
    /// messages, and `max_message` if given).
    pub async fn handshake(&mut self, max_message: Option<u32>) -> Hello {
        let f = self.recv().await;
        assert_eq!(f.ty, MsgType::Hello, "the node opens with a hello");
        let h = Hello::decode(&f.payload).unwrap();
        let mut reply = Hello::new("server");
        reply.features = vec![features::ERROR.into()];
        reply.max_message = max_message;
        self.send(reply.to_frame()).await;
        h
    }

    /// Configures and expects success.
    pub async fn configure(&mut self, cfg: &Configuration) {
        self.send(cfg.to_frame().unwrap()).await;
        assert!(self.expect_response().await, "configuration accepted");
    }

    /// Configures and expects a refusal: returns the reason.
    pub async fn refused(&mut self, cfg: &Configuration) -> String {
        self.send(cfg.to_frame().unwrap()).await;
        let e = self.expect_error().await;
        assert_eq!(e.code(), Some(ErrorCode::ConfigurationFailed), "{e}");
        assert_eq!(e.id, ErrorMsg::NO_ID);
        assert!(
            !self.expect_response().await,
            "negative response after the reason"
        );
        e.reason
    }
}

pub fn bench(input_size: u32, output_size: u32, delay_us: u32) -> Configuration {
    BenchmarkConfig {
        input_size,
        output_size,
        delay_us,
    }
    .to_configuration()
}

/// A configuration of `n` scripted cores (see [`TestCores`]).
pub fn cores(n: u32, input_size: u32, output_size: u32) -> Configuration {
    Configuration {
        input_size,
        output_size,
        cores: default_core_table(n, input_size, output_size).unwrap(),
        bitstream: Bytes::from_static(b"scripted cores"),
    }
}

/// Inputs whose first 16 bytes are `tag`-specific, the rest a pattern.
pub fn inputs(tag: u32, count: usize, size: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(count * size);
    for i in 0..count {
        let mut x: Vec<u8> = (0..size).map(|j| (j * 7 + i) as u8).collect();
        x[..4].copy_from_slice(&tag.to_le_bytes());
        x[4..8].copy_from_slice(&(i as u32).to_le_bytes());
        v.extend(x);
    }
    v
}

/// Permits handed to gated cores; `open_all` lets everything through.
#[derive(Default)]
pub struct Gate {
    /// (permits, open for all, cores waiting for a permit)
    state: Mutex<(u64, bool, usize)>,
    cv: Condvar,
}

impl Gate {
    pub fn open(&self, n: u64) {
        self.state.lock().unwrap().0 += n;
        self.cv.notify_all();
    }

    pub fn open_all(&self) {
        self.state.lock().unwrap().1 = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut s = self.state.lock().unwrap();
        s.2 += 1;
        self.cv.notify_all();
        while s.0 == 0 && !s.1 {
            s = self.cv.wait(s).unwrap();
        }
        s.2 -= 1;
        if !s.1 {
            s.0 -= 1;
        }
    }

    /// Waits until `n` cores hold an input and wait for a permit (blocking:
    /// call it from `spawn_blocking`).
    pub fn blocked(&self, n: usize) {
        let mut s = self.state.lock().unwrap();
        while s.2 < n {
            s = self.cv.wait(s).unwrap();
        }
    }

    /// [`Gate::blocked`] from async code.
    pub async fn until_blocked(self: &Arc<Self>, n: usize) {
        let me = self.clone();
        within(
            "cores to block on the gate",
            tokio::task::spawn_blocking(move || me.blocked(n)),
        )
        .await
        .unwrap();
    }
}

/// What scripted cores did, in order: "load", "done <first input byte>".
pub type Log = Arc<Mutex<Vec<String>>>;

/// Scripted cores: each output byte is the bitwise NOT of the input byte at
/// the same position (cycled); an input starting with 0xEE fails at once;
/// with a gate, every other input waits for a permit.
#[derive(Clone, Default)]
pub struct TestCores {
    pub gate: Option<Arc<Gate>>,
    pub log: Log,
    /// Cores dropped so far (their handler ended), with a signal.
    pub dropped: Arc<(Mutex<usize>, Condvar)>,
}

struct TestCore(TestCores);

impl Drop for TestCore {
    fn drop(&mut self) {
        let (n, cv) = &*self.0.dropped;
        *n.lock().unwrap() += 1;
        cv.notify_all();
    }
}

impl Core for TestCore {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        if input[0] == 0xEE {
            return Err(CoreError::Failed("scripted failure".into()));
        }
        if let Some(g) = &self.0.gate {
            g.wait();
        }
        for (o, i) in output.iter_mut().zip(input.iter().cycle()) {
            *o = !i;
        }
        self.0
            .log
            .lock()
            .unwrap()
            .push(format!("done {}", input[0]));
        Ok(())
    }
}

impl TestCores {
    pub fn loader(&self) -> CoreLoader {
        let me = self.clone();
        CoreLoader::new(move |cfg, _| {
            me.log.lock().unwrap().push("load".into());
            Ok(Loaded {
                cores: (0..cfg.cores.len())
                    .map(|_| Box::new(TestCore(me.clone())) as Box<dyn Core>)
                    .collect(),
                description: format!("{} scripted cores", cfg.cores.len()),
            })
        })
    }

    /// Waits until `n` of these cores have been dropped.
    pub async fn until_dropped(&self, n: usize) {
        let d = self.dropped.clone();
        let wait = tokio::task::spawn_blocking(move || {
            let (count, cv) = &*d;
            let mut c = count.lock().unwrap();
            while *c < n {
                c = cv.wait(c).unwrap();
            }
        });
        within("cores to be dropped", wait).await.unwrap();
    }

    /// What a scripted core computes for `input` (one input).
    pub fn expected(input: &[u8], output_size: usize) -> Vec<u8> {
        input.iter().cycle().take(output_size).map(|b| !b).collect()
    }
}

/// Checks a benchmarking result: each output echoes the first 16 bytes of
/// its input and is zero after them.
pub fn check_echo(input: &[u8], output: &[u8], input_size: usize, output_size: usize) {
    assert_eq!(input.len() / input_size, output.len() / output_size);
    assert_eq!(output.len() % output_size, 0);
    for (i, o) in input
        .chunks_exact(input_size)
        .zip(output.chunks_exact(output_size))
    {
        assert_eq!(&o[..16], &i[..16]);
        assert!(
            o[16..].iter().all(|&b| b == 0),
            "output after the echo is zero"
        );
    }
}

/// Reads the node's hello and answers with chunks of `size` bytes.
pub async fn handshake_chunks(srv: &mut TcpServer, size: u32) -> Hello {
    let f = srv.recv().await;
    assert_eq!(f.ty, MsgType::Hello);
    let h = Hello::decode(&f.payload).unwrap();
    let mut reply = Hello::new("server");
    reply.features = vec![features::ERROR.into(), features::CHUNKS.into()];
    reply.chunk_size = Some(size);
    srv.send(reply.to_frame()).await;
    h
}

pub async fn send_chunk(srv: &mut TcpServer, c: &Chunk) {
    let bytes = c.to_frame().unwrap().to_vec();
    srv.send_raw(&bytes).await;
}

pub fn cut(id: u32, class: u8, data: &[u8], size: usize) -> Vec<Chunk> {
    Chunks::new(id, class, Bytes::copy_from_slice(data), size)
        .unwrap()
        .collect()
}

/// The next whole result, reassembled if it came as chunks: (id, class, data).
pub async fn result(srv: &mut TcpServer, r: &mut Reassembler) -> (u32, u8, Bytes) {
    loop {
        let f = srv.recv().await;
        match f.ty {
            MsgType::Data => {
                let d = corefarm_smp::Data::parse(f.payload).unwrap();
                return (d.id, corefarm_smp::stream::DEFAULT_CLASS, d.data);
            }
            MsgType::Chunk => {
                if let Some(m) = r.push(Chunk::parse(f.payload).unwrap()).unwrap() {
                    return (m.id, m.class, m.data);
                }
            }
            other => panic!("expected a result, got {other:?}"),
        }
    }
}

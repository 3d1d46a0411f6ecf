//! Blocking corefarm user library.
//!
//! ```no_run
//! use corefarm_client::{Client, ClientOptions};
//! use corefarm_smp::BenchmarkConfig;
//! let c = Client::connect("127.0.0.1:9999", ClientOptions::default())?;
//! c.configure(&BenchmarkConfig { input_size: 16, output_size: 16, delay_us: 0 }.to_configuration())?;
//! let id = c.submit(bytes::Bytes::from(vec![0u8; 16]))?;
//! let out = c.recv(None)?;
//! assert_eq!(out.id, id);
//! # Ok::<(), corefarm_client::ClientError>(())
//! ```
//!
//! One background thread per connection reads every frame the server sends
//! (results, credits, errors, configuration responses); writes happen on the
//! caller's thread, header and body in one vectored write, so a submitted
//! buffer reaches the kernel without being copied.

mod error;
mod map;
mod reader;

use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_smp::blocking::{write_data_borrowed, write_frame, FrameReader};
use corefarm_smp::codec::ReadError;
use corefarm_smp::hello::features;
use corefarm_smp::{
    BenchmarkConfig, Configuration, CoreInfo, ErrorMsg, Hello, MsgType, DEFAULT_MAX_MESSAGE,
};

pub use error::{ClientError, Result};
pub use map::MapIter;
use reader::{Event, Shared};

/// Default TCP port of the server's user side.
pub const DEFAULT_USER_PORT: u16 = 9999;

/// How a [`Client`] connects.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Skip the hello exchange and behave exactly like the seed's user: no
    /// credit, no error messages (failures are a bad status or a closed socket).
    pub legacy: bool,
    /// Number of nodes to ask for (`None`: every free node).
    pub nodes: Option<u32>,
    /// Name announced in the hello (shows up in the server's logs).
    pub name: Option<String>,
    /// Largest payload accepted from the server.
    pub max_message: u32,
    /// Limit on establishing the TCP connection and on the hello exchange.
    pub connect_timeout: Option<Duration>,
    /// Limit on each blocking wait other than `recv` (which takes its own):
    /// configuration responses, credit, socket writes. `None` waits forever.
    pub io_timeout: Option<Duration>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            legacy: false,
            nodes: None,
            name: None,
            max_message: DEFAULT_MAX_MESSAGE,
            connect_timeout: Some(Duration::from_secs(10)),
            io_timeout: None,
        }
    }
}

/// One result: the id of the data message it answers, the outputs, and how
/// many outputs of the configured output size they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub id: u32,
    pub data: Bytes,
    pub count: u32,
}

/// A connection to a corefarm server. All methods take `&self`; the client
/// can be shared between threads, or [`split`](Client::split) into a sending
/// and a receiving half.
#[derive(Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

/// Sending half of a split client.
#[derive(Debug)]
pub struct Sender {
    inner: Arc<Inner>,
}

/// Receiving half of a split client.
#[derive(Debug)]
pub struct Receiver {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    addr: String,
    opts: ClientOptions,
    writer: Mutex<TcpStream>,
    shared: Arc<Shared>,
    events: Mutex<mpsc::Receiver<Event>>,
    next_id: AtomicU32,
    server_hello: Option<Hello>,
    credit_mode: bool,
    configure_lock: Mutex<()>,
    reader: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Client {
    /// Connects to `addr` ("host:port") and, unless `opts.legacy`, negotiates
    /// the extensions with a hello exchange.
    pub fn connect(addr: &str, opts: ClientOptions) -> Result<Client> {
        let stream = open(addr, opts.connect_timeout)?;
        let io = |during| move |source| ClientError::Io { during, source };
        stream
            .set_nodelay(true)
            .map_err(io("configuring the socket"))?;
        stream
            .set_write_timeout(opts.io_timeout)
            .map_err(io("configuring the socket"))?;
        let read_half = stream.try_clone().map_err(io("configuring the socket"))?;
        let mut reader = FrameReader::new(read_half, opts.max_message);
        let mut writer = stream;

        let server_hello = if opts.legacy {
            None
        } else {
            Some(handshake(addr, &opts, &mut writer, &mut reader)?)
        };
        let credit_mode = server_hello
            .as_ref()
            .is_some_and(|h| h.has(features::CREDIT));

        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel();
        let thread_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name("corefarm-client-reader".into())
            .spawn(move || reader::run(reader, &thread_shared, tx, credit_mode))
            .map_err(io("starting the reader thread"))?;

        Ok(Client {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                opts,
                writer: Mutex::new(writer),
                shared,
                events: Mutex::new(rx),
                next_id: AtomicU32::new(0),
                server_hello,
                credit_mode,
                configure_lock: Mutex::new(()),
                reader: Mutex::new(Some(handle)),
            }),
        })
    }

    /// Sends a configuration and waits for the server's response. A failure
    /// carries the server's reason when it sent one.
    pub fn configure(&self, cfg: &Configuration) -> Result<()> {
        self.inner.configure(cfg)
    }

    /// Sends the benchmarking configuration (seed 000 §4.2.2).
    pub fn configure_benchmark(
        &self,
        input_size: u32,
        output_size: u32,
        delay_us: u32,
    ) -> Result<()> {
        self.inner.configure(
            &BenchmarkConfig {
                input_size,
                output_size,
                delay_us,
            }
            .to_configuration(),
        )
    }

    /// Sends one data message (a whole number of inputs) under the next id,
    /// which it returns. Blocks while the server grants no credit.
    pub fn submit(&self, data: Bytes) -> Result<u32> {
        self.inner.submit(data)
    }

    /// Sends one data message under a caller-chosen id.
    pub fn submit_with_id(&self, id: u32, data: Bytes) -> Result<()> {
        self.inner.send_data(id, Body::Shared(data))
    }

    /// Like [`submit`](Client::submit) for borrowed memory: written straight
    /// from `data` to the socket (used by the Python binding for buffers).
    pub fn submit_slice(&self, data: &[u8]) -> Result<u32> {
        let id = self.inner.take_id();
        self.inner.send_data(id, Body::Borrowed(data))?;
        Ok(id)
    }

    /// Like [`submit_with_id`](Client::submit_with_id) for borrowed memory.
    pub fn submit_slice_with_id(&self, id: u32, data: &[u8]) -> Result<()> {
        self.inner.send_data(id, Body::Borrowed(data))
    }

    /// Next result, or the server's error for a data message. `None` waits
    /// without limit.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Output> {
        self.inner.recv(timeout)
    }

    /// Results in input order, keeping at most `window` data messages in flight.
    pub fn map<I>(&self, inputs: I, window: usize) -> MapIter<'_, I::IntoIter>
    where
        I: IntoIterator<Item = Bytes>,
    {
        MapIter::new(self, inputs.into_iter(), window)
    }

    /// Splits the client into a sender and a receiver for two threads. The
    /// connection closes when both are dropped.
    pub fn split(self) -> (Sender, Receiver) {
        (
            Sender {
                inner: self.inner.clone(),
            },
            Receiver { inner: self.inner },
        )
    }

    /// Number of nodes the server assigned (hello exchange only).
    pub fn nodes(&self) -> Option<u32> {
        self.inner.server_hello.as_ref().and_then(|h| h.nodes)
    }

    /// What the server reported about the last successful configuration,
    /// e.g. nodes that refused it and were dropped (empty if none).
    pub fn warnings(&self) -> Vec<String> {
        self.inner.shared.lock().warnings.clone()
    }

    /// The server's hello, if the extensions were negotiated.
    pub fn server_hello(&self) -> Option<&Hello> {
        self.inner.server_hello.as_ref()
    }

    /// Whether credit-based flow control is in force.
    pub fn credit_mode(&self) -> bool {
        self.inner.credit_mode
    }

    /// (input size, output size) of the configuration in force.
    pub fn sizes(&self) -> Option<(u32, u32)> {
        self.inner.shared.lock().sizes
    }

    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Closes the connection now: blocked calls in other threads return
    /// [`ClientError::ClosedLocally`]. Dropping the client also closes it.
    pub fn close(&self) {
        self.inner.close();
    }
}

impl Sender {
    pub fn configure(&self, cfg: &Configuration) -> Result<()> {
        self.inner.configure(cfg)
    }
    pub fn submit(&self, data: Bytes) -> Result<u32> {
        self.inner.submit(data)
    }
    pub fn submit_with_id(&self, id: u32, data: Bytes) -> Result<()> {
        self.inner.send_data(id, Body::Shared(data))
    }
    pub fn submit_slice(&self, data: &[u8]) -> Result<u32> {
        let id = self.inner.take_id();
        self.inner.send_data(id, Body::Borrowed(data))?;
        Ok(id)
    }
    pub fn close(&self) {
        self.inner.close();
    }
}

impl Receiver {
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Output> {
        self.inner.recv(timeout)
    }
    pub fn close(&self) {
        self.inner.close();
    }
}

/// The default core table of docs/interfaces.md, for images that do not
/// give one: base 0xC000_0000, span S = next power of two ≥ max(input,
/// output, 4096); core i has control = base + 4·S·i, input = control + S,
/// output = control + 2·S.
pub fn default_core_table(n: u32, input_size: u32, output_size: u32) -> Result<Vec<CoreInfo>> {
    const BASE: u64 = 0xC000_0000;
    let span = u64::from(input_size.max(output_size).max(4096)).next_power_of_two();
    (0..u64::from(n))
        .map(|i| {
            let control = BASE + 4 * span * i;
            let fits = |a: u64| u32::try_from(a).ok();
            match (fits(control), fits(control + span), fits(control + 2 * span + span - 1)) {
                (Some(control), Some(input), Some(_)) => Ok(CoreInfo {
                    control,
                    input,
                    output: control + 2 * span as u32,
                }),
                _ => Err(ClientError::InvalidInput(format!(
                    "{n} cores of {span}-byte memories do not fit the 32-bit address space above 0xC0000000"
                ))),
            }
        })
        .collect()
}

/// Resolves `addr` and connects to the first address that accepts.
fn open(addr: &str, timeout: Option<Duration>) -> Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|source| ClientError::Resolve {
            addr: addr.to_string(),
            source,
        })?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolved to no address");
    for a in addrs {
        let r = match timeout {
            Some(t) => TcpStream::connect_timeout(&a, t),
            None => TcpStream::connect(a),
        };
        match r {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(ClientError::Connect {
        addr: addr.to_string(),
        source: last,
    })
}

fn handshake(
    addr: &str,
    opts: &ClientOptions,
    writer: &mut TcpStream,
    reader: &mut FrameReader<TcpStream>,
) -> Result<Hello> {
    let fail = |detail: String| ClientError::Handshake {
        addr: addr.to_string(),
        detail,
    };
    let mut hello = Hello::new("user");
    hello.name = opts.name.clone();
    hello.features = vec![features::ERROR.into(), features::CREDIT.into()];
    hello.nodes = opts.nodes;
    write_frame(writer, hello.to_frame()).map_err(|e| fail(format!("sending hello: {e}")))?;

    // The read timeout is per socket, so it also bounds the reader's clone;
    // it is lifted again before the reader thread takes over.
    reader
        .get_ref()
        .set_read_timeout(opts.connect_timeout)
        .map_err(|e| fail(e.to_string()))?;
    let frame = match reader.read_frame() {
        Ok(Some(f)) => f,
        Ok(None) => {
            return Err(fail(
                "the server closed the connection (a seed-only server? try legacy mode)".into(),
            ))
        }
        Err(ReadError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            return Err(fail(format!(
                "no hello reply within {:?}",
                opts.connect_timeout.unwrap_or_default()
            )))
        }
        Err(e) => return Err(fail(e.to_string())),
    };
    reader
        .get_ref()
        .set_read_timeout(None)
        .map_err(|e| fail(e.to_string()))?;
    match frame.ty {
        MsgType::Hello => {
            let h = Hello::decode(&frame.payload).map_err(|e| fail(e.to_string()))?;
            if h.role != "server" {
                return Err(fail(format!(
                    "the peer says it is a {:?}, not a server",
                    h.role
                )));
            }
            Ok(h)
        }
        // E.g. "no nodes available": the server's own words are the best message.
        MsgType::Error => match ErrorMsg::parse(&frame.payload) {
            Ok(e) => Err(ClientError::Server(e)),
            Err(e) => Err(fail(e.to_string())),
        },
        other => Err(fail(format!(
            "expected a hello reply, got a {} message",
            other.name()
        ))),
    }
}

/// A data body: shared (`Bytes`, may outlive the call) or borrowed.
enum Body<'a> {
    Shared(Bytes),
    Borrowed(&'a [u8]),
}

impl Body<'_> {
    fn len(&self) -> usize {
        match self {
            Body::Shared(b) => b.len(),
            Body::Borrowed(b) => b.len(),
        }
    }
}

impl Inner {
    fn take_id(&self) -> u32 {
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            // NO_ID would be ambiguous in the server's error messages.
            if id != ErrorMsg::NO_ID {
                return id;
            }
        }
    }

    fn submit(&self, data: Bytes) -> Result<u32> {
        let id = self.take_id();
        self.send_data(id, Body::Shared(data))?;
        Ok(id)
    }

    fn deadline(&self) -> Option<Instant> {
        self.opts.io_timeout.map(|t| Instant::now() + t)
    }

    fn send_data(&self, id: u32, body: Body<'_>) -> Result<()> {
        let len = body.len();
        {
            let mut st = self.shared.lock();
            if let Some(f) = &st.failed {
                return Err(f.to_error("before this data could be sent"));
            }
            let (input_size, _) = st.sizes.ok_or(ClientError::NotConfigured)?;
            if len == 0 || !len.is_multiple_of(input_size as usize) {
                return Err(ClientError::InvalidInput(format!(
                    "{len} bytes is not a whole, non-zero number of {input_size}-byte inputs"
                )));
            }
            let max = self
                .server_hello
                .as_ref()
                .and_then(|h| h.max_message)
                .unwrap_or(u32::MAX) as usize;
            if len + corefarm_smp::DATA_ID_LEN > max {
                return Err(ClientError::InvalidInput(format!(
                    "a data message of {len} bytes exceeds the server's limit of {max} bytes"
                )));
            }
            if self.credit_mode {
                let deadline = self.deadline();
                while st.credit == 0 {
                    if let Some(f) = &st.failed {
                        return Err(f.to_error("while waiting for credit"));
                    }
                    st = self.wait(st, deadline, "waiting for credit from the server")?;
                }
                st.credit -= 1;
            }
        }
        let mut w = lock(&self.writer);
        let r = match body {
            Body::Shared(b) => write_data_borrowed(&mut *w, id, &b),
            Body::Borrowed(b) => write_data_borrowed(&mut *w, id, b),
        };
        r.map_err(|e| self.write_error(e, "while sending data"))
    }

    /// Waits on the state condvar until notified or `deadline`.
    fn wait<'a>(
        &self,
        st: MutexGuard<'a, reader::State>,
        deadline: Option<Instant>,
        during: &'static str,
    ) -> Result<MutexGuard<'a, reader::State>> {
        let cond = &self.shared.cond;
        match deadline {
            None => Ok(cond.wait(st).unwrap_or_else(|p| p.into_inner())),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ClientError::Timeout {
                        after: self.opts.io_timeout.unwrap_or_default(),
                        during,
                    });
                }
                Ok(cond
                    .wait_timeout(st, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0)
            }
        }
    }

    /// A failed write usually means the server went away; if the reader
    /// thread already knows why, that is the better message.
    fn write_error(&self, e: io::Error, during: &'static str) -> ClientError {
        if let Some(f) = &self.shared.lock().failed {
            return f.to_error(during);
        }
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ClientError::Timeout {
                after: self.opts.io_timeout.unwrap_or_default(),
                during: "sending to the server (it is not reading)",
            },
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                ClientError::Closed { during }
            }
            _ => ClientError::Io { during, source: e },
        }
    }

    fn configure(&self, cfg: &Configuration) -> Result<()> {
        let _one_at_a_time = lock(&self.configure_lock);
        {
            let mut st = self.shared.lock();
            if let Some(f) = &st.failed {
                return Err(f.to_error("before the configuration could be sent"));
            }
            st.configuring = true;
            st.config_reply = None;
            st.config_errors.clear();
            st.pending_sizes = Some((cfg.input_size, cfg.output_size));
        }
        {
            let mut w = lock(&self.writer);
            let sent = cfg
                .to_frame()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
                .and_then(|f| write_frame(&mut *w, f));
            if let Err(e) = sent {
                self.shared.lock().configuring = false;
                return Err(self.write_error(e, "while sending the configuration"));
            }
        }
        let deadline = self.deadline();
        let mut st = self.shared.lock();
        loop {
            if let Some(r) = st.config_reply.take() {
                let errors: Vec<ErrorMsg> = st.config_errors.drain(..).collect();
                return if r.ok() {
                    st.warnings = errors.into_iter().map(|e| e.reason).collect();
                    Ok(())
                } else {
                    let reasons: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                    let reason = (!reasons.is_empty()).then(|| reasons.join("; "));
                    Err(ClientError::Configuration {
                        status: Some(r.status),
                        reason,
                    })
                };
            }
            if let Some(f) = st.failed.clone() {
                st.configuring = false;
                // The server explained before it hung up: that is the error.
                if !st.config_errors.is_empty() {
                    let reasons: Vec<String> =
                        st.config_errors.drain(..).map(|e| e.to_string()).collect();
                    return Err(ClientError::Configuration {
                        status: None,
                        reason: Some(reasons.join("; ")),
                    });
                }
                return Err(f.to_error("while waiting for the configuration response"));
            }
            st = self.wait(st, deadline, "waiting for the configuration response")?;
        }
    }

    fn recv(&self, timeout: Option<Duration>) -> Result<Output> {
        let rx = lock(&self.events);
        let ev = match rx.try_recv() {
            Ok(ev) => ev,
            Err(mpsc::TryRecvError::Disconnected) => {
                return Err(self.closed("while waiting for results"))
            }
            Err(mpsc::TryRecvError::Empty) => {
                // A fatal server error was already delivered once; do not wait
                // for results that will never come.
                if let Some(f @ error::Failure::Server(_)) = &self.shared.lock().failed {
                    return Err(f.to_error("while waiting for results"));
                }
                match timeout {
                    None => rx
                        .recv()
                        .map_err(|_| self.closed("while waiting for results"))?,
                    Some(t) => match rx.recv_timeout(t) {
                        Ok(ev) => ev,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            return Err(ClientError::Timeout {
                                after: t,
                                during: "waiting for a result",
                            })
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => {
                            return Err(self.closed("while waiting for results"))
                        }
                    },
                }
            }
        };
        match ev {
            Event::Data(o) => Ok(o),
            Event::Error(e) => Err(ClientError::Server(e)),
        }
    }

    fn closed(&self, during: &'static str) -> ClientError {
        match &self.shared.lock().failed {
            Some(f) => f.to_error(during),
            None => ClientError::Closed { during },
        }
    }

    fn close(&self) {
        self.shared.lock().closing = true;
        let _ = lock(&self.writer).shutdown(Shutdown::Both);
        self.shared.fail(error::Failure::ClosedLocally);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
        // The reader sees end-of-stream after the shutdown and exits.
        if let Some(h) = lock(&self.reader).take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests;

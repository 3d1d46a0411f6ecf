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
//! (results, credits, errors, configuration and status responses); writes
//! happen on the caller's thread, header and body in one vectored write, so a
//! submitted buffer reaches the kernel without being copied.
//!
//! # One client, many threads: who gets which result
//!
//! Results are routed by the id of the data message they answer:
//!
//! - [`submit_pending`](Client::submit_pending) registers the id before the
//!   data is written and returns a [`Pending`]; that result goes to that
//!   handle only (wait, poll, callback or `.await`).
//!   [`map`](Client::map) works this way, so any number of threads can run
//!   `map`, `submit_pending` and `submit` + `recv` on one `Client` at once
//!   and each gets its own results.
//! - [`submit`](Client::submit) leaves the result to
//!   [`recv`](Client::recv), which returns results of plain submissions in
//!   arrival order to whichever thread calls it (the single-consumer and the
//!   [`split`](Client::split) patterns).
//!
//! `recv` never returns a result that a `Pending` (or a `map`) waits for. A
//! `recv` that could therefore only wait forever (no plain submission
//! outstanding, nothing queued, but pending ones in flight) fails with
//! [`ClientError::Usage`] instead of blocking. With nothing at all in flight
//! it waits, since another thread may be about to submit.
//!
//! # Surviving a lost server
//!
//! `connect` takes one address or several separated by commas; the first
//! that answers is used. With [`ClientOptions::reconnect_timeout`] (30 s
//! by default) a broken server connection does not fail the session: the
//! client reconnects with back-off to the next address (round-robin),
//! runs the hello and authentication again, sends the last accepted
//! configuration again, then every data message not yet answered under its
//! original id. Results are deduplicated by id, so `recv`, every
//! [`Pending`] and every `map` see each result exactly once, `map` in
//! input order; meanwhile they simply wait. A server that refuses the
//! configuration the lost one ran (no node for this user) is passed over.
//! When no server takes the session within the timeout, every waiter
//! fails with [`ClientError::ServerLost`], which counts the unanswered
//! data messages. To send a message again its body is kept until it is
//! answered: a `Bytes` body by reference, a borrowed one (`submit_slice*`)
//! as a copy, made only while resuming is on. Not resumed: legacy
//! (seed-format) sessions, which have no ids to resend under, and groups
//! and the direct path ([`group`], [`direct`]), which fail as before.
//!
//! # Co-working
//!
//! With the `cowork` feature, `Cowork` runs an image's native artifact on
//! this machine while the cluster computes the rest of the same call
//! (`Client::map_cowork`). It is a feature because it links the core loader
//! (dlopen, worker processes), which a client that only talks to a server
//! does not need.

mod chunked;
mod connect;
#[cfg(feature = "cowork")]
mod cowork;
pub mod direct;
mod error;
pub mod group;
mod inner;
mod map;
mod notify;
mod pending;
mod reader;
mod resume;
pub mod tls;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::hello::features;
use corefarm_smp::stream::DEFAULT_CLASS;
use corefarm_smp::{BenchmarkConfig, ClusterStatus, Configuration, Hello, DEFAULT_MAX_MESSAGE};

/// The default core table (docs/interfaces.md), for images that give none.
pub use corefarm_smp::default_core_table;
#[cfg(feature = "cowork")]
pub use cowork::{Cowork, CoworkError, CoworkOptions, CoworkReport, CoworkRun, Estimates};
pub use error::{ClientError, Result};
use inner::{Body, CreditWait, Inner, Route};
pub use map::MapIter;
pub use notify::{Notification, NOTIFICATION_QUEUE};
pub use pending::Pending;
use reader::Rendezvous;

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
    /// [`Client::set_io_timeout`] changes it on a connected client.
    pub io_timeout: Option<Duration>,
    /// The user secret, for a server with an auth file: the client then
    /// announces the `auth` feature and answers the server's challenge
    /// (see [`corefarm_smp::auth::Secret::from_env`] for the usual sources).
    pub secret: Option<corefarm_smp::auth::Secret>,
    /// The user (tenant) to act for: a `[users.<name>]` of the server's
    /// auth file, whose own secret `secret` then is. `None`: the anonymous
    /// tenant, with the shared user secret. See
    /// [`corefarm_smp::auth::user_from_env`] for `COREFARM_USER`.
    pub user: Option<String>,
    /// TLS to the server's user port (the CA to trust and, optionally, the
    /// name its certificate carries); `None`: plain TCP. Groups take the
    /// same ([`group::GroupOptions::tls`]); the direct data path to the
    /// nodes is plain TCP only.
    pub tls: Option<corefarm_smp::tls::ClientTls>,
    /// Ask for `chunks`: large messages and every message with
    /// a priority other than the default go out as chunks, a more urgent
    /// message's chunks between a bulk one's, and results come back as
    /// chunks of their message's class. Without it (or with a server that
    /// does not agree) every message is class 4 and priorities are ignored.
    pub chunks: bool,
    /// Largest chunk to ask for (`None`: the protocol's default, 128 KiB);
    /// the server may agree to less.
    pub chunk_size: Option<u32>,
    /// How long to try to resume the session after its server connection
    /// broke (`None`: never; a lost server fails the session at once). See
    /// "Surviving a lost server" in the crate docs.
    pub reconnect_timeout: Option<Duration>,
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
            secret: None,
            user: None,
            tls: None,
            chunks: false,
            chunk_size: None,
            reconnect_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// One result: the id of the data message it answers, the outputs, and how
/// many outputs of the configured output size they are.
///
/// A core's result is count × output size bytes, one output per input. A
/// streaming handler's result (docs/streams.md) is exactly what the
/// handlers emitted — a sum, the records a filter kept, possibly nothing —
/// since the client agrees the `any-length` feature: `data` is then whole,
/// whatever its length, and `count` is the number of *whole* outputs of
/// the configured size in it (`data.len() / output_size`, rounded down),
/// not the number of inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub id: u32,
    pub data: Bytes,
    /// Whole outputs of the configured output size in `data` (see above).
    pub count: u32,
}

/// A connection to a corefarm server. All methods take `&self`; the client
/// can be shared between threads, or [`split`](Client::split) into a sending
/// and a receiving half.
#[derive(Debug)]
pub struct Client {
    inner: Arc<Inner>,
    open: Arc<Open>,
}

/// Sending half of a split client.
#[derive(Debug)]
pub struct Sender {
    inner: Arc<Inner>,
    _open: Arc<Open>,
}

/// Receiving half of a split client.
#[derive(Debug)]
pub struct Receiver {
    inner: Arc<Inner>,
    _open: Arc<Open>,
}

/// Closes the connection once the last handle the user holds (a client, or
/// both halves of a split one) is gone, even while a co-working call's
/// configuration thread still holds the connection's state: that thread
/// then sees the connection closed and ends.
#[derive(Debug)]
struct Open(Arc<Inner>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Client {
    /// Connects to `addr` ("host:port", or several separated by commas:
    /// the first that answers is used, the others are where a resumed
    /// session goes) and, unless `opts.legacy`, negotiates the extensions
    /// with a hello exchange.
    pub fn connect(addr: &str, opts: ClientOptions) -> Result<Client> {
        let io = |during| move |source| ClientError::Io { during, source };
        let addrs = resume::addresses(addr)?;
        // Only a resuming client with somewhere else to go moves on.
        let moves_on = addrs.len() > 1 && opts.reconnect_timeout.is_some();
        let mut tried = addrs.iter().enumerate();
        let (index, writer, reader, server_hello) = loop {
            let (i, a) = tried.next().expect("at least one address");
            let linked = connect::open_link(a, &opts).and_then(|(mut w, mut r)| {
                let hello = match opts.legacy {
                    true => None,
                    false => Some(connect::handshake(a, &opts, moves_on, &mut w, &mut r)?),
                };
                Ok((w, r, hello))
            });
            match linked {
                Ok((w, r, h)) => break (i, w, r, h),
                Err(e) if i + 1 == addrs.len() => return Err(e),
                Err(_) => {}
            }
        };
        let credit_mode = server_hello
            .as_ref()
            .is_some_and(|h| h.has(features::CREDIT));

        let chunk_size = server_hello
            .as_ref()
            .filter(|h| h.has(features::CHUNKS))
            .and_then(|h| h.chunk_size)
            .filter(|&s| s > 0);
        let reassembler = chunk_size.map(|_| chunked::reassembler(opts.max_message));
        if let Some(size) = chunk_size {
            chunked::shallow_send_buffer(writer.tcp(), size);
        }
        let shared = Arc::new(Rendezvous::default());
        // Seed-format sessions have no ids to resend under: never resumed.
        let resume = match (opts.reconnect_timeout, &server_hello) {
            (Some(timeout), Some(_)) => {
                shared.lock().kept = Some(Default::default());
                Some(resume::Resume::new(addrs, index, timeout, opts.clone()))
            }
            _ => None,
        };

        let io_timeout = inner::IoTimeout::new(opts.io_timeout);
        let inner = Arc::new(Inner {
            addr: addr.to_string(),
            writer: Mutex::new(writer),
            shared,
            server_hello,
            credit_mode,
            chunk_size,
            gate: Default::default(),
            chunks_written: Default::default(),
            io_timeout,
            configure_lock: Mutex::new(()),
            status_lock: Mutex::new(()),
            configuration: Mutex::new(None),
            #[cfg(feature = "cowork")]
            cowork_configuring: Default::default(),
            configure_timing: Default::default(),
            reader: Mutex::new(Vec::new()),
            resume,
            link: Default::default(),
        });
        inner::spawn_reader(&inner, reader, 0, reassembler)
            .map_err(io("starting the reader thread"))?;
        Ok(Client {
            open: Arc::new(Open(inner.clone())),
            inner,
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
    /// which it returns; its result goes to [`recv`](Client::recv). Blocks
    /// while the server grants no credit.
    pub fn submit(&self, data: Bytes) -> Result<u32> {
        self.inner.submit(None, Body::Shared(data))
    }

    /// Like [`submit`](Client::submit) in priority class `class` (0 most
    /// urgent, 7 least; `submit` is class 4). With `chunks` agreed, its
    /// chunks go out ahead of less urgent messages' chunks that other
    /// threads are sending, and its result comes back the same way.
    /// Without `chunks` (not asked for, or a server that does not offer
    /// it) every message is class 4 and `class` has no effect, so the same
    /// code runs against any server.
    pub fn submit_with(&self, data: Bytes, class: u8) -> Result<u32> {
        self.inner.submit_class(None, Body::Shared(data), class)
    }

    /// Like [`submit_pending`](Client::submit_pending) in priority `class`.
    pub fn submit_pending_with(&self, data: Bytes, class: u8) -> Result<Pending> {
        let sent = self
            .inner
            .submit_pending_class(Body::Shared(data), CreditWait::Block, class)?;
        Ok(sent.expect("a blocking submit sends to a pending"))
    }

    /// Like [`submit_with`](Client::submit_with) for borrowed memory (with
    /// `chunks` agreed, a message sent as chunks is copied once), under
    /// `id` or the next automatic id.
    pub fn submit_slice_with(&self, id: Option<u32>, data: &[u8], class: u8) -> Result<u32> {
        self.inner.submit_class(id, Body::Borrowed(data), class)
    }

    /// Like [`submit_slice_pending`](Client::submit_slice_pending) in
    /// priority `class`; with `no_wait`, `None` instead of waiting for credit.
    pub fn submit_slice_pending_with(
        &self,
        data: &[u8],
        class: u8,
        no_wait: bool,
    ) -> Result<Option<Pending>> {
        let wait = if no_wait {
            CreditWait::NoWait
        } else {
            CreditWait::Block
        };
        self.inner
            .submit_pending_class(Body::Borrowed(data), wait, class)
    }

    /// Like [`submit_slice_with`](Client::submit_slice_with), but returns
    /// `Ok(None)` at once, sending nothing, when the server grants no
    /// credit right now.
    pub fn try_submit_slice_with(
        &self,
        id: Option<u32>,
        data: &[u8],
        class: u8,
    ) -> Result<Option<u32>> {
        let sent = self.inner.send_data(
            id,
            Body::Borrowed(data),
            Route::Recv,
            CreditWait::NoWait,
            class,
        )?;
        Ok(sent.map(|(id, _)| id))
    }

    /// Waits up to `timeout` until a data message of priority `class` could
    /// be sent without waiting for credit: `Ok(false)` when the time ran
    /// out, an error once the connection has failed. For callers that must
    /// stay responsive while the server grants no credit (a binding that
    /// checks for Ctrl-C, an event loop): wait in slices, then send with a
    /// `try_` submission, which another thread may have beaten to the
    /// credit.
    pub fn wait_for_credit(&self, class: u8, timeout: Duration) -> Result<bool> {
        self.inner.wait_for_credit(class, timeout)
    }

    /// Changes [`ClientOptions::io_timeout`] for the waits that start
    /// from now on (those under way keep the limit they began with) and
    /// for socket writes. `None` waits forever.
    pub fn set_io_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        inner::lock(&self.inner.writer)
            .tcp()
            .set_write_timeout(timeout)
            .map_err(|source| ClientError::Io {
                during: "setting the write timeout",
                source,
            })?;
        self.inner.io_timeout.set(timeout);
        Ok(())
    }

    /// The chunk size agreed with the server, if `chunks` was.
    pub fn chunk_size(&self) -> Option<u32> {
        self.inner.chunk_size
    }

    /// Sends one data message under a caller-chosen id (result to `recv`).
    /// An id a [`Pending`] still waits for is refused ([`ClientError::Usage`]).
    pub fn submit_with_id(&self, id: u32, data: Bytes) -> Result<()> {
        self.inner.submit(Some(id), Body::Shared(data)).map(drop)
    }

    /// Like [`submit`](Client::submit) for borrowed memory: written straight
    /// from `data` to the socket.
    pub fn submit_slice(&self, data: &[u8]) -> Result<u32> {
        self.inner.submit(None, Body::Borrowed(data))
    }

    /// Like [`submit_with_id`](Client::submit_with_id) for borrowed memory.
    pub fn submit_slice_with_id(&self, id: u32, data: &[u8]) -> Result<()> {
        self.inner.submit(Some(id), Body::Borrowed(data)).map(drop)
    }

    /// Sends one data message under the next id; its result (or the
    /// server's error for it) goes to the returned [`Pending`] only. Blocks
    /// while the server grants no credit.
    pub fn submit_pending(&self, data: Bytes) -> Result<Pending> {
        self.inner
            .submit_pending(Body::Shared(data), CreditWait::Block)
            .map(|p| p.expect("a blocking submit sends"))
    }

    /// Like [`submit_pending`](Client::submit_pending) for borrowed memory.
    pub fn submit_slice_pending(&self, data: &[u8]) -> Result<Pending> {
        self.inner
            .submit_pending(Body::Borrowed(data), CreditWait::Block)
            .map(|p| p.expect("a blocking submit sends"))
    }

    /// Like [`submit_slice_pending`](Client::submit_slice_pending), but
    /// returns `Ok(None)` at once, sending nothing, when the server grants no
    /// credit right now (for event loops that must not block).
    pub fn try_submit_slice_pending(&self, data: &[u8]) -> Result<Option<Pending>> {
        self.inner
            .submit_pending(Body::Borrowed(data), CreditWait::NoWait)
    }

    /// Next result of a plain submission ([`submit`](Client::submit) and
    /// friends), or the server's error for one; `None` waits without limit.
    /// Results that a [`Pending`] or a [`map`](Client::map) waits for are
    /// never returned here; see the crate docs for when this fails with
    /// [`ClientError::Usage`] instead of waiting.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Output> {
        self.inner.recv(timeout)
    }

    /// The oldest handler notification not yet taken (docs/streams.md,
    /// "Notifications"), waiting up to `timeout` (`None`: until one comes).
    /// `None` on timeout, or once the connection has ended and none is
    /// left. All notifications of a message arrive before its result, so
    /// once its result is in, they are all here. Results are unaffected:
    /// they never wait for this queue, which keeps the newest
    /// [`NOTIFICATION_QUEUE`] notifications.
    pub fn recv_notification(&self, timeout: Option<Duration>) -> Option<Notification> {
        self.inner.shared.notes.recv(timeout)
    }

    /// [`Client::recv_notification`] without waiting.
    pub fn try_recv_notification(&self) -> Option<Notification> {
        self.inner.shared.notes.try_recv()
    }

    /// Notifications dropped because [`NOTIFICATION_QUEUE`] were waiting.
    pub fn notifications_dropped(&self) -> u64 {
        self.inner.shared.notes.dropped()
    }

    /// Results in input order, keeping at most `window` data messages in
    /// flight. The results are routed to this iterator only, so several
    /// threads may each run a `map` on one client. A configuration sent
    /// while it runs ends it with [`ClientError::Usage`] before its next
    /// input: the inputs still to send were meant for the function in
    /// place when the map began.
    pub fn map<I>(&self, inputs: I, window: usize) -> MapIter<'_, I::IntoIter>
    where
        I: IntoIterator<Item = Bytes>,
    {
        MapIter::new(self, inputs.into_iter(), window, DEFAULT_CLASS)
    }

    /// [`map`](Client::map) with every input in priority class `class`.
    pub fn map_with<I>(&self, inputs: I, window: usize, class: u8) -> MapIter<'_, I::IntoIter>
    where
        I: IntoIterator<Item = Bytes>,
    {
        MapIter::new(self, inputs.into_iter(), window, class)
    }

    /// What the server is doing: its nodes and users (the status extension,
    /// negotiated in the hello). Fails with [`ClientError::Unsupported`] in
    /// legacy mode or when the server does not offer it.
    pub fn status(&self) -> Result<ClusterStatus> {
        self.inner.status()
    }

    /// [`status`](Client::status) with the node rows `q` asks for (a page,
    /// or none: the counts by state alone). A server from before pages
    /// existed answers with every node.
    pub fn status_query(&self, q: &corefarm_smp::StatusQuery) -> Result<ClusterStatus> {
        self.inner.status_query(q)
    }

    /// Whether the server answers [`status`](Client::status) requests.
    pub fn has_status(&self) -> bool {
        self.server_hello().is_some_and(|h| h.has(features::STATUS))
    }

    /// Splits the client into a sender and a receiver for two threads. The
    /// connection closes when both are dropped.
    pub fn split(self) -> (Sender, Receiver) {
        (
            Sender {
                inner: self.inner.clone(),
                _open: self.open.clone(),
            },
            Receiver {
                inner: self.inner,
                _open: self.open,
            },
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

    /// The last configuration the server accepted from this client.
    pub fn configuration(&self) -> Option<Configuration> {
        inner::lock(&self.inner.configuration).clone()
    }

    /// (input size, output size) of the configuration in force.
    pub fn sizes(&self) -> Option<(u32, u32)> {
        self.inner.shared.lock().sizes
    }

    /// The address (or comma-separated addresses) given to `connect`.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// The address of the server in use now (it changes when a session
    /// is resumed on another server of the list).
    pub fn server_addr(&self) -> String {
        match &self.inner.resume {
            Some(r) => r.current_addr(),
            None => self.inner.addr.clone(),
        }
    }

    /// Whether the session is being resumed now: its server was lost and
    /// a new connection is being set up (submissions wait meanwhile, for
    /// up to `reconnect_timeout` rather than `io_timeout`).
    pub fn resuming(&self) -> bool {
        self.inner.shared.lock().resuming
    }

    /// Times a server took this session back after its server was lost
    /// (counted once it accepted the configuration again).
    pub fn resumes(&self) -> u64 {
        self.inner.resume.as_ref().map_or(0, |r| r.resumes())
    }

    /// Results dropped because their data message had been answered
    /// already (a message sent again after a lost server, answered twice).
    pub fn duplicates_dropped(&self) -> u64 {
        self.inner.shared.lock().duplicates
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
        self.inner.submit(None, Body::Shared(data))
    }
    pub fn submit_with_id(&self, id: u32, data: Bytes) -> Result<()> {
        self.inner.submit(Some(id), Body::Shared(data)).map(drop)
    }
    pub fn submit_slice(&self, data: &[u8]) -> Result<u32> {
        self.inner.submit(None, Body::Borrowed(data))
    }
    pub fn submit_with(&self, data: Bytes, class: u8) -> Result<u32> {
        self.inner.submit_class(None, Body::Shared(data), class)
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

impl Inner {
    fn submit(&self, id: Option<u32>, body: Body<'_>) -> Result<u32> {
        self.submit_class(id, body, DEFAULT_CLASS)
    }

    fn submit_class(&self, id: Option<u32>, body: Body<'_>, class: u8) -> Result<u32> {
        let sent = self.send_data(id, body, Route::Recv, CreditWait::Block, class)?;
        Ok(sent.expect("a blocking submit sends").0)
    }

    fn submit_pending(&self, body: Body<'_>, wait: CreditWait) -> Result<Option<Pending>> {
        self.submit_pending_class(body, wait, DEFAULT_CLASS)
    }

    fn submit_pending_class(
        &self,
        body: Body<'_>,
        wait: CreditWait,
        class: u8,
    ) -> Result<Option<Pending>> {
        self.submit_pending_in(body, wait, class, None)
    }

    /// A submission for a `Pending` that is refused if a configuration was
    /// sent after `generation` (see `State::generation`).
    pub(crate) fn submit_pending_in(
        &self,
        body: Body<'_>,
        wait: CreditWait,
        class: u8,
        generation: Option<u64>,
    ) -> Result<Option<Pending>> {
        let sent = self.send_data(None, body, Route::Pending(generation), wait, class)?;
        Ok(sent.map(|(_, p)| p.expect("routed to a pending")))
    }

    /// How many configurations this client has sent.
    pub(crate) fn generation(&self) -> u64 {
        self.shared.lock().generation
    }
}

#[doc(hidden)]
impl Client {
    /// Test hook: writes of chunks (one, or a batch of one message's) this
    /// client has made.
    pub fn chunks_written(&self) -> u64 {
        self.inner
            .chunks_written
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Test hook: threads of priority `class` waiting for a turn to write.
    pub fn writers_waiting(&self, class: u8) -> u32 {
        self.inner.gate.waiting(class)
    }

    /// Test hook: blocks until at least `n` threads wait in `recv` (true) or
    /// `timeout` passes (false). Lets tests act on a blocked receiver
    /// without sleeping.
    pub fn wait_for_blocked_receivers(&self, n: usize, timeout: Duration) -> bool {
        self.wait_for_waiters(|st| st.receivers_waiting >= n, timeout)
    }

    /// Test hook: blocks until at least `n` submissions wait for credit
    /// (true) or `timeout` passes (false).
    pub fn wait_for_credit_waiters(&self, n: usize, timeout: Duration) -> bool {
        self.wait_for_waiters(|st| st.credit_waiters >= n, timeout)
    }

    fn wait_for_waiters(&self, done: impl Fn(&reader::State) -> bool, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut st = self.inner.shared.lock();
        while !done(&st) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .inner
                .shared
                .cond
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

#[cfg(test)]
mod resume_tests;
#[cfg(test)]
mod routing_tests;
#[cfg(test)]
mod tests;

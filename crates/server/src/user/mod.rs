//! The per-user handler (seed 000 §3.3.1): one task that owns the user's
//! connection, its nodes and every piece of routing state, so nothing on
//! the data path takes a lock.
//!
//! States: Initial → Nodes Configuration → Data Routing, and back to Nodes
//! Configuration on a new configuration once no data is in flight. Events come
//! from the user socket, from the nodes (results, responses, write
//! completions, disconnects), from the pool (nodes joining) and from a timer.
//!
//! - this file: the task, its event loop, replies and session endings;
//! - `frames`: what the user sends (hello, configuration, data, status);
//! - `configure`: configuring nodes, refusing configurations;
//! - `routing`: dispatch, credit, results and messages from nodes;
//! - `nodes`: taking, adopting, losing and releasing nodes; node timeouts.

mod configure;
mod frames;
mod nodes;
mod notify;
mod routing;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::tls::Stream;
use bytes::Bytes;
use corefarm_smp::codec::FrameReader;
use corefarm_smp::stream::DEFAULT_CLASS;
use corefarm_smp::{
    hello::features, Configuration, ErrorCode, ErrorMsg, OutFrame, ProtocolError,
    UserPhase as Phase,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{StreamExt, StreamMap};
use tokio_util::sync::CancellationToken;

use crate::dispatch::{Order, Window};
use crate::nodeconn::{NodeConn, NodeEvent};
use crate::pool::Control;
use crate::registry::UserEntry;
use crate::userconn::{Closed, Next, UserConn};
use crate::wire::Sink;
use crate::Shared;

impl From<Closed> for End {
    fn from(c: Closed) -> End {
        End::Error(c.into())
    }
}

pub(crate) use crate::userconn::USER_QUEUE;

/// How often timers (node deadlines, the idle user) are checked.
const TICK: Duration = Duration::from_millis(100);

/// A data message accepted from the user and not yet answered.
struct Pending {
    user_id: u32,
    data: Bytes,
    count: u32,
    /// Priority class, 0 most urgent (issue 11): the class of its chunks,
    /// or `stream::DEFAULT_CLASS` for a message sent whole. Orders the
    /// re-dispatch queue, the message's chunks on a chunked node link
    /// (`NodeConn::queue_class`) and the result's chunks back to the user.
    class: u8,
    /// When it was (last) handed to a node: its round trip adapts the window.
    sent: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Assigned but not configured yet (before the user's first configuration).
    Idle,
    Configuring {
        deadline: Instant,
    },
    Ready,
}

/// One of the user's nodes.
struct Node {
    conn_id: u64,
    tx: NodeConn,
    slot: Slot,
    in_flight: HashMap<u32, Pending>,
    sent: u64,
    written: u64,
    last_progress: Instant,
}

/// A configuration that arrived while routing: applied (or refused) once
/// no data is in flight, so its answer comes after every earlier result.
enum NextCfg {
    Apply(Configuration, Bytes),
    Refuse(ProtocolError),
}

/// Why the session ends. Logged with the user's address.
enum End {
    Closed,
    Error(String),
    /// The hello asked for a group: [`crate::group`] serves the rest.
    Group,
}

struct Handler {
    shared: Arc<Shared>,
    /// The user's connection, its hello, phase and configuration.
    conn: UserConn,
    want: Option<u32>,
    cfg_frame: Option<OutFrame>,
    next_cfg: Option<NextCfg>,
    nodes: HashMap<u64, Node>,
    order: Order,
    /// Credit policy: each node's adaptive window (by node id; kept apart
    /// from [`Node`] so that taking and losing nodes need not know of it).
    windows: HashMap<u64, Window>,
    events: StreamMap<u64, UnboundedReceiverStream<NodeEvent>>,
    /// Nodes the pool hands to this user after it registered.
    ctl_tx: mpsc::UnboundedSender<Control>,
    ctl_rx: mpsc::UnboundedReceiver<Control>,
    registered: bool,
    redispatch: VecDeque<Pending>,
    next_internal: u32,
    /// Data messages received and not yet answered (the seed's data counter).
    outstanding: u64,
    /// Credits granted to the user and not yet used.
    credit: u64,
    /// Reasons nodes gave for refusing the current configuration.
    refusals: configure::Refusals,
    /// Last message from the user or answer to it (for --user-idle-timeout).
    last_activity: Instant,
    /// Handler notifications dropped: the user did not agree `spin-notify`.
    notes_dropped: crate::notes::Dropped,
}

/// Removes the user from the registry however the task ends.
struct Registered(Arc<Shared>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.registry.remove_user(self.1);
    }
}

pub(crate) async fn run(
    shared: Arc<Shared>,
    stream: Stream,
    peer: SocketAddr,
    stop: CancellationToken,
    prefix: &[u8],
    (user, entry): (u64, Arc<UserEntry>),
) {
    let _registered = Registered(shared.clone(), user);
    let (rd, wr) = stream.into_split();
    let out = Arc::new(Sink::new(wr));
    let writer = out.spawn_user_writer(shared.opts.io_timeout, peer, stop.clone());
    let (ctl_tx, ctl_rx) = mpsc::unbounded_channel::<Control>();
    let shared_max = shared.opts.max_message;
    let reader = FrameReader::new(rd, shared.opts.max_message)
        .with_prefix(prefix)
        .with_read_timeout(shared.opts.read_timeout);
    let mut h = Handler {
        conn: UserConn::new((user, entry), peer, reader, out, shared_max),
        shared,
        want: None,
        cfg_frame: None,
        next_cfg: None,
        nodes: HashMap::new(),
        order: Order::default(),
        windows: HashMap::new(),
        events: StreamMap::new(),
        ctl_tx,
        ctl_rx,
        registered: false,
        redispatch: VecDeque::new(),
        next_internal: 0,
        outstanding: 0,
        credit: 0,
        refusals: Default::default(),
        last_activity: Instant::now(),
        notes_dropped: Default::default(),
    };
    let mut end = h.main_loop(&stop).await;
    if let End::Group = end {
        // The agreed hello was queued by the main loop, which would have
        // written it before its next wait: the group code takes over first.
        h.flush_writes();
        end = match crate::group::serve(&h.shared, user, &mut h.conn.reader, &h.conn.out, &stop)
            .await
        {
            Ok(()) => End::Closed,
            Err(e) => End::Error(e),
        };
    }
    match &end {
        End::Closed => tracing::info!(user = %peer, "user session ended"),
        End::Error(e) => tracing::warn!(user = %peer, "user session ended: {e}"),
        End::Group => unreachable!("served above"),
    }
    h.release_nodes();
    h.conn.out.finish();
    drop(h);
    // The writer flushes what is queued (e.g. a final error) then exits.
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

impl Handler {
    async fn main_loop(&mut self, stop: &CancellationToken) -> End {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if let Err(e) = self.pump().await {
                return e;
            }
            self.publish();
            let read_user = self.wants_user_input();
            let unflushed = self.unflushed();
            let out = self.conn.out.clone();
            let chunks_waiting = self.conn.outbound.as_ref().is_some_and(|o| !o.is_empty());
            tokio::select! {
                biased;
                _ = stop.cancelled() => return End::Closed,
                Some((id, ev)) = self.events.next(), if !self.events.is_empty() => {
                    if let Err(e) = self.on_node_event(id, ev).await { return e; }
                }
                Some(c) = self.ctl_rx.recv() => match c {
                    Control::NodeJoined(conn) => self.adopt(conn),
                },
                _ = tick.tick() => {
                    if let Err(e) = self.check_idle().await { return e; }
                    self.check_timeouts();
                }
                // After node events, so a result that just arrived competes
                // by class for the next chunk; before user input, so reads
                // do not hold results back while the socket takes them.
                _ = out.room(crate::chunked::SINK_DEPTH), if chunks_waiting => {
                    if let Err(e) = self.feed_chunk() { return e; }
                }
                next = self.conn.next(), if read_user => {
                    self.last_activity = Instant::now();
                    let r = match next {
                        Next::Frame(f) => self.on_user_frame(f).await,
                        Next::Placed(whole) => self.on_placed(whole).await,
                        Next::Closed => return End::Closed,
                        Next::Fatal(code, reason) => return self.fail_user(ErrorMsg::NO_ID, code, reason).await,
                        Next::Failed(e) => return End::Error(e),
                    };
                    if let Err(e) = r { return e; }
                }
                // Last, so only when nothing else is ready: what this
                // wake-up produced goes out in one write per socket.
                _ = std::future::ready(()), if unflushed => self.flush_writes(),
            }
        }
    }

    /// Counters for the status extension: two relaxed stores per event.
    fn publish(&self) {
        self.conn
            .entry
            .outstanding
            .store(self.outstanding, Ordering::Relaxed);
        self.conn
            .entry
            .queued
            .store(self.redispatch.len() as u64, Ordering::Relaxed);
    }

    /// Reads from the user only when the message could be acted on at once;
    /// otherwise the data waits in the user's socket (TCP back-pressure).
    fn wants_user_input(&mut self) -> bool {
        match self.conn.phase {
            Phase::Initial => true,
            Phase::Configuring => false,
            Phase::Routing => {
                self.next_cfg.is_none()
                    && ((self.redispatch.is_empty()
                        && self.pick_node(false, DEFAULT_CLASS).is_some())
                        || self.reads_ahead())
            }
        }
    }

    /// A `chunks` user under credit is read even while its nodes are busy:
    /// what it sends then waits in the server's re-dispatch queue, served
    /// by class, instead of in its socket behind the bulk messages it sent
    /// first. Credit bounds how much that can be.
    fn reads_ahead(&self) -> bool {
        self.conn.inbound.is_some()
            && self.conn.agreed(features::CREDIT)
            && self.redispatch.len() < crate::chunked::READ_AHEAD
    }

    /// A user with nothing outstanding that has been silent for
    /// `--user-idle-timeout` while another user waits with no node at all
    /// ends its session, so its nodes go back to the pool. Without
    /// contention an idle session keeps its nodes: a program that pauses
    /// between batches is not punished for it. Ending it (rather than keeping a
    /// session without nodes) is deliberate: giving the nodes back silently
    /// would mean re-acquiring and re-configuring them behind the user's back
    /// later, a delay and a failure (no node free) a seed-format user could
    /// not be told about; an explicit end is something every client sees.
    async fn check_idle(&mut self) -> Result<(), End> {
        let limit = self.shared.opts.user_idle_timeout;
        let busy = self.outstanding > 0
            || self.conn.outbound.as_ref().is_some_and(|o| !o.is_empty())
            || !self.redispatch.is_empty()
            || self.next_cfg.is_some()
            || self.conn.phase == Phase::Configuring;
        if busy
            || self.nodes.is_empty()
            || self.last_activity.elapsed() <= limit
            || !self.shared.pool.someone_starved(self.conn.user)
        {
            return Ok(());
        }
        let reason = format!(
            "idle for {limit:?} with nothing outstanding while another user waits for nodes; \
             session ended and its {} node(s) returned to the pool (--user-idle-timeout)",
            self.nodes.len()
        );
        if self.conn.hello.is_some() {
            Err(self
                .fail_user(ErrorMsg::NO_ID, ErrorCode::Timeout, reason)
                .await)
        } else {
            // A seed-format user has no way to hear a reason: just close.
            tracing::info!(user = %self.conn.peer, "{reason}");
            Err(End::Error(reason))
        }
    }

    async fn send_user(&mut self, f: OutFrame) -> Result<(), End> {
        // Back-pressure: when the user stops reading, the handler (and so
        // the nodes' results) waits after a few queued messages. Written
        // when the handler is about to wait (`flush_writes`).
        Ok(self.conn.send(f).await?)
    }

    /// A result to the user: whole, or as chunks of its class to a
    /// `chunks` user. The chunks go out as the socket takes them
    /// ([`Handler::feed_chunk`]); like [`Handler::send_user`], the handler
    /// waits once a queue's worth of results is waiting.
    async fn send_result(&mut self, id: u32, class: u8, data: bytes::Bytes) -> Result<(), End> {
        let Some(o) = self.conn.outbound.as_mut() else {
            return match OutFrame::data(id, data) {
                Ok(f) => self.send_user(f).await,
                Err(e) => Err(self.fail_user(id, e.code(), e.to_string()).await),
            };
        };
        if let Err(e) = o.push(id, class, data) {
            return Err(self.fail_user(id, ErrorCode::Internal, e.to_string()).await);
        }
        while self
            .conn
            .outbound
            .as_ref()
            .is_some_and(|o| o.len() > USER_QUEUE)
        {
            self.conn.out.room(crate::chunked::SINK_DEPTH).await;
            self.feed_chunk()?;
        }
        Ok(())
    }

    /// Hands the most urgent waiting chunk to the user's sink.
    fn feed_chunk(&mut self) -> Result<(), End> {
        self.conn.feed_chunk().map_err(End::Error)
    }

    async fn send_error(
        &mut self,
        id: u32,
        code: ErrorCode,
        reason: impl Into<String>,
    ) -> Result<(), End> {
        Ok(self.conn.send_error(id, code, reason).await?)
    }

    async fn send_response(&mut self, ok: bool) -> Result<(), End> {
        Ok(self.conn.send_response(ok).await?)
    }

    /// Reports a fatal error to the user (as the protocol allows) and ends the session.
    async fn fail_user(&mut self, id: u32, code: ErrorCode, reason: String) -> End {
        self.shared
            .metrics
            .error(crate::metrics::ErrorKind::UserError);
        tracing::warn!(user = %self.conn.peer, "{reason}");
        self.conn.report(id, code, &reason).await;
        End::Error(reason)
    }
}

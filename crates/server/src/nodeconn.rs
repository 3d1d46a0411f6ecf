//! A node connection: a reader task and a writer task that live as long as
//! the TCP connection, whoever currently owns the node (pool or user handler).
//! The owner sends through a `Sink` (written directly by the owner's task
//! when the socket is idle, else by the writer task) and hears from the node
//! through a channel, so ownership moves by moving a [`NodeConn`] value,
//! without touching the socket.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::tls::Stream;
use corefarm_smp::codec::{FrameReader, Read, ReadError};
use corefarm_smp::stream::{Chunk, Reassembler, DEFAULT_CLASS};

use crate::chunked::Inbound;
use corefarm_smp::{
    hello::features, ErrorCode, ErrorMsg, Frame, Hello, MsgType, OutFrame, ProtocolError,
};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::registry::{NodeEntry, NodeInfo};
use crate::sink::Sink;
use crate::ServerState;

/// Frames read from a node but not yet handled by its owner. Bounding them
/// makes a node's socket back up when the owner (ultimately the user) is slow.
const READ_AHEAD: usize = 16;

/// Results a node may have begun as chunks and not finished: a corefarm
/// node sends one chunked message per class at a time, so 8 at most.
const MAX_OPEN_RESULTS: usize = 16;

/// The chunk size in force on a node link: the smaller of the node's and
/// the server's (`--node-chunk-size`), or 0 (no chunks) when either side
/// does not want them. A node that lists the feature without a size takes
/// the server's.
pub(crate) fn negotiate_chunks(h: &Hello, ours: u32) -> u32 {
    if !h.has(features::CHUNKS) {
        return 0;
    }
    match h.chunk_size {
        Some(theirs) => theirs.min(ours),
        None => ours,
    }
}

/// Bytes a chunked result's buffer is given at its first chunk (it grows
/// past that as chunks arrive): large results are not copied as they grow,
/// yet a node cannot make the server reserve memory by announcing lengths.
const PREALLOCATE: u64 = 8 << 20;

pub enum NodeEvent {
    /// A frame from the node; the permit is released when the owner is done with it.
    Frame(Frame, OwnedSemaphorePermit),
    /// This many frames handed to the writer have been written to the
    /// socket (only reported when the dispatch policy needs it).
    Written(u64),
    /// The connection is gone; no further events follow.
    Closed(String),
}

/// Held by both tasks of a connection: when the last one ends, the node
/// leaves the registry and its `--max-nodes` slot is free again.
struct Slot {
    shared: Arc<ServerState>,
    entry: Arc<NodeEntry>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Out of the free pool first, so that a node no longer in the
        // registry holds no socket either.
        self.shared.pool.forget(self.entry.id);
        self.shared.registry.remove_node(&self.entry);
    }
}

pub struct NodeConn {
    pub id: u64,
    pub addr: SocketAddr,
    /// Identity and counters shown by the status extension.
    pub entry: Arc<NodeEntry>,
    sink: Arc<Sink>,
    /// Reports a frame the owner wrote itself, for policies that count writes.
    ev_tx: Option<mpsc::UnboundedSender<NodeEvent>>,
    pub events: mpsc::UnboundedReceiver<NodeEvent>,
    closed: Arc<AtomicBool>,
    kill: CancellationToken,
}

impl NodeConn {
    /// Starts the connection's tasks. `permit` is its `--max-nodes` slot;
    /// `prefix` holds bytes authentication already read from the stream.
    /// The receiver completes once the node's hello has been answered (and
    /// fails when the connection ends first); the node is not registered
    /// until the caller says so.
    pub(crate) fn start(
        stream: Stream,
        addr: SocketAddr,
        shared: &Arc<ServerState>,
        permit: OwnedSemaphorePermit,
        kill: CancellationToken,
        prefix: &[u8],
    ) -> (NodeConn, oneshot::Receiver<()>) {
        let id = shared.next_id();
        let entry = Arc::new(NodeEntry::new(id, addr));
        let (introduced_tx, introduced) = oneshot::channel();
        let slot = Arc::new(Slot {
            shared: shared.clone(),
            entry: entry.clone(),
            _permit: permit,
        });
        let (rd, wr) = stream.into_split();
        // Queue and stack hand a node its next message once the previous
        // write completed; the credit policy does not need write completions.
        let track_writes = shared.opts.policy != crate::Policy::Credit;
        let sink = Arc::new(if track_writes {
            Sink::via_task(wr)
        } else {
            Sink::new(wr)
        });
        let (ev_tx, events) = mpsc::unbounded_channel::<NodeEvent>();
        let closed = Arc::new(AtomicBool::new(false));
        let io_timeout = shared.opts.io_timeout;

        // Writer: frames the owner's direct writes left queued, in order.
        {
            let (ev_tx, closed, kill) = (ev_tx.clone(), closed.clone(), kill.clone());
            let (slot, sink) = (slot.clone(), sink.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let on_written = |n| {
                    if track_writes {
                        let _ = ev_tx.send(NodeEvent::Written(n));
                    }
                };
                let reason = tokio::select! {
                    _ = kill.cancelled() => "connection closed by the server".to_string(),
                    r = sink.run(io_timeout, on_written) => r.unwrap_or_else(|| "owner gone".into()),
                };
                sink.close(&reason);
                closed.store(true, Ordering::Release);
                kill.cancel();
                let _ = ev_tx.send(NodeEvent::Closed(reason));
            });
        }
        // Reader: frames to the owner; hellos are answered here so that no
        // owner ever has to care about them.
        {
            let (sink, closed, kill, entry) =
                (sink.clone(), closed.clone(), kill.clone(), entry.clone());
            let ev_tx = ev_tx.clone();
            let max = shared.opts.max_message;
            let prefix = prefix.to_vec();
            let read_timeout = shared.opts.read_timeout;
            let chunk_size = shared.opts.node_chunk_size;
            let metrics = shared.metrics.clone();
            // What a node sends is charged to the memory budget as it
            // arrives, as a user's is.
            let budget = shared.budget.clone();
            let mut introduced = Some(introduced_tx);
            tokio::spawn(async move {
                let _slot = slot;
                let permits = Arc::new(Semaphore::new(READ_AHEAD));
                let mut reader = FrameReader::new(rd, max)
                    .with_prefix(&prefix)
                    .with_read_timeout(read_timeout)
                    .with_meter(Box::new(budget.charge()))
                    .release_when_idle();
                // Set once the node negotiated chunks: its chunked results.
                let mut results: Option<Inbound> = None;
                let mut errors = false;
                let reason = loop {
                    let permit = tokio::select! {
                        _ = kill.cancelled() => break "connection closed by the server".to_string(),
                        p = permits.clone().acquire_owned() => p.expect("never closed"),
                    };
                    // Chunked results after their first chunk are read
                    // straight into their buffers.
                    let r = tokio::select! {
                        _ = kill.cancelled() => break "connection closed by the server".to_string(),
                        r = reader.read_with(results.as_mut()) => r,
                    };
                    let link = &_slot.entry.m.link;
                    let r = match r {
                        Ok(Some(Read::Frame(f))) => {
                            link.received(f.payload.len() + corefarm_smp::HEADER_LEN);
                            Ok(Some(f))
                        }
                        Ok(Some(Read::Placed { chunk, whole })) => {
                            link.received(crate::chunked::wire_len(&chunk));
                            let Some(m) = whole else { continue };
                            let f = Frame {
                                ty: MsgType::Data,
                                payload: m.data,
                            };
                            if ev_tx.send(NodeEvent::Frame(f, permit)).is_err() {
                                break "owner gone".into();
                            }
                            continue;
                        }
                        // A placed chunk that broke a rule, as one read whole;
                        // a node over the memory budget is refused alike.
                        Err(ReadError::Protocol(
                            e @ (ProtocolError::BadChunk(_) | ProtocolError::OverBudget(_)),
                        )) => {
                            if matches!(e, ProtocolError::OverBudget(_)) {
                                metrics.error(crate::metrics::ErrorKind::OverBudget);
                            }
                            if errors {
                                let m = ErrorMsg::new(ErrorMsg::NO_ID, e.code(), e.to_string());
                                sink.send(m.to_frame(), false);
                            }
                            break format!("{e}");
                        }
                        Ok(None) => Ok(None),
                        Err(e) => Err(e),
                    };
                    match r {
                        Ok(Some(f)) if f.ty == MsgType::Hello => match Hello::decode(&f.payload) {
                            Ok(h) if h.role == "node" => {
                                let mut reply = Hello::new("server");
                                errors = h.has(features::ERROR);
                                reply.features = if errors {
                                    vec![features::ERROR.into()]
                                } else {
                                    vec![]
                                };
                                if h.has(features::SPIN_NOTIFY) {
                                    reply.features.push(features::SPIN_NOTIFY.into());
                                }
                                reply.max_message = Some(max);
                                // Before the node is visible: an owner reads it on
                                // the first result of another length.
                                let any_length = h.has(features::ANY_LENGTH);
                                entry.set_any_length(any_length);
                                if any_length {
                                    reply.features.push(features::ANY_LENGTH.into());
                                }
                                let chunk = negotiate_chunks(&h, chunk_size);
                                if chunk > 0 {
                                    reply.features.push(features::CHUNKS.into());
                                    reply.chunk_size = Some(chunk);
                                    // A result is at most `max`, id included.
                                    let most = max.saturating_sub(4) as u64;
                                    let r = Reassembler::new(most, MAX_OPEN_RESULTS, 2 * most)
                                        .chunk_limit(u64::from(chunk))
                                        .with_id_prefix()
                                        .preallocate(PREALLOCATE);
                                    results = Some(Inbound::new(r, false).charged(budget.charge()));
                                }
                                sink.send(reply.to_frame(), false);
                                // After the answer: no chunk goes out before it.
                                sink.set_chunk_size(chunk);
                                // Only now may a user see the node (and send it a
                                // configuration): nothing may reach a node before
                                // the answer that tells it which features it has.
                                entry.set_info(NodeInfo {
                                    name: h.name.clone(),
                                    targets: h.targets.clone(),
                                    hello: true,
                                    peer: h.peer.clone().filter(|_| h.has(features::PEER)),
                                    group_priority: h.has(features::GROUP_PRIORITY),
                                });
                                let targets = entry.info().targets;
                                tracing::info!(node = %entry.label(), "node hello: targets={targets:?}");
                                if let Some(t) = introduced.take() {
                                    let _ = t.send(());
                                }
                            }
                            Ok(h) => {
                                let why = format!("hello with role {:?} on the node port", h.role);
                                metrics.error(crate::metrics::ErrorKind::BadHello);
                                // A user that offered `error` hears which
                                // port it wants (nothing else was agreed).
                                if h.role == "user" && h.has(features::ERROR) {
                                    let hint = format!(
                                        "{why}: users connect to the server's user port \
                                         (--users-listen, 9999 by default)"
                                    );
                                    let m =
                                        ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Malformed, hint);
                                    sink.send(m.to_frame(), false);
                                }
                                break why;
                            }
                            // Only a peer that speaks the extensions sends a
                            // hello: it is told (`bad_hello`), as at the user port.
                            Err(e) => {
                                let why = format!("invalid hello: {e}");
                                let m = ErrorMsg::new(ErrorMsg::NO_ID, e.code(), why.as_str());
                                metrics.error(crate::metrics::ErrorKind::BadHello);
                                sink.send(m.to_frame(), false);
                                break why;
                            }
                        },
                        Ok(Some(f)) if f.ty == MsgType::Chunk => {
                            let Some(r) = results.as_mut() else {
                                break "a chunk message from a node that did not negotiate chunks"
                                    .into();
                            };
                            match Chunk::parse(f.payload).and_then(|c| r.push(c)) {
                                Ok(None) => {}
                                Ok(Some(m)) => {
                                    let f = Frame {
                                        ty: MsgType::Data,
                                        payload: m.data,
                                    };
                                    if ev_tx.send(NodeEvent::Frame(f, permit)).is_err() {
                                        break "owner gone".into();
                                    }
                                }
                                Err(e) => {
                                    if errors {
                                        let why = e.to_string();
                                        let m = ErrorMsg::new(ErrorMsg::NO_ID, e.code(), why);
                                        sink.send(m.to_frame(), false);
                                    }
                                    break format!("{e}");
                                }
                            }
                        }
                        Ok(Some(f)) => {
                            if ev_tx.send(NodeEvent::Frame(f, permit)).is_err() {
                                break "owner gone".into();
                            }
                        }
                        Ok(None) => break "node closed the connection".into(),
                        // A first hello too large to read: told like one
                        // that does not decode.
                        Err(ReadError::Protocol(e))
                            if introduced.is_some()
                                && reader.begun_type() == Some(MsgType::Hello as u8) =>
                        {
                            let why = format!("invalid hello: {e}");
                            let m = ErrorMsg::new(ErrorMsg::NO_ID, e.code(), why.as_str());
                            metrics.error(crate::metrics::ErrorKind::BadHello);
                            sink.send(m.to_frame(), false);
                            break why;
                        }
                        Err(e) => break format!("{e}"),
                    }
                };
                if !kill.is_cancelled() {
                    // Owners log their own losses; this covers free nodes too.
                    tracing::info!(node = %entry.label(), "node connection ended: {reason}");
                }
                closed.store(true, Ordering::Release);
                kill.cancel();
                let _ = ev_tx.send(NodeEvent::Closed(reason));
            });
        }
        let conn = NodeConn {
            id,
            addr,
            entry,
            sink,
            ev_tx: track_writes.then_some(ev_tx),
            events,
            closed,
            kill,
        };
        (conn, introduced)
    }

    /// Sends a frame to the node now (written at once when the socket is
    /// idle, else by the writer task). Returns false if the connection is gone.
    pub fn send(&self, f: OutFrame) -> bool {
        let ok = self.queue(f);
        self.flush();
        ok
    }

    /// Queues a frame for the next [`NodeConn::flush`], so that the frames
    /// an owner produces in one wake-up share a `writev`. Returns false if
    /// the connection is gone.
    pub fn queue(&self, f: OutFrame) -> bool {
        self.queue_class(f, DEFAULT_CLASS)
    }

    /// [`NodeConn::queue`] of a data message in priority `class` (0 is
    /// served first): on a link with chunks, a message larger than the
    /// chunk size goes as chunks, interleaved with others by class.
    pub fn queue_class(&self, f: OutFrame, class: u8) -> bool {
        // Counted when handed to the socket's queue, by the node's one
        // owner (a session's handler, or the scheduler of shared nodes).
        self.entry.m.link.sent(f.wire_len());
        self.sink.push_class(f, class, true)
    }

    /// [`NodeConn::send`] in priority `class`.
    pub fn send_class(&self, f: OutFrame, class: u8) -> bool {
        let ok = self.queue_class(f, class);
        self.flush();
        ok
    }

    /// Writes the queued frames (see `Sink::flush`).
    pub fn flush(&self) {
        let written = self.sink.flush();
        if written > 0 {
            // Counted like the writer task's completions (queue and stack).
            if let Some(ev) = &self.ev_tx {
                let _ = ev.send(NodeEvent::Written(written));
            }
        }
    }

    /// Frames were queued that only a flush will write.
    pub fn unflushed(&self) -> bool {
        self.sink.unflushed()
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Closes the connection (the node manager reconnects and starts afresh).
    pub fn close(&self) {
        self.kill.cancel();
    }

    /// `name@address`, as every log line names a node.
    pub fn label(&self) -> String {
        self.entry.label()
    }
}

//! A node connection: a reader task and a writer task that live as long as
//! the TCP connection, whoever currently owns the node (pool or user handler).
//! The owner talks to them through channels, so ownership moves by moving a
//! [`NodeConn`] value, without touching the socket.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use corefarm_smp::codec::{write_batch, FrameReader};
use corefarm_smp::{hello::features, Frame, Hello, MsgType, OutFrame};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::registry::{NodeEntry, NodeInfo};
use crate::Shared;

/// Frames read from a node but not yet handled by its owner. Bounding them
/// makes a node's socket back up when the owner (ultimately the user) is slow.
const READ_AHEAD: usize = 16;

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
    shared: Arc<Shared>,
    id: u64,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.registry.remove_node(self.id);
    }
}

pub struct NodeConn {
    pub id: u64,
    pub addr: SocketAddr,
    /// Identity and counters shown by the status extension.
    pub entry: Arc<NodeEntry>,
    tx: mpsc::UnboundedSender<(OutFrame, bool)>,
    pub events: mpsc::UnboundedReceiver<NodeEvent>,
    closed: Arc<AtomicBool>,
    kill: CancellationToken,
}

impl NodeConn {
    /// Starts the connection's tasks. `permit` is its `--max-nodes` slot.
    pub(crate) fn start(
        stream: TcpStream,
        addr: SocketAddr,
        shared: &Arc<Shared>,
        permit: OwnedSemaphorePermit,
        kill: CancellationToken,
    ) -> NodeConn {
        let id = shared.next_id();
        let entry = Arc::new(NodeEntry::new(id, addr));
        shared.registry.add_node(entry.clone());
        let slot = Arc::new(Slot {
            shared: shared.clone(),
            id,
            _permit: permit,
        });
        let (rd, mut wr) = stream.into_split();
        // The flag says whether the owner wants a `Written` event for the frame
        // (hello replies are the connection's own business).
        let (tx, mut out_rx) = mpsc::unbounded_channel::<(OutFrame, bool)>();
        let (ev_tx, events) = mpsc::unbounded_channel::<NodeEvent>();
        let closed = Arc::new(AtomicBool::new(false));
        let io_timeout = shared.opts.io_timeout;
        // Queue and stack hand a node its next message once the previous
        // write completed; the credit policy does not need write completions.
        let track_writes = shared.opts.policy != crate::Policy::Credit;

        // Writer: frames from the owner, in order, one at a time.
        {
            let (ev_tx, closed, kill) = (ev_tx.clone(), closed.clone(), kill.clone());
            let slot = slot.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let reason = loop {
                    let (f, notify) = tokio::select! {
                        _ = kill.cancelled() => break "connection closed by the server".to_string(),
                        f = out_rx.recv() => match f { Some(f) => f, None => break "owner gone".to_string() },
                    };
                    let mut notified = notify as u64;
                    let mut bytes = f.wire_len();
                    let more = || {
                        out_rx.try_recv().ok().map(|(f, n)| {
                            notified += n as u64;
                            bytes += f.wire_len();
                            f
                        })
                    };
                    match tokio::time::timeout(io_timeout, write_batch(&mut wr, f, more)).await {
                        Ok(Ok(_)) => {
                            _slot
                                .shared
                                .metrics
                                .bytes(crate::metrics::Link::NodeOut, bytes);
                            if track_writes && notified > 0 {
                                let _ = ev_tx.send(NodeEvent::Written(notified));
                            }
                        }
                        Ok(Err(e)) => break format!("write failed: {e}"),
                        Err(_) => break format!("write made no progress for {io_timeout:?}"),
                    }
                };
                closed.store(true, Ordering::Release);
                kill.cancel();
                let _ = ev_tx.send(NodeEvent::Closed(reason));
            });
        }
        // Reader: frames to the owner; hellos are answered here so that no
        // owner ever has to care about them.
        {
            let (tx, closed, kill, entry) =
                (tx.clone(), closed.clone(), kill.clone(), entry.clone());
            let max = shared.opts.max_message;
            let read_timeout = shared.opts.read_timeout;
            tokio::spawn(async move {
                let _slot = slot;
                let permits = Arc::new(Semaphore::new(READ_AHEAD));
                let mut reader = FrameReader::new(rd, max).with_read_timeout(read_timeout);
                let reason = loop {
                    let permit = tokio::select! {
                        _ = kill.cancelled() => break "connection closed by the server".to_string(),
                        p = permits.clone().acquire_owned() => p.expect("never closed"),
                    };
                    let r = tokio::select! {
                        _ = kill.cancelled() => break "connection closed by the server".to_string(),
                        r = reader.read_frame() => r,
                    };
                    if let Ok(Some(f)) = &r {
                        _slot.shared.metrics.bytes(
                            crate::metrics::Link::NodeIn,
                            f.payload.len() + corefarm_smp::HEADER_LEN,
                        );
                    }
                    match r {
                        Ok(Some(f)) if f.ty == MsgType::Hello => match Hello::decode(&f.payload) {
                            Ok(h) if h.role == "node" => {
                                entry.set_info(NodeInfo {
                                    name: h.name.clone(),
                                    targets: h.targets.clone(),
                                    hello: true,
                                });
                                tracing::info!(node = %entry.label(), "node hello: targets={:?}", h.targets);
                                let mut reply = Hello::new("server");
                                reply.features = if h.has(features::ERROR) {
                                    vec![features::ERROR.into()]
                                } else {
                                    vec![]
                                };
                                reply.max_message = Some(max);
                                let _ = tx.send((reply.to_frame(), false));
                            }
                            Ok(h) => {
                                break format!("hello with role {:?} on the node port", h.role)
                            }
                            Err(e) => break format!("invalid hello: {e}"),
                        },
                        Ok(Some(f)) => {
                            if ev_tx.send(NodeEvent::Frame(f, permit)).is_err() {
                                break "owner gone".into();
                            }
                        }
                        Ok(None) => break "node closed the connection".into(),
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
        NodeConn {
            id,
            addr,
            entry,
            tx,
            events,
            closed,
            kill,
        }
    }

    /// Queues a frame for the node. Returns false if the connection is gone.
    pub fn send(&self, f: OutFrame) -> bool {
        self.tx.send((f, true)).is_ok()
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

//! Exclusive mode's placement: the nodes this user took from the pool,
//! owned by the session's task, so nothing on the data path takes a lock.
//!
//! - this file: the placement's state and its answers to the session;
//! - `configure`: configuring the nodes, and why none took a configuration;
//! - `routing`: dispatch by policy, credit windows, what nodes send back;
//! - `nodes`: taking, adopting, losing and releasing nodes; node timeouts;
//! - `progress`: late messages copied to another node, stalled nodes set
//!   aside ([`crate::dispatch::progress`]).

mod configure;
mod nodes;
mod progress;
mod routing;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use corefarm_smp::stream::DEFAULT_CLASS;
use corefarm_smp::{hello::features, Configuration, OutFrame, UserPhase as Phase};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

use crate::events::EventMap;

use super::{Admitted, Cx, Input, Placement, SessionEnd, View};
use crate::dispatch::{Order, Window};
use crate::nodeconn::{NodeConn, NodeEvent};
use crate::pool::Control;
use crate::ServerState;

/// A data message placed on this user's nodes and not yet answered.
struct Pending {
    user_id: u32,
    data: Bytes,
    count: u32,
    /// Priority class, 0 most urgent: orders the re-dispatch queue, the
    /// message's chunks on a chunked node link (`NodeConn::queue_class`)
    /// and the result's chunks back to the user.
    class: u8,
    /// When it was (last) handed to a node: its round trip adapts the window.
    sent: Instant,
    /// Handler notifications of it relayed so far (`notes::within`).
    notes: u32,
    /// Its other copy in flight (node, internal id) once it was hedged:
    /// the first answer of the two wins.
    twin: Option<(u64, u32)>,
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
    /// When it last answered anything, or was sent work while it had none.
    last_progress: Instant,
    /// Copies whose twin answered first, with when each was sent and its
    /// input count: their answer is dropped when it comes, but still
    /// measures this node's service time.
    late: HashMap<u32, (Instant, u32)>,
    /// This node's own service time, seconds per input (every answer of
    /// it, a late copy's included): a node slower than the others at the
    /// same function (an RTL simulation beside native cores) is judged by
    /// its own pace, not by theirs.
    service: Option<f64>,
    /// No progress for the stall bound: takes no new work until it answers.
    stalled: bool,
    /// In [`Owned::unflushed_nodes`].
    queued: bool,
}

/// What wakes an owned placement.
pub(crate) enum OwnedEvent {
    Node(u64, NodeEvent),
    /// The pool hands this user a node that joined.
    Joined(NodeConn),
    /// The progress rule has something to decide.
    Progress,
}

pub(crate) struct Owned {
    shared: Arc<ServerState>,
    user: u64,
    peer: SocketAddr,
    /// Its registry entry: the account its nodes' time is charged to.
    entry: Arc<crate::registry::UserEntry>,
    /// Nodes the hello asked for.
    want: Option<u32>,
    /// Its user's `max_nodes`, when its other sessions held them all at
    /// hello (so this one got none; the configuration's refusal says so).
    at_max_nodes: Option<u32>,
    /// The user agreed chunks: its urgent messages get a reserve.
    chunks: bool,
    /// The session's phase as this placement drives it: configuring from
    /// [`Placement::configure`] until it reports the answer, then routing
    /// (or initial again).
    phase: Phase,
    /// Output size of the configuration: a result's expected length.
    output_size: u32,
    cfg_frame: Option<OutFrame>,
    /// The targets of the configuration's image: a node that announced
    /// none of them is not sent it.
    carried: Option<corefarm_smp::targets::Carried>,
    nodes: HashMap<u64, Node>,
    /// Nodes in `nodes` whose slot is Ready: the user's credit is the
    /// window times their number, asked after every event.
    ready: usize,
    order: Order,
    /// Credit policy: the window every node of the session holds. One for
    /// all, judged on their results together: windows of their own competed
    /// for whatever the nodes share (the user's link, the server's CPU) —
    /// a node whose window grew took its neighbours' share, its own rate
    /// rose with it, and the windows drifted apart.
    window: Window,
    /// Nodes with frames queued since the last flush: the session waits
    /// after every wake-up, and looking through all of its nodes each time
    /// cost a pass over thousands of them per event.
    unflushed_nodes: Vec<u64>,
    events: EventMap<u64, UnboundedReceiverStream<NodeEvent>>,
    /// Nodes the pool hands to this user after it registered.
    ctl_tx: mpsc::UnboundedSender<Control>,
    ctl_rx: mpsc::UnboundedReceiver<Control>,
    registered: bool,
    /// The last wait for nodes ended with none: the next asks only what is
    /// free, so a user is not made to wait `--node-wait` twice (at hello,
    /// then at its configuration) for the same answer.
    waited_in_vain: bool,
    /// The user agreed `moves-on`: it has other servers to go to.
    moves_on: bool,
    redispatch: VecDeque<Pending>,
    next_internal: u32,
    /// Reasons nodes gave for refusing the current configuration.
    refusals: configure::Refusals,
    /// Origin of the windows' clock (they time results as durations).
    clock: Instant,
    /// The configuration's work may be hedged (no streaming handler sets).
    hedgeable: bool,
    /// The configuration's measured service time, seconds per input.
    service: Option<f64>,
    /// Late messages (node, internal id) waiting for a node to take their copy.
    due: Vec<(u64, u32)>,
    /// Hedged messages whose two copies are both in flight.
    hedged: usize,
    /// When the progress rule next needs a look, and the timer for it
    /// (reset only when that time changes).
    progress_at: Option<Instant>,
    armed: Option<Instant>,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Owned {
    /// `want` within its user's `max_nodes`, less the nodes its user's
    /// other sessions hold now. A user at its limit gets no node: its
    /// configuration is refused with the limit named (nodes it holds are
    /// in use; waiting for one of its own sessions to end is for it to
    /// decide, by trying again).
    fn capped(&mut self, want: Option<u32>) -> Option<u32> {
        let Some(a) = self.entry.account() else {
            return want;
        };
        let Some(max) = a.tenant.limits.max_nodes else {
            return want;
        };
        let held = self.shared.registry.nodes_held_by(a, self.user) as u32;
        let left = max.saturating_sub(held);
        if left == 0 && want != Some(0) {
            self.at_max_nodes = Some(max);
        }
        Some(want.map_or(left, |w| w.min(left)))
    }

    /// Charges its account node time (the session names the account
    /// before its first configuration, so before any node works for it).
    fn charge(&self, d: std::time::Duration) {
        if let Some(a) = self.entry.account() {
            a.node_time(d);
        }
    }

    pub(crate) fn new(
        shared: Arc<ServerState>,
        user: u64,
        peer: SocketAddr,
        entry: Arc<crate::registry::UserEntry>,
    ) -> Owned {
        let (ctl_tx, ctl_rx) = mpsc::unbounded_channel::<Control>();
        let window = Window::new(shared.opts.credit, shared.opts.credit_adaptive);
        Owned {
            shared,
            user,
            peer,
            entry,
            want: None,
            at_max_nodes: None,
            chunks: false,
            phase: Phase::Initial,
            output_size: 0,
            cfg_frame: None,
            carried: None,
            nodes: HashMap::new(),
            ready: 0,
            order: Order::default(),
            window,
            unflushed_nodes: Vec::new(),
            events: EventMap::new(),
            ctl_tx,
            ctl_rx,
            registered: false,
            waited_in_vain: false,
            moves_on: false,
            redispatch: VecDeque::new(),
            next_internal: 0,
            refusals: Default::default(),
            clock: Instant::now(),
            hedgeable: true,
            service: None,
            due: Vec::new(),
            hedged: 0,
            progress_at: None,
            armed: None,
            timer: Box::pin(tokio::time::sleep(std::time::Duration::ZERO)),
        }
    }

    /// A `chunks` user under credit is read even while its nodes are busy:
    /// what it sends then waits in the re-dispatch queue, served by class,
    /// instead of in its socket behind the bulk messages it sent first.
    /// Credit bounds how much that can be.
    fn reads_ahead(&self, credit: bool) -> bool {
        self.chunks && credit && self.redispatch.len() < crate::chunked::READ_AHEAD
    }
}

impl Placement for Owned {
    type Event = OwnedEvent;

    const FEATURES: &'static [&'static str] = &[
        features::ERROR,
        features::CREDIT,
        features::STATUS,
        features::ANY_LENGTH,
        features::SPIN_NOTIFY,
        features::MOVES_ON,
    ];

    const PACED_BY_READS: bool = true;

    async fn hello(&mut self, want: Option<u32>, chunks: bool, moves_on: bool) -> u32 {
        self.want = self.capped(want);
        self.chunks = chunks;
        self.moves_on = moves_on;
        self.take_nodes().await;
        self.nodes.len() as u32
    }

    async fn configure(
        &mut self,
        cfg: &Configuration,
        payload: Bytes,
        first: bool,
        cx: &mut Cx<'_>,
    ) {
        if first {
            self.take_nodes().await;
        } else {
            // Service times change with the configuration: windows start afresh.
            let opts = &self.shared.opts;
            self.window = Window::new(opts.credit, opts.credit_adaptive);
        }
        self.service = None;
        for n in self.nodes.values_mut() {
            n.service = None;
        }
        self.hedgeable = crate::dispatch::progress::hedgeable(&cfg.bitstream);
        self.start_configuring(cfg, payload, cx);
    }

    fn ready_for_data(&mut self, v: &View) -> bool {
        (self.redispatch.is_empty() && self.pick_node(false, DEFAULT_CLASS).is_some())
            || self.reads_ahead(v.credit)
    }

    fn data(
        &mut self,
        input: Input,
        _queue_full: bool,
        _cx: &mut Cx<'_>,
    ) -> Result<Admitted, SessionEnd> {
        self.dispatch(Pending {
            user_id: input.id,
            data: input.data,
            count: input.count,
            class: input.class,
            sent: Instant::now(),
            notes: 0,
            twin: None,
        });
        Ok(Admitted::Placed)
    }

    fn pump(&mut self) {
        // Late messages first: they are the oldest work.
        self.place_hedges();
        self.redispatch_waiting();
    }

    fn credit_window(&self) -> u64 {
        self.shared
            .opts
            .user_window
            .map_or_else(|| self.user_window(), |w| w as u64)
            .max(1)
            + u64::from(self.urgent_reserve(0))
    }

    async fn event(&mut self) -> OwnedEvent {
        if self.progress_at != self.armed {
            self.armed = self.progress_at;
            if let Some(at) = self.armed {
                self.timer.as_mut().reset(at);
            }
        }
        tokio::select! {
            biased;
            Some((id, ev)) = self.events.next(), if !self.events.is_empty() => OwnedEvent::Node(id, ev),
            _ = self.timer.as_mut(), if self.armed.is_some() => OwnedEvent::Progress,
            Some(c) = self.ctl_rx.recv() => match c {
                Control::NodeJoined(conn) => OwnedEvent::Joined(conn),
            },
            // Never: this placement holds a sender of `ctl_rx`.
            else => std::future::pending().await,
        }
    }

    fn handle(&mut self, ev: OwnedEvent, cx: &mut Cx<'_>) {
        match ev {
            OwnedEvent::Node(id, ev) => self.on_node_event(id, ev, cx),
            OwnedEvent::Joined(conn) => self.adopt(conn),
            OwnedEvent::Progress => {
                self.armed = None;
                self.check_progress();
            }
        }
    }

    fn tick(&mut self) {
        self.check_timeouts();
    }

    fn wanted_elsewhere(&self) -> Option<usize> {
        let idle = self.redispatch.is_empty() && !self.nodes.is_empty();
        (idle && self.shared.pool.someone_starved(self.user)).then_some(self.nodes.len())
    }

    fn label(&self, node: u64) -> Option<String> {
        self.nodes.get(&node).map(|n| n.tx.label())
    }

    fn queued(&self) -> u64 {
        self.redispatch.len() as u64
    }

    fn unflushed(&self) -> bool {
        !self.unflushed_nodes.is_empty()
    }

    fn flush(&mut self) {
        for id in self.unflushed_nodes.drain(..) {
            if let Some(n) = self.nodes.get_mut(&id) {
                n.queued = false;
                n.tx.flush();
            }
        }
    }

    fn finish(&mut self) {
        self.release_nodes();
    }
}

//! The task that owns every node in shared mode and runs [`Sched`].
//!
//! It is the pool's only taker (a waiter that wants every node), so nodes
//! reach it the same way they reach a user in exclusive mode. Users talk to
//! it through [`Handle`]; it answers each user on that user's channel. Node
//! I/O stays in [`crate::nodeconn`]: this task only turns events into
//! scheduler calls and scheduler actions into frames.
//!
//! Why one task owns every node: replicas of one function serve many users,
//! and choosing among them, moving a node between functions and
//! re-dispatching a dead node's work need one consistent view. One owner
//! keeps the data path free of locks, as the session's own task does for
//! exclusive nodes; the price is that all shared-mode data passes through
//! this task (a channel hop per message in and out).
//!
//! The seed's behaviour is kept where a seed user sees it: the session, not
//! the scheduler, drains a user's data in flight before a new configuration
//! and answers in seed terms; the scheduler answers a configuration once a
//! replica of its function exists.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::{
    ConfigurationResponse, Data, ErrorCode, ErrorMsg, MsgType, NodeState, Notification, OutFrame,
};
use tokio::sync::{mpsc, oneshot};

use super::places::Places;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

use crate::events::EventMap;
use tokio_util::sync::CancellationToken;

use super::{Action, FnId, Job, NodeBreach, Params, Sched};
use crate::nodeconn::{NodeConn, NodeEvent};
use crate::pool::{Control, Waiter};
use crate::ServerState;

/// From a user session to the scheduler.
pub enum Cmd {
    Join {
        user: u64,
        tx: mpsc::UnboundedSender<ToUser>,
        /// Its registry entry: the account node time is charged to.
        entry: Arc<crate::registry::UserEntry>,
    },
    Configure {
        user: u64,
        payload: Bytes,
        input_size: u32,
        output_size: u32,
        /// The user agreed `moves-on` ([`crate::sched::Sched::set_moves_on`]).
        moves_on: bool,
    },
    Data(Job),
    Leave {
        user: u64,
    },
    /// A group's gang allocation ([`Handle::lend`]).
    Lend {
        user: u64,
        n: usize,
        reply: oneshot::Sender<Result<Lent, LendRefused>>,
    },
    /// Nodes lent to a group that stopped waiting before it took them.
    Return {
        conns: Vec<NodeConn>,
    },
}

/// Nodes on their way to a group. Dropped before the group took them (its
/// wait ended in the instant they were sent, or its session went away),
/// they go back to the scheduler: a `NodeConn` dropped on its own would
/// leave its node connected and owned by nobody.
pub struct Lent {
    conns: Vec<NodeConn>,
    home: mpsc::WeakUnboundedSender<Cmd>,
}

impl Lent {
    fn take(mut self) -> Vec<NodeConn> {
        std::mem::take(&mut self.conns)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if self.conns.is_empty() {
            return;
        }
        let conns = std::mem::take(&mut self.conns);
        // No scheduler any more: the server is stopping and closes them.
        if let Some(home) = self.home.upgrade() {
            let _ = home.send(Cmd::Return { conns });
        }
    }
}

/// From the scheduler to one user session.
pub enum ToUser {
    /// The answer to its configuration; `queue` bounds its function's queue.
    Configured {
        ok: bool,
        errors: Vec<String>,
        queue: Arc<Places>,
    },
    Result {
        id: u32,
        data: Bytes,
        class: u8,
        /// Inputs of the data message (see [`Action::Result`]).
        count: u32,
    },
    Failed {
        id: u32,
        code: ErrorCode,
        reason: String,
    },
    /// A handler's notification, before the result of its message.
    Notification(crate::notes::Queued),
}

#[derive(Clone)]
pub struct Handle(mpsc::UnboundedSender<Cmd>);

impl Handle {
    /// False once the scheduler has stopped.
    pub fn send(&self, c: Cmd) -> bool {
        self.0.send(c).is_ok()
    }

    /// `n` nodes with a peer port for a group, all or none: `Err` at once
    /// (with the reason) when the scheduler has too few, otherwise once
    /// every promised node has finished the work already sent to it.
    /// Dropping the future gives back whatever was handed over meanwhile.
    pub async fn lend(&self, user: u64, n: usize) -> Result<Vec<NodeConn>, LendRefused> {
        let (reply, rx) = oneshot::channel();
        if !self.send(Cmd::Lend { user, n, reply }) {
            return Err(LendRefused::Stopped);
        }
        match rx.await {
            Ok(r) => r.map(Lent::take),
            Err(_) => Err(LendRefused::Stopped),
        }
    }
}

/// A group's request, filled in order as promised nodes become idle.
struct Loan {
    user: u64,
    need: usize,
    got: Vec<NodeConn>,
    reply: oneshot::Sender<Result<Lent, LendRefused>>,
}

/// Why the scheduler lends no nodes to a group; the message is part of
/// the reason the group's user reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LendRefused {
    #[error("the scheduler has stopped")]
    Stopped,
    #[error(
        "{peers} of the {nodes} shared nodes have a peer port ({promised} already promised \
         to groups; nodes being programmed are not taken)"
    )]
    TooFew {
        peers: usize,
        nodes: usize,
        promised: usize,
    },
}

/// Publishing the view costs a lock and a copy: at most this often while
/// events stream, and at every tick.
const PUBLISH_EVERY: Duration = Duration::from_millis(1);

pub(crate) fn start(shared: Arc<ServerState>, stop: CancellationToken) -> Handle {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(shared, rx, tx.downgrade(), stop));
    Handle(tx)
}

fn params(shared: &ServerState) -> Params {
    let o = &shared.opts;
    Params {
        policy: o.policy,
        credit: o.credit,
        credit_adaptive: o.credit_adaptive,
        credit_max_bytes: o.credit_max_bytes,
        node_wait: o.node_wait,
        hedge: o.hedge,
        ..Params::new(o.monitor_period)
    }
}

/// A user's channel, its function, and its registry entry (its account).
type UserLink = (
    mpsc::UnboundedSender<ToUser>,
    Option<FnId>,
    Arc<crate::registry::UserEntry>,
);

struct Driver {
    shared: Arc<ServerState>,
    sched: Sched,
    start: Instant,
    conns: HashMap<u64, NodeConn>,
    events: EventMap<u64, UnboundedReceiverStream<NodeEvent>>,
    /// Each user's channel, function and registry entry.
    users: HashMap<u64, UserLink>,
    queues: HashMap<FnId, Arc<Places>>,
    loans: std::collections::VecDeque<Loan>,
    /// Where a [`Lent`] dropped on its way sends its nodes back.
    home: mpsc::WeakUnboundedSender<Cmd>,
    last_publish: Instant,
}

async fn run(
    shared: Arc<ServerState>,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    home: mpsc::WeakUnboundedSender<Cmd>,
    stop: CancellationToken,
) {
    let (ctl_tx, mut ctl_rx) = mpsc::unbounded_channel::<Control>();
    let me = shared.next_id();
    shared.pool.register(Waiter {
        user: me,
        tx: ctl_tx,
        want: None,
        have: 0,
        refused: Default::default(),
    });
    let mut d = Driver {
        sched: Sched::new(params(&shared)),
        start: Instant::now(),
        conns: HashMap::new(),
        events: EventMap::new(),
        users: HashMap::new(),
        queues: HashMap::new(),
        loans: Default::default(),
        home,
        last_publish: Instant::now(),
        shared,
    };
    for conn in d.shared.pool.take_for(me, None) {
        d.adopt(conn);
    }
    // The tick drives Algorithm 1 (every period) and the node deadlines.
    let mut tick = tokio::time::interval(d.sched.params().period.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The progress rule's next look; reset only when that time changes.
    let progress = tokio::time::sleep_until(d.start);
    tokio::pin!(progress);
    let mut progress_at = None;
    loop {
        let mut force = false;
        let next = d.sched.next_progress_check();
        if next != progress_at {
            progress_at = next;
            if let Some(at) = next {
                progress.as_mut().reset(d.start + at);
            }
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = &mut progress, if progress_at.is_some() => {
                progress_at = None;
                let now = d.now();
                d.sched.check_progress(now);
            }
            Some((id, ev)) = d.events.next(), if !d.events.is_empty() => d.on_node_event(id, ev),
            Some(Control::NodeJoined(conn)) = ctl_rx.recv() => d.adopt(conn),
            Some(c) = rx.recv() => d.on_cmd(c),
            _ = tick.tick() => {
                let now = d.now();
                d.sched.tick(now);
                d.drop_abandoned_loans();
                let o = &d.shared.opts;
                for (node, why) in d.sched.expired(now, o.config_timeout, o.node_timeout) {
                    if let Some(c) = d.conns.get(&node) {
                        tracing::warn!(node = %c.label(), "{why}");
                        c.close();
                    }
                }
                force = true;
            }
        }
        d.execute();
        if force || d.last_publish.elapsed() >= PUBLISH_EVERY {
            d.publish();
        }
    }
    d.shared.pool.unregister(me);
    for c in d.conns.values() {
        c.close();
    }
}

impl Driver {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn publish(&mut self) {
        *self.shared.view.lock().expect("view lock") = self.sched.view();
        self.last_publish = Instant::now();
    }

    fn adopt(&mut self, mut conn: NodeConn) {
        if conn.is_closed() {
            return;
        }
        let events = std::mem::replace(&mut conn.events, mpsc::unbounded_channel().1);
        self.events
            .insert(conn.id, UnboundedReceiverStream::new(events));
        conn.entry.assign(None);
        tracing::info!(node = %conn.label(), "node joins the shared pool");
        let id = conn.id;
        self.conns.insert(id, conn);
        let now = self.now();
        self.sched.add_node(id, now);
    }

    fn on_cmd(&mut self, c: Cmd) {
        let now = self.now();
        match c {
            Cmd::Join { user, tx, entry } => {
                self.sched.user_joined(user);
                self.users.insert(user, (tx, None, entry));
            }
            Cmd::Configure {
                user,
                payload,
                input_size,
                output_size,
                moves_on,
            } => {
                self.sched.set_moves_on(user, moves_on);
                // Its account is named by now (at admission, or at its hello
                // or first configuration): its weight is its tenant's.
                let account = self.users.get(&user).and_then(|u| u.2.account());
                if let Some(a) = account {
                    let (name, w) = (a.tenant.name.as_deref(), a.tenant.limits.weight);
                    self.sched.set_tenant(user, name, w);
                    self.sched.set_max_nodes(user, a.tenant.limits.max_nodes);
                }
                let f = self
                    .sched
                    .configure(user, payload, input_size, output_size, now);
                let o = &self.shared.opts;
                self.queues
                    .entry(f)
                    .or_insert_with(|| Arc::new(Places::new(o.queue_limit, &o.class_depths)));
                let old = self.users.get_mut(&user).and_then(|u| u.1.replace(f));
                self.forget_queue(old);
            }
            Cmd::Data(job) => self.sched.submit(job, now),
            Cmd::Leave { user } => {
                self.sched.user_gone(user, now);
                let old = self.users.remove(&user).and_then(|u| u.1);
                self.forget_queue(old);
            }
            Cmd::Return { conns } => {
                tracing::info!("{} nodes lent to a group that stopped waiting", conns.len());
                conns.into_iter().for_each(|c| self.adopt(c));
            }
            Cmd::Lend { user, n, reply } => {
                let candidates: Vec<u64> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| c.entry.info().peer.is_some())
                    .map(|(&id, _)| id)
                    .collect();
                if self.sched.lend(&candidates, n, now) {
                    tracing::info!(user, "lending {n} nodes to a group");
                    self.loans.push_back(Loan {
                        user,
                        need: n,
                        got: Vec::new(),
                        reply,
                    });
                } else {
                    let _ = reply.send(Err(LendRefused::TooFew {
                        peers: candidates.len(),
                        nodes: self.conns.len(),
                        promised: self.sched.lending(),
                    }));
                }
            }
        }
    }

    /// A node that left the scheduler goes to the oldest unfilled loan,
    /// or back into the scheduler if no group waits any more.
    fn hand_over(&mut self, node: u64) {
        let Some(mut conn) = self.conns.remove(&node) else {
            return;
        };
        if let Some(ev) = self.events.remove(&node) {
            conn.events = ev.into_inner();
        }
        self.drop_abandoned_loans();
        let Some(loan) = self.loans.front_mut() else {
            self.adopt(conn);
            return;
        };
        conn.entry.assign(Some(loan.user));
        loan.got.push(conn);
        if loan.got.len() == loan.need {
            let loan = self.loans.pop_front().expect("front");
            let lent = Lent {
                conns: loan.got,
                home: self.home.clone(),
            };
            if let Err(Ok(back)) = loan.reply.send(Ok(lent)) {
                back.take().into_iter().for_each(|c| self.adopt(c));
            }
        }
    }

    /// Loans whose group stopped waiting return what they were given.
    fn drop_abandoned_loans(&mut self) {
        let (gone, keep): (Vec<Loan>, Vec<Loan>) =
            self.loans.drain(..).partition(|l| l.reply.is_closed());
        self.loans = keep.into();
        for c in gone.into_iter().flat_map(|l| l.got) {
            self.adopt(c);
        }
    }

    /// A function's queue bound goes when its last user does.
    fn forget_queue(&mut self, f: Option<FnId>) {
        if let Some(f) = f {
            if !self.users.values().any(|u| u.1 == Some(f)) {
                self.queues.remove(&f);
            }
        }
    }

    fn on_node_event(&mut self, id: u64, ev: NodeEvent) {
        let now = self.now();
        let broke = match ev {
            NodeEvent::Written(n) => {
                self.sched.on_written(id, n, now);
                None
            }
            NodeEvent::Closed(reason) => {
                self.events.remove(&id);
                if let Some(c) = self.conns.remove(&id) {
                    tracing::warn!(node = %c.label(), "node lost: {reason}");
                }
                self.sched.remove_node(id, now);
                None
            }
            NodeEvent::Frame(f, _permit) => match f.ty {
                MsgType::Data => match Data::parse(f.payload) {
                    Ok(d) => {
                        let any = self.conns.get(&id).is_some_and(|c| c.entry.any_length());
                        self.sched.on_result(id, d.id, d.data, any, now).err()
                    }
                    Err(source) => Some(NodeBreach::Malformed {
                        what: "data message",
                        source,
                    }),
                },
                MsgType::ConfigurationResponse => {
                    let ok = ConfigurationResponse::parse(&f.payload).is_ok_and(|r| r.ok());
                    self.sched.on_config_response(id, ok, now).err()
                }
                MsgType::Error => match ErrorMsg::parse(&f.payload) {
                    Ok(e) => {
                        self.sched.on_node_error(id, e.id, e.code, &e.reason, now);
                        None
                    }
                    Err(source) => Some(NodeBreach::Malformed {
                        what: "error message",
                        source,
                    }),
                },
                MsgType::Notification => match Notification::parse(f.payload) {
                    Ok(n) => self.sched.on_notification(id, n).err(),
                    Err(source) => Some(NodeBreach::Malformed {
                        what: "notification",
                        source,
                    }),
                },
                other => Some(NodeBreach::Unexpected(other.name())),
            },
        };
        if let (Some(why), Some(c)) = (broke, self.conns.get(&id)) {
            // Its work is re-dispatched when the close is reported.
            tracing::warn!(node = %c.label(), "closing node: {why}");
            c.close();
        }
    }

    /// A node is programmed for `function`: the programming is charged
    /// to the function's users in equal parts.
    fn charge_programming(&self, function: FnId) {
        let mine = || self.users.values().filter(move |u| u.1 == Some(function));
        let n = mine().count();
        for u in mine() {
            if let Some(a) = u.2.account() {
                a.reconfigured(n);
            }
        }
    }

    fn execute(&mut self) {
        let mut unfit = Vec::new();
        for a in self.sched.take_actions() {
            match a {
                Action::Configure {
                    node,
                    payload,
                    function,
                } => {
                    let Some(c) = self.conns.get(&node) else {
                        continue;
                    };
                    if let Some(why) = unfit_for(c, &payload) {
                        unfit.push((node, why));
                        continue;
                    }
                    // Its reconfigurations and their duration count in its
                    // metrics from here to its response, as in exclusive mode.
                    let (label, cores) = corefarm_smp::Configuration::parse(payload.clone())
                        .map_or((function.short(), 0), |cfg| {
                            (crate::metrics::function_label(&cfg), cfg.cores.len())
                        });
                    c.entry.m.configuring(label, cores);
                    self.charge_programming(function);
                    match OutFrame::new(MsgType::Configuration, payload) {
                        Ok(f) => {
                            c.send(f);
                        }
                        Err(e) => c.close_with(&format!("configuration does not fit a frame: {e}")),
                    }
                }
                Action::Send {
                    node,
                    internal,
                    data,
                    class,
                    first,
                } => {
                    if let (Some(c), Ok(f)) =
                        (self.conns.get(&node), OutFrame::data(internal, data))
                    {
                        c.entry.m.dispatched(first, Instant::now().into_std());
                        // A failed send is followed by the node's Closed event.
                        c.send_class(f, class);
                    }
                }
                Action::Answered {
                    node,
                    idle,
                    failed,
                    user,
                } => {
                    if let Some(c) = self.conns.get(&node) {
                        let took = c.entry.m.answered(idle, failed, Instant::now().into_std());
                        let entry = user.and_then(|u| self.users.get(&u)).map(|u| &u.2);
                        if let Some(a) = entry.and_then(|e| e.account()) {
                            a.node_time(took);
                        }
                    }
                }
                Action::Configured { user, ok, errors } => {
                    tracing::debug!(user, ok, "configuration answered");
                    let Some((tx, f, _)) = self.users.get(&user) else {
                        continue;
                    };
                    let queue = f
                        .and_then(|f| self.queues.get(&f).cloned())
                        .unwrap_or_else(|| Arc::new(Places::new(1, &[])));
                    let _ = tx.send(ToUser::Configured { ok, errors, queue });
                }
                Action::Result {
                    node,
                    user,
                    id,
                    data,
                    class,
                    count,
                } => {
                    if let Some(c) = self.conns.get(&node) {
                        c.entry
                            .results
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    if let Some((tx, ..)) = self.users.get(&user) {
                        let _ = tx.send(ToUser::Result {
                            id,
                            data,
                            class,
                            count,
                        });
                    }
                }
                Action::Failed {
                    user,
                    id,
                    code,
                    reason,
                } => {
                    if let Some((tx, ..)) = self.users.get(&user) {
                        let _ = tx.send(ToUser::Failed { id, code, reason });
                    }
                }
                Action::State { node, state } => {
                    if let Some(c) = self.conns.get(&node) {
                        c.entry.set_state(state);
                        if state == NodeState::Configuring {
                            tracing::info!(node = %c.label(), "reconfiguring");
                        }
                    }
                }
                Action::Close { node, reason } => {
                    if let Some(c) = self.conns.get(&node) {
                        c.close_with(&reason);
                    }
                }
                Action::Lent { node } => self.hand_over(node),
                Action::Hedged { from, to } => {
                    self.shared.metrics.hedged();
                    tracing::debug!(from, to, "late message hedged");
                }
                Action::Duplicate { node } => {
                    self.shared.metrics.hedge_duplicate();
                    tracing::debug!(node, "late duplicate dropped");
                }
                Action::Stalled { node, stalled } => {
                    if let Some(c) = self.conns.get(&node) {
                        match stalled {
                            true => {
                                tracing::warn!(node = %c.label(), "no progress: no new work until it answers")
                            }
                            false => {
                                tracing::info!(node = %c.label(), "answered again: takes work")
                            }
                        }
                    }
                }
                Action::Notify { user, note } => {
                    if let Some((tx, ..)) = self.users.get(&user) {
                        match crate::notes::queue(&self.shared.budget, note) {
                            Ok(q) => {
                                let _ = tx.send(ToUser::Notification(q));
                            }
                            Err(e) => {
                                tracing::debug!(user, "handler notification dropped: {e}");
                                self.shared.metrics.notification(false);
                                self.shared
                                    .metrics
                                    .error(crate::metrics::ErrorKind::OverBudget);
                            }
                        }
                    }
                }
            }
        }
        self.refuse_unfit(unfit);
    }

    /// Nodes the scheduler chose for a configuration whose image they
    /// cannot run (their hello's targets) are not sent it: each refuses it
    /// at once, with the reason, and the scheduler never offers it to that
    /// node again.
    fn refuse_unfit(&mut self, unfit: Vec<(u64, String)>) {
        if unfit.is_empty() {
            return;
        }
        let now = self.now();
        for (node, why) in unfit {
            let code = ErrorCode::ConfigurationFailed as u32;
            self.sched
                .on_node_error(node, ErrorMsg::NO_ID, code, &why, now);
            // Never a breach: the node is configuring this function.
            let _ = self.sched.on_config_response(node, false, now);
        }
        self.execute();
    }
}

/// Why the node on `c` is not sent `payload`, a configuration: it
/// announced targets, none of which its image's artifacts are for.
fn unfit_for(c: &NodeConn, payload: &Bytes) -> Option<String> {
    let cfg = corefarm_smp::Configuration::parse(payload.clone()).ok()?;
    let carried = corefarm_smp::targets::Carried::of(&cfg.bitstream)?;
    let why = carried.fits(&c.entry.info().targets).err()?;
    tracing::info!(node = %c.label(), "node not configured: {why}");
    Some(why.to_string())
}

trait CloseWith {
    fn close_with(&self, reason: &str);
}

impl CloseWith for NodeConn {
    fn close_with(&self, reason: &str) {
        tracing::warn!(node = %self.label(), "closing node: {reason}");
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use corefarm_node::NodeOptions;
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    use crate::{Server, ServerOptions, Sharing, StatusHandle};

    const LIMIT: Duration = Duration::from_secs(15);

    /// The users of the named nodes, sorted.
    fn users(status: &StatusHandle) -> Vec<Option<u64>> {
        let mut u: Vec<Option<u64>> = status
            .get()
            .nodes
            .iter()
            .filter(|n| n.name.is_some())
            .map(|n| n.user)
            .collect();
        u.sort_unstable();
        u
    }

    async fn wait_for(status: &StatusHandle, what: &str, want: &[Option<u64>]) {
        let deadline = Instant::now() + LIMIT;
        while users(status) != want {
            assert!(
                Instant::now() < deadline,
                "{what}: nodes' users {:?}",
                users(status)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The group's side of a loan, dropped after the scheduler sent it the
    /// nodes but before it read them (the race `timeout_at` loses when its
    /// deadline and the reply land in the same poll): the nodes go back to
    /// the scheduler instead of staying connected and owned by nobody.
    /// One thread: between two of this test's polls of the loan, and
    /// between its look at the status and its poll, the driver cannot run.
    #[tokio::test(flavor = "current_thread")]
    async fn nodes_sent_to_a_group_that_stopped_waiting_come_back() {
        let server = Server::bind(ServerOptions {
            nodes_listen: "127.0.0.1:0".into(),
            users_listen: "127.0.0.1:0".into(),
            sharing: Sharing::Shared,
            ..ServerOptions::default()
        })
        .await
        .unwrap();
        let (shared, status, nodes) = (
            server.shared.clone(),
            server.status_handle(),
            server.nodes_addr(),
        );
        let stop = CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        tokio::spawn(server.run(stop.clone()));
        for i in 0..2 {
            let o = NodeOptions {
                server: nodes.to_string(),
                name: format!("n{i}"),
                peer_listen: Some("127.0.0.1:0".parse().unwrap()),
                ..NodeOptions::default()
            };
            tokio::spawn(corefarm_node::run(o, stop.child_token()));
        }
        wait_for(&status, "both nodes connected", &[None, None]).await;
        let h = shared.sched.get().expect("shared mode runs a scheduler");
        let mut cx = Context::from_waker(Waker::noop());
        let deadline = Instant::now() + LIMIT;
        let lend = loop {
            let mut lend = Box::pin(h.lend(7, 2));
            assert!(lend.as_mut().poll(&mut cx).is_pending());
            // Idle nodes are handed over at once: once both are marked the
            // group's, the reply is on its way, and it is never taken.
            let sent = loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                if users(&status) == [Some(7), Some(7)] {
                    break true;
                }
                match lend.as_mut().poll(&mut cx) {
                    Poll::Pending => {}
                    // Not both in the scheduler yet: ask again.
                    Poll::Ready(Err(_)) => break false,
                    Poll::Ready(Ok(_)) => unreachable!("nodes are marked before they are sent"),
                }
                assert!(Instant::now() < deadline, "no loan: {:?}", users(&status));
            };
            if sent {
                break lend;
            }
        };
        drop(lend);
        wait_for(&status, "both nodes back in the scheduler", &[None, None]).await;
    }
}

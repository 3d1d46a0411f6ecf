//! Shared nodes (seed 002 chapter 5): functions instead of owners.
//!
//! [`Sched`] is a pure state machine — no I/O, no clock of its own: every
//! event carries `now` (time since the scheduler started), and what must
//! happen is returned as [`Action`]s. So the whole policy is unit-tested
//! with a fake clock, and the async [`driver`] only moves bytes.
//!
//! - [`function`]: a function = the SHA-256 of a configuration payload;
//!   its measured service time and demand.
//! - [`queue`]: a function's job queue, deficit round-robin by bytes over users.
//! - [`classq`]: that queue per priority class, strict priority with a guard.
//! - [`algorithm1`]: the periodic reconfiguration (seed Algorithm 1) with the
//!   cost of reprogramming weighed in.
//! - `route`: what follows every event — failing refused functions,
//!   placing requested ones, finishing drains, dispatching queued jobs.
//! - [`driver`]: the task that owns every node in `--sharing shared` mode.
//! - [`session`]: a user connection in shared mode.
//! - [`first`]: which session a user gets (group users are lent nodes).
//! - `lend`: nodes promised to groups leave once their work is done.

pub mod algorithm1;
pub mod classq;
pub mod driver;
pub mod first;
pub mod function;
mod lend;
mod notify;
mod params;
pub mod places;
pub mod queue;
mod route;
pub mod session;
pub mod view;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::{ErrorCode, NodeState};

use crate::dispatch::{Order, Window};
pub use function::FnId;
use function::Function;
pub use params::{Params, Sharing};

/// A data message of one user, queued or in flight.
#[derive(Debug)]
pub struct Job {
    pub user: u64,
    /// The user's id for it.
    pub id: u32,
    pub data: Bytes,
    pub count: u32,
    /// Priority class, 0 most urgent (issue 11): orders the function's
    /// queue, and the job's chunks on a node link that negotiated chunks.
    pub class: u8,
    /// Its place in the function's bounded queue; released at dispatch.
    pub permit: Option<places::Place>,
    sent: Duration,
}

impl Job {
    pub fn new(user: u64, id: u32, data: Bytes, count: u32) -> Job {
        Job {
            user,
            id,
            data,
            count,
            class: corefarm_smp::stream::DEFAULT_CLASS,
            permit: None,
            sent: Duration::ZERO,
        }
    }
}

impl queue::Queued for Job {
    fn user(&self) -> u64 {
        self.user
    }
    fn bytes(&self) -> u64 {
        self.data.len() as u64
    }
    fn class(&self) -> u8 {
        self.class
    }
}

/// What the driver must do.
#[derive(Debug)]
pub enum Action {
    Configure {
        node: u64,
        payload: Bytes,
        /// The function it loads (for the node's metrics).
        function: FnId,
    },
    Send {
        node: u64,
        internal: u32,
        data: Bytes,
        /// The job's priority class: its chunks' class on a node link
        /// that negotiated chunks (issue 11).
        class: u8,
        /// Nothing else was in flight on the node: its busy time starts.
        first: bool,
    },
    /// A node answered a job (a result, or an error for it); `idle`: it
    /// has nothing else in flight (its busy time stops). For the node's
    /// metrics, as exclusive mode keeps them.
    Answered {
        node: u64,
        idle: bool,
        failed: bool,
    },
    /// The answer to a user's configuration (errors go before it).
    Configured {
        user: u64,
        ok: bool,
        errors: Vec<String>,
    },
    Result {
        node: u64,
        user: u64,
        id: u32,
        data: Bytes,
        /// The job's class: a `chunks` user gets the result in it.
        class: u8,
        /// Inputs in the job: a user without `any-length` expects count ×
        /// output size bytes, which a node with it need not send.
        count: u32,
    },
    Failed {
        user: u64,
        id: u32,
        code: ErrorCode,
        reason: String,
    },
    /// A handler's notification for the user's message `note.id`.
    Notify {
        user: u64,
        note: corefarm_smp::Notification,
    },
    State {
        node: u64,
        state: NodeState,
    },
    Close {
        node: u64,
        reason: String,
    },
    /// The node left the scheduler for a group; the driver hands it over.
    Lent {
        node: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum SlotState {
    /// Holds no function (new, or its configuration was refused).
    Empty,
    Configuring {
        target: FnId,
        since: Duration,
    },
    Ready,
    /// Takes no new work; once idle it is reconfigured for `target`.
    Draining {
        target: FnId,
    },
    /// Promised to a group: takes no new work; once idle it leaves the
    /// scheduler ([`Action::Lent`]).
    Lending,
}

#[derive(Debug)]
struct Slot {
    /// The function it holds (Ready, Draining).
    function: Option<FnId>,
    state: SlotState,
    in_flight: HashMap<u32, Job>,
    window: Window,
    sent: u64,
    written: u64,
    /// When its last job finished: the next one's service starts no earlier.
    busy_until: Duration,
    last_progress: Duration,
    /// Measured reconfiguration time (moving average).
    reconfig: Option<Duration>,
    /// Functions it refused: never offered again.
    refused: HashSet<FnId>,
}

impl Slot {
    /// The function it serves (Ready) or is being loaded or drained for:
    /// what it counts as a replica of (a draining node is promised to its
    /// target, so no second node is drained for the same function).
    fn promised_to(&self) -> Option<FnId> {
        match self.state {
            SlotState::Ready => self.function,
            SlotState::Configuring { target, .. } | SlotState::Draining { target } => Some(target),
            SlotState::Empty | SlotState::Lending => None,
        }
    }

    fn idle(&self) -> bool {
        self.in_flight.is_empty() && matches!(self.state, SlotState::Empty | SlotState::Ready)
    }
}

#[derive(Debug, Default)]
struct UserRec {
    function: Option<FnId>,
    in_flight: u64,
}

/// Forgotten functions whose reconfiguration counts [`Sched`] keeps.
const FORGOTTEN_MAX: usize = 4096;

pub struct Sched {
    p: Params,
    fns: HashMap<FnId, Function>,
    nodes: BTreeMap<u64, Slot>,
    orders: HashMap<FnId, Order>,
    users: HashMap<u64, UserRec>,
    /// Reconfigurations of functions no user wants and no node holds, so
    /// that the status keeps counting from there when one comes back (the
    /// same payload is the same function); at most [`FORGOTTEN_MAX`].
    forgotten: HashMap<FnId, u64>,
    next_internal: u32,
    period_start: Duration,
    /// Since when no node has been connected (for `node_wait`).
    no_nodes_since: Option<Duration>,
    out: Vec<Action>,
}

impl Sched {
    pub fn new(p: Params) -> Sched {
        Sched {
            p,
            fns: HashMap::new(),
            nodes: BTreeMap::new(),
            orders: HashMap::new(),
            users: HashMap::new(),
            forgotten: HashMap::new(),
            next_internal: 0,
            period_start: Duration::ZERO,
            no_nodes_since: Some(Duration::ZERO),
            out: Vec::new(),
        }
    }

    pub fn params(&self) -> &Params {
        &self.p
    }

    /// Everything decided since the last call, in order.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.out)
    }

    pub fn add_node(&mut self, node: u64, now: Duration) {
        self.nodes.insert(
            node,
            Slot {
                function: None,
                state: SlotState::Empty,
                in_flight: HashMap::new(),
                window: Window::new(self.p.credit, self.p.credit_adaptive),
                sent: 0,
                written: 0,
                busy_until: now,
                last_progress: now,
                reconfig: None,
                refused: HashSet::new(),
            },
        );
        self.no_nodes_since = None;
        self.settle(now);
    }

    /// A node is gone: its in-flight work goes back to the front of its
    /// users' queues, to be re-dispatched to another replica or to wait for one.
    pub fn remove_node(&mut self, node: u64, now: Duration) {
        self.detach(node, now);
        self.settle(now);
    }

    /// [`Sched::remove_node`] without the follow-up.
    fn detach(&mut self, node: u64, now: Duration) {
        let Some(slot) = self.nodes.remove(&node) else {
            return;
        };
        if let SlotState::Configuring { target, .. } = slot.state {
            if let Some(f) = self.fns.get_mut(&target) {
                // A configuration that kills or hangs nodes must not be
                // retried on every node forever (see `MAX_LOST_LOADS`).
                f.lost_loads += 1;
                f.note(format!("node {node} was lost while loading it"));
            }
        }
        if let Some(f) = slot.function {
            if let Some(o) = self.orders.get_mut(&f) {
                o.remove(node);
            }
        }
        let mut moved: Vec<(u32, Job)> = slot.in_flight.into_iter().collect();
        moved.sort_by_key(|(k, _)| std::cmp::Reverse(*k));
        for (_, j) in moved {
            if let Some(u) = self.users.get_mut(&j.user) {
                u.in_flight -= 1;
            }
            if let Some(f) = self
                .fns
                .get_mut(&slot.function.expect("in flight implies a function"))
            {
                f.queue.push_front(j);
            }
        }
        if let Some(f) = slot.function {
            if self.replicas_or_loading(f) == 0 {
                if let Some(func) = self.fns.get_mut(&f).filter(|f| f.wanted()) {
                    // Its users still want it: load it elsewhere.
                    func.requested.get_or_insert(now);
                }
            }
        }
        if let Some(f) = slot.function {
            self.forget_if_unused(f);
        }
        if self.nodes.is_empty() {
            self.no_nodes_since = Some(now);
        }
    }

    /// A user's configuration: registers or finds its function. Returns the
    /// function's id; the answer comes as [`Action::Configured`].
    pub fn configure(
        &mut self,
        user: u64,
        payload: Bytes,
        input_size: u32,
        output_size: u32,
        now: Duration,
    ) -> FnId {
        let id = FnId::of(&payload);
        self.leave_function(user);
        self.users.entry(user).or_default().function = Some(id);
        let forgotten = &mut self.forgotten;
        let f = self.fns.entry(id).or_insert_with(|| {
            let mut f = Function::new(id, payload, input_size, output_size);
            f.reconfigurations = forgotten.remove(&id).unwrap_or(0);
            f
        });
        f.users.insert(user);
        if self.replicas(id) > 0 {
            self.out.push(Action::Configured {
                user,
                ok: true,
                errors: vec![],
            });
        } else {
            let f = self.fns.get_mut(&id).expect("inserted");
            f.waiting.push(user);
            f.requested.get_or_insert(now);
        }
        self.settle(now);
        id
    }

    /// A data message of a configured user.
    pub fn submit(&mut self, job: Job, now: Duration) {
        let fid = self.users.get(&job.user).and_then(|u| u.function);
        let Some(f) = fid.and_then(|id| self.fns.get_mut(&id)) else {
            let (user, id) = (job.user, job.id);
            let reason = "data message before a successful configuration".to_string();
            self.out.push(Action::Failed {
                user,
                id,
                code: ErrorCode::NotConfigured,
                reason,
            });
            return;
        };
        f.queue.push(job);
        let id = f.id;
        if self.replicas(id) == 0 {
            self.fns
                .get_mut(&id)
                .expect("exists")
                .requested
                .get_or_insert(now);
        }
        self.settle(now);
    }

    /// The user left: its queued work is dropped, results still in flight
    /// will be discarded.
    pub fn user_gone(&mut self, user: u64, now: Duration) {
        self.leave_function(user);
        self.users.remove(&user);
        self.settle(now);
    }

    fn leave_function(&mut self, user: u64) {
        let Some(old) = self.users.get_mut(&user).and_then(|u| u.function.take()) else {
            return;
        };
        if let Some(f) = self.fns.get_mut(&old) {
            f.users.remove(&user);
            f.waiting.retain(|&u| u != user);
            drop(f.queue.remove_user(user));
        }
        self.forget_if_unused(old);
    }

    fn forget_if_unused(&mut self, id: FnId) {
        let held = self.nodes.values().any(|s| {
            s.function == Some(id)
                || matches!(s.state, SlotState::Configuring { target, .. } if target == id)
        });
        if !held && self.fns.get(&id).is_some_and(|f| !f.wanted()) {
            if let Some(f) = self.fns.remove(&id).filter(|f| f.reconfigurations > 0) {
                if self.forgotten.len() >= FORGOTTEN_MAX {
                    // Any one: the bound is on memory, the counts are a courtesy.
                    let any = self.forgotten.keys().next().copied();
                    any.map(|k| self.forgotten.remove(&k));
                }
                self.forgotten.insert(id, f.reconfigurations);
            }
            self.orders.remove(&id);
        }
    }

    /// Replicas of a function that take work now.
    pub fn replicas(&self, id: FnId) -> usize {
        self.nodes
            .values()
            .filter(|s| s.function == Some(id) && s.state == SlotState::Ready)
            .count()
    }

    /// Replicas plus nodes being configured for it.
    fn replicas_or_loading(&self, id: FnId) -> usize {
        self.nodes
            .values()
            .filter(|s| s.promised_to() == Some(id))
            .count()
    }

    /// Sends `node` the configuration of `f`.
    fn reconfigure(&mut self, node: u64, f: FnId, now: Duration) {
        let Some(func) = self.fns.get(&f) else { return };
        let payload = func.payload.clone();
        let slot = self.nodes.get_mut(&node).expect("reconfigured node exists");
        let old = slot.function.take();
        if let Some(old) = old {
            if let Some(o) = self.orders.get_mut(&old) {
                o.remove(node);
            }
        }
        slot.state = SlotState::Configuring {
            target: f,
            since: now,
        };
        // Service times change with the function: the window starts afresh.
        slot.window = Window::new(self.p.credit, self.p.credit_adaptive);
        slot.sent += 1;
        // A function nobody uses any more, whose last replica this was, is
        // forgotten (the soak showed one kept per configuration otherwise).
        if let Some(old) = old.filter(|&o| o != f) {
            self.forget_if_unused(old);
        }
        self.out.push(Action::Configure {
            node,
            payload,
            function: f,
        });
        self.out.push(Action::State {
            node,
            state: NodeState::Configuring,
        });
    }

    pub fn on_config_response(&mut self, node: u64, ok: bool, now: Duration) -> Result<(), String> {
        let Some(slot) = self.nodes.get_mut(&node) else {
            return Ok(());
        };
        let SlotState::Configuring { target, since } = slot.state else {
            return Err("configuration response while not configuring".into());
        };
        let took = now.saturating_sub(since);
        slot.reconfig = Some(match slot.reconfig {
            Some(r) => (r * 3 + took) / 4,
            None => took,
        });
        slot.last_progress = now;
        slot.busy_until = now;
        if ok {
            slot.state = SlotState::Ready;
            slot.function = Some(target);
            self.orders.entry(target).or_default().add(node);
            self.out.push(Action::State {
                node,
                state: NodeState::Ready,
            });
            if let Some(f) = self.fns.get_mut(&target) {
                f.reconfigurations += 1;
                f.requested = None;
                f.lost_loads = 0;
                f.refusals.clear();
                for user in std::mem::take(&mut f.waiting) {
                    self.out.push(Action::Configured {
                        user,
                        ok: true,
                        errors: vec![],
                    });
                }
            }
        } else {
            slot.state = SlotState::Empty;
            slot.refused.insert(target);
            self.out.push(Action::State {
                node,
                state: NodeState::Free,
            });
            if let Some(f) = self.fns.get_mut(&target) {
                if f.refusals.is_empty() {
                    f.note(format!("node {node} refused the configuration"));
                }
            }
        }
        self.settle(now);
        Ok(())
    }

    /// A node explained an error: a per-input failure, or why it refuses
    /// the configuration it is loading.
    /// `code`: the node's (`ErrorCode::per_input` decides what the user sees).
    pub fn on_node_error(&mut self, node: u64, id: u32, code: u32, reason: &str, now: Duration) {
        let Some(slot) = self.nodes.get_mut(&node) else {
            return;
        };
        if let Some(j) = slot.in_flight.remove(&id) {
            slot.last_progress = now;
            self.out.push(Action::Answered {
                node,
                idle: slot.in_flight.is_empty(),
                failed: true,
            });
            if let Some(u) = self.users.get_mut(&j.user) {
                u.in_flight -= 1;
                let reason = format!("node {node} failed on this input: {reason}");
                self.out.push(Action::Failed {
                    user: j.user,
                    id: j.id,
                    code: ErrorCode::per_input(code),
                    reason,
                });
            }
        } else if let SlotState::Configuring { target, .. } = slot.state {
            if let Some(f) = self.fns.get_mut(&target) {
                f.note(format!("node {node}: {reason}"));
            }
        }
        self.settle(now);
    }

    /// A result from a node. `Err`: the node broke the protocol and must be
    /// closed (its work is re-dispatched when the close is reported).
    /// `any_length`: the node agreed `any-length`, so a result of another
    /// size than count × output size is no breach.
    pub fn on_result(
        &mut self,
        node: u64,
        internal: u32,
        data: Bytes,
        any_length: bool,
        now: Duration,
    ) -> Result<(), String> {
        let Some(slot) = self.nodes.get_mut(&node) else {
            return Ok(());
        };
        let Some(job) = slot.in_flight.remove(&internal) else {
            return Err(format!("result for unknown id {internal}"));
        };
        let f = slot.function.and_then(|f| self.fns.get_mut(&f));
        let expect = f
            .as_ref()
            .map_or(0, |f| f.output_size as usize * job.count as usize);
        if !crate::anylen::node_may_send(data.len(), expect, any_length) {
            let why = format!(
                "result of {} bytes for {} input(s), expected {expect}",
                data.len(),
                job.count
            );
            slot.in_flight.insert(internal, job);
            return Err(why);
        }
        self.out.push(Action::Answered {
            node,
            idle: slot.in_flight.is_empty(),
            failed: false,
        });
        let started = job.sent.max(slot.busy_until);
        let took = now.saturating_sub(started);
        slot.busy_until = now;
        slot.last_progress = now;
        let cap =
            (self.p.credit_max_bytes / (job.data.len() as u64).max(1)).min(u32::MAX as u64) as u32;
        slot.window.on_result(
            slot.in_flight.len(),
            now.saturating_sub(job.sent),
            false,
            cap,
        );
        if let Some(f) = f {
            f.record_service(took, job.count);
        }
        if let Some(u) = self.users.get_mut(&job.user) {
            u.in_flight -= 1;
            self.out.push(Action::Result {
                node,
                user: job.user,
                id: job.id,
                data,
                class: job.class,
                count: job.count,
            });
        }
        self.settle(now);
        Ok(())
    }

    /// Queue and stack policies: frames written to the node's socket.
    pub fn on_written(&mut self, node: u64, count: u64, now: Duration) {
        if let Some(s) = self.nodes.get_mut(&node) {
            s.written += count;
        }
        self.settle(now);
    }

    /// Periodic work: Algorithm 1 once per period, users left without any node.
    pub fn tick(&mut self, now: Duration) {
        if now.saturating_sub(self.period_start) >= self.p.period {
            self.period_start = now;
            self.monitor(now);
        }
        if let Some(since) = self.no_nodes_since {
            if now.saturating_sub(since) >= self.p.node_wait {
                self.fail_without_nodes(now);
            }
        }
        self.settle(now);
    }
}

#[cfg(test)]
mod tests;

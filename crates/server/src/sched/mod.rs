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
//! - [`first`]: which session a user gets (group users are lent nodes).
//! - `nodes`: a node's slot and the events a node causes.
//! - `lend`: nodes promised to groups leave once their work is done.
//! - `active`: which users count in the fair shares (work now or lately).
//! - `limits`: a tenant's `max_nodes`, from a count of the nodes it uses.

mod active;
pub mod algorithm1;
pub mod classq;
pub mod driver;
pub mod first;
pub mod function;
mod index;
mod lend;
mod limits;
mod nodes;
mod notify;
mod params;
pub mod places;
mod progress;
pub mod queue;
mod ranked;
mod route;
pub mod view;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::{ErrorCode, NodeState};

pub use function::FnId;
use function::Function;
use nodes::{Slot, SlotState};
pub use params::{Params, Sharing};

/// How a node broke the protocol; the node is closed (its work goes to
/// others when the close is reported). The message is logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeBreach {
    #[error("configuration response while not configuring")]
    NotConfiguring,
    #[error("result for unknown id {0}")]
    UnknownResult(u32),
    #[error("notification for unknown id {0}")]
    UnknownNotification(u32),
    /// Not `count` × output size, from a node that did not agree `any-length`.
    #[error("result of {len} bytes for {count} input(s), expected {expect}")]
    WrongLength {
        len: usize,
        count: u32,
        expect: usize,
    },
    /// A message that does not parse; `what` names its type.
    #[error("bad {what}: {source}")]
    Malformed {
        what: &'static str,
        source: corefarm_smp::ProtocolError,
    },
    #[error("unexpected {0} message from a node")]
    Unexpected(&'static str),
}

/// A data message of one user, queued or in flight.
#[derive(Debug)]
pub struct Job {
    pub user: u64,
    /// The user's id for it.
    pub id: u32,
    pub data: Bytes,
    pub count: u32,
    /// Priority class, 0 most urgent: orders the function's
    /// queue, and the job's chunks on a node link that negotiated chunks.
    pub class: u8,
    /// Its place in the function's bounded queue; released at dispatch.
    pub permit: Option<places::Place>,
    sent: Duration,
    /// Handler notifications of it relayed so far (`notes::within`).
    notes: u32,
    /// Its other copy in flight (node, internal id) once it was hedged
    /// ([`crate::dispatch::progress`]): the first answer of the two wins.
    twin: Option<(u64, u32)>,
    /// Its session's share of the function's queue, set at submit, in
    /// [`queue::WEIGHT_UNIT`]s ([`Sched::units`]).
    weight: u64,
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
            notes: 0,
            twin: None,
            weight: queue::WEIGHT_UNIT,
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
    fn weight(&self) -> u64 {
        self.weight
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
        /// that negotiated chunks.
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
        /// Whose job it was (its account is charged the node time); `None`
        /// for the late copy of a job already answered.
        user: Option<u64>,
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
    /// A late job's copy went to `to` (its first copy is on `from`).
    Hedged {
        from: u64,
        to: u64,
    },
    /// The answer of a job's other copy came first: this one is dropped.
    Duplicate {
        node: u64,
    },
    /// A node made no progress for the stall bound (it takes no new work),
    /// or answered again (`stalled: false`).
    Stalled {
        node: u64,
        stalled: bool,
    },
}

#[derive(Debug, Default)]
struct UserRec {
    function: Option<FnId>,
    in_flight: u64,
    /// Connected and not configured yet: it counts in the fair shares as
    /// one more user ([`Sched::user_joined`]).
    joining: bool,
    /// Its user's (tenant's) weight; 0 is taken as 1 ([`Sched::set_weight`]).
    weight: u32,
    /// Its tenant's name, when its sessions share its weight
    /// ([`Sched::set_tenant`]); `None`: a tenant of its own.
    tenant: Option<Arc<str>>,
    /// Its tenant's `max_nodes`: most nodes running the tenant's work at once.
    max_nodes: Option<u32>,
    /// While it counts in its function's fair share ([`active`]): when
    /// its activity is looked at next (its entry in `Sched::expiry`).
    active_until: Option<Duration>,
    /// When it last had work: submitted, configured, answered, or seen
    /// with work queued or in flight.
    last_busy: Duration,
    /// It has other servers to go to (`moves-on`): see [`Sched::set_moves_on`].
    moves_on: bool,
}

impl UserRec {
    fn weight(&self) -> u32 {
        self.weight.max(1)
    }

    /// One of its jobs was answered (or failed) at `now`.
    fn answered(&mut self, now: Duration) {
        self.in_flight -= 1;
        self.last_busy = self.last_busy.max(now);
    }
}

/// One session of `tenant` fewer.
fn forget_session(tenants: &mut HashMap<Arc<str>, u32>, tenant: &Arc<str>) {
    if let Some(n) = tenants.get_mut(tenant) {
        *n -= 1;
        if *n == 0 {
            tenants.remove(tenant);
        }
    }
}

/// Forgotten functions whose reconfiguration counts [`Sched`] keeps.
const FORGOTTEN_MAX: usize = 4096;

pub struct Sched {
    p: Params,
    fns: HashMap<FnId, Function>,
    nodes: BTreeMap<u64, Slot>,
    /// The slots indexed, so that each event costs O(log n) in the nodes.
    ix: index::Index,
    users: HashMap<u64, UserRec>,
    /// Sessions of each named tenant among `users`: they share its weight.
    tenants: HashMap<Arc<str>, u32>,
    /// Users with `joining` set, counted here because the fair shares are
    /// computed after every event.
    joining: usize,
    /// Active users by when their activity is looked at next ([`active`]).
    expiry: std::collections::BTreeSet<(Duration, u64)>,
    /// The nodes' programming time, a moving average over every node's
    /// configuration responses: how long a user stays active after its
    /// work ([`Sched::active_window`]).
    programming: Option<Duration>,
    /// Nodes running the work of tenants with a `max_nodes` ([`limits`]).
    limits: limits::Limits,
    /// Reconfigurations of functions no user wants and no node holds, so
    /// that the status keeps counting from there when one comes back (the
    /// same payload is the same function); at most [`FORGOTTEN_MAX`].
    forgotten: HashMap<FnId, u64>,
    next_internal: u32,
    period_start: Duration,
    /// Since when no node has been connected (for `node_wait`).
    no_nodes_since: Option<Duration>,
    /// Late jobs (node, internal id) waiting for a node to take their copy.
    due: Vec<(u64, u32)>,
    /// When the progress rule next needs a look ([`Sched::check_progress`]).
    progress_at: Option<Duration>,
    out: Vec<Action>,
}

impl Sched {
    pub fn new(p: Params) -> Sched {
        Sched {
            p,
            fns: HashMap::new(),
            nodes: BTreeMap::new(),
            ix: index::Index::default(),
            users: HashMap::new(),
            tenants: HashMap::new(),
            joining: 0,
            expiry: Default::default(),
            programming: None,
            limits: Default::default(),
            forgotten: HashMap::new(),
            next_internal: 0,
            period_start: Duration::ZERO,
            no_nodes_since: Some(Duration::ZERO),
            due: Vec::new(),
            progress_at: None,
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
        self.placement_changed();
        self.leave_function(user);
        let rec = self.users.entry(user).or_default();
        rec.function = Some(id);
        if std::mem::take(&mut rec.joining) {
            self.joining -= 1;
        }
        let forgotten = &mut self.forgotten;
        let f = self.fns.entry(id).or_insert_with(|| {
            let mut f = Function::new(id, payload, input_size, output_size);
            f.reconfigurations = forgotten.remove(&id).unwrap_or(0);
            f
        });
        f.users.insert(user);
        // A configuration announces work: the user counts in the shares.
        self.note_busy(user, now);
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
            self.note_pending(id);
            self.note_requested(id);
        }
        self.settle(now);
        id
    }

    /// The user's share of node time against other users, its tenant's
    /// weight: its jobs are served that much more per round of its
    /// function's queue, and its function's fair share of the nodes counts
    /// it that many times. Until set, a user's weight is 1.
    pub fn set_weight(&mut self, user: u64, weight: u32) {
        self.placement_changed();
        self.users.entry(user).or_default().weight = weight;
    }

    /// [`Sched::set_weight`] for a session of the named tenant `name`:
    /// the tenant's sessions share its weight equally, so two sessions of
    /// one user together weigh what one would. A session that names no
    /// user (`None`) weighs as a tenant of its own: the shared secret may
    /// be held by many people, whose programs should not shrink each
    /// other's share by opening sessions.
    pub fn set_tenant(&mut self, user: u64, name: Option<&str>, weight: u32) {
        self.placement_changed();
        let rec = self.users.entry(user).or_default();
        rec.weight = weight;
        if rec.tenant.as_deref() == name {
            return;
        }
        let old = std::mem::replace(&mut rec.tenant, name.map(Arc::from));
        if let Some(old) = old {
            forget_session(&mut self.tenants, &old);
        }
        if let Some(name) = name {
            *self.tenants.entry(Arc::from(name)).or_default() += 1;
        }
    }

    /// The tenant's `max_nodes` for its session `user`: its jobs go only
    /// to nodes already running the tenant's work once that many do.
    pub fn set_max_nodes(&mut self, user: u64, max: Option<u32>) {
        let rec = self.users.entry(user).or_default();
        let had = std::mem::replace(&mut rec.max_nodes, max).is_some();
        self.limits.limited(had, max.is_some());
    }

    /// The user agreed `moves-on`: it has other servers to go to. While
    /// no node is connected here, its work is failed at once with
    /// `no-nodes` instead of waiting `node_wait` for one, so that it
    /// resumes on a server that has nodes (a standby that kept them, say).
    pub fn set_moves_on(&mut self, user: u64, on: bool) {
        self.users.entry(user).or_default().moves_on = on;
    }

    /// With no node connected, fails the queued work of the users that can
    /// go elsewhere ([`Sched::set_moves_on`]); the others wait `node_wait`
    /// as before. A configuration still waiting is left to wait: refused
    /// here it would fail a first configuration (a client moves on only
    /// from a `no-nodes` answer, which a refused configuration is not),
    /// and a node killed and restarted is usually back within the wait.
    fn release_movers(&mut self) {
        if !self.nodes.is_empty() {
            return;
        }
        let reason = "no node is connected to this server any more: \
                      the session moves to another server";
        let users = &self.users;
        let mut released = false;
        for f in self.fns.values_mut() {
            let movers: Vec<u64> = f
                .users
                .iter()
                .copied()
                .filter(|u| users.get(u).is_some_and(|r| r.moves_on))
                .collect();
            for user in movers {
                for j in f.queue.remove_user(user) {
                    released = true;
                    self.out.push(Action::Failed {
                        user,
                        id: j.id,
                        code: ErrorCode::NoNodes,
                        reason: reason.into(),
                    });
                }
            }
        }
        // The released users keep their functions: nothing to forget.
        if released {
            self.placement_changed();
        }
    }

    /// A session's share in [`queue::WEIGHT_UNIT`]s: its tenant's weight
    /// divided among the tenant's sessions.
    fn units(&self, rec: &UserRec) -> u64 {
        let n = rec
            .tenant
            .as_ref()
            .and_then(|t| self.tenants.get(t))
            .map_or(1, |&n| u64::from(n.max(1)));
        u64::from(rec.weight()) * queue::WEIGHT_UNIT / n
    }

    /// A data message of a configured user.
    pub fn submit(&mut self, mut job: Job, now: Duration) {
        let rec = self.users.get(&job.user);
        job.weight = rec.map_or(queue::WEIGHT_UNIT, |r| self.units(r));
        let fid = rec.and_then(|u| u.function);
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
        let user = job.user;
        f.queue.push(job);
        let id = f.id;
        if self.nodes.is_empty() && self.users.get(&user).is_some_and(|r| r.moves_on) {
            // Nothing here to run it: a user with other servers goes now.
            self.release_movers();
            return;
        }
        self.note_pending(id);
        self.note_busy(user, now);
        if self.replicas(id) == 0 {
            self.fns
                .get_mut(&id)
                .expect("exists")
                .requested
                .get_or_insert(now);
            self.note_requested(id);
        }
        self.settle(now);
    }

    /// A user connected. Until it configures, it counts in the fair shares
    /// as a user of a function of its own: users that connect together
    /// configure a moment apart, and the first would otherwise load its
    /// function on every spare node only for the others to drain them
    /// (seed 002's workload at P = 100 ms: each of the others then waited
    /// one reprogramming more for its first function).
    pub fn user_joined(&mut self, user: u64) {
        self.placement_changed();
        if let std::collections::hash_map::Entry::Vacant(e) = self.users.entry(user) {
            e.insert(UserRec {
                joining: true,
                ..UserRec::default()
            });
            self.joining += 1;
        }
    }

    /// The user left: its queued work is dropped, results still in flight
    /// will be discarded.
    pub fn user_gone(&mut self, user: u64, now: Duration) {
        self.placement_changed();
        self.leave_function(user);
        if let Some(rec) = self.users.remove(&user) {
            if rec.joining {
                self.joining -= 1;
            }
            if let Some(at) = rec.active_until {
                self.expiry.remove(&(at, user));
            }
            self.limits.limited(rec.max_nodes.is_some(), false);
            self.forget_limited(user, &rec);
            if let Some(t) = rec.tenant {
                forget_session(&mut self.tenants, &t);
            }
        }
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
        let held = self.ix.held(id);
        if !held && self.fns.get(&id).is_some_and(|f| !f.wanted()) {
            if let Some(f) = self.fns.remove(&id).filter(|f| f.reconfigurations > 0) {
                if self.forgotten.len() >= FORGOTTEN_MAX {
                    // Any one: the bound is on memory, the counts are a courtesy.
                    let any = self.forgotten.keys().next().copied();
                    any.map(|k| self.forgotten.remove(&k));
                }
                self.forgotten.insert(id, f.reconfigurations);
            }
            self.ix.rotation_forget(id);
        }
    }

    /// Replicas of a function that take work now.
    pub fn replicas(&self, id: FnId) -> usize {
        self.ix.ready(id)
    }

    /// Replicas plus nodes being configured for it.
    fn replicas_or_loading(&self, id: FnId) -> usize {
        self.ix.promised(id)
    }

    /// Periodic work: users without work lately leave the fair shares,
    /// Algorithm 1 once per period, users left without any node.
    pub fn tick(&mut self, now: Duration) {
        self.expire_active(now);
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

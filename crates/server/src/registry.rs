//! One shared picture of the cluster, for the status extension and for
//! in-process tests.
//!
//! Cheap on the hot path: every node and user has an entry whose counters
//! are atomics written only by the task that owns the node or user (relaxed
//! increments, no lock per data message). The maps are locked only when a
//! connection comes or goes, and when someone asks for a status.
//!
//! Totals over connections (bytes per link, results and latency by user
//! name) are the live entries' sum plus what ended connections left, which
//! an entry hands over as it leaves its map, under the map's lock: a sum
//! taken under the same lock counts every connection exactly once, so the
//! totals never step back.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use corefarm_smp::{
    AccountStatus, ClusterStatus, LinkBytes, NodeCounts, NodePage, NodeState, NodeStatus,
    UserPhase, UserStatus,
};

use crate::accounts::{Account, Accounts};

use crate::metrics::{Metrics, NameTotals};

/// Targets of a node's hello that are kept: a node runs a few (one per
/// kind of core it has); more are a peer's attempt to grow the status.
pub const MAX_TARGETS: usize = 16;

/// What a node told us about itself in its hello.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    pub name: Option<String>,
    pub targets: Vec<String>,
    pub hello: bool,
    /// Its peer port (`peer` feature), where group members reach it.
    pub peer: Option<String>,
    /// It takes group commands carrying a class (`group-priority` feature).
    pub group_priority: bool,
}

/// A connected node as the rest of the server sees it.
#[derive(Debug)]
pub struct NodeEntry {
    pub id: u64,
    pub addr: SocketAddr,
    info: Mutex<NodeInfo>,
    state: AtomicU8,
    /// The user it is assigned to; 0 = none (ids start at 1).
    user: AtomicU64,
    pub in_flight: AtomicU64,
    pub results: AtomicU64,
    /// It agreed `any-length` in its hello: its results may have any
    /// length (streaming handlers), not only count × output size.
    any_length: AtomicBool,
    /// Busy time, results, reconfigurations for metrics (crate::metrics).
    pub m: crate::metrics::NodeMetrics,
}

impl NodeEntry {
    pub fn new(id: u64, addr: SocketAddr) -> Self {
        NodeEntry {
            id,
            addr,
            info: Mutex::new(NodeInfo::default()),
            state: AtomicU8::new(node_state_code(NodeState::Free)),
            user: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            results: AtomicU64::new(0),
            any_length: AtomicBool::new(false),
            m: Default::default(),
        }
    }

    /// What the node's hello said, each name in it bounded
    /// ([`corefarm_telemetry::bounded`], as user names are) and at most
    /// [`MAX_TARGETS`] targets kept: logs, `/status` and `/metrics` show
    /// these, so a peer's hello cannot make them arbitrarily long.
    pub fn set_info(&self, mut info: NodeInfo) {
        let bound = |s: &mut String| {
            if let std::borrow::Cow::Owned(cut) = corefarm_telemetry::bounded(s) {
                *s = cut;
            }
        };
        info.targets.truncate(MAX_TARGETS);
        let names = info.name.iter_mut().chain(info.peer.iter_mut());
        names.chain(info.targets.iter_mut()).for_each(bound);
        *self.info.lock().expect("node info lock") = info;
    }

    pub fn set_any_length(&self, yes: bool) {
        self.any_length.store(yes, Ordering::Relaxed);
    }

    /// Read only for a result whose length is not count × output size.
    pub fn any_length(&self) -> bool {
        self.any_length.load(Ordering::Relaxed)
    }

    pub fn info(&self) -> NodeInfo {
        self.info.lock().expect("node info lock").clone()
    }

    /// How logs name a node, everywhere: `name@address` (`node-<id>@address`
    /// for a seed node, which has no name).
    pub fn label(&self) -> String {
        match &self.info.lock().expect("node info lock").name {
            Some(n) => format!("{n}@{}", self.addr),
            None => format!("node-{}@{}", self.id, self.addr),
        }
    }

    /// A new owner: `None` = the free pool. Counters restart, since they
    /// describe the node's work for its current user.
    pub fn assign(&self, user: Option<u64>) {
        self.user.store(user.unwrap_or(0), Ordering::Relaxed);
        self.in_flight.store(0, Ordering::Relaxed);
        self.results.store(0, Ordering::Relaxed);
        let state = if user.is_some() {
            NodeState::Assigned
        } else {
            NodeState::Free
        };
        self.set_state(state);
    }

    pub fn state(&self) -> NodeState {
        node_state_from(self.state.load(Ordering::Relaxed))
    }

    pub fn set_state(&self, s: NodeState) {
        self.state.store(node_state_code(s), Ordering::Relaxed);
        self.m.on_state(s);
    }

    pub fn status(&self) -> NodeStatus {
        let user = self.user.load(Ordering::Relaxed);
        let info = self.info();
        let mut s = NodeStatus {
            id: self.id,
            name: info.name,
            targets: info.targets,
            addr: self.addr.to_string(),
            state: node_state_from(self.state.load(Ordering::Relaxed)),
            user: (user != 0).then_some(user),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            results: self.results.load(Ordering::Relaxed),
            ..Default::default()
        };
        self.m.fill(&mut s);
        s
    }
}

fn node_state_code(s: NodeState) -> u8 {
    match s {
        NodeState::Free => 0,
        NodeState::Assigned => 1,
        NodeState::Configuring => 2,
        NodeState::Ready => 3,
    }
}

fn node_state_from(v: u8) -> NodeState {
    match v {
        1 => NodeState::Assigned,
        2 => NodeState::Configuring,
        3 => NodeState::Ready,
        _ => NodeState::Free,
    }
}

/// A connected user, published by its handler task.
#[derive(Debug)]
pub struct UserEntry {
    pub id: u64,
    pub addr: SocketAddr,
    name: Mutex<Option<String>>,
    hello: AtomicBool,
    phase: AtomicU8,
    pub outstanding: AtomicU64,
    pub queued: AtomicU64,
    pub results: AtomicU64,
    /// Failures and latency for metrics (crate::metrics).
    pub m: crate::metrics::UserMetrics,
    /// The user (tenant) it acts for; set once: at admission with an auth
    /// file, else from its hello, else the anonymous account.
    account: OnceLock<Arc<Account>>,
}

impl UserEntry {
    pub fn new(id: u64, addr: SocketAddr) -> Self {
        UserEntry {
            id,
            addr,
            name: Mutex::new(None),
            hello: AtomicBool::new(false),
            phase: AtomicU8::new(0),
            outstanding: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            results: AtomicU64::new(0),
            m: Default::default(),
            account: OnceLock::new(),
        }
    }

    /// The account it acts for, unless it has one already.
    pub fn set_account(&self, a: Arc<Account>) {
        self.account_or(|| a);
    }

    /// Its account, `f`'s if it had none yet (its session then begins there).
    pub fn account_or(&self, f: impl FnOnce() -> Arc<Account>) -> &Arc<Account> {
        let mut new = false;
        let a = self.account.get_or_init(|| {
            new = true;
            f()
        });
        if new {
            a.session_began();
        }
        a
    }

    /// Its account, if it has one yet.
    pub fn account(&self) -> Option<&Arc<Account>> {
        self.account.get()
    }

    /// Its metrics label: the hello name, `anonymous` or `seed`.
    pub fn label(&self) -> String {
        let name = self.name.lock().expect("user name lock");
        crate::metrics::user_label(name.as_deref(), self.hello.load(Ordering::Relaxed))
    }

    /// The user's hello was answered; its name is kept bounded
    /// ([`corefarm_telemetry::bounded`]), as the status and logs show it.
    pub fn set_hello(&self, name: Option<&str>) {
        let name = name.map(|n| corefarm_telemetry::bounded(n).into_owned());
        *self.name.lock().expect("user name lock") = name;
        self.hello.store(true, Ordering::Relaxed);
    }

    pub fn set_phase(&self, p: UserPhase) {
        let v = match p {
            UserPhase::Initial => 0,
            UserPhase::Configuring => 1,
            UserPhase::Routing => 2,
        };
        self.phase.store(v, Ordering::Relaxed);
    }

    fn status(&self, nodes: Vec<u64>) -> UserStatus {
        let mut s = UserStatus {
            id: self.id,
            addr: self.addr.to_string(),
            name: self.name.lock().expect("user name lock").clone(),
            hello: self.hello.load(Ordering::Relaxed),
            phase: match self.phase.load(Ordering::Relaxed) {
                1 => UserPhase::Configuring,
                2 => UserPhase::Routing,
                _ => UserPhase::Initial,
            },
            nodes,
            outstanding: self.outstanding.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            results: self.results.load(Ordering::Relaxed),
            account: self.account().map(|a| a.name().to_string()),
            ..Default::default()
        };
        self.m.fill(&mut s);
        s
    }
}

/// (in, out) byte pairs added.
fn add(a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
    (a.0 + b.0, a.1 + b.1)
}

/// Live entries and the bytes of those that ended, under one lock.
#[derive(Debug)]
struct Map<T> {
    live: BTreeMap<u64, Arc<T>>,
    /// (in, out) bytes of ended connections.
    ended: (u64, u64),
}

impl<T> Default for Map<T> {
    fn default() -> Self {
        Map {
            live: BTreeMap::new(),
            ended: (0, 0),
        }
    }
}

#[derive(Debug)]
pub struct Registry {
    nodes: Mutex<Map<NodeEntry>>,
    users: Mutex<Map<UserEntry>>,
    /// Since when no node has been connected (the start, or the last
    /// node's leaving); `None` while one is.
    no_nodes_since: Mutex<Option<tokio::time::Instant>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            nodes: Mutex::default(),
            users: Mutex::default(),
            no_nodes_since: Mutex::new(Some(tokio::time::Instant::now())),
        }
    }
}

impl Registry {
    /// Adds a node unless `closed()` says its connection already ended.
    /// Checked under the registry lock: a connection's removal (when its
    /// last task ends, after it is marked closed) then either comes after
    /// the insert and undoes it, or the insert does not happen.
    pub fn add_node_if_open(&self, e: Arc<NodeEntry>, closed: impl FnOnce() -> bool) -> bool {
        let mut nodes = self.nodes.lock().expect("registry lock");
        if closed() {
            return false;
        }
        nodes.live.insert(e.id, e);
        *self.no_nodes_since.lock().expect("registry lock") = None;
        true
    }

    /// The node's connection ended (its last task is gone, whether or not
    /// it was ever added): its bytes move to the ended total.
    pub fn remove_node(&self, e: &NodeEntry) {
        let mut nodes = self.nodes.lock().expect("registry lock");
        if nodes.live.remove(&e.id).is_some() && nodes.live.is_empty() {
            *self.no_nodes_since.lock().expect("registry lock") = Some(tokio::time::Instant::now());
        }
        nodes.ended = add(nodes.ended, e.m.link.bytes());
    }

    /// How long no node has been connected (since the server started, or
    /// since the last one left); `None` while one is.
    pub fn without_nodes_for(&self) -> Option<std::time::Duration> {
        let since = *self.no_nodes_since.lock().expect("registry lock");
        since.map(|t| t.elapsed())
    }

    /// Nodes connected now.
    pub fn node_count(&self) -> usize {
        self.nodes.lock().expect("registry lock").live.len()
    }

    /// Nodes connected now that pass `f`.
    pub fn count_nodes(&self, f: impl Fn(&NodeEntry) -> bool) -> usize {
        let nodes = self.nodes.lock().expect("registry lock");
        nodes.live.values().filter(|n| f(n)).count()
    }

    pub fn add_user(&self, e: Arc<UserEntry>) {
        self.users
            .lock()
            .expect("registry lock")
            .live
            .insert(e.id, e);
    }

    /// The session ended: its bytes move to the ended total, its results
    /// and latency to its name's slot. Called once per added user.
    pub fn remove_user(&self, id: u64) {
        let mut users = self.users.lock().expect("registry lock");
        if let Some(e) = users.live.remove(&id) {
            users.ended = add(users.ended, e.m.link.bytes());
            e.m.fold();
            if let Some(a) = e.account() {
                a.session_ended(e.m.link.bytes());
            }
        }
    }

    /// Nodes assigned now to sessions of `account` other than `except`
    /// (exclusive mode: what counts against its `max_nodes`).
    pub fn nodes_held_by(&self, account: &Arc<Account>, except: u64) -> usize {
        let ids: std::collections::HashSet<u64> = {
            let users = self.users.lock().expect("registry lock");
            let mine = |u: &&Arc<UserEntry>| {
                u.id != except && u.account().is_some_and(|a| Arc::ptr_eq(a, account))
            };
            users.live.values().filter(mine).map(|u| u.id).collect()
        };
        if ids.is_empty() {
            return 0;
        }
        self.count_nodes(|n| ids.contains(&n.user.load(Ordering::Relaxed)))
    }

    /// Every account, its open sessions' bytes summed under the lock
    /// their ends are folded under (so no byte is seen twice or missed).
    pub fn accounts(&self, accounts: &Accounts) -> Vec<AccountStatus> {
        let users = self.users.lock().expect("registry lock");
        let mut live: std::collections::HashMap<*const Account, (u64, u64)> = Default::default();
        for u in users.live.values() {
            if let Some(a) = u.account() {
                let b = live.entry(Arc::as_ptr(a)).or_default();
                *b = add(*b, u.m.link.bytes());
            }
        }
        accounts.snapshot(|a| live.get(&Arc::as_ptr(a)).copied().unwrap_or_default())
    }

    /// Results, failures and latency by user name, ended and live sessions.
    pub fn by_name(&self, m: &Metrics) -> Vec<NameTotals> {
        let users = self.users.lock().expect("registry lock");
        m.by_name(users.live.values().map(|u| &u.m))
    }

    /// Each node's configuration-time histogram, by node id (metrics).
    pub fn config_times(&self) -> Vec<(u64, corefarm_telemetry::HistogramSnapshot)> {
        let nodes = self.nodes.lock().expect("registry lock");
        nodes
            .live
            .values()
            .map(|n| (n.id, n.m.config_times()))
            .collect()
    }

    /// Everything but the server-wide fields (policy, limits, who asks).
    #[cfg(test)]
    pub fn snapshot(&self) -> ClusterStatus {
        self.snapshot_page(None)
    }

    /// The status snapshot with the node rows of one page only (every
    /// node's without one); the counts by state cover every node. One pass
    /// over the nodes, rows built only for the page, and each user's node
    /// list from one map: linear in the nodes whatever the page, where a
    /// row per node would make a large cluster's answer megabytes.
    pub fn snapshot_page(&self, page: Option<&NodePage>) -> ClusterStatus {
        let mut bytes = LinkBytes::default();
        let mut counts = NodeCounts::default();
        let mut by_user: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut functions: HashMap<u64, String> = HashMap::new();
        let nodes: Vec<NodeStatus> = {
            let nodes = self.nodes.lock().expect("registry lock");
            (bytes.node_in, bytes.node_out) = nodes
                .live
                .values()
                .map(|n| n.m.link.bytes())
                .fold(nodes.ended, add);
            let mut rows = Vec::new();
            let mut index = 0;
            for n in nodes.live.values() {
                let state = n.state();
                counts.add(state);
                let user = n.user.load(Ordering::Relaxed);
                if user != 0 {
                    by_user.entry(user).or_default().push(n.id);
                    // Its nodes are configured alike: theirs is its function.
                    if let std::collections::hash_map::Entry::Vacant(e) = functions.entry(user) {
                        if let Some(f) = n.m.function() {
                            e.insert(f);
                        }
                    }
                }
                let listed = match page {
                    None => true,
                    Some(p) if p.state.is_none_or(|s| s == state) => {
                        index += 1;
                        p.holds(index - 1)
                    }
                    Some(_) => false,
                };
                if listed {
                    rows.push(n.status());
                }
            }
            rows
        };
        let users = self.users.lock().expect("registry lock");
        (bytes.user_in, bytes.user_out) = users
            .live
            .values()
            .map(|u| u.m.link.bytes())
            .fold(users.ended, add);
        let users = users
            .live
            .values()
            .map(|u| {
                let mut s = u.status(by_user.remove(&u.id).unwrap_or_default());
                s.function = functions.remove(&u.id);
                s
            })
            .collect();
        ClusterStatus {
            nodes,
            users,
            bytes,
            node_counts: Some(counts),
            ..ClusterStatus::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn snapshot_lists_nodes_under_their_users() {
        let r = Registry::default();
        let (a, b) = (
            Arc::new(NodeEntry::new(1, addr(10))),
            Arc::new(NodeEntry::new(2, addr(11))),
        );
        a.set_info(NodeInfo {
            name: Some("n0".into()),
            hello: true,
            ..Default::default()
        });
        r.add_node_if_open(a.clone(), || false);
        r.add_node_if_open(b.clone(), || false);
        let u = Arc::new(UserEntry::new(7, addr(20)));
        u.set_hello(Some("prog"));
        u.set_phase(UserPhase::Routing);
        r.add_user(u.clone());
        a.assign(Some(7));
        a.set_state(NodeState::Ready);
        a.in_flight.fetch_add(2, Ordering::Relaxed);
        u.outstanding.fetch_add(2, Ordering::Relaxed);

        let s = r.snapshot();
        let n0 = s.node(1).unwrap();
        assert_eq!(
            (n0.state, n0.user, n0.in_flight),
            (NodeState::Ready, Some(7), 2)
        );
        assert_eq!(n0.name.as_deref(), Some("n0"));
        assert_eq!(s.node(2).unwrap().state, NodeState::Free);
        let us = s.user(7).unwrap();
        assert_eq!(us.nodes, vec![1]);
        assert_eq!(
            (us.phase, us.hello, us.outstanding),
            (UserPhase::Routing, true, 2)
        );

        // Back to the pool: counters restart, the user no longer lists it.
        a.assign(None);
        let s = r.snapshot();
        assert_eq!(s.node(1).unwrap().state, NodeState::Free);
        assert_eq!(s.node(1).unwrap().in_flight, 0);
        assert!(s.user(7).unwrap().nodes.is_empty());
        r.remove_node(&a);
        r.remove_user(7);
        let s = r.snapshot();
        assert!(s.node(1).is_none() && s.user(7).is_none());
    }

    #[test]
    fn totals_stay_when_connections_end() {
        let (r, m) = (Registry::default(), Metrics::default());
        let n = Arc::new(NodeEntry::new(1, addr(10)));
        r.add_node_if_open(n.clone(), || false);
        let u = Arc::new(UserEntry::new(2, addr(20)));
        u.set_hello(Some("prog"));
        r.add_user(u.clone());
        u.m.link.received(100);
        n.m.link.sent(100);
        n.m.link.received(40);
        u.m.link.sent(40);
        u.m.result(&m, || u.label(), std::time::Duration::from_millis(1));
        // A node that never got past its hello still counts what it sent.
        let early = NodeEntry::new(3, addr(11));
        early.m.link.received(12);

        let totals = |r: &Registry| {
            let names = r.by_name(&m);
            let prog = names.iter().find(|t| t.name == "prog").unwrap();
            (r.snapshot().bytes, prog.results, prog.latency.count)
        };
        let live = totals(&r);
        assert_eq!(
            live,
            (
                LinkBytes {
                    user_in: 100,
                    user_out: 40,
                    node_in: 40,
                    node_out: 100
                },
                1,
                1
            )
        );
        r.remove_user(2);
        r.remove_node(&n);
        assert_eq!(totals(&r), live, "ended connections keep their counts");
        r.remove_node(&early);
        assert_eq!(totals(&r).0.node_in, 52);
        // A second session of the same name adds to the first.
        let again = Arc::new(UserEntry::new(4, addr(21)));
        again.set_hello(Some("prog"));
        r.add_user(again.clone());
        again
            .m
            .result(&m, || again.label(), std::time::Duration::from_millis(1));
        assert_eq!(totals(&r).1, 2);
    }

    #[test]
    fn labels_are_name_at_address() {
        let n = NodeEntry::new(3, addr(12));
        assert_eq!(n.label(), "node-3@127.0.0.1:12");
        n.set_info(NodeInfo {
            name: Some("fpga-a".into()),
            ..Default::default()
        });
        assert_eq!(n.label(), "fpga-a@127.0.0.1:12");
    }
}

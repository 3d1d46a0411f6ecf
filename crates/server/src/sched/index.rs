//! Indexes over the nodes' slots, so that what follows every event costs
//! O(log n) in the nodes instead of a scan of them all: per function its
//! replicas (counted, and those that take work now, in the policy's
//! order), the nodes being loaded, drained, lent, busy or idle, and the
//! functions that may have work waiting.
//!
//! Every change to a slot is followed by [`Sched::reindex`], which
//! compares the slot's [`Key`] with the one indexed and moves it; the
//! indexes are therefore exactly a function of the slots, which the
//! scheduler's tests check against a full scan after random events.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::nodes::{Slot, SlotState};
use super::route::SHARED_WINDOW;
use super::{FnId, Sched};
use crate::dispatch::{Load, Policy};

/// What the indexes know of a slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Key {
    state: SlotState,
    function: Option<FnId>,
    /// Jobs sent and not answered ([`Slot::outstanding`]).
    outstanding: usize,
    stalled: bool,
    /// Messages its window admits in flight in shared mode.
    cap: u32,
    /// Messages sent and not yet written to its socket.
    unwritten: bool,
}

impl Key {
    pub(super) fn of(s: &Slot) -> Key {
        Key {
            state: s.state,
            function: s.function,
            outstanding: s.outstanding(),
            stalled: s.stalled,
            cap: s.window.get().clamp(1, SHARED_WINDOW),
            unwritten: s.sent > s.written,
        }
    }

    fn promised_to(&self) -> Option<FnId> {
        match self.state {
            SlotState::Ready => self.function,
            SlotState::Configuring { target, .. } | SlotState::Draining { target } => Some(target),
            SlotState::Empty | SlotState::Lending => None,
        }
    }

    fn ready_for(&self) -> Option<FnId> {
        (self.state == SlotState::Ready).then_some(self.function)?
    }

    fn configuring_for(&self) -> Option<FnId> {
        match self.state {
            SlotState::Configuring { target, .. } => Some(target),
            _ => None,
        }
    }

    fn idle(&self) -> bool {
        self.outstanding == 0 && matches!(self.state, SlotState::Empty | SlotState::Ready)
    }

    /// Takes work of its function now, as the policies' load sees it
    /// (`None`: not at all).
    fn serving(&self) -> Option<FnId> {
        self.ready_for().filter(|_| !self.stalled)
    }
}

/// A function's replicas in the dispatch policy's order (the queue
/// policy's rotation, the stack's fixed order): each has a sequence
/// number, and moving one to the back gives it a new one.
#[derive(Debug, Default)]
struct Rotation {
    next: u64,
    seq: BTreeMap<u64, u64>,
    by_seq: BTreeMap<u64, u64>,
    /// Credit: replicas with room in their window, by (in flight, order).
    room: BTreeSet<(usize, u64, u64)>,
    /// Queue and stack: replicas with nothing left to write, by order.
    written: BTreeSet<(u64, u64)>,
}

/// Adds 1 (or takes 1) to `f`'s count, dropping zero counts.
fn count(map: &mut HashMap<FnId, usize>, f: Option<FnId>, add: bool) {
    let Some(f) = f else { return };
    let n = map.entry(f).or_default();
    match add {
        true => *n += 1,
        false => *n -= 1,
    }
    if *n == 0 {
        map.remove(&f);
    }
}

fn member<K, T>(map: &mut HashMap<K, BTreeSet<T>>, k: K, v: T, add: bool)
where
    K: std::hash::Hash + Eq,
    T: Ord,
{
    match add {
        true => {
            map.entry(k).or_default().insert(v);
        }
        false => {
            if let Some(set) = map.get_mut(&k) {
                set.remove(&v);
                if set.is_empty() {
                    map.remove(&k);
                }
            }
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Index {
    keys: HashMap<u64, Key>,
    /// Nodes serving, loading or drained for each function.
    promised: HashMap<FnId, usize>,
    /// Nodes serving each function (Ready).
    ready: HashMap<FnId, usize>,
    /// Nodes holding each function or being loaded with it.
    held: HashMap<FnId, usize>,
    configuring: HashMap<FnId, BTreeSet<u64>>,
    draining: BTreeSet<u64>,
    lending: BTreeSet<u64>,
    busy: BTreeSet<u64>,
    /// Idle nodes by the function they hold.
    idle: HashMap<Option<FnId>, BTreeSet<u64>>,
    /// Connected nodes that refused each function.
    refused: HashMap<FnId, usize>,
    rotations: HashMap<FnId, Rotation>,
    /// Functions that may have queued work or waiting users (a superset:
    /// entries are added where work is queued or a user waits, and
    /// dropped when found without either).
    pub(super) pending: HashSet<FnId>,
    /// Functions that may be requested (a superset, as `pending`).
    pub(super) requested: HashSet<FnId>,
    /// Functions that may have queued work and a replica serving them (a
    /// superset): the only ones [`Sched::pump`] can dispatch for.
    pub(super) dispatchable: HashSet<FnId>,
    /// Functions given work or a waiting user since the refusal check last
    /// looked ([`Sched::refusal_candidates`]).
    pub(super) fresh: HashSet<FnId>,
    /// Every pending function needs the refusal check: nodes came or left
    /// since it last looked.
    pub(super) recheck: bool,
    /// Whether no node can move to another function (no spare node, none
    /// above its function's fair share), while nothing placement depends
    /// on changed; `None`: to be counted ([`Sched::placement_changed`]).
    pub(super) dry: Option<bool>,
    /// Tests: Algorithm 1's step 1 as the scan of every node per function.
    #[cfg(test)]
    pub(super) scan_serve: bool,
    /// Tests: placement and the refusal check always run in full, as if
    /// everything had changed.
    #[cfg(test)]
    pub(super) always_place: bool,
}

impl Index {
    fn apply(&mut self, node: u64, k: &Key, add: bool) {
        count(&mut self.promised, k.promised_to(), add);
        count(&mut self.ready, k.ready_for(), add);
        count(&mut self.held, k.function, add);
        count(&mut self.held, k.configuring_for(), add);
        if let Some(f) = k.configuring_for() {
            member(&mut self.configuring, f, node, add);
        }
        let sets = [
            (
                &mut self.draining,
                matches!(k.state, SlotState::Draining { .. }),
            ),
            (&mut self.lending, k.state == SlotState::Lending),
            (&mut self.busy, k.outstanding > 0),
        ];
        for (set, on) in sets {
            if on {
                match add {
                    true => set.insert(node),
                    false => set.remove(&node),
                };
            }
        }
        if k.idle() {
            member(&mut self.idle, k.function, node, add);
        }
    }

    /// The node's entries in `f`'s rotation sets, by its key: there are
    /// some while it is in the rotation and serves `f`.
    fn rotation_entries(&mut self, node: u64, f: Option<FnId>, add: bool) {
        let Some(k) = self.keys.get(&node) else {
            return;
        };
        let Some(f) = f.filter(|&f| k.serving() == Some(f)) else {
            return;
        };
        let Some(r) = self.rotations.get_mut(&f) else {
            return;
        };
        let Some(&seq) = r.seq.get(&node) else { return };
        let room = (k.outstanding < k.cap as usize).then_some((k.outstanding, seq, node));
        let written = (!k.unwritten).then_some((seq, node));
        match add {
            true => {
                room.map(|e| r.room.insert(e));
                written.map(|e| r.written.insert(e));
            }
            false => {
                room.map(|e| r.room.remove(&e));
                written.map(|e| r.written.remove(&e));
            }
        }
    }

    /// The node's slot is now `now` (`None`: gone).
    pub(super) fn set(&mut self, node: u64, now: Option<Key>) {
        let before = self.keys.get(&node).copied();
        if before == now {
            return;
        }
        // What placement and the refusal check count changes only when a
        // node comes, leaves, or is promised to another function: not with
        // a data message, nor when a node finishes loading.
        let promised = |k: Option<Key>| k.and_then(|k| k.promised_to());
        if before.is_none() || now.is_none() {
            self.dry = None;
            self.recheck = true;
        } else if promised(before) != promised(now) {
            self.dry = None;
            // Only these two may have lost their last replica.
            self.fresh.extend(promised(before));
            self.fresh.extend(promised(now));
        }
        let ready = |k: Option<Key>| k.and_then(|k| k.ready_for());
        if let Some(f) = ready(now).filter(|&f| ready(before) != Some(f)) {
            self.dispatchable.insert(f);
        }
        self.rotation_entries(node, before.and_then(|k| k.serving()), false);
        if let Some(k) = before {
            self.apply(node, &k, false);
        }
        match now {
            Some(k) => {
                self.apply(node, &k, true);
                self.keys.insert(node, k);
            }
            None => {
                self.keys.remove(&node);
            }
        }
        self.rotation_entries(node, now.and_then(|k| k.serving()), true);
    }

    /// `node` joins the back of `f`'s rotation.
    pub(super) fn rotation_add(&mut self, f: FnId, node: u64) {
        self.rotation_remove(f, node);
        let r = self.rotations.entry(f).or_default();
        let seq = r.next;
        r.next += 1;
        r.seq.insert(node, seq);
        r.by_seq.insert(seq, node);
        self.rotation_entries(node, Some(f), true);
    }

    pub(super) fn rotation_remove(&mut self, f: FnId, node: u64) {
        if !self
            .rotations
            .get(&f)
            .is_some_and(|r| r.seq.contains_key(&node))
        {
            return;
        }
        self.rotation_entries(node, Some(f), false);
        let r = self.rotations.get_mut(&f).expect("checked");
        let seq = r.seq.remove(&node).expect("checked");
        r.by_seq.remove(&seq);
    }

    pub(super) fn rotation_forget(&mut self, f: FnId) {
        self.rotations.remove(&f);
    }

    /// The node the policy picks among `f`'s replicas, without the loading
    /// replicas' say (see [`Sched::pump`]), moved to the back of the
    /// rotation except by the stack policy.
    pub(super) fn pick(&mut self, f: FnId, policy: Policy) -> Option<u64> {
        let r = self.rotations.get(&f)?;
        let node = match policy {
            Policy::Credit => r.room.first().map(|e| e.2),
            Policy::Queue | Policy::Stack => r.written.first().map(|e| e.1),
        }?;
        if policy != Policy::Stack {
            self.rotation_add(f, node);
        }
        Some(node)
    }

    /// [`Index::pick`] with every replica's load from `load`: a scan of
    /// the rotation, as [`crate::dispatch::Order::pick`] does.
    pub(super) fn pick_by(
        &mut self,
        f: FnId,
        policy: Policy,
        load: impl Fn(u64) -> Option<Load>,
    ) -> Option<u64> {
        let r = self.rotations.get(&f)?;
        let mut order = crate::dispatch::Order::default();
        r.by_seq.values().for_each(|&n| order.add(n));
        let (_, node) = order.peek(policy, load)?;
        if policy != Policy::Stack {
            self.rotation_add(f, node);
        }
        Some(node)
    }

    /// A connected node refused `f` (`add`), or one that had left.
    pub(super) fn refusal(&mut self, f: FnId, add: bool) {
        count(&mut self.refused, Some(f), add);
        // Refused by every node now, perhaps.
        self.fresh.insert(f);
    }

    pub(super) fn refused(&self, f: FnId) -> usize {
        self.refused.get(&f).copied().unwrap_or(0)
    }

    pub(super) fn promised(&self, f: FnId) -> usize {
        self.promised.get(&f).copied().unwrap_or(0)
    }

    /// Every function with nodes promised to it, and how many.
    pub(super) fn promised_all(&self) -> impl Iterator<Item = (FnId, usize)> + '_ {
        self.promised.iter().map(|(&f, &n)| (f, n))
    }

    pub(super) fn ready(&self, f: FnId) -> usize {
        self.ready.get(&f).copied().unwrap_or(0)
    }

    pub(super) fn held(&self, f: FnId) -> bool {
        self.held.contains_key(&f)
    }

    /// Nodes being loaded with `f`, by id.
    pub(super) fn configuring(&self, f: FnId) -> impl Iterator<Item = u64> + '_ {
        self.configuring.get(&f).into_iter().flatten().copied()
    }

    /// Every node being loaded.
    pub(super) fn loading(&self) -> impl Iterator<Item = u64> + '_ {
        self.configuring.values().flatten().copied()
    }

    pub(super) fn draining(&self) -> &BTreeSet<u64> {
        &self.draining
    }

    pub(super) fn lending(&self) -> &BTreeSet<u64> {
        &self.lending
    }

    /// Nodes with work in flight, by id.
    pub(super) fn busy(&self) -> &BTreeSet<u64> {
        &self.busy
    }

    /// Idle nodes by the function they hold (`None`: none).
    pub(super) fn idle(&self) -> impl Iterator<Item = (Option<FnId>, &BTreeSet<u64>)> {
        self.idle.iter().map(|(&f, s)| (f, s))
    }

    /// Idle nodes holding `f` (`None`: nothing), by id.
    pub(super) fn idle_holding(&self, f: Option<FnId>) -> impl Iterator<Item = u64> + '_ {
        self.idle.get(&f).into_iter().flatten().copied()
    }

    /// `f`'s replicas in the rotation, by id.
    pub(super) fn members(&self, f: FnId) -> impl Iterator<Item = u64> + '_ {
        self.rotations
            .get(&f)
            .into_iter()
            .flat_map(|r| r.seq.keys().copied())
    }
}

impl Sched {
    /// The node's slot changed (or left): its index entries follow.
    pub(super) fn reindex(&mut self, node: u64) {
        let key = self.nodes.get(&node).map(Key::of);
        self.ix.set(node, key);
        self.track_limits(node);
        // An idle node holding nothing anyone wants is a spare one.
        if let Some(k) = key.filter(Key::idle) {
            let wanted = |f| {
                self.fns
                    .get(&f)
                    .is_some_and(super::function::Function::wanted)
            };
            if !k.function.is_some_and(wanted) {
                self.ix.dry = None;
            }
        }
    }

    /// Something placement depends on changed: its count of spare nodes
    /// and of functions above their fair share is redone at the next
    /// event. Called where the nodes' functions, the users or their
    /// weights change; any change to how a function's fair share is
    /// counted (`route::share_weight`) must call it too.
    pub(super) fn placement_changed(&mut self) {
        self.ix.dry = None;
        self.ix.recheck = true;
    }

    /// Work was queued for `f`, or a user waits for it.
    pub(super) fn note_pending(&mut self, f: FnId) {
        self.ix.pending.insert(f);
        self.ix.fresh.insert(f);
        self.ix.dispatchable.insert(f);
        // A function wanted only for its queued work weighs in the fair shares.
        if self.fns.get(&f).is_some_and(|f| f.users.is_empty()) {
            self.placement_changed();
        }
    }

    /// `f` asked for a replica.
    pub(super) fn note_requested(&mut self, f: FnId) {
        self.ix.requested.insert(f);
    }

    /// The functions with queued work or waiting users (`queued`: queued
    /// work only), dropping from the index those with neither.
    pub(super) fn pending(&mut self, queued: bool) -> Vec<FnId> {
        let fns = &self.fns;
        self.ix.pending.retain(|id| {
            fns.get(id)
                .is_some_and(|f| !f.queue.is_empty() || !f.waiting.is_empty())
        });
        let mut ids: Vec<FnId> = self
            .ix
            .pending
            .iter()
            .copied()
            .filter(|id| !queued || !fns[id].queue.is_empty())
            .collect();
        // By id: the order the functions are served in does not depend
        // on a hash.
        ids.sort_unstable();
        ids
    }

    /// The functions that may dispatch queued work now: queued work and a
    /// ready replica, by id; dropping from the index those without.
    pub(super) fn dispatchable(&mut self) -> Vec<FnId> {
        let (fns, ready) = (&self.fns, &self.ix.ready);
        self.ix.dispatchable.retain(|id| {
            fns.get(id).is_some_and(|f| !f.queue.is_empty()) && ready.contains_key(id)
        });
        let mut ids: Vec<FnId> = self.ix.dispatchable.iter().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// The pending functions the refusal check must look at: all after a
    /// node came or left, else those given work or a waiting user, refused
    /// by a node or losing a node since it last looked (nothing else makes
    /// a function unloadable); by id.
    pub(super) fn refusal_candidates(&mut self) -> Vec<FnId> {
        #[cfg(test)]
        if self.ix.always_place {
            self.ix.recheck = true;
        }
        let mut ids = match std::mem::take(&mut self.ix.recheck) {
            true => self.pending(false),
            false => {
                let fns = &self.fns;
                self.ix
                    .fresh
                    .iter()
                    .copied()
                    .filter(|id| {
                        fns.get(id)
                            .is_some_and(|f| !f.queue.is_empty() || !f.waiting.is_empty())
                    })
                    .collect()
            }
        };
        self.ix.fresh.clear();
        ids.sort_unstable();
        ids
    }

    /// The requested functions, dropping from the index those that are not.
    pub(super) fn requested(&mut self) -> Vec<(std::time::Duration, FnId)> {
        let fns = &self.fns;
        self.ix
            .requested
            .retain(|id| fns.get(id).is_some_and(|f| f.requested.is_some()));
        self.ix
            .requested
            .iter()
            .filter_map(|id| fns[id].requested.map(|t| (t, *id)))
            .collect()
    }

    /// The indexes against a scan of every slot and function: what the
    /// scheduler's tests check after random events.
    #[cfg(test)]
    pub(super) fn check_index(&self) {
        let mut fresh = Index::default();
        for (&node, s) in &self.nodes {
            fresh.set(node, Some(Key::of(s)));
        }
        assert_eq!(self.ix.keys, fresh.keys, "keys");
        assert_eq!(self.ix.promised, fresh.promised, "promised");
        assert_eq!(self.ix.ready, fresh.ready, "ready");
        assert_eq!(self.ix.held, fresh.held, "held");
        assert_eq!(self.ix.configuring, fresh.configuring, "configuring");
        assert_eq!(self.ix.draining, fresh.draining, "draining");
        assert_eq!(self.ix.lending, fresh.lending, "lending");
        assert_eq!(self.ix.busy, fresh.busy, "busy");
        assert_eq!(self.ix.idle, fresh.idle, "idle");
        let mut refused: HashMap<FnId, usize> = HashMap::new();
        for s in self.nodes.values() {
            for &f in &s.refused {
                *refused.entry(f).or_default() += 1;
            }
        }
        assert_eq!(self.ix.refused, refused, "refused");
        for (id, f) in &self.fns {
            if !f.queue.is_empty() || !f.waiting.is_empty() {
                assert!(self.ix.pending.contains(id), "pending {id}");
            }
            if f.requested.is_some() {
                assert!(self.ix.requested.contains(id), "requested {id}");
            }
        }
        // Every rotation: its members, and its sets as a scan would find them.
        for (f, r) in &self.ix.rotations {
            assert_eq!(r.seq.len(), r.by_seq.len());
            let mut room = BTreeSet::new();
            let mut written = BTreeSet::new();
            for (&node, &seq) in &r.seq {
                assert_eq!(r.by_seq.get(&seq), Some(&node));
                let k = Key::of(&self.nodes[&node]);
                if k.serving() != Some(*f) {
                    continue;
                }
                if k.outstanding < k.cap as usize {
                    room.insert((k.outstanding, seq, node));
                }
                if !k.unwritten {
                    written.insert((seq, node));
                }
            }
            assert_eq!(r.room, room, "room of {f}");
            assert_eq!(r.written, written, "written of {f}");
        }
        // A node serving a function is in its rotation.
        for (&node, s) in &self.nodes {
            if let Some(f) = Key::of(s).ready_for() {
                assert!(self.ix.members(f).any(|n| n == node), "{node} not in {f}");
            }
        }
    }
}

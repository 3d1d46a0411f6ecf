//! What follows every event: functions every node refused fail, requested
//! functions go onto spare nodes, drained nodes are reprogrammed, and queued
//! jobs go to the replicas the dispatch policy picks.

use std::time::Duration;

use super::function::Function;
use corefarm_smp::ErrorCode;

use super::{Action, FnId, Sched, SlotState};
use crate::dispatch::Load;

/// Shared mode: at most this many messages in flight per replica, whatever
/// the adaptive window says (one in service, one ready). A job in the queue
/// can still go to any replica, including one being loaded; a dispatched
/// job is committed to its node. Seed 002 §5.4.7 makes the same argument
/// for submitting many small jobs rather than a few large ones.
pub(super) const SHARED_WINDOW: u32 = 2;

/// A function whose loading lost this many nodes in a row (closed or timed
/// out before answering) is given up: its waiting users get a negative
/// response with the reasons, as when every node refuses it.
pub(super) const MAX_LOST_LOADS: u32 = 3;

/// A function's weight in the fair shares, in [`super::queue::WEIGHT_UNIT`]s:
/// its active sessions' shares of their tenants' weights summed (a session
/// with work now or lately: [`super::active`]), one if it is wanted only
/// for its queued work, none if nobody wants it or its users are idle.
pub(super) fn share_weight(s: &Sched, f: &Function) -> u128 {
    match (f.wanted(), f.users.is_empty()) {
        (false, _) => 0,
        (true, true) => u128::from(super::queue::WEIGHT_UNIT),
        (true, false) => s.active_weight(f).0,
    }
}

impl Sched {
    /// After every event: fail functions every node refused, place requested
    /// functions on free nodes, finish drains, dispatch queued work.
    pub(super) fn settle(&mut self, now: Duration) {
        self.fail_refused();
        self.place(now);
        self.finish_drains(now);
        self.finish_lends(now);
        self.pump(now);
        self.spread(now);
    }

    /// A function no node can load: every connected node refused it, or
    /// loading it lost `MAX_LOST_LOADS` nodes in a row.
    fn unloadable(&self, f: &Function) -> bool {
        f.lost_loads >= MAX_LOST_LOADS
            || (!self.nodes.is_empty() && self.ix.refused(f.id) == self.nodes.len())
    }

    /// Users of a function no node can load hear it: those waiting for
    /// their configuration get a negative response with the reasons, and
    /// data queued for it while no replica is left (its last one lost) fails
    /// with them, instead of waiting for a replica that cannot come.
    fn fail_refused(&mut self) {
        let mut ids = self.refusal_candidates();
        ids.retain(|id| self.unloadable(&self.fns[id]) && self.replicas_or_loading(*id) == 0);
        for id in ids {
            let f = self.fns.get_mut(&id).expect("listed");
            let reason = match f.refusals.is_empty() {
                true => "no node can load the configuration".to_string(),
                false => format!(
                    "no node can load the configuration: {}",
                    f.refusals.join("; ")
                ),
            };
            while let Some(j) = f.queue.pop() {
                self.out.push(Action::Failed {
                    user: j.user,
                    id: j.id,
                    code: ErrorCode::ConfigurationFailed,
                    reason: reason.clone(),
                });
            }
            let errors = std::mem::take(&mut f.refusals);
            f.requested = None;
            for user in std::mem::take(&mut f.waiting) {
                f.users.remove(&user);
                if let Some(u) = self.users.get_mut(&user) {
                    u.function = None;
                }
                self.out.push(Action::Configured {
                    user,
                    ok: false,
                    errors: errors.clone(),
                });
            }
            self.forget_if_unused(id);
            self.placement_changed();
        }
    }

    /// A requested function without a replica goes at once onto a node
    /// nobody needs: empty, or holding a function no user wants any more.
    /// Without one, a node of a function holding more than its fair share
    /// is drained for it at once, as exclusive mode reprograms a user's own
    /// nodes at once: waiting for Algorithm 1's period would leave the user
    /// idle while other functions keep replicas beyond their share.
    fn place(&mut self, now: Duration) {
        if self.dry() {
            return;
        }
        let mut wanting = self.requested();
        wanting.retain(|&(_, id)| {
            self.fns[&id].lost_loads < MAX_LOST_LOADS && self.replicas_or_loading(id) == 0
        });
        if wanting.is_empty() {
            return;
        }
        // Counted once: placing and draining change no function's weight.
        let users = self.users_of_wanted();
        let spare = self.spare_sets();
        let above = self.above_share(users);
        // No spare node and none to take: nothing can be placed, however
        // many functions wait (more functions than nodes).
        if spare.is_empty() && (above.is_empty() || !self.p.fair_share) {
            return;
        }
        let (mut spare, mut above) = (Some(spare), Some(above));
        wanting.sort();
        // A fair share of the nodes is loaded together with the first
        // replica. Loading only one would make the user wait for it (the
        // positive response) and then its queued jobs wait for a second
        // round of programming on the spare nodes (`spread`), where
        // exclusive mode programs all of a user's nodes at once. Spare
        // nodes hold nothing anyone wants: this costs only their own idle
        // time.
        for (_, f) in wanting {
            let fair = match self.p.fair_share {
                true => self.share_of(f, users),
                false => 1,
            };
            let mut placed = 0;
            for _ in 0..fair {
                let sets = spare.get_or_insert_with(|| self.spare_sets());
                let Some(node) = self.spare_for(f, sets) else {
                    break;
                };
                tracing::debug!(node, function = %f, "a new function on a spare node");
                self.reconfigure(node, f, now);
                placed += 1;
                (above, spare) = (None, None);
            }
            // The rest of the share from functions holding more than
            // theirs, for the same reason: taking one node and leaving the
            // rest to the queued work made each call of a burst on a new
            // function wait for a second programming. The first node may
            // be drained; the others only if idle now, so no function's
            // work in flight is held up for work that may be small.
            while self.p.fair_share && placed < fair {
                let a = above.get_or_insert_with(|| self.above_share(users));
                let Some((node, left)) = self.surplus_for(f, now, a) else {
                    break;
                };
                if placed > 0 && (left > 0.0 || !self.nodes[&node].in_flight.is_empty()) {
                    break;
                }
                self.drain_for(node, f, now);
                placed += 1;
                (above, spare) = (None, None);
            }
        }
    }

    /// `f`'s fair share of the nodes: as many as exclusive mode would give
    /// its users if only the active ones held nodes, the nodes split over
    /// `users` (the weights of the active users of the functions someone
    /// wants — a function wanted only for its queued work counts as one
    /// user — and of the users still to configure) by weight; at least one.
    fn share_of(&self, f: FnId, users: u128) -> usize {
        let mine = self.fns.get(&f).map_or(1, |f| share_weight(self, f)).max(1);
        let share = self.nodes.len() as u128 * mine / users.max(1);
        usize::try_from(share).unwrap_or(usize::MAX).max(1)
    }

    /// The active users of the functions someone wants, and the users
    /// about to configure their first.
    fn users_of_wanted(&self) -> u128 {
        let w = |f| share_weight(self, f);
        let joining = self.joining as u128 * u128::from(super::queue::WEIGHT_UNIT);
        self.fns.values().map(w).sum::<u128>() + joining
    }

    /// The functions held by idle nodes that nobody needs (`None`: nodes
    /// holding none): where [`Sched::spare_for`] looks. Linear in the
    /// functions held by idle nodes; counted once per round of placements
    /// and again after each.
    fn spare_sets(&self) -> Vec<Option<FnId>> {
        let unwanted =
            |g: Option<FnId>| g.is_none_or(|g| !self.fns.get(&g).is_some_and(Function::wanted));
        self.ix
            .idle()
            .map(|(g, _)| g)
            .filter(|&g| unwanted(g))
            .collect()
    }

    /// The spare nodes in `sets` (from [`Sched::spare_sets`]).
    fn spare_count(&self, sets: &[Option<FnId>]) -> usize {
        sets.iter().map(|&g| self.ix.idle_holding(g).count()).sum()
    }

    /// Nodes owed to fair shares: what the functions of active users (or
    /// with queued work) lack of their shares, plus a share for each user
    /// still to configure. Linear in the functions; counted only when a
    /// function would borrow a spare node beyond its share.
    fn owed(&self, users: u128) -> usize {
        let unit = u128::from(super::queue::WEIGHT_UNIT);
        let joining = self.nodes.len() as u128 * unit / users.max(1);
        let joining = self.joining * usize::try_from(joining).unwrap_or(usize::MAX).max(1);
        self.fns
            .values()
            .filter(|g| share_weight(self, g) > 0)
            .map(|g| {
                self.share_of(g.id, users)
                    .saturating_sub(self.ix.promised(g.id))
            })
            .sum::<usize>()
            + joining
    }

    /// A node nobody needs, idle, that may load `f`: the first by id of
    /// the nodes in `sets` (from [`Sched::spare_sets`]).
    fn spare_for(&self, f: FnId, sets: &[Option<FnId>]) -> Option<u64> {
        sets.iter()
            .filter_map(|&g| {
                self.ix
                    .idle_holding(g)
                    .find(|n| !self.nodes[n].refused.contains(&f))
            })
            .min()
    }

    /// The functions holding more nodes than their fair share (of
    /// `users`), with how many they hold: those [`Sched::surplus_for`] may
    /// take a node from. Linear in the functions that hold nodes; counted
    /// once per round of placements and again after each move.
    fn above_share(&self, users: u128) -> Vec<(FnId, usize)> {
        self.ix
            .promised_all()
            .filter(|&(g, n)| n > self.share_of(g, users))
            .collect()
    }

    /// A replica `f` may take from a function holding more than its fair
    /// share (`above`, from [`Sched::above_share`]), and how long until its
    /// work in flight is done (from its function's measured service time):
    /// the one idle first (one with no work in flight before one whose work
    /// should be done by now), then one of the function with the most. Moving a
    /// node from above a fair share to below one cannot make the two
    /// functions trade it back.
    fn surplus_for(&self, f: FnId, now: Duration, above: &[(FnId, usize)]) -> Option<(u64, f64)> {
        above
            .iter()
            .filter(|&&(g, _)| g != f)
            .flat_map(|&(g, n)| self.ix.members(g).map(move |id| (g, n, id)))
            .filter_map(|(g, n, id)| {
                let s = &self.nodes[&id];
                if s.state != SlotState::Ready || s.function != Some(g) || s.refused.contains(&f) {
                    return None;
                }
                let service = self.fns.get(&g)?.service_or(self.p.service_prior);
                let inputs: u64 = s.in_flight.values().map(|j| j.count as u64).sum();
                let done = now.saturating_sub(s.busy_until).as_secs_f64();
                let left = (inputs as f64 * service - done).max(0.0);
                let busy = !s.in_flight.is_empty();
                Some((
                    Duration::from_secs_f64(left),
                    busy,
                    std::cmp::Reverse(n),
                    id,
                ))
            })
            .min()
            .map(|(left, _, _, id)| (id, left.as_secs_f64()))
    }

    /// No node can move to another function: none is spare, and none
    /// is above its function's fair share (or fair shares are off), so
    /// [`Sched::place`] and [`Sched::spread`] have nothing to do. Counted
    /// again only after [`Sched::placement_changed`]: with more functions
    /// waiting than nodes, an event then costs no count of the functions.
    fn dry(&mut self) -> bool {
        #[cfg(test)]
        if self.ix.always_place {
            return false;
        }
        if let Some(dry) = self.ix.dry {
            return dry;
        }
        let dry = self.spare_sets().is_empty()
            && (!self.p.fair_share || self.above_share(self.users_of_wanted()).is_empty());
        self.ix.dry = Some(dry);
        dry
    }

    /// `node` loads `f` now if idle; otherwise it takes no new work and
    /// loads `f` once its work is done (`finish_drains`).
    fn drain_for(&mut self, node: u64, f: FnId, now: Duration) {
        tracing::debug!(node, function = %f, "a replica beyond its function's fair share goes to another");
        let slot = self.nodes.get_mut(&node).expect("listed");
        match slot.in_flight.is_empty() {
            true => self.reconfigure(node, f, now),
            false => {
                slot.state = SlotState::Draining { target: f };
                self.reindex(node);
            }
        }
    }

    /// Work that waits in a queue after dispatch goes onto more nodes at
    /// once, without waiting for the period, when the queue would keep the
    /// function's replicas busy longer than the new node takes to be ready
    /// (drained, if it is taken from another function, and programmed): spare
    /// nodes first (they hold nothing anyone wants, so it costs only their
    /// idle time), then, up to the function's fair share, nodes of
    /// functions holding more than theirs. Algorithm 1 then decides about
    /// the rest.
    fn spread(&mut self, now: Duration) {
        if self.dry() {
            return;
        }
        let mut waiting: Vec<(usize, FnId)> = self
            .pending(true)
            .into_iter()
            .map(|f| (self.fns[&f].queue.len(), f))
            .collect();
        waiting.sort_by_key(|w| std::cmp::Reverse(w.0));
        if waiting.is_empty() {
            return;
        }
        // Counted once: placing and draining change no function's weight.
        let users = self.users_of_wanted();
        let (mut above, mut spare, mut owed) = (None, None, None);
        for (queued, f) in waiting {
            let fair = self.share_of(f, users);
            let func = &self.fns[&f];
            let work = func.queue.iter().map(|j| j.count as f64).sum::<f64>()
                * func.service_or(self.p.service_prior);
            // Promised to it and not serving it: loading or drained for it.
            let mut loading = self.ix.promised(f) - self.ix.ready(f);
            while loading < queued {
                let replicas = self.replicas_or_loading(f);
                // A spare node is free now; one taken from another
                // function once its work in flight is done.
                let sets = spare.get_or_insert_with(|| self.spare_sets());
                // Beyond its fair share, a function borrows only the spare
                // nodes no other function's share is owed: borrowed ones
                // would be drained back from it as soon as the owed
                // function has work, one programming more for each.
                let borrow = |me: &Self, owed: &mut Option<usize>| {
                    !me.p.fair_share
                        || replicas < fair
                        || me.spare_count(sets) > *owed.get_or_insert_with(|| me.owed(users))
                };
                let node = match self.spare_for(f, sets) {
                    Some(_) if !borrow(self, &mut owed) => None,
                    Some(n) => Some((n, None)),
                    None if self.p.fair_share && replicas < fair => {
                        let a = above.get_or_insert_with(|| self.above_share(users));
                        self.surplus_for(f, now, a).map(|(n, left)| (n, Some(left)))
                    }
                    None => None,
                };
                let Some((node, drain)) = node else { break };
                // Worth it only if the node is ready (drained and
                // programmed) before the replicas would have finished the
                // queue: a drained node takes no work of its own function,
                // and one that comes too late is not needed any more.
                let ready_in = drain.unwrap_or(0.0) + self.reconfig_time(node).as_secs_f64();
                if work / replicas.max(1) as f64 <= ready_in {
                    break;
                }
                match drain {
                    Some(_) => self.drain_for(node, f, now),
                    None => {
                        tracing::debug!(node, function = %f, queued, "queued work on a spare node");
                        self.reconfigure(node, f, now)
                    }
                }
                (above, spare, owed) = (None, None, None);
                loading += 1;
            }
        }
    }

    fn finish_drains(&mut self, now: Duration) {
        let done: Vec<(u64, FnId)> = self
            .ix
            .draining()
            .iter()
            .filter_map(|id| {
                let s = &self.nodes[id];
                match s.state {
                    SlotState::Draining { target } if s.outstanding() == 0 => Some((*id, target)),
                    _ => None,
                }
            })
            .collect();
        for (node, target) in done {
            // Still needed: only this node is promised to the function, or
            // it has work waiting (a drain for its fair share).
            let needed = self.fns.get(&target).is_some_and(|f| {
                f.wanted() && (self.replicas_or_loading(target) == 1 || !f.queue.is_empty())
            });
            if needed {
                tracing::debug!(node, function = %target, "a drained node loads its next function");
                self.reconfigure(node, target, now);
            } else {
                self.nodes.get_mut(&node).expect("listed").state = SlotState::Ready;
                self.reindex(node);
            }
        }
    }

    /// Dispatches queued jobs to the replicas the policy picks.
    fn pump(&mut self, now: Duration) {
        // Late jobs first: they are the oldest work.
        self.place_hedges(now);
        for fid in self.dispatchable() {
            // When this function's loading replicas will take work.
            let loading: Vec<Duration> = self
                .ix
                .configuring(fid)
                .filter_map(|id| match self.nodes[&id].state {
                    SlotState::Configuring { since, .. } => Some(since + self.reconfig_time(id)),
                    _ => None,
                })
                .collect();
            let service = self.fns[&fid].service_or(self.p.service_prior);
            loop {
                let (nodes, policy) = (&self.nodes, self.p.policy);
                let queued = self.fns.get(&fid).map_or(0, |f| f.queue.len());
                let load = |id: u64| {
                    nodes
                        .get(&id)
                        .filter(|s| {
                            s.state == SlotState::Ready && s.function == Some(fid) && !s.stalled
                        })
                        .map(|s| {
                            let mut window = s.window.get().min(SHARED_WINDOW);
                            // A busy replica queues no job that a replica
                            // still loading would start sooner: the queue
                            // is short enough for those to take it all.
                            if !s.in_flight.is_empty() && !loading.is_empty() {
                                let inputs: u64 =
                                    s.in_flight.values().map(|j| j.count as u64).sum();
                                // Its work in flight began at `busy_until`.
                                let work = Duration::from_secs_f64(inputs as f64 * service);
                                let frees = (s.busy_until + work).max(now);
                                let sooner = loading.iter().filter(|&&t| t < frees).count();
                                if queued <= sooner {
                                    window = window.min(s.in_flight.len() as u32);
                                }
                            }
                            Load {
                                unwritten: s.sent.saturating_sub(s.written),
                                in_flight: s.outstanding(),
                                window,
                            }
                        })
                };
                // Without replicas loading, the load is the indexed one.
                let picked = match loading.is_empty() {
                    true => self.ix.pick(fid, policy),
                    false => self.ix.pick_by(fid, policy, load),
                };
                let Some(node) = picked else {
                    break;
                };
                // A session whose tenant is at its `max_nodes` is served
                // only by a node its tenant already uses.
                let Some((node, mut job)) = self.next_job(fid, node) else {
                    break;
                };
                // A function wanted only for its queued work is not any
                // more once that is dispatched: its idle nodes are spare.
                if self
                    .fns
                    .get(&fid)
                    .is_some_and(|f| f.users.is_empty() && f.queue.is_empty())
                {
                    self.placement_changed();
                }
                job.permit = None;
                job.sent = now;
                let internal = self.next_internal;
                self.next_internal = self.next_internal.wrapping_add(1);
                if let Some(u) = self.users.get_mut(&job.user) {
                    u.in_flight += 1;
                }
                let slot = self.nodes.get_mut(&node).expect("picked");
                let first = slot.outstanding() == 0;
                if first {
                    slot.last_progress = now;
                    slot.busy_until = slot.busy_until.max(now);
                }
                let late_at = self.p.hedge.map(|h| now + h.earliest());
                self.out.push(Action::Send {
                    node,
                    internal,
                    data: job.data.clone(),
                    class: job.class,
                    first,
                });
                slot.in_flight.insert(internal, job);
                slot.sent += 1;
                self.reindex(node);
                // No job is late before the floor; the check then looks at
                // the measured service time.
                if let Some(at) = late_at {
                    self.arm_progress(at);
                }
            }
        }
    }

    /// Nodes past a deadline: configuring too long, or silent with work.
    pub fn expired(
        &self,
        now: Duration,
        config: Duration,
        progress: Duration,
    ) -> Vec<(u64, String)> {
        // Only nodes being loaded or with work can be past a deadline.
        let mut look: Vec<u64> = self.ix.busy().iter().copied().collect();
        look.extend(self.ix.loading());
        look.sort_unstable();
        look.dedup();
        look.into_iter()
            .map(|id| (id, &self.nodes[&id]))
            .filter_map(|(id, s)| match s.state {
                SlotState::Configuring { since, .. } if now.saturating_sub(since) > config => {
                    Some((id, format!("no configuration response within {config:?}")))
                }
                _ if s.outstanding() > 0 && now.saturating_sub(s.last_progress) > progress => {
                    Some((
                        id,
                        format!(
                            "no result for {progress:?} with {} message(s) in flight",
                            s.outstanding()
                        ),
                    ))
                }
                _ => None,
            })
            .collect()
    }

    pub(super) fn fail_without_nodes(&mut self, now: Duration) {
        let wait = self.p.node_wait;
        let reason = format!("no node is connected to the server (waited {wait:?}, --node-wait)");
        for f in self.fns.values_mut() {
            for user in std::mem::take(&mut f.waiting) {
                f.users.remove(&user);
                if let Some(u) = self.users.get_mut(&user) {
                    u.function = None;
                }
                self.out.push(Action::Configured {
                    user,
                    ok: false,
                    errors: vec![reason.clone()],
                });
            }
            while let Some(j) = f.queue.pop() {
                let (user, id, reason) = (j.user, j.id, reason.clone());
                self.out.push(Action::Failed {
                    user,
                    id,
                    code: ErrorCode::NoNodes,
                    reason,
                });
            }
            f.requested = None;
        }
        self.placement_changed();
        let ids: Vec<FnId> = self.fns.keys().copied().collect();
        ids.into_iter().for_each(|id| self.forget_if_unused(id));
        self.no_nodes_since = Some(now);
    }
}

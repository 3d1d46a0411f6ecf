//! A tenant's `max_nodes` in shared mode: at most that many nodes run its
//! work at once. The nodes running each limited tenant's work are kept
//! as a set, updated from a node's jobs in flight whenever its slot
//! changes ([`Sched::reindex`]), so the check is a lookup, not a scan of
//! the nodes; while no session has a limit nothing is tracked.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::route::SHARED_WINDOW;
use super::{FnId, Function, Job, Sched, SlotState};
use crate::dispatch::Policy;

/// Whose `max_nodes` a job counts against: its named tenant (every
/// session of it), or its session alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Holder {
    Tenant(Arc<str>),
    Session(u64),
}

#[derive(Debug, Default)]
pub(super) struct Limits {
    /// Sessions with a `max_nodes`: while none, nothing is tracked.
    sessions: usize,
    /// Per limited holder, the nodes running its work.
    running: HashMap<Holder, HashSet<u64>>,
    /// Per node, the limited holders it runs work of, as `running` has it.
    on: HashMap<u64, Vec<Holder>>,
}

impl Limits {
    /// A session's limit changed from set (`had`) to set (`has`) or not.
    pub(super) fn limited(&mut self, had: bool, has: bool) {
        match (had, has) {
            (false, true) => self.sessions += 1,
            (true, false) => self.sessions -= 1,
            _ => {}
        }
    }

    /// Nodes running `h`'s work.
    fn nodes(&self, h: &Holder) -> Option<&HashSet<u64>> {
        self.running.get(h)
    }
}

impl Sched {
    /// Whose limit `user`'s work counts against, if it has one.
    fn holder(&self, user: u64) -> Option<(Holder, u32)> {
        let rec = self.users.get(&user)?;
        let max = rec.max_nodes?;
        let h = match &rec.tenant {
            Some(t) => Holder::Tenant(t.clone()),
            None => Holder::Session(user),
        };
        Some((h, max))
    }

    /// `node`'s jobs in flight changed (or it left): the limited holders
    /// it runs work of are counted afresh. O(jobs in flight on the node).
    pub(super) fn track_limits(&mut self, node: u64) {
        if self.limits.sessions == 0 && self.limits.on.is_empty() {
            return;
        }
        let mut now: Vec<Holder> = Vec::new();
        if let Some(s) = self.nodes.get(&node) {
            for j in s.in_flight.values() {
                if let Some((h, _)) = self.holder(j.user) {
                    if !now.contains(&h) {
                        now.push(h);
                    }
                }
            }
        }
        let l = &mut self.limits;
        for h in l.on.remove(&node).unwrap_or_default() {
            if let Some(set) = l.running.get_mut(&h) {
                set.remove(&node);
                if set.is_empty() {
                    l.running.remove(&h);
                }
            }
        }
        for h in &now {
            l.running.entry(h.clone()).or_default().insert(node);
        }
        if !now.is_empty() {
            l.on.insert(node, now);
        }
    }

    /// A limited session left (`rec` is its record, already removed): the
    /// nodes running its work no longer count it against its tenant.
    pub(super) fn forget_limited(&mut self, user: u64, rec: &super::UserRec) {
        if rec.max_nodes.is_none() {
            return;
        }
        let h = match &rec.tenant {
            Some(t) => Holder::Tenant(t.clone()),
            None => Holder::Session(user),
        };
        let nodes: Vec<u64> = self
            .limits
            .nodes(&h)
            .into_iter()
            .flatten()
            .copied()
            .collect();
        nodes.into_iter().for_each(|n| self.track_limits(n));
    }

    /// Whether `user`'s work may run on `node`: its tenant has no
    /// `max_nodes`, runs work on fewer nodes, or already on this one.
    pub(super) fn may_run(&self, user: u64, node: u64) -> bool {
        let Some((h, max)) = self.holder(user) else {
            return true;
        };
        self.limits
            .nodes(&h)
            .is_none_or(|set| set.len() < max as usize || set.contains(&node))
    }

    /// Sessions of `f` held off `node` by their tenant's `max_nodes`.
    fn held_off(&self, f: &Function, node: u64) -> Vec<u64> {
        if self.limits.sessions == 0 {
            return Vec::new();
        }
        let limited = |u: &&u64| self.users.get(u).is_some_and(|r| r.max_nodes.is_some());
        f.users
            .iter()
            .filter(limited)
            .filter(|&&u| !self.may_run(u, node))
            .copied()
            .collect()
    }

    /// A replica of `fid` already running `user`'s tenant's work, with
    /// room for one more job (the least loaded): where a tenant at its
    /// `max_nodes` is served. O(its nodes).
    fn own_replica(&self, fid: FnId, user: u64) -> Option<u64> {
        let (h, _) = self.holder(user)?;
        let policy = self.p.policy;
        self.limits
            .nodes(&h)?
            .iter()
            .filter_map(|&n| Some((n, self.nodes.get(&n)?)))
            .filter(|(_, s)| s.state == SlotState::Ready && s.function == Some(fid) && !s.stalled)
            .filter(|(_, s)| match policy {
                Policy::Credit => s.outstanding() < s.window.get().clamp(1, SHARED_WINDOW) as usize,
                Policy::Queue | Policy::Stack => s.sent <= s.written,
            })
            .min_by_key(|&(n, s)| (s.outstanding(), n))
            .map(|(n, _)| n)
    }

    /// The next job of `fid` and its node, `node` being the dispatch
    /// policy's pick: a job of a session `node` may run; otherwise, when
    /// every queued session is held off it by its tenant's `max_nodes`, a
    /// job of the first of those with room on a replica its tenant already
    /// uses, on that replica. `None`: nothing can be sent now.
    pub(super) fn next_job(&mut self, fid: FnId, node: u64) -> Option<(u64, Job)> {
        let off = self.fns.get(&fid).map(|f| self.held_off(f, node))?;
        let f = self.fns.get_mut(&fid)?;
        if let Some(j) = f.queue.pop_except(&off) {
            return Some((node, j));
        }
        // Only held-off sessions have work queued.
        let (u, own) = off
            .iter()
            .filter(|&&u| self.fns[&fid].queue.len_of(u) > 0)
            .find_map(|&u| Some((u, self.own_replica(fid, u)?)))?;
        let others: Vec<u64> = off.into_iter().filter(|&v| v != u).collect();
        let j = self.fns.get_mut(&fid)?.queue.pop_except(&others)?;
        Some((own, j))
    }

    /// The tracked nodes against a scan of every node's jobs in flight:
    /// what the scheduler's tests check after random events.
    #[cfg(test)]
    pub(super) fn check_limits(&self) {
        let mut running: HashMap<Holder, HashSet<u64>> = HashMap::new();
        for (&n, s) in &self.nodes {
            for j in s.in_flight.values() {
                if let Some((h, _)) = self.holder(j.user) {
                    running.entry(h).or_default().insert(n);
                }
            }
        }
        assert_eq!(self.limits.running, running, "nodes running limited work");
    }
}

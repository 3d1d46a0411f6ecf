//! Nodes grouped by the function they hold, the groups in order of a rank
//! (Algorithm 1's claim of the group's function), so that the node with
//! the lowest (rank, id) is found without a scan of every node.
//!
//! All nodes of a group share their rank: when a node moves, only the
//! groups of the two functions whose replica counts changed are ranked
//! again, O(log n) each. A node that may not take a given function (it
//! refused it) is passed over inside its group; without refusals the first
//! group listed holds the answer.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};

use super::FnId;

/// A rank ordered as `f64::total_cmp` orders it.
#[derive(Debug, Clone, Copy)]
struct Rank(f64);

impl PartialEq for Rank {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Rank {}
impl PartialOrd for Rank {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Rank {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// A group: the nodes holding one function (`None`: none).
type Group = Option<FnId>;

#[derive(Debug, Default)]
pub(super) struct Ranked {
    members: HashMap<Group, BTreeSet<u64>>,
    /// Each listed group's key in `order`.
    listed: HashMap<Group, (Rank, u64)>,
    order: BTreeSet<(Rank, u64, Group)>,
}

impl Ranked {
    /// `node` belongs to `g` (before the groups are ranked).
    pub(super) fn add(&mut self, g: Group, node: u64) {
        self.members.entry(g).or_default().insert(node);
    }

    /// Every group, for the first ranking.
    pub(super) fn groups(&self) -> Vec<Group> {
        self.members.keys().copied().collect()
    }

    /// `node` leaves `g` (if it was there).
    pub(super) fn remove(&mut self, g: Group, node: u64) {
        if let Some(m) = self.members.get_mut(&g) {
            m.remove(&node);
            if m.is_empty() {
                self.members.remove(&g);
            }
        }
    }

    /// `g`'s rank is now `rank`; `None`: the group is not a candidate.
    pub(super) fn rank(&mut self, g: Group, rank: Option<f64>) {
        if let Some((r, first)) = self.listed.remove(&g) {
            self.order.remove(&(r, first, g));
        }
        let first = self.members.get(&g).and_then(|m| m.first().copied());
        if let (Some(rank), Some(first)) = (rank, first) {
            self.listed.insert(g, (Rank(rank), first));
            self.order.insert((Rank(rank), first, g));
        }
    }

    /// No group is a candidate.
    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The node with the lowest (rank, id) among the listed groups' nodes
    /// that `ok` accepts, and its group.
    pub(super) fn lowest(&self, ok: impl Fn(u64) -> bool) -> Option<(Group, u64)> {
        let mut best: Option<(Rank, u64, Group)> = None;
        for &(rank, first, g) in &self.order {
            // A group's nodes come no earlier than its first.
            if best.is_some_and(|(r, id, _)| (rank, first) > (r, id)) {
                break;
            }
            let found = self.members[&g].iter().copied().find(|&n| ok(n));
            if let Some(n) = found {
                if best.is_none_or(|(r, id, _)| (rank, n) < (r, id)) {
                    best = Some((rank, n, g));
                }
            }
        }
        best.map(|(_, n, g)| (g, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(b: u8) -> Group {
        Some(FnId([b; 32]))
    }

    #[test]
    fn lowest_rank_then_lowest_id_passing_over_refusals() {
        let mut r = Ranked::default();
        for (g, n) in [(f(1), 5), (f(1), 9), (f(2), 3), (None, 7)] {
            r.add(g, n);
        }
        for g in r.groups() {
            r.rank(g, Some(if g == f(2) { 2.0 } else { 1.0 }));
        }
        assert_eq!(r.lowest(|_| true), Some((f(1), 5)));
        // Node 5 refuses: 7 (None, rank 1) comes before 9 (same rank).
        assert_eq!(r.lowest(|n| n != 5), Some((None, 7)));
        assert_eq!(r.lowest(|n| n == 3), Some((f(2), 3)));
        r.remove(f(1), 5);
        r.rank(f(1), Some(0.5));
        assert_eq!(r.lowest(|_| true), Some((f(1), 9)));
        r.rank(f(1), None);
        r.rank(None, None);
        assert_eq!(r.lowest(|_| true), Some((f(2), 3)));
        r.rank(f(2), None);
        assert!(r.is_empty());
        assert_eq!(r.lowest(|_| true), None);
    }
}

//! Lending nodes to groups in shared mode. A group gang-allocates
//! its nodes for its lifetime, but in shared mode the scheduler holds every
//! node. It takes the chosen ones out of service — no new work, while work
//! already dispatched finishes there, so nothing runs twice — and lets each
//! go once idle ([`Action::Lent`]). They come back through the pool when the
//! group ends, as any newly connected node does.

use std::time::Duration;

use super::function::Function;
use super::{Action, Sched, SlotState};

impl Sched {
    /// Promises `n` of `candidates` (the nodes a group can use) to a group,
    /// all or none. Idle nodes go first, then nodes holding nothing anyone
    /// wants, then those with the least work in flight. Nodes being
    /// configured are not taken: their programming would be wasted.
    pub fn lend(&mut self, candidates: &[u64], n: usize, now: Duration) -> bool {
        let mut pick: Vec<(usize, bool, u64)> = candidates
            .iter()
            .filter_map(|&id| {
                let s = self.nodes.get(&id)?;
                let free = matches!(
                    s.state,
                    SlotState::Empty | SlotState::Ready | SlotState::Draining { .. }
                );
                let wanted = s
                    .function
                    .is_some_and(|f| self.fns.get(&f).is_some_and(Function::wanted));
                free.then_some((s.outstanding(), wanted, id))
            })
            .collect();
        if pick.len() < n {
            return false;
        }
        pick.sort_unstable();
        for &(_, _, id) in &pick[..n] {
            let s = self.nodes.get_mut(&id).expect("picked");
            s.state = SlotState::Lending;
            if let Some(f) = s.function {
                self.ix.rotation_remove(f, id);
            }
            self.reindex(id);
        }
        self.settle(now);
        true
    }

    /// Promised nodes whose last job finished leave the scheduler; work
    /// queued for their function waits for, or loads, another replica.
    pub(super) fn finish_lends(&mut self, now: Duration) {
        let done: Vec<u64> = self
            .ix
            .lending()
            .iter()
            .copied()
            .filter(|id| self.nodes[id].outstanding() == 0)
            .collect();
        for node in done {
            self.detach(node, now);
            self.out.push(Action::Lent { node });
        }
    }

    /// Nodes promised to groups and still finishing work.
    pub fn lending(&self) -> usize {
        self.ix.lending().len()
    }
}

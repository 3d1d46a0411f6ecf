//! Exclusive mode's side of the progress rule ([`crate::dispatch::progress`]):
//! a late message gets a copy on another of the user's nodes, the first
//! answer wins; a node without progress takes no new work until it
//! answers. The placement's timer (`Owned::event`) wakes it when the
//! rule next has something to decide.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Node, Owned, Pending, Slot};
use crate::dispatch::progress::{budget, expect, record_service, slower};

impl Node {
    /// Messages sent and not answered, copies whose twin won included:
    /// the node is still working on them.
    pub(super) fn outstanding(&self) -> usize {
        self.in_flight.len() + self.late.len()
    }

    /// It answered something: its progress clock restarts and, if it was
    /// stalled, it takes work again with the window it had.
    pub(super) fn progressed(&mut self, now: Instant) {
        self.last_progress = now;
        if std::mem::take(&mut self.stalled) {
            tracing::info!(node = %self.tx.label(), "answered again: takes work");
        }
    }
}

impl Owned {
    /// Time on the placement's clock (the rule and the windows count from it).
    fn since(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.clock)
    }

    /// The rule needs a look no later than `at`.
    pub(super) fn arm_progress(&mut self, at: Instant) {
        if self.shared.opts.hedge.is_some() {
            self.progress_at = Some(self.progress_at.map_or(at, |t| t.min(at)));
        }
    }

    /// Marks late messages due for a copy and stalled nodes, then sends
    /// the copies that have a node.
    pub(super) fn check_progress(&mut self) {
        self.progress_at = None;
        let Some(rule) = self.shared.opts.hedge else {
            return;
        };
        let now = Instant::now();
        let t = self.since(now);
        let mut next: Option<Duration> = None;
        let mut soon = |at: Duration| next = Some(next.map_or(at, |n: Duration| n.min(at)));
        let (clock, service, hedgeable) = (self.clock, self.service, self.hedgeable);
        let at = |i: Instant| i.saturating_duration_since(clock);
        for (&id, n) in self.nodes.iter_mut() {
            if n.slot != Slot::Ready || n.outstanding() == 0 {
                continue;
            }
            let last = at(n.last_progress);
            let service = slower(n.service, service);
            let mut longest = None;
            for (&internal, p) in &n.in_flight {
                let Some(e) = expect(service, p.count) else {
                    continue;
                };
                longest = longest.max(Some(e));
                if !hedgeable || p.twin.is_some() {
                    continue;
                }
                let late = rule.late_at(at(p.sent), last, e);
                if t >= late {
                    if !self.due.contains(&(id, internal)) {
                        self.due.push((id, internal));
                    }
                } else {
                    soon(late);
                }
            }
            let Some(longest) = longest.or_else(|| expect(service, 1)) else {
                continue;
            };
            if !n.stalled {
                let stall = last + rule.stall_after(longest);
                if t >= stall {
                    n.stalled = true;
                    tracing::warn!(
                        user = %self.peer,
                        node = %n.tx.label(),
                        "no progress for {:?} with {} message(s) in flight: no new work until it answers",
                        t - last,
                        n.outstanding()
                    );
                } else {
                    soon(stall);
                }
            }
        }
        self.progress_at = next.map(|d| self.clock + d);
        self.place_hedges();
    }

    /// Sends a copy of each due message to another ready node with room in
    /// its window, within the budget of copies in flight; the rest stay due
    /// until a node has room (tried again after every event).
    pub(super) fn place_hedges(&mut self) {
        if self.due.is_empty() {
            return;
        }
        let due = std::mem::take(&mut self.due);
        for (from, internal) in due {
            let Some(p) = self
                .nodes
                .get(&from)
                .and_then(|n| n.in_flight.get(&internal))
                .filter(|p| p.twin.is_none())
            else {
                continue;
            };
            let w = self.window.get().max(1);
            let window = |_: &u64| w;
            let takers = self
                .nodes
                .iter()
                .filter(|(_, n)| n.slot == Slot::Ready && !n.stalled);
            if self.hedged >= budget(takers.clone().map(|(id, _)| window(id))) {
                self.due.push((from, internal));
                continue;
            }
            let target = takers
                .filter(|&(&id, n)| id != from && n.outstanding() < window(&id) as usize)
                .min_by_key(|(_, n)| n.outstanding())
                .map(|(&id, _)| id);
            let Some(to) = target else {
                self.due.push((from, internal));
                continue;
            };
            let copy = Pending {
                user_id: p.user_id,
                data: p.data.clone(),
                count: p.count,
                class: p.class,
                sent: Instant::now(),
                notes: 0,
                twin: Some((from, internal)),
            };
            let Ok(copy_id) = self.send_to(to, copy) else {
                self.due.push((from, internal));
                continue;
            };
            if let Some(p) = self
                .nodes
                .get_mut(&from)
                .and_then(|n| n.in_flight.get_mut(&internal))
            {
                p.twin = Some((to, copy_id));
            }
            self.hedged += 1;
            self.shared.metrics.hedged();
            tracing::debug!(user = %self.peer, from, to, "late message hedged");
        }
    }

    /// A message with a twin was answered (or its node lost): the twin's
    /// answer, if one still comes, is dropped; the pair leaves the budget.
    /// `answered`: this copy's answer won; otherwise the twin carries on.
    pub(super) fn settle_twin(&mut self, twin: Option<(u64, u32)>, answered: bool) {
        let Some((node, internal)) = twin else { return };
        let Some(n) = self.nodes.get_mut(&node) else {
            return;
        };
        if answered {
            if let Some(p) = n.in_flight.remove(&internal) {
                n.late.insert(internal, (p.sent, p.count));
            } else {
                return;
            }
        } else if let Some(p) = n.in_flight.get_mut(&internal) {
            p.twin = None;
        } else {
            return;
        }
        self.hedged = self.hedged.saturating_sub(1);
    }

    /// An answer (result or error) to a copy whose twin answered first:
    /// dropped and counted. `false` if `internal` is no such copy.
    pub(super) fn drop_late(&mut self, node: u64, internal: u32) -> bool {
        let Some(n) = self.nodes.get_mut(&node) else {
            return false;
        };
        let Some((sent, count)) = n.late.remove(&internal) else {
            return false;
        };
        let now = Instant::now();
        let took = now.saturating_duration_since(sent.max(n.last_progress));
        n.service = Some(record_service(n.service, took, count));
        n.progressed(now);
        n.tx.entry.in_flight.fetch_sub(1, Ordering::Relaxed);
        let node_time =
            n.tx.entry
                .m
                .answered(n.outstanding() == 0, false, now.into_std());
        tracing::debug!(user = %self.peer, node = %n.tx.label(), "late duplicate dropped");
        self.charge(node_time);
        self.shared.metrics.hedge_duplicate();
        true
    }
}

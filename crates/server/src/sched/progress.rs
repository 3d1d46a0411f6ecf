//! Shared mode's side of the progress rule ([`crate::dispatch::progress`]):
//! late jobs get a copy on another replica of their function, nodes without
//! progress take no new work. Time comes in the events, as everywhere in
//! [`Sched`]; the driver asks [`Sched::next_progress_check`] when to call
//! [`Sched::check_progress`].

use std::time::Duration;

use super::route::SHARED_WINDOW;
use super::{Action, Job, Sched, Slot, SlotState};
use crate::dispatch::progress::{budget, expect, record_service, slower};

impl Slot {
    /// Jobs sent and not answered, copies whose twin won included: the
    /// node is still working on them.
    pub(super) fn outstanding(&self) -> usize {
        self.in_flight.len() + self.late.len()
    }

    /// It answered something: its progress clock restarts and, if it was
    /// stalled, it takes work again.
    pub(super) fn progressed(&mut self, node: u64, now: Duration, out: &mut Vec<Action>) {
        self.last_progress = now;
        if std::mem::take(&mut self.stalled) {
            out.push(Action::Stalled {
                node,
                stalled: false,
            });
        }
    }
}

impl Sched {
    /// When [`Sched::check_progress`] next has something to decide.
    pub fn next_progress_check(&self) -> Option<Duration> {
        self.progress_at
    }

    /// The rule needs a look no later than `at`.
    pub(super) fn arm_progress(&mut self, at: Duration) {
        if self.p.hedge.is_some() {
            self.progress_at = Some(self.progress_at.map_or(at, |t| t.min(at)));
        }
    }

    /// Marks late jobs due for a copy and stalled nodes, then settles (the
    /// copies go out with the rest of the dispatch).
    pub fn check_progress(&mut self, now: Duration) {
        self.progress_at = None;
        let Some(rule) = self.p.hedge else { return };
        let mut next: Option<Duration> = None;
        let mut soon = |t: Duration| next = Some(next.map_or(t, |n: Duration| n.min(t)));
        // Only nodes with work in flight can be late or stalled.
        let busy: Vec<u64> = self.ix.busy().iter().copied().collect();
        let mut changed = Vec::new();
        for node in busy {
            let slot = self.nodes.get_mut(&node).expect("indexed");
            let Some(f) = slot.function.and_then(|f| self.fns.get(&f)) else {
                continue;
            };
            let service = slower(slot.service, f.service);
            let mut longest = None;
            for (&internal, job) in &slot.in_flight {
                let Some(e) = expect(service, job.count) else {
                    continue;
                };
                longest = longest.max(Some(e));
                if !f.hedgeable || job.twin.is_some() {
                    continue;
                }
                let late = rule.late_at(job.sent, slot.last_progress, e);
                if now >= late {
                    if !self.due.contains(&(node, internal)) {
                        self.due.push((node, internal));
                    }
                } else {
                    soon(late);
                }
            }
            let Some(longest) = longest.or_else(|| expect(service, 1)) else {
                continue;
            };
            if !slot.stalled {
                let at = slot.last_progress + rule.stall_after(longest);
                if now >= at {
                    slot.stalled = true;
                    changed.push(node);
                    self.out.push(Action::Stalled {
                        node,
                        stalled: true,
                    });
                } else {
                    soon(at);
                }
            }
        }
        changed.into_iter().for_each(|n| self.reindex(n));
        self.progress_at = next;
        self.settle(now);
    }

    /// Sends a copy of each due job to another ready replica of its
    /// function with room in its window, within the function's budget of
    /// copies in flight; the rest stay due until a replica has room.
    pub(super) fn place_hedges(&mut self, now: Duration) {
        if self.due.is_empty() {
            return;
        }
        let due = std::mem::take(&mut self.due);
        for (from, internal) in due {
            let Some(src) = self.nodes.get(&from) else {
                continue;
            };
            let Some(job) = src.in_flight.get(&internal).filter(|j| j.twin.is_none()) else {
                continue;
            };
            let Some(fid) = src.function else { continue };
            let Some(f) = self.fns.get(&fid) else {
                continue;
            };
            // Its function's replicas by id (every node serving it is one).
            let replicas = || {
                self.ix
                    .members(fid)
                    .map(|id| (id, &self.nodes[&id]))
                    .filter(move |(_, s)| {
                        s.state == SlotState::Ready && s.function == Some(fid) && !s.stalled
                    })
            };
            let window = |s: &Slot| s.window.get().clamp(1, SHARED_WINDOW);
            if f.hedged >= budget(replicas().map(|(_, s)| window(s))) {
                self.due.push((from, internal));
                continue;
            }
            // A copy counts against its tenant's `max_nodes` as the job does.
            let user = job.user;
            let target = replicas()
                .filter(|&(id, s)| id != from && s.outstanding() < window(s) as usize)
                .filter(|&(id, _)| self.may_run(user, id))
                .min_by_key(|(_, s)| s.outstanding())
                .map(|(id, _)| id);
            let Some(to) = target else {
                self.due.push((from, internal));
                continue;
            };
            let copy_id = self.next_internal;
            self.next_internal = self.next_internal.wrapping_add(1);
            let mut copy = Job::new(job.user, job.id, job.data.clone(), job.count);
            copy.class = job.class;
            copy.sent = now;
            copy.twin = Some((from, internal));
            let (data, class) = (copy.data.clone(), copy.class);
            self.nodes
                .get_mut(&from)
                .and_then(|s| s.in_flight.get_mut(&internal))
                .expect("listed")
                .twin = Some((to, copy_id));
            self.fns.get_mut(&fid).expect("listed").hedged += 1;
            let slot = self.nodes.get_mut(&to).expect("picked");
            let first = slot.outstanding() == 0;
            if first {
                slot.last_progress = now;
                slot.busy_until = slot.busy_until.max(now);
            }
            slot.in_flight.insert(copy_id, copy);
            slot.sent += 1;
            self.reindex(to);
            tracing::debug!(from, to, "late job hedged");
            self.out.push(Action::Hedged { from, to });
            self.out.push(Action::Send {
                node: to,
                internal: copy_id,
                data,
                class,
                first,
            });
        }
    }

    /// A job with a twin was answered (or its node lost): the twin's
    /// answer, if one still comes, is dropped; the pair no longer counts
    /// against the budget. `answered`: the other copy answered first.
    pub(super) fn settle_twin(&mut self, twin: Option<(u64, u32)>, answered: bool) {
        let Some((node, internal)) = twin else { return };
        let Some(slot) = self.nodes.get_mut(&node) else {
            return;
        };
        let Some(mut other) = slot.in_flight.remove(&internal) else {
            return;
        };
        if answered {
            slot.late.insert(internal, (other.sent, other.count));
        } else {
            other.twin = None;
            slot.in_flight.insert(internal, other);
        }
        if let Some(f) = slot.function.and_then(|f| self.fns.get_mut(&f)) {
            f.hedged = f.hedged.saturating_sub(1);
        }
        self.reindex(node);
    }

    /// An answer to a copy whose twin answered first: dropped and counted.
    /// `false` if `internal` is no such copy.
    pub(super) fn drop_late(&mut self, node: u64, internal: u32, now: Duration) -> bool {
        let Some(slot) = self.nodes.get_mut(&node) else {
            return false;
        };
        let Some((sent, count)) = slot.late.remove(&internal) else {
            return false;
        };
        let took = now.saturating_sub(sent.max(slot.busy_until));
        slot.service = Some(record_service(slot.service, took, count));
        slot.busy_until = now;
        slot.progressed(node, now, &mut self.out);
        self.out.push(Action::Duplicate { node });
        self.out.push(Action::Answered {
            node,
            idle: slot.outstanding() == 0,
            failed: false,
            user: None,
        });
        self.reindex(node);
        true
    }
}

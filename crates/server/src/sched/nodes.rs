//! The nodes' side of the scheduler: a node's slot (what it holds, what
//! it has in flight, its credit window) and the events a node causes —
//! joining, leaving, answering a configuration, a result or an error.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::{ErrorCode, NodeState};

use super::{Action, FnId, Job, NodeBreach, Sched};
use crate::dispatch::progress::record_service;
use crate::dispatch::{Answer, Window};

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum SlotState {
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
pub(super) struct Slot {
    /// The function it holds (Ready, Draining).
    pub(super) function: Option<FnId>,
    pub(super) state: SlotState,
    pub(super) in_flight: HashMap<u32, Job>,
    /// Copies whose twin answered first, with when each was sent and its
    /// input count: their answer is dropped when it comes, but still
    /// measures this node's service time.
    pub(super) late: HashMap<u32, (Duration, u32)>,
    /// Its own service time at its function, seconds per input (every
    /// answer, a late copy's included): a node slower than the function's
    /// other replicas by design is judged by its own pace.
    pub(super) service: Option<f64>,
    /// No progress for the stall bound: takes no new work until it answers.
    pub(super) stalled: bool,
    pub(super) window: Window,
    pub(super) sent: u64,
    pub(super) written: u64,
    /// When its last job finished: the next one's service starts no earlier.
    pub(super) busy_until: Duration,
    pub(super) last_progress: Duration,
    /// Measured reconfiguration time (moving average).
    pub(super) reconfig: Option<Duration>,
    /// Functions it refused: never offered again.
    pub(super) refused: HashSet<FnId>,
}

impl Slot {
    /// The function it serves (Ready) or is being loaded or drained for:
    /// what it counts as a replica of (a draining node is promised to its
    /// target, so no second node is drained for the same function).
    pub(super) fn promised_to(&self) -> Option<FnId> {
        match self.state {
            SlotState::Ready => self.function,
            SlotState::Configuring { target, .. } | SlotState::Draining { target } => Some(target),
            SlotState::Empty | SlotState::Lending => None,
        }
    }

    pub(super) fn idle(&self) -> bool {
        self.outstanding() == 0 && matches!(self.state, SlotState::Empty | SlotState::Ready)
    }
}

impl Sched {
    pub fn add_node(&mut self, node: u64, now: Duration) {
        self.nodes.insert(
            node,
            Slot {
                function: None,
                state: SlotState::Empty,
                in_flight: HashMap::new(),
                late: HashMap::new(),
                service: None,
                stalled: false,
                window: Window::new(self.p.credit, self.p.credit_adaptive),
                sent: 0,
                written: 0,
                busy_until: now,
                last_progress: now,
                reconfig: None,
                refused: HashSet::new(),
            },
        );
        self.reindex(node);
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
    pub(super) fn detach(&mut self, node: u64, now: Duration) {
        let Some(slot) = self.nodes.remove(&node) else {
            return;
        };
        self.reindex(node);
        for &f in &slot.refused {
            self.ix.refusal(f, false);
        }
        if let SlotState::Configuring { target, .. } = slot.state {
            if let Some(f) = self.fns.get_mut(&target) {
                // A configuration that kills or hangs nodes must not be
                // retried on every node forever (see `MAX_LOST_LOADS`).
                f.lost_loads += 1;
                f.note(format!("node {node} was lost while loading it"));
            }
        }
        if let Some(f) = slot.function {
            self.ix.rotation_remove(f, node);
        }
        let mut moved: Vec<(u32, Job)> = slot.in_flight.into_iter().collect();
        moved.sort_by_key(|(k, _)| std::cmp::Reverse(*k));
        for (_, j) in moved {
            if j.twin.is_some() {
                // Its other copy is in flight elsewhere and carries on alone.
                self.settle_twin(j.twin, false);
                continue;
            }
            if let Some(u) = self.users.get_mut(&j.user) {
                u.in_flight -= 1;
            }
            if let Some(f) = self
                .fns
                .get_mut(&slot.function.expect("in flight implies a function"))
            {
                f.queue.push_front(j);
                let id = f.id;
                self.note_pending(id);
            }
        }
        if let Some(f) = slot.function {
            if self.replicas_or_loading(f) == 0 {
                if let Some(func) = self.fns.get_mut(&f).filter(|f| f.wanted()) {
                    // Its users still want it: load it elsewhere.
                    func.requested.get_or_insert(now);
                    self.note_requested(f);
                }
            }
        }
        if let Some(f) = slot.function {
            self.forget_if_unused(f);
        }
        if self.nodes.is_empty() {
            self.no_nodes_since = Some(now);
            self.release_movers();
        }
    }

    /// Sends `node` the configuration of `f`.
    pub(super) fn reconfigure(&mut self, node: u64, f: FnId, now: Duration) {
        let Some(func) = self.fns.get(&f) else { return };
        let payload = func.payload.clone();
        let slot = self.nodes.get_mut(&node).expect("reconfigured node exists");
        let old = slot.function.take();
        slot.service = None;
        if let Some(old) = old {
            self.ix.rotation_remove(old, node);
        }
        slot.state = SlotState::Configuring {
            target: f,
            since: now,
        };
        // Service times change with the function: the window starts afresh.
        slot.window = Window::new(self.p.credit, self.p.credit_adaptive);
        slot.sent += 1;
        self.reindex(node);
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

    pub fn on_config_response(
        &mut self,
        node: u64,
        ok: bool,
        now: Duration,
    ) -> Result<(), NodeBreach> {
        let Some(slot) = self.nodes.get_mut(&node) else {
            return Ok(());
        };
        let SlotState::Configuring { target, since } = slot.state else {
            return Err(NodeBreach::NotConfiguring);
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
            self.ix.rotation_add(target, node);
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
            if slot.refused.insert(target) {
                self.ix.refusal(target, true);
            }
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
        self.reindex(node);
        self.note_programming(took);
        self.settle(now);
        Ok(())
    }

    /// A node explained an error: a per-input failure, or why it refuses
    /// the configuration it is loading.
    /// `code`: the node's (`ErrorCode::per_input` decides what the user sees).
    pub fn on_node_error(&mut self, node: u64, id: u32, code: u32, reason: &str, now: Duration) {
        if self.drop_late(node, id, now) {
            return self.settle(now);
        }
        let Some(slot) = self.nodes.get_mut(&node) else {
            return;
        };
        if let Some(j) = slot.in_flight.remove(&id) {
            slot.progressed(node, now, &mut self.out);
            self.reindex(node);
            let slot = &self.nodes[&node];
            self.out.push(Action::Answered {
                node,
                idle: slot.outstanding() == 0,
                failed: true,
                user: Some(j.user),
            });
            // A core fails the same way on either copy: the first answer wins.
            self.settle_twin(j.twin, true);
            if let Some(u) = self.users.get_mut(&j.user) {
                u.answered(now);
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
    ) -> Result<(), NodeBreach> {
        if self.drop_late(node, internal, now) {
            self.settle(now);
            return Ok(());
        }
        let Some(slot) = self.nodes.get_mut(&node) else {
            return Ok(());
        };
        let Some(job) = slot.in_flight.remove(&internal) else {
            return Err(NodeBreach::UnknownResult(internal));
        };
        let f = slot.function.and_then(|f| self.fns.get_mut(&f));
        let expect = f
            .as_ref()
            .map_or(0, |f| f.output_size as usize * job.count as usize);
        if !crate::anylen::node_may_send(data.len(), expect, any_length) {
            let why = NodeBreach::WrongLength {
                len: data.len(),
                count: job.count,
                expect,
            };
            slot.in_flight.insert(internal, job);
            return Err(why);
        }
        self.out.push(Action::Answered {
            node,
            idle: slot.outstanding() == 0,
            failed: false,
            user: Some(job.user),
        });
        let started = job.sent.max(slot.busy_until);
        let took = now.saturating_sub(started);
        slot.service = Some(record_service(slot.service, took, job.count));
        slot.busy_until = now;
        slot.progressed(node, now, &mut self.out);
        let cap =
            (self.p.credit_max_bytes / (job.data.len() as u64).max(1)).min(u32::MAX as u64) as u32;
        slot.window.on_result(Answer {
            at: now,
            left: slot.in_flight.len(),
            user_blocked: false,
            cap,
            nodes: 1,
        });
        let measured = f.is_some_and(|f| {
            let first = f.service.is_none();
            f.record_service(took, job.count);
            first
        });
        self.reindex(node);
        if measured && !self.ix.busy().is_empty() {
            // The first measure of the function: its work in flight can be late now.
            self.arm_progress(now);
        }
        self.settle_twin(job.twin, true);
        if let Some(u) = self.users.get_mut(&job.user) {
            u.answered(now);
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
            self.reindex(node);
        }
        self.settle(now);
    }
}

//! Data Routing state (seed 000 §3.3.1.3): data to nodes by policy, results
//! back to the user, credit toward credit-aware users.

use std::sync::atomic::Ordering;

use corefarm_smp::stream::DEFAULT_CLASS;
use corefarm_smp::{
    ConfigurationResponse, Data, ErrorCode, ErrorMsg, Frame, MsgType, NodeState, Notification,
    OutFrame,
};
use tokio::time::Instant;

use super::{Owned, Pending, Slot};
use crate::dispatch::progress::record_service;
use crate::dispatch::{Answer, Load};
use crate::nodeconn::NodeEvent;
use crate::session::{Cx, Outcome};

impl Owned {
    pub(super) fn pick_node(&mut self, commit: bool, class: u8) -> Option<u64> {
        let policy = self.shared.opts.policy;
        let nodes = &self.nodes;
        let window = self.window.get();
        let reserve = self.urgent_reserve(class);
        let load = |id: u64| {
            nodes
                .get(&id)
                .filter(|n| n.slot == Slot::Ready && !n.stalled)
                .map(|n| Load {
                    unwritten: n.sent.saturating_sub(n.written),
                    in_flight: n.outstanding(),
                    window: window + reserve,
                })
        };
        if commit {
            self.order.pick(policy, load)
        } else {
            self.order.peek(policy, load).map(|(_, id)| id)
        }
    }

    /// Extra messages in flight a message of `class` may use: an urgent
    /// one from a `chunks` user gets [`crate::chunked::URGENT_RESERVE`].
    pub(super) fn urgent_reserve(&self, class: u8) -> u32 {
        if self.chunks && class < DEFAULT_CLASS {
            crate::chunked::URGENT_RESERVE
        } else {
            0
        }
    }

    /// The most urgent class waiting for a node.
    fn waiting_class(&self) -> u8 {
        self.redispatch
            .iter()
            .map(|p| p.class)
            .min()
            .unwrap_or(DEFAULT_CLASS)
    }

    /// Sum of the ready nodes' windows: what a credit-aware user may have
    /// outstanding unless `--user-window` fixes it.
    pub(super) fn user_window(&self) -> u64 {
        self.ready as u64 * self.window.get() as u64
    }

    pub(super) fn dispatch(&mut self, p: Pending) {
        let Some(id) = self.pick_node(true, p.class) else {
            self.redispatch.push_back(p);
            return;
        };
        if let Err(p) = self.send_to(id, p) {
            self.redispatch.push_back(p);
        }
    }

    /// Sends `p` to node `id` under a new internal id, which it returns;
    /// gives `p` back if no frame can carry it.
    pub(super) fn send_to(&mut self, id: u64, mut p: Pending) -> Result<u32, Pending> {
        let internal = self.next_internal;
        // The data arrived in a frame within --max-message, so it fits one again.
        let Ok(frame) = OutFrame::data(internal, p.data.clone()) else {
            return Err(p);
        };
        self.next_internal = self.next_internal.wrapping_add(1);
        let hedge = self.shared.opts.hedge;
        let n = self.nodes.get_mut(&id).expect("picked node exists");
        let now = Instant::now();
        if n.outstanding() == 0 {
            n.last_progress = now;
        }
        p.sent = now;
        let class = p.class;
        n.in_flight.insert(internal, p);
        n.tx.entry.in_flight.fetch_add(1, Ordering::Relaxed);
        n.tx.entry
            .m
            .dispatched(n.in_flight.len() == 1, now.into_std());
        // Written when the session is about to wait (`flush_writes`), with
        // whatever else this wake-up produced for the node.
        // In the user's class: on a chunked node link an urgent message's
        // chunks go out between a bulk one's.
        if n.tx.queue_class(frame, class) {
            n.sent += 1;
            if !n.queued {
                n.queued = true;
                self.unflushed_nodes.push(id);
            }
        }
        // On a failed send the node's Closed event follows and re-dispatches.
        // Nothing is late before half the floor; the rule then looks at
        // the measured service time.
        if let Some(h) = hedge {
            self.arm_progress(now + h.earliest());
        }
        Ok(internal)
    }

    /// The most urgent message waiting for a node, first come first served
    /// within its class. No anti-starvation guard is needed here: the user
    /// is not read while anything waits, so the queue only drains.
    fn next_redispatch(&mut self) -> Option<Pending> {
        let (at, _) = self
            .redispatch
            .iter()
            .enumerate()
            .min_by_key(|&(i, p)| (p.class, i))?;
        self.redispatch.remove(at)
    }

    /// Re-dispatch: messages waiting for a node go to the nodes that can
    /// take them now, most urgent first.
    pub(super) fn redispatch_waiting(&mut self) {
        while !self.redispatch.is_empty() && self.pick_node(false, self.waiting_class()).is_some() {
            let p = self.next_redispatch().expect("non-empty");
            self.dispatch(p);
        }
    }

    pub(super) fn on_node_event(&mut self, id: u64, ev: NodeEvent, cx: &mut Cx<'_>) {
        match ev {
            NodeEvent::Written(count) => {
                if let Some(n) = self.nodes.get_mut(&id) {
                    n.written += count;
                }
            }
            NodeEvent::Closed(reason) => self.lose_node(id, &reason, cx),
            NodeEvent::Frame(f, _permit) => self.on_node_frame(id, f, cx),
        }
    }

    fn on_node_frame(&mut self, id: u64, f: Frame, cx: &mut Cx<'_>) {
        let held = self.nodes.len().min(u32::MAX as usize) as u32;
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        if !n.late.is_empty() {
            // The answer of a copy whose twin won may come in any state,
            // even after a new configuration was sent behind it.
            let late = match f.ty {
                MsgType::Data => Data::parse(f.payload.clone()).ok().map(|d| d.id),
                MsgType::Error => ErrorMsg::parse(&f.payload).ok().map(|e| e.id),
                MsgType::Notification => {
                    let note = Notification::parse(f.payload.clone()).ok();
                    // Its user heard the twin's; the answer still follows.
                    if note.is_some_and(|n| self.nodes[&id].late.contains_key(&n.id)) {
                        return;
                    }
                    None
                }
                _ => None,
            };
            if late.is_some_and(|l| self.drop_late(id, l)) {
                return;
            }
        }
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        match (f.ty, n.slot) {
            (MsgType::Data, Slot::Ready) => {
                let d = match Data::parse(f.payload) {
                    Ok(d) => d,
                    Err(e) => return self.lose_node(id, &format!("bad data message: {e}"), cx),
                };
                let Some(p) = n.in_flight.remove(&d.id) else {
                    let reason = format!("result for unknown id {}", d.id);
                    return self.lose_node(id, &reason, cx);
                };
                let expect = p.count as usize * self.output_size as usize;
                let any_length = d.data.len() != expect && n.tx.entry.any_length();
                if !crate::anylen::node_may_send(d.data.len(), expect, any_length) {
                    let reason = format!(
                        "result of {} bytes for {} input(s), expected {expect}",
                        d.data.len(),
                        p.count
                    );
                    n.in_flight.insert(d.id, p);
                    return self.lose_node(id, &reason, cx);
                }
                let now = Instant::now();
                // Service counts from when the node could start it.
                let took = now.saturating_duration_since(p.sent.max(n.last_progress));
                n.service = Some(record_service(n.service, took, p.count));
                n.progressed(now);
                n.tx.entry.in_flight.fetch_sub(1, Ordering::Relaxed);
                n.tx.entry.results.fetch_add(1, Ordering::Relaxed);
                let node_time =
                    n.tx.entry
                        .m
                        .answered(n.outstanding() == 0, false, now.into_std());
                let left = n.outstanding();
                let budget = self.shared.opts.credit_max_bytes / (p.data.len() as u64).max(1);
                let cap = budget.min(u32::MAX as u64) as u32;
                let answer = Answer {
                    at: now.duration_since(self.clock),
                    left,
                    user_blocked: cx.credit_blocked,
                    cap,
                    nodes: held,
                };
                let w = &mut self.window;
                let before = w.get();
                w.on_result(answer);
                if w.get() != before {
                    tracing::debug!(
                        node = id,
                        "credit window {before} -> {} (rtt {:?}, {left} left)",
                        w.get(),
                        now - p.sent
                    );
                }
                let first = self.service.is_none();
                self.service = Some(record_service(self.service, took, p.count));
                self.charge(node_time);
                if first {
                    // The first measure: work in flight can be late now.
                    self.arm_progress(now);
                }
                self.settle_twin(p.twin, true);
                cx.report(Outcome::Result {
                    id: p.user_id,
                    class: p.class,
                    data: d.data,
                    count: p.count,
                    rtt: Some(now - p.sent),
                    node: Some(id),
                });
            }
            (MsgType::Notification, Slot::Ready) => self.on_node_notification(id, f, cx),
            (MsgType::ConfigurationResponse, Slot::Configuring { .. }) => {
                let ok = ConfigurationResponse::parse(&f.payload)
                    .map(|r| r.ok())
                    .unwrap_or(false);
                if ok {
                    n.slot = Slot::Ready;
                    self.ready += 1;
                    n.tx.entry.set_state(NodeState::Ready);
                    tracing::info!(user = %self.peer, node = %n.tx.label(), "node configured");
                    if let Some(a) = self.entry.account() {
                        a.reconfigured(1);
                    }
                } else {
                    tracing::warn!(user = %self.peer, node = %n.tx.label(), "node refused the configuration");
                    self.refusals.refused(id, n.tx.label());
                    let user = self.user;
                    self.shared.pool.update(user, |w| {
                        w.refused.insert(id);
                        w.have = w.have.saturating_sub(1);
                    });
                    self.release_node(id);
                }
                self.finish_configuring_if_done(cx);
                if !ok {
                    self.fail_if_no_node_left("the last one refused the configuration", cx);
                }
            }
            (MsgType::Error, _) => {
                let e = match ErrorMsg::parse(&f.payload) {
                    Ok(e) => e,
                    Err(e) => return self.lose_node(id, &format!("bad error message: {e}"), cx),
                };
                if let Some(p) = n.in_flight.remove(&e.id) {
                    // A core failed on this input: the user hears about it by id.
                    n.progressed(Instant::now());
                    n.tx.entry.in_flight.fetch_sub(1, Ordering::Relaxed);
                    let at = n.last_progress.into_std();
                    let node_time = n.tx.entry.m.answered(n.outstanding() == 0, true, at);
                    let reason =
                        format!("node {} failed on this input: {}", n.tx.label(), e.reason);
                    let code = ErrorCode::per_input(e.code);
                    // A core fails the same way on either copy: the first answer wins.
                    self.settle_twin(p.twin, true);
                    self.charge(node_time);
                    cx.report(Outcome::Failed {
                        id: p.user_id,
                        code,
                        reason,
                    });
                } else {
                    tracing::warn!(user = %self.peer, node = %n.tx.label(), "node reports: {e}");
                    if matches!(n.slot, Slot::Configuring { .. }) {
                        self.refusals.reason(id, n.tx.label(), &e.reason);
                    }
                }
            }
            (ty, slot) => {
                let reason = format!(
                    "unexpected {} message from node in state {slot:?}",
                    ty.name()
                );
                self.lose_node(id, &reason, cx)
            }
        }
    }

    /// A node's handler notification, with the id the user gave the message
    /// (the node knows the internal id, mapped back the way its result is).
    /// One for an id not in flight on that node loses the node, like a
    /// result for one.
    fn on_node_notification(&mut self, id: u64, f: Frame, cx: &mut Cx<'_>) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        let note = match Notification::parse(f.payload) {
            Ok(note) => note,
            Err(e) => return self.lose_node(id, &format!("bad notification: {e}"), cx),
        };
        let Some(p) = n.in_flight.get_mut(&note.id) else {
            let reason = format!("notification for unknown id {}", note.id);
            return self.lose_node(id, &reason, cx);
        };
        if crate::notes::within(&mut p.notes, p.user_id, || n.tx.entry.label()) {
            cx.report(Outcome::Notification(note.with_id(p.user_id)));
        }
    }
}

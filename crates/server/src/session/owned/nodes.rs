//! The user's nodes: taking them from the pool, adopting nodes that join,
//! losing broken ones (their work goes to the others), giving idle ones back.

use std::collections::HashMap;

use corefarm_smp::{ErrorCode, NodeState, UserPhase as Phase};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{Node, Owned, Pending, Slot};
use crate::nodeconn::NodeConn;
use crate::pool::{Control, Waiter};
use crate::session::{Cx, Outcome, SessionEnd};

impl Owned {
    /// Assigns free nodes to this user, waiting up to `--node-wait` when it
    /// has fewer than it asked for (or none). The user stays registered with
    /// the pool, so nodes that join later come to it too. Called at hello and
    /// at every configuration from the Initial state, so a user whose nodes
    /// refused a configuration can try another one with whatever is free.
    pub(super) async fn take_nodes(&mut self) {
        if self.want == Some(0) {
            return;
        }
        if !self.registered {
            self.registered = true;
            self.shared.pool.register(Waiter {
                user: self.user,
                tx: self.ctl_tx.clone(),
                want: self.want,
                have: self.nodes.len() as u32,
                refused: Default::default(),
            });
        }
        for conn in self.shared.pool.take_for(self.user, self.want) {
            self.adopt(conn);
        }
        // Nodes the pool sent since the last wait.
        while let Ok(Control::NodeJoined(conn)) = self.ctl_rx.try_recv() {
            self.adopt(conn);
        }
        // Nodes that connect meanwhile are sent to us by the pool. A server
        // that has had no node at all for a whole --node-wait (its nodes
        // went to a standby server while it was down, say) answers at once:
        // waiting once more would only hold the user back from a server
        // that has nodes.
        let node_wait = self.shared.opts.node_wait;
        let deserted = (self.shared.registry.without_nodes_for()).is_some_and(|d| d >= node_wait);
        // A user with other servers to go to is not held by one without
        // any node (restarted after its nodes went to a standby, say).
        let elsewhere = self.moves_on && self.shared.registry.node_count() == 0;
        let wait = match (self.waited_in_vain || deserted || elsewhere) && self.nodes.is_empty() {
            true => std::time::Duration::ZERO,
            false => node_wait,
        };
        let deadline = Instant::now() + wait;
        while !self.enough_nodes() {
            tokio::select! {
                Some(c) = self.ctl_rx.recv() => match c {
                    Control::NodeJoined(conn) => self.adopt(conn),
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        self.waited_in_vain = self.nodes.is_empty();
        tracing::info!(user = %self.peer, "assigned {} node(s)", self.nodes.len());
    }

    fn enough_nodes(&self) -> bool {
        match self.want {
            Some(w) => self.nodes.len() as u32 >= w,
            None => !self.nodes.is_empty(),
        }
    }

    pub(super) fn adopt(&mut self, mut conn: NodeConn) {
        if conn.is_closed() {
            return;
        }
        if let Some(why) = self.cfg_frame.as_ref().and(self.unfit(&conn)) {
            // It could only refuse the configuration: back to the pool.
            tracing::info!(user = %self.peer, node = %conn.label(), "node not taken: {why}");
            let (user, id) = (self.user, conn.id);
            self.shared.pool.update(user, |w| {
                w.refused.insert(id);
                w.have = w.have.saturating_sub(1);
            });
            self.shared.pool.add(conn);
            return;
        }
        let events = std::mem::replace(&mut conn.events, mpsc::unbounded_channel().1);
        self.events
            .insert(conn.id, UnboundedReceiverStream::new(events));
        let id = conn.id;
        conn.entry.assign(Some(self.user));
        let mut st = Node {
            conn_id: id,
            tx: conn,
            slot: Slot::Idle,
            in_flight: HashMap::new(),
            sent: 0,
            written: 0,
            last_progress: Instant::now(),
            late: Default::default(),
            service: None,
            stalled: false,
            queued: false,
        };
        self.order.add(id);
        // A node joining a configured user is configured at once and joins the rotation.
        if let Some(f) = &self.cfg_frame {
            if st.tx.send(f.clone()) {
                st.sent += 1;
                st.slot = Slot::Configuring {
                    deadline: Instant::now() + self.shared.opts.config_timeout,
                };
                st.tx.entry.set_state(NodeState::Configuring);
            }
        }
        tracing::info!(user = %self.peer, node = %st.tx.label(), "node assigned");
        self.nodes.insert(id, st);
    }

    /// Takes a failed node out of rotation; everything it had in flight goes
    /// to the remaining nodes, so each result still arrives exactly once.
    pub(super) fn lose_node(&mut self, id: u64, reason: &str, cx: &mut Cx<'_>) {
        let Some(n) = self.drop_node(id, reason) else {
            return;
        };
        if matches!(n.slot, Slot::Configuring { .. }) {
            self.refusals.reason(id, n.tx.label(), reason);
        }
        let mut moved: Vec<(u32, Pending)> = Vec::with_capacity(n.in_flight.len());
        for (k, p) in n.in_flight {
            match p.twin {
                // Its other copy is in flight elsewhere and carries on alone.
                Some(_) => self.settle_twin(p.twin, false),
                None => moved.push((k, p)),
            }
        }
        self.shared.metrics.node_lost(moved.len());
        moved.sort_by_key(|(k, _)| *k);
        for (_, p) in moved.into_iter().rev() {
            self.redispatch.push_front(p);
        }
        self.finish_configuring_if_done(cx);
        self.fail_if_no_node_left(&format!("last one lost: {reason}"), cx);
    }

    /// A routing user with no node left, ready or still configuring, cannot
    /// be served: each input waiting for a node gets its own no-nodes error,
    /// then the session ends (`why` says what happened to the last node).
    pub(super) fn fail_if_no_node_left(&mut self, why: &str, cx: &mut Cx<'_>) {
        let alive = self
            .nodes
            .values()
            .any(|n| matches!(n.slot, Slot::Ready | Slot::Configuring { .. }));
        if self.phase == Phase::Routing && !alive {
            let end = SessionEnd::NoNodes(why.to_string());
            let reason = end.to_string();
            for p in self.redispatch.drain(..) {
                cx.report(Outcome::Unserved {
                    id: p.user_id,
                    code: ErrorCode::NoNodes,
                    reason: reason.clone(),
                });
            }
            cx.report(Outcome::End(end));
        }
    }

    /// Takes node `id` out of the session's table.
    fn remove_node(&mut self, id: u64) -> Option<Node> {
        let n = self.nodes.remove(&id)?;
        if n.slot == Slot::Ready {
            self.ready -= 1;
        }
        Some(n)
    }

    pub(super) fn drop_node(&mut self, id: u64, reason: &str) -> Option<Node> {
        let n = self.remove_node(id)?;
        self.order.remove(id);
        self.events.remove(&id);
        tracing::warn!(user = %self.peer, node = %n.tx.label(), "node dropped: {reason}");
        n.tx.close();
        let user = self.user;
        self.shared
            .pool
            .update(user, |w| w.have = w.have.saturating_sub(1));
        Some(n)
    }

    /// Returns a healthy, idle node to the pool.
    pub(super) fn release_node(&mut self, id: u64) {
        let Some(mut n) = self.remove_node(id) else {
            return;
        };
        self.order.remove(id);
        let writes_done = self.shared.opts.policy == crate::Policy::Credit || n.sent == n.written;
        let idle = n.outstanding() == 0 && writes_done && !n.tx.is_closed();
        match self.events.remove(&id) {
            Some(stream) if idle => {
                n.tx.events = stream.into_inner();
                tracing::info!(user = %self.peer, node = %n.tx.label(), "node returned to the pool");
                self.shared.pool.add(n.tx);
            }
            _ => n.tx.close(),
        }
    }

    /// Node deadlines: configuration response, progress while work is in flight.
    pub(super) fn check_timeouts(&mut self) {
        let now = Instant::now();
        let opts = &self.shared.opts;
        let expired: Vec<(u64, String)> = self
            .nodes
            .values()
            .filter_map(|n| match n.slot {
                Slot::Configuring { deadline } if now > deadline => Some((
                    n.conn_id,
                    format!("no configuration response within {:?}", opts.config_timeout),
                )),
                Slot::Ready
                    if n.outstanding() > 0
                        && now.duration_since(n.last_progress) > opts.node_timeout =>
                {
                    Some((
                        n.conn_id,
                        format!(
                            "no result for {:?} with {} message(s) in flight",
                            opts.node_timeout,
                            n.outstanding()
                        ),
                    ))
                }
                _ => None,
            })
            .collect();
        for (id, reason) in expired {
            // Synthesise a close; the next loop turn handles it like any other loss.
            if let Some(n) = self.nodes.get(&id) {
                tracing::warn!(user = %self.peer, node = %n.tx.label(), "{reason}");
                n.tx.close();
            }
        }
    }

    /// At the end of the session: idle nodes back to the pool, busy ones reset.
    pub(super) fn release_nodes(&mut self) {
        self.shared.pool.unregister(self.user);
        // Nodes the pool sent after the loop stopped listening go back too.
        while let Ok(Control::NodeJoined(conn)) = self.ctl_rx.try_recv() {
            self.shared.pool.add(conn);
        }
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            let busy = self
                .nodes
                .get(&id)
                .is_some_and(|n| n.outstanding() > 0 || matches!(n.slot, Slot::Configuring { .. }));
            if busy {
                // Work in flight for a departed user: reset the node by closing
                // it; its node manager reconnects with a clean state.
                if let Some(n) = self.remove_node(id) {
                    n.tx.close();
                }
            } else {
                self.release_node(id);
            }
        }
    }
}

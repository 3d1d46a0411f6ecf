//! Data Routing state (seed 000 §3.3.1.3): data to nodes by policy, results
//! back to the user, credit toward credit-aware users.

use std::sync::atomic::Ordering;

use corefarm_smp::stream::DEFAULT_CLASS;
use corefarm_smp::{
    hello::features, ConfigurationResponse, Credit, Data, ErrorCode, ErrorMsg, Frame, MsgType,
    NodeState, OutFrame, UserPhase as Phase,
};
use tokio::time::Instant;

use super::{End, Handler, NextCfg, Pending, Slot};
use crate::dispatch::{Load, Window};
use crate::nodeconn::NodeEvent;

impl Handler {
    pub(super) fn pick_node(&mut self, commit: bool, class: u8) -> Option<u64> {
        let policy = self.shared.opts.policy;
        let (nodes, windows) = (&self.nodes, &self.windows);
        let initial = self.shared.opts.credit.max(1);
        let reserve = self.urgent_reserve(class);
        let load = |id: u64| {
            nodes
                .get(&id)
                .filter(|n| n.slot == Slot::Ready)
                .map(|n| Load {
                    unwritten: n.sent.saturating_sub(n.written),
                    in_flight: n.in_flight.len(),
                    window: windows.get(&id).map_or(initial, Window::get) + reserve,
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
        if self.conn.inbound.is_some() && class < DEFAULT_CLASS {
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

    /// The node's credit window, created on first use.
    fn window(&mut self, id: u64) -> &mut Window {
        let opts = &self.shared.opts;
        self.windows
            .entry(id)
            .or_insert_with(|| Window::new(opts.credit, opts.credit_adaptive))
    }

    /// Sum of the ready nodes' windows: what a credit-aware user may have
    /// outstanding unless `--user-window` fixes it.
    fn user_window(&self) -> u64 {
        let initial = self.shared.opts.credit.max(1);
        self.nodes
            .iter()
            .filter(|(_, n)| n.slot == Slot::Ready)
            .map(|(id, _)| self.windows.get(id).map_or(initial, Window::get) as u64)
            .sum()
    }

    pub(super) fn dispatch(&mut self, mut p: Pending) {
        let Some(id) = self.pick_node(true, p.class) else {
            self.redispatch.push_back(p);
            return;
        };
        let internal = self.next_internal;
        self.next_internal = self.next_internal.wrapping_add(1);
        let n = self.nodes.get_mut(&id).expect("picked node exists");
        // The data arrived in a frame within --max-message, so it fits one again.
        let Ok(frame) = OutFrame::data(internal, p.data.clone()) else {
            self.redispatch.push_back(p);
            return;
        };
        let now = Instant::now();
        if n.in_flight.is_empty() {
            n.last_progress = now;
        }
        p.sent = now;
        let class = p.class;
        n.in_flight.insert(internal, p);
        n.tx.entry.in_flight.fetch_add(1, Ordering::Relaxed);
        n.tx.entry
            .m
            .dispatched(n.in_flight.len() == 1, now.into_std());
        // Written when the handler is about to wait (`flush_writes`), with
        // whatever else this wake-up produced for the node.
        // In the user's class: on a chunked node link an urgent message's
        // chunks go out between a bulk one's.
        if n.tx.queue_class(frame, class) {
            n.sent += 1;
        }
        let in_flight = n.in_flight.len();
        self.window(id).on_dispatch(in_flight);
        // On a failed send the node's Closed event follows and re-dispatches.
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

    /// Frames queued for the user or a node and not written yet.
    pub(super) fn unflushed(&self) -> bool {
        self.conn.out.unflushed() || self.nodes.values().any(|n| n.tx.unflushed())
    }

    /// Writes what this wake-up queued: one `writev` per socket for every
    /// message and credit produced since the handler last waited.
    pub(super) fn flush_writes(&mut self) {
        for n in self.nodes.values() {
            n.tx.flush();
        }
        self.conn.out.flush();
    }

    /// Housekeeping after every event: re-dispatch, reconfigure, grant credit.
    pub(super) async fn pump(&mut self) -> Result<(), End> {
        if self.conn.phase != Phase::Routing {
            return Ok(());
        }
        while !self.redispatch.is_empty() && self.pick_node(false, self.waiting_class()).is_some() {
            let p = self.next_redispatch().expect("non-empty");
            self.dispatch(p);
        }
        let results_out = self.conn.outbound.as_ref().is_none_or(|o| o.is_empty());
        if self.next_cfg.is_some() && self.outstanding == 0 && results_out {
            return match self.next_cfg.take().expect("checked") {
                NextCfg::Apply(cfg, payload) => {
                    tracing::info!(user = %self.conn.peer, "reconfiguring");
                    // Service times change with the configuration: windows start afresh.
                    self.windows.clear();
                    self.start_configuring(cfg, payload).await
                }
                NextCfg::Refuse(e) => self.refuse_configuration(e).await,
            };
        }
        if self.conn.agreed(features::CREDIT) && self.next_cfg.is_none() {
            let window = self
                .shared
                .opts
                .user_window
                .map_or_else(|| self.user_window(), |w| w as u64)
                .max(1)
                + u64::from(self.urgent_reserve(0));
            let used = self.outstanding + self.credit;
            if used < window {
                let grant = (window - used) as u32;
                self.credit += grant as u64;
                self.send_user(Credit { messages: grant }.to_frame())
                    .await?;
            }
        }
        Ok(())
    }

    pub(super) async fn on_node_event(&mut self, id: u64, ev: NodeEvent) -> Result<(), End> {
        match ev {
            NodeEvent::Written(count) => {
                if let Some(n) = self.nodes.get_mut(&id) {
                    n.written += count;
                }
                Ok(())
            }
            NodeEvent::Closed(reason) => {
                self.windows.remove(&id);
                self.lose_node(id, &reason).await
            }
            NodeEvent::Frame(f, _permit) => self.on_node_frame(id, f).await,
        }
    }

    async fn on_node_frame(&mut self, id: u64, f: Frame) -> Result<(), End> {
        let Some(n) = self.nodes.get_mut(&id) else {
            return Ok(());
        };
        match (f.ty, n.slot) {
            (MsgType::Data, Slot::Ready) => {
                let d = match Data::parse(f.payload) {
                    Ok(d) => d,
                    Err(e) => return self.lose_node(id, &format!("bad data message: {e}")).await,
                };
                let Some(p) = n.in_flight.remove(&d.id) else {
                    let reason = format!("result for unknown id {}", d.id);
                    return self.lose_node(id, &reason).await;
                };
                let cfg = self.conn.cfg.as_ref().expect("ready implies configured");
                let expect = p.count as usize * cfg.output_size as usize;
                let any_length = d.data.len() != expect && n.tx.entry.any_length();
                if !crate::anylen::node_may_send(d.data.len(), expect, any_length) {
                    let reason = format!(
                        "result of {} bytes for {} input(s), expected {expect}",
                        d.data.len(),
                        p.count
                    );
                    n.in_flight.insert(d.id, p);
                    return self.lose_node(id, &reason).await;
                }
                let now = Instant::now();
                n.last_progress = now;
                n.tx.entry.in_flight.fetch_sub(1, Ordering::Relaxed);
                n.tx.entry.results.fetch_add(1, Ordering::Relaxed);
                n.tx.entry
                    .m
                    .answered(n.in_flight.is_empty(), false, now.into_std());
                let left = n.in_flight.len();
                let budget = self.shared.opts.credit_max_bytes / (p.data.len() as u64).max(1);
                let cap = budget.min(u32::MAX as u64) as u32;
                let blocked = self.conn.agreed(features::CREDIT) && self.credit == 0;
                let w = self.window(id);
                let before = w.get();
                w.on_result(left, now - p.sent, blocked, cap);
                if w.get() != before {
                    tracing::debug!(
                        node = id,
                        "credit window {before} -> {} (rtt {:?}, {left} left)",
                        w.get(),
                        now - p.sent
                    );
                }
                let agreed = d.data.len() != expect && self.conn.agreed(features::ANY_LENGTH);
                let data =
                    match crate::anylen::for_user(d.data, expect, agreed, self.conn.result_limit) {
                        Ok(data) => data,
                        Err(why) => {
                            // Like a failed core: the user hears about it by id.
                            let node = self.nodes.get(&id).map(|n| n.tx.label());
                            let reason = format!("node {}: {why}", node.unwrap_or_default());
                            return self.core_failure(p.user_id, reason).await;
                        }
                    };
                self.conn.entry.results.fetch_add(1, Ordering::Relaxed);
                let m = &self.shared.metrics;
                self.conn
                    .entry
                    .m
                    .result(m, || self.conn.entry.label(), now - p.sent);
                self.answered();
                // A result within the frame limit fits one to the user (same limit).
                self.send_result(p.user_id, p.class, data).await
            }
            (MsgType::Notification, Slot::Ready) => self.on_node_notification(id, f).await,
            (MsgType::ConfigurationResponse, Slot::Configuring { .. }) => {
                let ok = ConfigurationResponse::parse(&f.payload)
                    .map(|r| r.ok())
                    .unwrap_or(false);
                if ok {
                    n.slot = Slot::Ready;
                    n.tx.entry.set_state(NodeState::Ready);
                    tracing::info!(user = %self.conn.peer, node = %n.tx.label(), "node configured");
                } else {
                    tracing::warn!(user = %self.conn.peer, node = %n.tx.label(), "node refused the configuration");
                    self.refusals.refused(id, n.tx.label());
                    self.shared
                        .metrics
                        .error(crate::metrics::ErrorKind::ConfigurationFailed);
                    let user = self.conn.user;
                    self.shared.pool.update(user, |w| {
                        w.refused.insert(id);
                        w.have = w.have.saturating_sub(1);
                    });
                    self.release_node(id);
                }
                self.finish_configuring_if_done().await?;
                if !ok {
                    self.fail_if_no_node_left("the last one refused the configuration")
                        .await?;
                }
                Ok(())
            }
            (MsgType::Error, _) => {
                let e = match ErrorMsg::parse(&f.payload) {
                    Ok(e) => e,
                    Err(e) => return self.lose_node(id, &format!("bad error message: {e}")).await,
                };
                if let Some(p) = n.in_flight.remove(&e.id) {
                    // A core failed on this input: the user hears about it by id.
                    n.last_progress = Instant::now();
                    n.tx.entry.in_flight.fetch_sub(1, Ordering::Relaxed);
                    let at = n.last_progress.into_std();
                    n.tx.entry.m.answered(n.in_flight.is_empty(), true, at);
                    let reason =
                        format!("node {} failed on this input: {}", n.tx.label(), e.reason);
                    let code = ErrorCode::per_input(e.code);
                    self.input_failure(p.user_id, code, reason).await
                } else {
                    tracing::warn!(user = %self.conn.peer, node = %n.tx.label(), "node reports: {e}");
                    if matches!(n.slot, Slot::Configuring { .. }) {
                        self.refusals.reason(id, n.tx.label(), &e.reason);
                    }
                    Ok(())
                }
            }
            (ty, slot) => {
                let reason = format!(
                    "unexpected {} message from node in state {slot:?}",
                    ty.name()
                );
                self.lose_node(id, &reason).await
            }
        }
    }

    /// One data message answered (a result or a per-input error).
    fn answered(&mut self) {
        self.outstanding -= 1;
        self.last_activity = Instant::now();
    }

    /// A data message failed on a node (its core, or a result it cannot
    /// take): a hello user hears about it by id; a seed user cannot be told
    /// about one input, so its session ends.
    async fn core_failure(&mut self, user_id: u32, reason: String) -> Result<(), End> {
        self.input_failure(user_id, ErrorCode::CoreFailure, reason)
            .await
    }

    /// [`Self::core_failure`] with the node's code where the user can act
    /// on it (`ErrorCode::per_input`).
    async fn input_failure(
        &mut self,
        user_id: u32,
        code: ErrorCode,
        reason: String,
    ) -> Result<(), End> {
        self.answered();
        self.conn
            .entry
            .m
            .failure(&self.shared.metrics, || self.conn.entry.label());
        // Only a user that agreed `error` can be told about one input; any
        // other (a seed user, or a hello without it) would otherwise never
        // hear of this message again, so its session ends with the reason.
        if self.conn.agreed(features::ERROR) {
            self.send_error(user_id, code, reason).await
        } else {
            Err(self.fail_user(user_id, code, reason).await)
        }
    }
}

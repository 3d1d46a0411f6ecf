//! What the session tells the user unasked: the placement's outcomes
//! (configuration answers, results, failures, notifications), credit, and
//! the end of an idle session.

use std::sync::atomic::Ordering;

use corefarm_smp::{hello::features, Credit, ErrorCode, ErrorMsg, UserPhase as Phase};
use tokio::time::Instant;

use super::{NextCfg, Outcome, Placement, Session, SessionEnd};

impl<P: Placement> Session<P> {
    /// Housekeeping after every event: the placement's, a configuration
    /// that waited for the data in flight, credit toward a credit user.
    pub(super) async fn pump(&mut self) -> Result<(), SessionEnd> {
        if self.conn.phase != Phase::Routing {
            return Ok(());
        }
        self.placement.pump();
        self.place_held().await?;
        let held = self.quota.held.is_some();
        let drained = self.outstanding == 0 && self.results_waiting() == 0 && !held;
        if drained {
            if let Some(next) = self.next_cfg.take() {
                return match next {
                    NextCfg::Apply(cfg, payload) => {
                        tracing::info!(user = %self.conn.peer, "reconfiguring");
                        self.start_configuring(cfg, payload, false).await
                    }
                    NextCfg::Refuse(e) => self.refuse_configuration(e).await,
                };
            }
        }
        if self.conn.agreed(features::CREDIT) && self.next_cfg.is_none() {
            let window = self.placement.credit_window();
            // A result still waiting to go out counts as outstanding: credit
            // must not let a user that does not read pile up results here.
            // So does an input held for room in the user's queued bytes.
            let used = self.outstanding + self.credit + self.results_waiting() + u64::from(held);
            if used < window {
                let grant = (window - used) as u32;
                self.credit += grant as u64;
                self.send_user(Credit { messages: grant }.to_frame())
                    .await?;
            }
        }
        Ok(())
    }

    /// Tells the user what the placement reported, in order.
    pub(super) async fn deliver(&mut self) -> Result<(), SessionEnd> {
        while let Some(o) = self.outbox.pop_front() {
            if let Err(e) = self.on_outcome(o).await {
                self.outbox.clear();
                return Err(e);
            }
        }
        Ok(())
    }

    async fn on_outcome(&mut self, o: Outcome) -> Result<(), SessionEnd> {
        match o {
            Outcome::Configured { ok, warnings } => {
                if ok {
                    self.conn.set_phase(Phase::Routing);
                } else {
                    // Back to Initial: the next configuration starts afresh;
                    // until it comes the connection holds its place and
                    // nothing else, which a new connection may take back
                    // (and `check_idle` ends it once silent too long).
                    self.conn.set_phase(Phase::Initial);
                    self.conn.cfg = None;
                    self.place.unhold();
                }
                // Warnings before the response (docs/protocol.md).
                for (code, why) in warnings {
                    self.send_error(ErrorMsg::NO_ID, code, why).await?;
                }
                self.send_response(ok).await
            }
            Outcome::Result {
                id,
                class,
                data,
                count,
                rtt,
                node,
            } => {
                let output_size = self.conn.cfg.as_ref().map_or(0, |c| c.output_size);
                let expect = count as usize * output_size as usize;
                let agreed = data.len() != expect && self.conn.agreed(features::ANY_LENGTH);
                let data =
                    match crate::anylen::for_user(data, expect, agreed, self.conn.result_limit) {
                        Ok(data) => data,
                        Err(why) => {
                            // Like a failed core: the user hears about it by id.
                            let reason = match node {
                                Some(n) => {
                                    format!(
                                        "node {}: {why}",
                                        self.placement.label(n).unwrap_or_default()
                                    )
                                }
                                None => why.to_string(),
                            };
                            return self.input_failure(id, ErrorCode::CoreFailure, reason).await;
                        }
                    };
                self.conn.entry.results.fetch_add(1, Ordering::Relaxed);
                self.account().inputs(count);
                if let Some(rtt) = rtt {
                    let m = &self.shared.metrics;
                    self.conn.entry.m.result(m, || self.conn.entry.label(), rtt);
                }
                self.answered(id);
                self.send_result(id, class, data).await
            }
            Outcome::Failed { id, code, reason } => self.input_failure(id, code, reason).await,
            // Sent before the message's result (which may still go as
            // chunks): outcomes are told in the order they happened.
            Outcome::Notification(note) if self.conn.agreed(features::SPIN_NOTIFY) => {
                match note.to_frame() {
                    Ok(f) => {
                        self.shared.metrics.notification(true);
                        self.send_user(f).await
                    }
                    Err(e) => {
                        tracing::warn!(user = %self.conn.peer, "notification not relayed: {e}");
                        Ok(())
                    }
                }
            }
            Outcome::Notification(note) => {
                self.notes_dropped.count(&self.conn.peer, &note);
                self.shared.metrics.notification(false);
                Ok(())
            }
            Outcome::Unserved { id, code, reason } => self.send_error(id, code, reason).await,
            Outcome::End(e) => Err(e),
        }
    }

    /// The account the session acts for; a session that never named one
    /// (a seed-format user) acts for the anonymous account.
    pub(super) fn account(&self) -> &std::sync::Arc<crate::accounts::Account> {
        let accounts = &self.shared.accounts;
        self.conn.entry.account_or(|| accounts.anonymous().clone())
    }

    /// One data message answered (a result or a per-input error).
    fn answered(&mut self, id: u32) {
        self.quota.answered(id);
        self.outstanding = self.outstanding.saturating_sub(1);
        self.last_activity = Instant::now();
    }

    /// A data message failed (its core, or a result the user cannot take):
    /// a user that agreed `error` hears about it by id; any other (a seed
    /// user, or a hello without it) cannot be told about one input and
    /// would otherwise never hear of this message again, so its session
    /// ends with the reason.
    async fn input_failure(
        &mut self,
        id: u32,
        code: ErrorCode,
        reason: String,
    ) -> Result<(), SessionEnd> {
        self.answered(id);
        self.conn
            .entry
            .m
            .failure(&self.shared.metrics, || self.conn.entry.label());
        if self.conn.agreed(features::ERROR) {
            self.send_error(id, code, reason).await
        } else {
            Err(SessionEnd::InputFailed { id, code, reason })
        }
    }

    /// A connection that holds a place and nothing else — no message yet,
    /// or not configured — ends after its deadline whether or not anyone
    /// waits ([`Session::check_unconfigured`]).
    ///
    /// A configured user with nothing outstanding that has been silent for
    /// `--user-idle-timeout` while another user waits with no node at all
    /// ends its session, so its nodes go back to the pool. Without
    /// contention an idle session keeps its nodes: a program that pauses
    /// between batches is not punished for it. Ending it (rather than keeping a
    /// session without nodes) is deliberate: giving the nodes back silently
    /// would mean re-acquiring and re-configuring them behind the user's back
    /// later, a delay and a failure (no node free) a seed-format user could
    /// not be told about; an explicit end is something every client sees.
    pub(super) fn check_idle(&mut self) -> Result<(), SessionEnd> {
        if self.conn.phase == Phase::Initial && self.conn.cfg.is_none() {
            return self.check_unconfigured();
        }
        let limit = self.shared.opts.user_idle_timeout;
        let busy = self.outstanding > 0
            || self.quota.held.is_some()
            || self.results_waiting() > 0
            || self.next_cfg.is_some()
            || self.conn.phase == Phase::Configuring;
        if busy || self.last_activity.elapsed() <= limit {
            return Ok(());
        }
        match self.placement.wanted_elsewhere() {
            Some(nodes) => Err(SessionEnd::Idle { limit, nodes }),
            None => Ok(()),
        }
    }

    /// Not configured: the first message must come within `--read-timeout`
    /// of the connection (a client sends it at once), and then a message at
    /// least every `--user-idle-timeout` (a hello with nothing after it, an
    /// observer that stopped asking). Such a connection holds a place, and
    /// maybe nodes, that users who compute need. A frame that has begun is
    /// left to the read deadlines, which bound its progress instead.
    fn check_unconfigured(&self) -> Result<(), SessionEnd> {
        if self.conn.reader.begun_type().is_some() {
            return Ok(());
        }
        if !self.spoke {
            let limit = self.shared.opts.read_timeout;
            return match self.place.since().elapsed() > limit {
                true => Err(SessionEnd::Silent { limit }),
                false => Ok(()),
            };
        }
        let limit = self.shared.opts.user_idle_timeout;
        match self.last_activity.elapsed() > limit {
            true => Err(SessionEnd::Unconfigured { limit }),
            false => Ok(()),
        }
    }

    /// A new connection took this one's place (`limits::Places`).
    pub(super) fn evicted(&self) -> SessionEnd {
        SessionEnd::Evicted {
            max: self.shared.opts.max_users,
        }
    }
}

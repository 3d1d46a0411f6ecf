//! Messages from the user: hello, configuration, data, chunks and status.
//!
//! A configuration that cannot work (input or output plus the data id
//! larger than `--max-message`, no output for a core configuration) is
//! refused before any node sees it, and the session stays where it was
//! (Initial, or routing with the previous configuration), so the user can
//! correct it. One that arrives while routing waits until no data is in
//! flight, so its answer comes after every earlier result.

use corefarm_smp::{
    hello::features, Configuration, Data, ErrorCode, ErrorMsg, Frame, Hello, MsgType,
    UserPhase as Phase,
};

use corefarm_smp::stream::{Message, DEFAULT_CLASS};

use corefarm_smp::auth::check_user_name;

use super::{Admitted, Cx, Input, NextCfg, Placement, Session, SessionEnd};
use crate::auth::Tenant;
use crate::greeting::{self, Asked};
use crate::intake::Refused;

/// A configured user's receive buffer holds this many data messages of
/// its input size (the kernel doubles the figure for its bookkeeping).
/// Under credit eight, not fewer: with two, a user's window opened a
/// message at a time, which cost a third more syscalls and three times the
/// context switches per forwarded message, and the latency it saved is
/// lost in the user's own send buffer (megabytes) anyway.
const USER_RCVBUF_MESSAGES: usize = 8;
/// Under queue and stack, which put no bound on the data in flight to a
/// node, the small buffer is what paces a user without credit; a larger one
/// let it push a backlog of seconds into the nodes.
const USER_RCVBUF_MESSAGES_UNBOUNDED: usize = 2;
/// Floor: tiny messages still travel many per window.
const USER_RCVBUF_MIN: usize = 64 << 10;
/// Above this the buffer is left to the kernel's auto-tuning.
const USER_RCVBUF_MAX: usize = 1 << 20;

impl<P: Placement> Session<P> {
    pub(super) async fn on_user_frame(&mut self, frame: Frame) -> Result<(), SessionEnd> {
        match self.conn.asked(frame.ty) {
            Asked::Hello => self.on_hello(frame).await,
            Asked::Configuration => self.on_configuration(frame).await,
            Asked::Data => self.on_data(frame).await,
            Asked::Chunk => self.on_chunk(frame).await,
            Asked::Status => {
                // A query that does not parse is answered in full, as the
                // empty request is: the status is read-only.
                let q = corefarm_smp::StatusQuery::decode(&frame.payload).unwrap_or_default();
                let status = self.shared.status_query(Some(self.conn.user), &q);
                self.send_user(status.to_frame()).await
            }
            Asked::Refused(code, reason) => Err(SessionEnd::Broke { code, reason }),
        }
    }

    async fn on_hello(&mut self, frame: Frame) -> Result<(), SessionEnd> {
        let h = greeting::user_hello(&frame.payload).map_err(SessionEnd::HelloRefused)?;
        self.name_account(&h)?;
        if h.has(features::GROUP) {
            // A group user takes its nodes as one group (crate::group), not
            // here; its place is no longer taken back.
            if !self.place.hold() {
                return Err(self.evicted());
            }
            let mut agreed = Hello::new("server");
            agreed.features = [features::ERROR, features::GROUP]
                .map(String::from)
                .to_vec();
            // Commands with a class are relayed (without it to a node
            // that did not agree it): `features::GROUP_PRIORITY`.
            if h.has(features::GROUP_PRIORITY) {
                agreed.features.push(features::GROUP_PRIORITY.into());
            }
            agreed.nodes = Some(0);
            agreed.max_message = Some(self.shared.opts.max_message);
            self.conn.hello = Some(agreed.clone());
            self.conn.entry.set_hello(h.name.as_deref());
            self.send_user(agreed.to_frame()).await?;
            return Err(SessionEnd::Group);
        }
        let greeting::Agreed {
            hello: mut agreed,
            chunks,
        } = greeting::agree(
            &h,
            P::FEATURES,
            self.shared.opts.max_message,
            self.conn.peer,
        );
        let chunked = chunks.is_some();
        if let Some(c) = chunks {
            let (budget, t) = (&self.shared.budget, self.shared.opts.message_timeout);
            self.conn.inbound = Some(c.inbound.charged(budget.charge()).timed(t));
            self.conn.outbound = Some(c.outbound);
            if let Some(sock) = self.conn.reader.get_ref().sock() {
                crate::chunked::shallow_buffers(&sock, c.size);
            }
        }
        self.conn.hello = Some(agreed.clone());
        self.conn.result_limit = crate::anylen::user_limit(self.shared.opts.max_message, Some(&h));
        self.conn.entry.set_hello(h.name.as_deref());
        // `nodes: 0` asks for none: an observer (e.g. `corefarm status`)
        // must not take nodes away from the users that compute.
        let moves_on = agreed.has(features::MOVES_ON);
        agreed.nodes = Some(self.placement.hello(h.nodes, chunked, moves_on).await);
        // The user was waiting on the placement, not idle.
        self.last_activity = tokio::time::Instant::now();
        self.send_user(agreed.to_frame()).await
    }

    /// The account the session acts for: proven at admission with an
    /// auth file; else the user its hello names (nothing to prove it
    /// against: whoever reaches a server without one is trusted), or the
    /// anonymous account.
    fn name_account(&self, h: &Hello) -> Result<(), SessionEnd> {
        if self.conn.entry.account().is_some() {
            return Ok(());
        }
        let accounts = &self.shared.accounts;
        let account = match &h.user {
            Some(name) => {
                check_user_name(name).map_err(|e| {
                    SessionEnd::HelloRefused(greeting::Refused {
                        code: ErrorCode::Malformed,
                        reason: e.to_string(),
                        reads_errors: h.has(features::ERROR),
                    })
                })?;
                accounts.of(&std::sync::Arc::new(Tenant::named(name)))
            }
            None => accounts.anonymous().clone(),
        };
        self.conn.entry.set_account(account);
        Ok(())
    }

    async fn on_configuration(&mut self, frame: Frame) -> Result<(), SessionEnd> {
        // Named before any node works for it (a seed-format user: anonymous).
        self.account();
        let payload = frame.payload.clone();
        let cfg = Configuration::parse(frame.payload).map_err(|e| SessionEnd::Broke {
            code: e.code(),
            reason: format!("invalid configuration: {e}"),
        })?;
        tracing::info!(user = %self.conn.peer, "configuration: input {} B, output {} B, {} cores, {} bytes of bitstream",
            cfg.input_size, cfg.output_size, cfg.cores.len(), cfg.bitstream.len());
        // Checked before any node sees it: a configuration whose results
        // cannot be carried would otherwise make every node fail its first
        // result and be dropped from the pool.
        let verdict = cfg.check_limits(self.shared.opts.max_message);
        // Only a user without credit needs it: credit already bounds what a
        // hello user has sent and not had read, and a small buffer would cap
        // its throughput for nothing.
        if P::PACED_BY_READS && verdict.is_ok() && !self.conn.agreed(features::CREDIT) {
            self.bound_receive_buffer(cfg.input_size);
        }
        if self.conn.phase == Phase::Initial {
            match verdict {
                // Configuring, the place is no longer taken back.
                Ok(()) if !self.place.hold() => Err(self.evicted()),
                Ok(()) if self.elsewhere() => self.refuse_without_nodes().await,
                Ok(()) => self.start_configuring(cfg, payload, true).await,
                Err(e) => self.refuse_configuration(e).await,
            }
        } else {
            // Seed §3.3.1.3: wait until no data is in flight, then reconfigure.
            self.next_cfg = Some(match verdict {
                Ok(()) => NextCfg::Apply(cfg, payload),
                Err(e) => NextCfg::Refuse(e),
            });
            Ok(())
        }
    }

    /// Hands a checked configuration to the placement.
    pub(super) async fn start_configuring(
        &mut self,
        cfg: Configuration,
        payload: bytes::Bytes,
        first: bool,
    ) -> Result<(), SessionEnd> {
        self.conn.set_phase(Phase::Configuring);
        let mut cx = Cx {
            out: &mut self.outbox,
            credit_blocked: false,
        };
        self.placement
            .configure(&cfg, payload, first, &mut cx)
            .await;
        self.conn.cfg = Some(cfg);
        // The user was waiting on the placement, not idle.
        self.last_activity = tokio::time::Instant::now();
        self.deliver().await
    }

    /// A configuration that can never work here (see
    /// [`Configuration::check_limits`]): the user hears why, no node ever
    /// sees it, and the session goes on as before — still unconfigured, or
    /// routing with the previous configuration — so a corrected
    /// configuration on the same connection works.
    pub(super) async fn refuse_configuration(
        &mut self,
        e: corefarm_smp::ProtocolError,
    ) -> Result<(), SessionEnd> {
        let reason = format!(
            "configuration refused: {e} (--max-message is {})",
            self.shared.opts.max_message
        );
        tracing::warn!(user = %self.conn.peer, "{reason}");
        self.send_error(ErrorMsg::NO_ID, e.code(), reason).await?;
        self.send_response(false).await
    }

    /// A user that can go to another server (`moves-on`) is not held
    /// for `--node-wait` by a server with no node at all: another server
    /// in its list may hold the nodes (this one restarted after a failover).
    fn elsewhere(&self) -> bool {
        self.conn.agreed(features::MOVES_ON) && self.shared.registry.node_count() == 0
    }

    /// Tells a `moves-on` user at once that no node is connected; the
    /// session stays unconfigured, so it may still configure here.
    async fn refuse_without_nodes(&mut self) -> Result<(), SessionEnd> {
        tracing::info!(user = %self.conn.peer, "no node is connected: the user moves on");
        let reason = "no node is connected to the server (the user has other servers to try)";
        self.send_error(ErrorMsg::NO_ID, ErrorCode::NoNodes, reason)
            .await?;
        self.send_response(false).await
    }

    /// Sizes the kernel's receive buffer of the user socket to a few data
    /// messages of the configured input size. The server reads a user only
    /// when a node can take the message, so whatever a user sends beyond
    /// that waits in this buffer; a seed-format user (no credit) keeps it
    /// full, and with the kernel's auto-tuning (megabytes) that wait was
    /// tens of milliseconds. Large inputs keep auto-tuning: a buffer of a few
    /// of them would exceed what the kernel grants anyway, and shrinking it
    /// would cost throughput, not latency.
    fn bound_receive_buffer(&self, input_size: u32) {
        let message = input_size as usize + 12;
        let messages = if self.shared.opts.policy == crate::Policy::Credit {
            USER_RCVBUF_MESSAGES
        } else {
            USER_RCVBUF_MESSAGES_UNBOUNDED
        };
        let want = messages * message;
        if want > USER_RCVBUF_MAX {
            return;
        }
        let Some(sock) = self.conn.reader.get_ref().sock() else {
            return;
        };
        if let Err(e) = sock.set_recv_buffer_size(want.max(USER_RCVBUF_MIN)) {
            tracing::debug!(user = %self.conn.peer, "cannot set the receive buffer: {e}");
        }
    }

    async fn on_data(&mut self, frame: Frame) -> Result<(), SessionEnd> {
        let d = Data::parse(frame.payload).map_err(|e| SessionEnd::Broke {
            code: e.code(),
            reason: e.to_string(),
        })?;
        self.accept_data(d, DEFAULT_CLASS).await
    }

    /// A chunk of a data message; the message it completes is placed like
    /// one sent whole, in the chunks' class. Any broken rule (see
    /// `smp::stream`) ends the session with the reason.
    async fn on_chunk(&mut self, frame: Frame) -> Result<(), SessionEnd> {
        match self.conn.chunk(frame.payload) {
            Ok(whole) => self.on_whole(whole).await,
            Err(e) => Err(SessionEnd::Broke {
                code: e.code(),
                reason: e.to_string(),
            }),
        }
    }

    /// A chunk read into its message's buffer: allowed when a chunk frame
    /// would be, then as one.
    pub(super) async fn on_placed(&mut self, whole: Option<Message>) -> Result<(), SessionEnd> {
        if let Asked::Refused(code, reason) = self.conn.asked(MsgType::Chunk) {
            return Err(SessionEnd::Broke { code, reason });
        }
        self.on_whole(whole).await
    }

    /// The message a chunk completed, if any, placed like one sent whole.
    async fn on_whole(&mut self, whole: Option<Message>) -> Result<(), SessionEnd> {
        let Some(m) = whole else { return Ok(()) };
        let class = m.class;
        self.accept_data(Data::from(m), class).await
    }

    async fn accept_data(&mut self, d: Data, class: u8) -> Result<(), SessionEnd> {
        let count = match self.conn.intake(&mut self.credit, d.id, d.data.len()) {
            Ok(n) => n,
            // Its credit comes back with the next grant.
            Err(Refused::ById(id, code, why)) => return self.send_error(id, code, why).await,
            Err(Refused::End(id, code, reason)) => {
                return Err(SessionEnd::BadInput { id, code, reason })
            }
        };
        let input = Input {
            id: d.id,
            data: d.data,
            count,
            class,
        };
        if let Some(max) = self.account().queue_limit() {
            let len = input.data.len() as u64;
            if len > max {
                return self.over_quota(input.id, len, max).await;
            }
            let account = self.account().clone();
            if !self.quota.take(&account, input.id, len, max) {
                // Waits for room; nothing more is read meanwhile.
                self.quota.held = Some(input);
                return Ok(());
            }
        }
        self.place(input).await
    }

    /// An input held for room in its user's `max_queued_bytes`, placed
    /// once it fits and the placement can take it.
    pub(super) async fn place_held(&mut self) -> Result<(), SessionEnd> {
        let Some(input) = &self.quota.held else {
            return Ok(());
        };
        let (id, len) = (input.id, input.data.len() as u64);
        let view = self.view();
        if !self.placement.ready_for_data(&view) {
            return Ok(());
        }
        let account = self.account().clone();
        let max = account.queue_limit().unwrap_or(u64::MAX);
        if !self.quota.take(&account, id, len, max) {
            return Ok(());
        }
        let input = self.quota.held.take().expect("checked above");
        self.place(input).await
    }

    /// An input larger than its user's `max_queued_bytes`: it could never
    /// be taken, so it is refused by id (its credit comes back with the
    /// next grant); a user that cannot hear errors by id ends its session.
    async fn over_quota(&mut self, id: u32, len: u64, max: u64) -> Result<(), SessionEnd> {
        let reason = format!(
            "data id {id}: {len} bytes exceed the max_queued_bytes of user {:?} ({max} bytes)",
            self.account().name()
        );
        if self.conn.agreed(features::ERROR) {
            return self.send_error(id, ErrorCode::TooLarge, reason).await;
        }
        Err(SessionEnd::BadInput {
            id,
            code: ErrorCode::TooLarge,
            reason,
        })
    }

    /// Hands an accepted input to the placement.
    async fn place(&mut self, input: Input) -> Result<(), SessionEnd> {
        let id = input.id;
        let queue_full = self.conn.agreed(features::QUEUE_FULL);
        let mut cx = Cx {
            out: &mut self.outbox,
            credit_blocked: false,
        };
        match self.placement.data(input, queue_full, &mut cx)? {
            Admitted::Placed => {
                self.outstanding += 1;
                self.deliver().await
            }
            Admitted::QueueFull(full) => {
                // The user's again: no longer queued.
                self.quota.answered(id);
                let why = format!("{full}; send it again later");
                // Sent even without the error feature: queue-full asked for it.
                self.send_user(ErrorMsg::new(id, ErrorCode::QueueFull, why).to_frame())
                    .await
            }
        }
    }
}

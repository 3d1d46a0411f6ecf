//! Nodes Configuration state (seed 000 §3.3.1.2): the configuration goes to
//! every node at once; the user hears success if at least one node took it.

use bytes::Bytes;
use corefarm_smp::{
    Configuration, ErrorCode, ErrorMsg, MsgType, NodeState, OutFrame, ProtocolError,
    UserPhase as Phase,
};
use tokio::time::Instant;

use super::{End, Handler, Slot};

impl Handler {
    /// A configuration that can never work here (see
    /// [`Configuration::check_limits`]): the user hears why, no node ever
    /// sees it, and the session goes on as before — still unconfigured, or
    /// routing with the previous configuration — so a corrected
    /// configuration on the same connection works.
    pub(super) async fn refuse_configuration(&mut self, e: ProtocolError) -> Result<(), End> {
        let reason = format!(
            "configuration refused: {e} (--max-message is {})",
            self.shared.opts.max_message
        );
        tracing::warn!(user = %self.peer, "{reason}");
        self.send_error(ErrorMsg::NO_ID, e.code(), reason).await?;
        self.send_response(false).await
    }

    pub(super) async fn start_configuring(
        &mut self,
        cfg: Configuration,
        payload: Bytes,
    ) -> Result<(), End> {
        // The payload arrived within --max-message, so it always fits a frame.
        let frame = match OutFrame::new(MsgType::Configuration, payload) {
            Ok(f) => f,
            Err(e) => {
                return Err(self
                    .fail_user(ErrorMsg::NO_ID, e.code(), e.to_string())
                    .await)
            }
        };
        self.set_phase(Phase::Configuring);
        self.refusals.clear();
        self.cfg = Some(cfg);
        self.cfg_frame = Some(frame.clone());
        let deadline = Instant::now() + self.shared.opts.config_timeout;
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            let n = self.nodes.get_mut(&id).expect("listed");
            if n.tx.send(frame.clone()) {
                n.sent += 1;
                n.slot = Slot::Configuring { deadline };
                n.tx.entry.set_state(NodeState::Configuring);
            } else {
                self.drop_node(id, "connection closed before configuration");
            }
        }
        self.finish_configuring_if_done().await
    }

    pub(super) async fn finish_configuring_if_done(&mut self) -> Result<(), End> {
        if self.phase != Phase::Configuring
            || self
                .nodes
                .values()
                .any(|n| matches!(n.slot, Slot::Configuring { .. }))
        {
            return Ok(());
        }
        let ready = self
            .nodes
            .values()
            .filter(|n| n.slot == Slot::Ready)
            .count();
        if ready > 0 {
            tracing::info!(user = %self.peer, "configured {ready} node(s)");
            self.set_phase(Phase::Routing);
            for r in std::mem::take(&mut self.refusals) {
                let reason = format!("node dropped: {r}");
                self.send_error(ErrorMsg::NO_ID, ErrorCode::ConfigurationFailed, reason)
                    .await?;
            }
            self.send_response(true).await
        } else {
            let why = if self.refusals.is_empty() {
                "no free node is connected to the server".to_string()
            } else {
                format!("no node could be configured: {}", self.refusals.join("; "))
            };
            tracing::warn!(user = %self.peer, "configuration failed: {why}");
            // Back to Initial: the next configuration takes free nodes again.
            self.set_phase(Phase::Initial);
            self.cfg = None;
            self.cfg_frame = None;
            self.send_error(ErrorMsg::NO_ID, ErrorCode::ConfigurationFailed, why)
                .await?;
            self.send_response(false).await
        }
    }
}

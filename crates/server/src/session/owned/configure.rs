//! Nodes Configuration state (seed 000 §3.3.1.2): the configuration goes to
//! every node at once; the user hears success if at least one node took it.
//!
//! A configuration that every node refused returns the session to Initial,
//! and the next configuration takes free nodes again: the pool forgets
//! which nodes refused the previous one, since the next may suit them.

use bytes::Bytes;
use corefarm_smp::targets::Carried;
use corefarm_smp::{
    ClusterStatus, Configuration, ErrorCode, ErrorMsg, MsgType, NodeState, OutFrame,
    UserPhase as Phase,
};
use tokio::time::Instant;

use super::{Owned, Slot};
use crate::nodeconn::NodeConn;
use crate::session::{Cx, Outcome, SessionEnd};

/// Node labels listed in one line of a refusal; the rest are counted.
const LISTED: usize = 6;

/// Why the nodes that did not take the current configuration failed, by
/// node. A node's own words (an error message before its negative response,
/// or why its connection was lost) win over a bare negative response.
#[derive(Debug, Default)]
pub(super) struct Refusals(Vec<Refusal>);

#[derive(Debug)]
struct Refusal {
    node: u64,
    label: String,
    /// `None`: a negative response without a reason (e.g. a seed node).
    reason: Option<String>,
}

impl Refusals {
    pub fn clear(&mut self) {
        self.0.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The node explained itself; its first explanation is kept.
    pub fn reason(&mut self, node: u64, label: String, reason: &str) {
        match self.0.iter_mut().find(|r| r.node == node) {
            Some(r) => {
                r.reason.get_or_insert_with(|| reason.to_string());
            }
            None => self.0.push(Refusal {
                node,
                label,
                reason: Some(reason.to_string()),
            }),
        }
    }

    /// The node answered the configuration negatively.
    pub fn refused(&mut self, node: u64, label: String) {
        if !self.0.iter().any(|r| r.node == node) {
            self.0.push(Refusal {
                node,
                label,
                reason: None,
            });
        }
    }

    /// One line per distinct reason, naming the nodes it applies to, in the
    /// order the reasons first came: "2 nodes (a@h:1, b@h:2): why" or
    /// "a@h:1: why".
    pub fn lines(&self) -> Vec<(String, String)> {
        let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
        for r in &self.0 {
            let reason = r
                .reason
                .as_deref()
                .unwrap_or("refused the configuration without a reason");
            match groups.iter_mut().find(|(why, _)| *why == reason) {
                Some((_, labels)) => labels.push(&r.label),
                None => groups.push((reason, vec![&r.label])),
            }
        }
        groups
            .into_iter()
            .map(|(why, labels)| (who(&labels), why.to_string()))
            .collect()
    }
}

/// "a@h:1", or "3 nodes (a@h:1, b@h:2, c@h:3)", long lists cut short.
fn who(labels: &[&str]) -> String {
    if let [one] = labels {
        return one.to_string();
    }
    let mut listed = labels[..labels.len().min(LISTED)].join(", ");
    if labels.len() > LISTED {
        listed.push_str(&format!(" and {} more", labels.len() - LISTED));
    }
    format!("{} ({listed})", count(labels.len(), "node"))
}

/// "1 node", "2 nodes".
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// The cluster as a user without nodes sees it: "no node is connected",
/// "4 nodes connected, all assigned to other users", ...
fn availability(status: &ClusterStatus, me: u64) -> String {
    let total = status.nodes.len();
    let others = status
        .nodes
        .iter()
        .filter(|n| n.user.is_some_and(|u| u != me))
        .count();
    let free = status.count_nodes(NodeState::Free);
    match (total, others) {
        (0, _) => "no node is connected to the server".to_string(),
        (1, 1) => "1 node connected, assigned to another user".to_string(),
        (t, o) if t == o => format!("{t} nodes connected, all assigned to other users"),
        (t, o) => format!(
            "{} connected: {o} assigned to other users, {free} free",
            count(t, "node")
        ),
    }
}

impl Owned {
    /// Sends the configuration to every node at once (taking nodes first is
    /// the caller's); the answer is reported once every node has answered.
    pub(super) fn start_configuring(
        &mut self,
        cfg: &Configuration,
        payload: Bytes,
        cx: &mut Cx<'_>,
    ) {
        // The payload arrived within --max-message, so it always fits a frame.
        let frame = match OutFrame::new(MsgType::Configuration, payload) {
            Ok(f) => f,
            Err(e) => {
                return cx.report(Outcome::End(SessionEnd::Unsendable {
                    id: ErrorMsg::NO_ID,
                    code: e.code(),
                    reason: e.to_string(),
                }))
            }
        };
        self.phase = Phase::Configuring;
        self.refusals.clear();
        let (function, cores) = (crate::metrics::function_label(cfg), cfg.cores.len());
        self.output_size = cfg.output_size;
        self.cfg_frame = Some(frame.clone());
        self.carried = Carried::of(&cfg.bitstream);
        let deadline = Instant::now() + self.shared.opts.config_timeout;
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            if let Some(why) = self.unfit(&self.nodes[&id].tx) {
                self.refuse_unfit(id, &why);
                continue;
            }
            let n = self.nodes.get_mut(&id).expect("listed");
            if n.tx.send(frame.clone()) {
                n.sent += 1;
                if n.slot == Slot::Ready {
                    self.ready -= 1;
                }
                n.slot = Slot::Configuring { deadline };
                n.tx.entry.m.configuring(function.clone(), cores);
                n.tx.entry.set_state(NodeState::Configuring);
            } else {
                let why = "connection closed before configuration";
                self.refusals.reason(id, n.tx.label(), why);
                self.drop_node(id, why);
            }
        }
        self.finish_configuring_if_done(cx);
    }

    /// Why `conn` is not sent the current configuration: it announced
    /// targets, none of which the image's artifacts are for.
    pub(super) fn unfit(&self, conn: &NodeConn) -> Option<String> {
        let c = self.carried.as_ref()?;
        c.fits(&conn.entry.info().targets)
            .err()
            .map(|e| e.to_string())
    }

    /// A node not sent the configuration counts as having refused it: it
    /// goes back to the pool, never offered to this user again for it.
    fn refuse_unfit(&mut self, id: u64, why: &str) {
        let Some(n) = self.nodes.get(&id) else {
            return;
        };
        tracing::info!(user = %self.peer, node = %n.tx.label(), "node not configured: {why}");
        self.refusals.reason(id, n.tx.label(), why);
        let user = self.user;
        self.shared.pool.update(user, |w| {
            w.refused.insert(id);
            w.have = w.have.saturating_sub(1);
        });
        self.release_node(id);
    }

    /// Once no node is still configuring: success if at least one took the
    /// configuration (with a warning per shortfall and per refusal), else
    /// failure with the reason.
    pub(super) fn finish_configuring_if_done(&mut self, cx: &mut Cx<'_>) {
        if self.phase != Phase::Configuring
            || self
                .nodes
                .values()
                .any(|n| matches!(n.slot, Slot::Configuring { .. }))
        {
            return;
        }
        let ready = self
            .nodes
            .values()
            .filter(|n| n.slot == Slot::Ready)
            .count();
        if ready > 0 {
            tracing::info!(user = %self.peer, "configured {}", count(ready, "node"));
            self.phase = Phase::Routing;
            let mut warnings = Vec::new();
            if let Some(short) = self.shortfall() {
                tracing::info!(user = %self.peer, "{short}");
                warnings.push((ErrorCode::NoNodes, short));
            }
            for (who, why) in std::mem::take(&mut self.refusals).lines() {
                warnings.push((
                    ErrorCode::ConfigurationFailed,
                    format!("{who} dropped: {why}"),
                ));
            }
            cx.report(Outcome::Configured { ok: true, warnings });
        } else {
            let why = self.why_no_node();
            tracing::warn!(user = %self.peer, "configuration failed: {why}");
            // Once per configuration refused to the user, however many of
            // its nodes refused it (each is named in the reason).
            self.shared
                .metrics
                .error(crate::metrics::ErrorKind::ConfigurationFailed);
            // Back to Initial: the next configuration takes free nodes again.
            self.phase = Phase::Initial;
            self.cfg_frame = None;
            let warnings = vec![(ErrorCode::ConfigurationFailed, why)];
            cx.report(Outcome::Configured {
                ok: false,
                warnings,
            });
        }
    }

    /// "asked for 8 nodes, 3 assigned (3 connected)" when the user got
    /// fewer nodes than its hello asked for; nodes that were assigned and
    /// dropped are reported separately.
    fn shortfall(&self) -> Option<String> {
        let want = self.want? as usize;
        let assigned = self.nodes.len() + self.refusals.len();
        if assigned >= want {
            return None;
        }
        let status = self.shared.status(None);
        let others = status
            .nodes
            .iter()
            .filter(|n| n.user.is_some_and(|u| u != self.user))
            .count();
        let held = match others {
            0 => String::new(),
            o => format!(", {o} assigned to other users"),
        };
        Some(format!(
            "asked for {}, {assigned} assigned ({} connected{held})",
            count(want, "node"),
            status.nodes.len()
        ))
    }

    /// The reason a configuration reached no node, for the user.
    fn why_no_node(&self) -> String {
        if !self.refusals.is_empty() {
            let lines: Vec<String> = self
                .refusals
                .lines()
                .into_iter()
                .map(|(who, why)| format!("{who}: {why}"))
                .collect();
            return format!("no node could be configured: {}", lines.join("; "));
        }
        if let (Some(max), Some(a)) = (self.at_max_nodes, self.entry.account()) {
            return format!(
                "user {:?} is at its node limit (max_nodes = {max}): its other sessions \
                 hold {max} node(s); end one of them or ask the operator for a larger limit",
                a.name()
            );
        }
        if self.want == Some(0) {
            return "this session asked for no nodes (hello with nodes: 0), \
                    so there is no node to configure"
                .to_string();
        }
        let status = self.shared.status(None);
        let advice = match status.nodes.is_empty() {
            true => "start node managers (corefarm node --server …) and configure again",
            false => {
                "configure again once another user leaves, ask for fewer nodes (hello \
                 nodes), or ask the operator for --sharing shared, where users share nodes"
            }
        };
        format!(
            "no node for this user: {} (waited {:?} for one, --node-wait); {advice}",
            availability(&status, self.user),
            self.shared.opts.node_wait
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_group_by_reason_and_keep_a_nodes_own_words() {
        let mut r = Refusals::default();
        r.reason(1, "a@h:1".into(), "no artifact for native");
        r.refused(1, "a@h:1".into()); // its negative response after the error
        r.refused(2, "node-2@h:2".into());
        r.reason(3, "c@h:3".into(), "no artifact for native");
        assert_eq!(r.len(), 3);
        assert_eq!(
            r.lines(),
            vec![
                (
                    "2 nodes (a@h:1, c@h:3)".to_string(),
                    "no artifact for native".to_string()
                ),
                (
                    "node-2@h:2".to_string(),
                    "refused the configuration without a reason".to_string()
                ),
            ]
        );
    }

    #[test]
    fn long_node_lists_are_cut_short() {
        let labels: Vec<String> = (0..9).map(|i| format!("n{i}@h:{i}")).collect();
        let refs: Vec<&str> = labels.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            who(&refs),
            "9 nodes (n0@h:0, n1@h:1, n2@h:2, n3@h:3, n4@h:4, n5@h:5 and 3 more)"
        );
    }

    #[test]
    fn availability_says_who_holds_the_nodes() {
        use corefarm_smp::NodeStatus;
        let node = |id, user| NodeStatus {
            id,
            user,
            state: if user.is_some() {
                NodeState::Ready
            } else {
                NodeState::Free
            },
            ..NodeStatus::default()
        };
        let mut s = ClusterStatus::default();
        assert_eq!(availability(&s, 9), "no node is connected to the server");
        s.nodes = vec![node(1, Some(5))];
        assert_eq!(
            availability(&s, 9),
            "1 node connected, assigned to another user"
        );
        s.nodes = (1..=4).map(|i| node(i, Some(5 + i % 2))).collect();
        assert_eq!(
            availability(&s, 9),
            "4 nodes connected, all assigned to other users"
        );
        s.nodes.push(node(5, None));
        assert_eq!(
            availability(&s, 9),
            "5 nodes connected: 4 assigned to other users, 1 free"
        );
    }
}

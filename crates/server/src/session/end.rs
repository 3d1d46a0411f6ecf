//! Why a session ends, and the one place a cause becomes what the user is
//! told (an SMP error code, as the protocol allows), a metric and a log line.

use std::time::Duration;

use corefarm_smp::{ErrorCode, ErrorMsg};

use super::{Placement, Session};
use crate::greeting;
use crate::userconn::Closed;

/// Why a user session ends.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionEnd {
    /// The user closed the connection, or the server is stopping.
    #[error("the user closed the connection")]
    Closed,
    /// The connection failed: nobody is left to tell.
    #[error("{0}")]
    Link(String),
    /// A result chunk could not be handed to the user's socket.
    #[error(transparent)]
    Feed(#[from] crate::chunked::FeedError),
    /// The user's hello was refused (see [`greeting::Refused`]).
    #[error("{}", .0.reason)]
    HelloRefused(greeting::Refused),
    /// The user broke a rule of the protocol, or a read deadline passed.
    #[error("{reason}")]
    Broke { code: ErrorCode, reason: String },
    /// A data message the user cannot be told about by id was refused
    /// (see `intake::check`).
    #[error("{reason}")]
    BadInput {
        id: u32,
        code: ErrorCode,
        reason: String,
    },
    /// A data message failed and the user cannot be told about one input
    /// (a seed-format user, or a hello without `error`).
    #[error("{reason}")]
    InputFailed {
        id: u32,
        code: ErrorCode,
        reason: String,
    },
    /// No node is left to process the user's data.
    #[error("no node left to process data ({0})")]
    NoNodes(String),
    /// Silent with nothing outstanding while another user waits for nodes.
    #[error(
        "idle for {limit:?} with nothing outstanding while another user waits for nodes; \
         session ended and its {nodes} node(s) returned to the pool (--user-idle-timeout)"
    )]
    Idle { limit: Duration, nodes: usize },
    /// No first message within the deadline of a new connection.
    #[error("sent nothing within {limit:?} of connecting; closed (--read-timeout)")]
    Silent { limit: Duration },
    /// Not configured, and no message for `--user-idle-timeout`.
    #[error(
        "no configuration and no message for {limit:?}: the connection held a place \
         and nothing else; closed (--user-idle-timeout)"
    )]
    Unconfigured { limit: Duration },
    /// A new connection took the place of this unconfigured, idle one.
    #[error(
        "the server is at its limit of {max} user connection(s) (--max-users) and this \
         connection, not configured and the idlest, gave its place to a new one"
    )]
    Evicted { max: usize },
    /// A frame to the user could not be built.
    #[error("{reason}")]
    Unsendable {
        id: u32,
        code: ErrorCode,
        reason: String,
    },
    /// The scheduler (shared mode) has stopped.
    #[error("scheduler stopped")]
    SchedulerStopped { id: u32 },
    /// The hello asked for a group: [`crate::group`] serves the rest.
    #[error("the hello asked for a group")]
    Group,
    /// The group session that took the connection over ended with this.
    #[error("{0}")]
    GroupEnded(#[from] crate::group::GroupEnd),
    /// Over the memory budget, or a chunked message left unfinished.
    #[error("{0}")]
    Held(crate::budget::Held),
}

impl From<Closed> for SessionEnd {
    fn from(_: Closed) -> SessionEnd {
        SessionEnd::Link("user connection closed".into())
    }
}

impl SessionEnd {
    /// The id and SMP code the user is told of, for the causes it is told.
    pub(crate) fn told(&self) -> Option<(u32, ErrorCode)> {
        match self {
            SessionEnd::Broke { code, .. } => Some((ErrorMsg::NO_ID, *code)),
            SessionEnd::BadInput { id, code, .. }
            | SessionEnd::InputFailed { id, code, .. }
            | SessionEnd::Unsendable { id, code, .. } => Some((*id, *code)),
            SessionEnd::NoNodes(_) => Some((ErrorMsg::NO_ID, ErrorCode::NoNodes)),
            SessionEnd::Idle { .. }
            | SessionEnd::Silent { .. }
            | SessionEnd::Unconfigured { .. }
            | SessionEnd::Evicted { .. } => Some((ErrorMsg::NO_ID, ErrorCode::Timeout)),
            SessionEnd::SchedulerStopped { id } => Some((*id, ErrorCode::Internal)),
            SessionEnd::HelloRefused(r) => Some((ErrorMsg::NO_ID, r.code)),
            SessionEnd::Held(h) => Some(h.told()),
            SessionEnd::Closed
            | SessionEnd::Link(_)
            | SessionEnd::Feed(_)
            | SessionEnd::Group
            | SessionEnd::GroupEnded(_) => None,
        }
    }
}

impl<P: Placement> Session<P> {
    /// Tells the user why its session ends, as the protocol allows, counts
    /// it and logs it.
    pub(super) async fn close(&mut self, end: &SessionEnd) {
        let peer = self.conn.peer;
        match end {
            SessionEnd::Closed => {
                tracing::info!(user = %peer, "user session ended");
                return;
            }
            // A seed-format user has no way to hear why it idled out: just close.
            SessionEnd::Idle { .. } if self.conn.hello.is_none() => {}
            // Holding a place and nothing else: told after a hello; a
            // seed-format user (or one that never spoke) cannot be, outside
            // a configuration it is waiting on.
            SessionEnd::Silent { .. }
            | SessionEnd::Unconfigured { .. }
            | SessionEnd::Evicted { .. } => {
                let kind = match end {
                    SessionEnd::Evicted { .. } => crate::metrics::ErrorKind::Evicted,
                    _ => crate::metrics::ErrorKind::Idle,
                };
                self.shared.metrics.error(kind);
                if self.conn.hello.is_some() {
                    self.conn
                        .report(ErrorMsg::NO_ID, ErrorCode::Timeout, &end.to_string())
                        .await;
                }
            }
            SessionEnd::HelloRefused(r) => {
                let metrics = &self.shared.metrics;
                metrics.error(crate::metrics::ErrorKind::BadHello);
                self.conn.refuse_hello(r).await;
            }
            _ => {
                if let Some((id, code)) = end.told() {
                    self.error_metric(end);
                    self.conn.report(id, code, &end.to_string()).await;
                }
            }
        }
        tracing::warn!(user = %peer, "user session ended: {end}");
    }

    fn error_metric(&self, end: &SessionEnd) {
        let kind = match end {
            SessionEnd::Held(h) => h.kind(),
            _ => crate::metrics::ErrorKind::UserError,
        };
        self.shared.metrics.error(kind);
    }
}

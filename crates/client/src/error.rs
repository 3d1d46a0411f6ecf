//! The client's error type. Every message says what went wrong and, where it
//! matters, while doing what, so that it can be shown to a user unchanged.

use std::io;
use std::time::Duration;

use corefarm_smp::{ErrorCode, ErrorMsg, ProtocolError};

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    // The cause is in the message and not a `source`: error chains
    // (`anyhow`'s `{:#}`) would print it twice.
    #[error("could not resolve the server address {addr}: {cause}")]
    Resolve { addr: String, cause: io::Error },
    #[error("could not connect to the corefarm server at {addr}: {cause}")]
    Connect { addr: String, cause: io::Error },
    #[error("the server at {addr} did not complete the hello exchange: {detail}")]
    Handshake { addr: String, detail: String },
    #[error("TLS with the server at {addr} failed: {cause}")]
    Tls {
        addr: String,
        // Boxed: the rustls and pem causes would make every client
        // error several times larger.
        cause: Box<crate::tls::HandshakeError>,
    },
    #[error("the server closed the connection {during}")]
    Closed { during: &'static str },
    #[error("the connection was closed by this client")]
    ClosedLocally,
    #[error("timed out after {after:?} {during}")]
    Timeout {
        after: Duration,
        during: &'static str,
    },
    #[error("configuration failed: {}", reason.as_deref().unwrap_or("the server gave no reason"))]
    Configuration {
        /// The configuration response's status, if one arrived.
        status: Option<u8>,
        /// The server's explanation (from an `Error` message), if it sent one.
        reason: Option<String>,
    },
    #[error("server error: {0}")]
    Server(ErrorMsg),
    #[error("protocol error in a message from the server: {0}")]
    Protocol(ProtocolError),
    #[error("unexpected message from the server: {0}")]
    Unexpected(String),
    #[error("i/o error {during}: {source}")]
    Io {
        during: &'static str,
        source: io::Error,
    },
    #[error("not configured: call configure() before submitting data")]
    NotConfigured,
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The client was used in a way that cannot work (e.g. `recv` while
    /// every result in flight belongs to a `Pending`); the message says how.
    #[error("misuse of the client: {0}")]
    Usage(String),
    #[error("the server does not support {0}")]
    Unsupported(&'static str),
    /// The connection to the server broke and no server took the session
    /// back within `ClientOptions::reconnect_timeout`: `unanswered` data
    /// messages (one per `map` input) never got their result.
    #[error(
        "lost the server and could not resume within {waited:?}: {unanswered} data \
         message(s) never got their result (last attempt: {cause})"
    )]
    ServerLost {
        unanswered: usize,
        waited: Duration,
        /// Why the last attempt to reach a server failed.
        cause: std::sync::Arc<ClientError>,
    },
}

impl ClientError {
    /// The server's error message, if this error is one.
    pub fn server_error(&self) -> Option<&ErrorMsg> {
        match self {
            ClientError::Server(e) => Some(e),
            _ => None,
        }
    }

    pub fn is_timeout(&self) -> bool {
        matches!(self, ClientError::Timeout { .. })
    }

    /// Whether trying again, on a new connection to the same or another
    /// server, may succeed: the server went away or could not be reached,
    /// or it has no node for this user. A resuming client reconnects on
    /// these and on nothing else; errors about the request itself, the
    /// credentials or the protocol are not retryable.
    pub fn retryable(&self) -> bool {
        match self {
            ClientError::Resolve { .. }
            | ClientError::Connect { .. }
            | ClientError::Handshake { .. }
            | ClientError::Closed { .. }
            | ClientError::Io { .. } => true,
            ClientError::Server(e) => e.code() == Some(ErrorCode::NoNodes),
            _ => false,
        }
    }
}

/// Why the connection stopped working, as recorded by the reader thread.
/// Cloneable so that every waiter can be told.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    Closed,
    ClosedLocally,
    Io(io::ErrorKind, String),
    Protocol(ProtocolError),
    Unexpected(String),
    Server(ErrorMsg),
    /// Resuming gave up (see [`ClientError::ServerLost`]).
    Lost {
        unanswered: usize,
        waited: std::time::Duration,
        cause: std::sync::Arc<ClientError>,
    },
}

impl Failure {
    /// [`ClientError::retryable`] of the error this failure becomes.
    pub(crate) fn retryable(&self) -> bool {
        self.to_error("").retryable()
    }

    pub(crate) fn to_error(&self, during: &'static str) -> ClientError {
        match self {
            Failure::Closed => ClientError::Closed { during },
            Failure::ClosedLocally => ClientError::ClosedLocally,
            Failure::Io(kind, msg) => ClientError::Io {
                during,
                source: io::Error::new(*kind, msg.clone()),
            },
            Failure::Protocol(e) => ClientError::Protocol(e.clone()),
            Failure::Unexpected(what) => ClientError::Unexpected(what.clone()),
            Failure::Server(e) => ClientError::Server(e.clone()),
            Failure::Lost {
                unanswered,
                waited,
                cause,
            } => ClientError::ServerLost {
                unanswered: *unanswered,
                waited: *waited,
                cause: cause.clone(),
            },
        }
    }
}

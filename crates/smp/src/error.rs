use thiserror::Error;

/// Why a byte sequence is not a valid SMP message. Every variant names the
/// offending field so that the reason can be sent back to the peer verbatim.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("payload of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge { size: u32, max: u32 },
    #[error("{what}: payload of {got} bytes is too short, need at least {need}")]
    Truncated {
        what: &'static str,
        got: usize,
        need: usize,
    },
    #[error("configuration declares {cores} cores but the payload holds only {room} bytes for the core table")]
    CoreTableTooLong { cores: u32, room: usize },
    #[error("configuration declares {cores} cores; at most {max} are allowed")]
    TooManyCores { cores: u32, max: u32 },
    #[error("configuration has input size 0")]
    ZeroInputSize,
    #[error("benchmarking configuration needs input and output sizes of at least 16 bytes, got {input} and {output}")]
    BenchmarkTooSmall { input: u32, output: u32 },
    #[error("data of {len} bytes is not a whole number of {unit}-byte {what}")]
    NotMultiple {
        len: usize,
        unit: u32,
        what: &'static str,
    },
    #[error("data message carries no {0}")]
    EmptyData(&'static str),
    #[error("hello is not valid: {0}")]
    BadHello(String),
    #[error("error message reason is not UTF-8")]
    BadReason,
    #[error("connection closed in the middle of a message ({0} bytes buffered)")]
    TruncatedStream(usize),
    #[error(
        "{what} size of {size} bytes plus the 4-byte id exceeds the message limit of {max} bytes"
    )]
    SizeOverLimit {
        what: &'static str,
        size: u32,
        max: u32,
    },
    #[error("configuration has output size 0: its results would carry nothing")]
    ZeroOutputSize,
    #[error("a payload of {0} bytes cannot be described by the 32-bit size field")]
    Unrepresentable(usize),
    #[error("inline prefix of {0} bytes is longer than the 24 bytes a frame carries")]
    PrefixTooLong(usize),
    #[error(
        "the peer speaks TLS to a plain SMP port: connect without TLS, or start the server \
         with --tls-cert/--tls-key for this port"
    )]
    TlsOnPlainPort,
    #[error("core table: {0}")]
    CoreTable(String),
    #[error("status is not valid: {0}")]
    BadStatus(String),
    #[error("peer message is not valid: {0}")]
    BadPeer(String),
    #[error("authentication message is not valid: {0}")]
    BadAuth(String),
    #[error("group message is not valid: {0}")]
    BadGroup(String),
    #[error("chunk is not valid: {0}")]
    BadChunk(String),
    #[error("notification is not valid: {0}")]
    BadNotification(String),
    /// The receiver's memory for unfinished messages is spent (the reason
    /// says whose bound and what to do): the peer that asked for more is
    /// refused, not the receiver.
    #[error("{0}")]
    OverBudget(String),
}

/// Codes carried by the `Error` extension message. Stable on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    /// The message could not be parsed.
    Malformed = 1,
    /// The payload exceeded the receiver's limit.
    TooLarge = 2,
    /// A valid message arrived in a state that does not accept it.
    UnexpectedMessage = 3,
    /// Data arrived before any configuration.
    NotConfigured = 4,
    /// Data size is not a whole number of inputs/outputs.
    BadDataSize = 5,
    /// No node is left to process the user's data.
    NoNodes = 6,
    /// Configuration failed (on every node, or on this node).
    ConfigurationFailed = 7,
    /// A peer stopped responding.
    Timeout = 8,
    /// A hardware core failed while processing this data.
    CoreFailure = 9,
    /// Anything else; the reason says what.
    Internal = 10,
    /// The peer did not prove it holds its role's secret (or sent none).
    Unauthorized = 11,
    /// Shared mode: the function's job queue is full (only to a user that
    /// asked for it with the `queue-full` hello feature; others are pushed back).
    QueueFull = 12,
}

impl ErrorCode {
    pub fn from_u32(v: u32) -> Option<Self> {
        use ErrorCode::*;
        Some(match v {
            1 => Malformed,
            2 => TooLarge,
            3 => UnexpectedMessage,
            4 => NotConfigured,
            5 => BadDataSize,
            6 => NoNodes,
            7 => ConfigurationFailed,
            8 => Timeout,
            9 => CoreFailure,
            10 => Internal,
            11 => Unauthorized,
            12 => QueueFull,
            _ => return None,
        })
    }

    /// The code a node's per-input error keeps on its way to the user:
    /// `too-large` and `bad-data-size` say what the user can change;
    /// anything else (and a code this version does not know) is a
    /// `core-failure` of that input.
    pub fn per_input(node_code: u32) -> Self {
        match Self::from_u32(node_code) {
            Some(c @ (ErrorCode::TooLarge | ErrorCode::BadDataSize)) => c,
            _ => ErrorCode::CoreFailure,
        }
    }

    pub fn name(self) -> &'static str {
        use ErrorCode::*;
        match self {
            Malformed => "malformed",
            TooLarge => "too-large",
            UnexpectedMessage => "unexpected-message",
            NotConfigured => "not-configured",
            BadDataSize => "bad-data-size",
            NoNodes => "no-nodes",
            ConfigurationFailed => "configuration-failed",
            Timeout => "timeout",
            CoreFailure => "core-failure",
            Internal => "internal",
            Unauthorized => "unauthorized",
            QueueFull => "queue-full",
        }
    }
}

impl ProtocolError {
    /// A stable machine-readable name for the kind of error (used by the
    /// shared test vectors and the Python binding).
    pub fn kind(&self) -> &'static str {
        match self {
            ProtocolError::UnknownType(_) => "unknown_type",
            ProtocolError::TooLarge { .. } => "too_large",
            ProtocolError::Truncated { .. } => "truncated",
            ProtocolError::CoreTableTooLong { .. } => "core_table_too_long",
            ProtocolError::TooManyCores { .. } => "too_many_cores",
            ProtocolError::ZeroInputSize => "zero_input_size",
            ProtocolError::BenchmarkTooSmall { .. } => "benchmark_too_small",
            ProtocolError::NotMultiple { .. } => "not_multiple",
            ProtocolError::EmptyData(_) => "empty_data",
            ProtocolError::BadHello(_) => "bad_hello",
            ProtocolError::BadReason => "bad_reason",
            ProtocolError::TruncatedStream(_) => "truncated_stream",
            ProtocolError::SizeOverLimit { .. } => "size_over_limit",
            ProtocolError::ZeroOutputSize => "zero_output_size",
            ProtocolError::Unrepresentable(_) => "unrepresentable",
            ProtocolError::PrefixTooLong(_) => "prefix_too_long",
            ProtocolError::TlsOnPlainPort => "tls_on_plain_port",
            ProtocolError::CoreTable(_) => "core_table",
            ProtocolError::BadStatus(_) => "bad_status",
            ProtocolError::BadPeer(_) => "bad_peer",
            ProtocolError::BadAuth(_) => "bad_auth",
            ProtocolError::BadGroup(_) => "bad_group",
            ProtocolError::BadChunk(_) => "bad_chunk",
            ProtocolError::BadNotification(_) => "bad_notification",
            ProtocolError::OverBudget(_) => "over_budget",
        }
    }

    /// The wire code that best describes this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtocolError::TooLarge { .. }
            | ProtocolError::SizeOverLimit { .. }
            | ProtocolError::Unrepresentable(_)
            | ProtocolError::OverBudget(_) => ErrorCode::TooLarge,
            ProtocolError::ZeroOutputSize | ProtocolError::TooManyCores { .. } => {
                ErrorCode::ConfigurationFailed
            }
            ProtocolError::NotMultiple { .. } | ProtocolError::EmptyData(_) => {
                ErrorCode::BadDataSize
            }
            _ => ErrorCode::Malformed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn a_per_input_error_keeps_only_the_codes_a_user_can_act_on() {
        assert_eq!(ErrorCode::per_input(2), ErrorCode::TooLarge);
        assert_eq!(ErrorCode::per_input(5), ErrorCode::BadDataSize);
        for other in [0, 1, 3, 8, 9, 10, 12, 99] {
            assert_eq!(
                ErrorCode::per_input(other),
                ErrorCode::CoreFailure,
                "{other}"
            );
        }
    }
}

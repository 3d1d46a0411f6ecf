//! SMP — the Serial Messaging Protocol of seed 000 §3.2, plus the extensions
//! corefarm negotiates with an optional hello exchange.
//!
//! Layout of the crate, one concept per file:
//! - [`header`]: the 8-byte header every message starts with.
//! - [`message`]: typed payloads (configuration, response, data, hello, error, credit),
//!   parsed check-then-parse from an untrusted byte slice.
//! - [`outframe`]: messages on their way out (header inline, body shared) and batches of them.
//! - [`peer`]: node-to-node messages of the node fabric (peer port only).
//! - [`group`]: groups of nodes driven by a user: control, commands, replies.
//! - [`status`]: the status extension (what the server is doing, as JSON).
//! - [`stream`]: chunked messages with priority classes (feature `chunks`).
//! - [`notify`]: streaming handlers' notifications (node → server → user).
//! - [`auth`]: challenge–response authentication of hello peers.
//! - [`codec`]: async framing over tokio streams (bounded, cancel-safe reads; vectored writes).
//! - [`blocking`]: the same framing over `std::io` for synchronous peers.
//!
//! Every payload is a `bytes::Bytes`, so a frame read from one socket can be
//! forwarded to another without copying its body.

pub mod auth;
pub mod blocking;
pub mod codec;
pub mod error;
pub mod group;
pub mod header;
pub mod hello;
pub mod message;
pub mod notify;
pub mod outframe;
pub mod peer;
pub mod priority;
pub mod status;
pub mod stream;
pub mod targets;
pub mod tls;

pub use error::{ErrorCode, ProtocolError};
pub use header::{Header, MsgType, HEADER_LEN};
pub use hello::Hello;
pub use message::{
    default_core_table, BenchmarkConfig, Configuration, ConfigurationResponse, CoreInfo, Credit,
    Data, ErrorMsg, Frame, DEFAULT_CORE_BASE,
};
pub use notify::Notification;
pub use outframe::{FrameBatch, OutFrame};
pub use peer::{
    Algo, CollHeader, CollOp, DType, PeerBody, PeerFrame, PeerHeader, PeerKind, PeerMsg, ReduceOp,
};
pub use status::{
    AccountStatus, ClusterStatus, FunctionStatus, LinkBytes, NodeCounts, NodePage, NodeState,
    NodeStatus, StatusQuery, UserPhase, UserStatus,
};

/// Default upper bound on a payload: large enough for any realistic bitstream
/// or batch of inputs, small enough that a hostile header cannot make a peer
/// allocate 4 GiB.
pub const DEFAULT_MAX_MESSAGE: u32 = 256 * 1024 * 1024;

/// Version of the extension set announced in `Hello`.
pub const PROTOCOL_VERSION: u32 = 1;

/// Size of the `id` field that starts every data payload.
pub const DATA_ID_LEN: usize = 4;

/// Minimum input/output size of the benchmarking configuration (seed 000 §4.2.2):
/// the node echoes the first 16 bytes of each input into its output.
pub const BENCH_ECHO_LEN: usize = 16;

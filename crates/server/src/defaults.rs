//! Default values of [`crate::ServerOptions`], in one place: the CLI shows and
//! uses these same constants, so a default is never written twice.

use std::time::Duration;

use crate::Policy;

/// Loopback: without an auth file the ports must not be reachable from other hosts.
pub const NODES_LISTEN: &str = "127.0.0.1:8888";
pub const USERS_LISTEN: &str = "127.0.0.1:9999";
/// Where the ports listen by default once `--auth-file` is given.
pub const NODES_LISTEN_AUTH: &str = "0.0.0.0:8888";
pub const USERS_LISTEN_AUTH: &str = "0.0.0.0:9999";
pub const POLICY: Policy = Policy::Credit;
/// Credit policy: data messages in flight per node.
pub const CREDIT: u32 = 4;
/// Credit policy: the window adapts (start at `CREDIT`).
pub const CREDIT_ADAPTIVE: bool = true;
/// Credit policy: an adaptive window's byte budget per node.
pub const CREDIT_MAX_BYTES: u64 = 32 << 20;
pub const MAX_MESSAGE: u32 = corefarm_smp::DEFAULT_MAX_MESSAGE;
pub const CONFIG_TIMEOUT: Duration = Duration::from_secs(30);
pub const NODE_TIMEOUT: Duration = Duration::from_secs(60);
/// A node that makes no progress may add at most this many times the
/// work's measured service time to its latency: a copy goes to another
/// node in time to land within it (`--hedge-factor`).
pub const HEDGE_FACTOR: f64 = 4.0;
/// ...and never less than this (`--hedge-floor-ms`): above a round trip
/// and a scheduling hiccup, far under `NODE_TIMEOUT`.
pub const HEDGE_FLOOR: Duration = Duration::from_millis(50);
pub const IO_TIMEOUT: Duration = Duration::from_secs(60);
pub const NODE_WAIT: Duration = Duration::from_secs(5);
/// Well under a minute: an idle user holds nodes other users may be waiting
/// for. Also how long a user that is not configured (a hello and nothing
/// after it, an observer gone quiet) may stay silent, contention or not: it
/// holds a `--max-users` place and nothing else, and a program between a
/// hello and its configuration, or `corefarm top` between two polls, is
/// silent for far less.
pub const USER_IDLE_TIMEOUT: Duration = Duration::from_secs(20);
/// A begun frame must finish its header within this, and make progress at
/// least this often. Also the deadline for a new user connection's first
/// message: every client sends it as soon as it is connected, so waiting as
/// long as for a stalled header costs nothing legitimate, and it is the
/// bound the way in (TLS, authentication) already has, so a silent socket
/// holds a place equally long with or without `--auth-file`.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new node connection may take to say hello before it joins the
/// pool as a seed-format node: corefarm nodes say it at once, so this only
/// delays nodes that never will.
pub const NODE_HELLO_GRACE: Duration = Duration::from_millis(250);
/// At the limit a new user takes the place of the idlest connection that is
/// not configured (see `limits::Places`); only configured users are refused
/// their successors.
pub const MAX_USERS: usize = 256;
pub const MAX_NODES: usize = 1024;

/// Nodes up to which `/metrics` has a series per node (`--metrics-nodes`):
/// nine families per node, so 256 nodes are about 5,000 series; a larger
/// cluster gets its totals and counts by state only.
pub const METRICS_NODES: usize = 256;
/// Who owns the nodes. Exclusive (the seed's behaviour) until the sharing
/// benchmark (docs/sharing.md) shows shared to be no worse for one user.
pub const SHARING: crate::Sharing = crate::Sharing::Exclusive;
/// Shared mode: Algorithm 1's monitoring period P.
pub const MONITOR_PERIOD: Duration = Duration::from_millis(10);
/// Shared mode: data messages a function's queue holds before users are pushed back.
pub const QUEUE_LIMIT: usize = 1024;
/// A user's chunked message must be finished within this much time of the
/// server waiting for its chunks (`--message-timeout`; time the server
/// holds the user back does not count). A minute: a message of the default
/// `--max-message` (256 MiB) at about 4.5 MB/s; a peer that leaves a message
/// unfinished holds its memory no longer than this.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(60);
/// Floor of the default `--memory-budget`.
pub const MEMORY_BUDGET_FLOOR: u64 = 1 << 30;

/// The default `--memory-budget` for a `--max-message`: room for four
/// messages of the largest size (two users each at their per-connection
/// bound of twice `--max-message` of unfinished chunked messages), and at
/// least [`MEMORY_BUDGET_FLOOR`] so that many users sending ordinary
/// messages at once are never near it. A host with less memory to spare
/// than this should set it lower; what one peer can hold is still bounded
/// by its own limits first.
pub fn memory_budget(max_message: u32) -> u64 {
    (4 * u64::from(max_message)).max(MEMORY_BUDGET_FLOOR)
}
/// Chunk size on the node link (`--node-chunk-size`); 0 turns chunks off.
pub const NODE_CHUNK_SIZE: u32 = corefarm_smp::stream::DEFAULT_CHUNK_SIZE;

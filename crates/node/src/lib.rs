//! The corefarm node manager (seed 000 §3.4.2).
//!
//! One session per server connection, structured like the seed's node:
//! - the receiving task ([`session`]) reads SMP messages, reconfigures on every
//!   configuration message ([`configure`]) and queues each data message as a job;
//! - the core engine ([`handlers`]) — one task per hardware core on the event
//!   loop — takes jobs from the input queue ([`jobq`], by priority class),
//!   runs them on their core and pushes results; the benchmarking
//!   configuration is one more core ([`mod@bench`]);
//! - the sending task ([`sender`]) writes results back to the server.
//!
//! The node fabric ([`peer`]) links the node managers of a group over their
//! peer ports; [`collective`] runs MPI-like collectives over it;
//! [`group`] runs a user's group commands on a member against its resident
//! [`buffers`].
//!
//! A memory guard ([`guard`]) bounds the bytes held by queued jobs and results:
//! when it is exhausted the receiving task stops reading, so TCP back-pressure
//! slows the server down instead of the node over-allocating.

pub mod bench;
pub mod buffers;
pub mod collective;
pub mod configure;
mod direct;
pub mod group;
pub mod guard;
pub mod handlers;
pub mod inbound;
pub mod jobq;
pub mod metrics;
pub mod notes;
pub mod peer;
pub mod sender;
pub mod session;
pub mod spin;

pub use configure::CoreLoader;

use std::time::Duration;

use corefarm_cores::LoadOptions;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Everything a node manager needs to know to run.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Server node port, `HOST:PORT`, or several, comma-separated (an
    /// active server and its standbys): the node connects to the first
    /// that answers and stays with it until that connection ends, then
    /// tries the address after it, round-robin, with the reconnection
    /// back-off ([`servers`]).
    pub server: String,
    /// Identity announced in the hello exchange.
    pub name: String,
    /// Send a hello (corefarm extensions). Off = a seed-format node.
    pub hello: bool,
    /// Bytes of input and output data the node may hold at once.
    pub memory_limit: usize,
    /// Largest payload accepted from the server, and the bound on one input
    /// or one result: configurations whose sizes cannot fit are refused.
    pub max_message: u32,
    /// Reconnect after the connection ends (with back-off).
    pub reconnect: bool,
    /// Added to every configuration before it is answered: emulates a
    /// board's programming time in simulation (`--reconfigure-delay-ms`).
    pub reconfigure_delay: std::time::Duration,
    /// Which hardware-core backends may load and how.
    pub load: LoadOptions,
    /// Turns configurations into cores (default: `corefarm_cores::load`).
    pub loader: CoreLoader,
    /// The peer port of the node fabric ([`peer`]); `None`: no peer port.
    /// An unspecified IP (the default, `0.0.0.0:0`) means the interface the
    /// node reaches the server through; port 0 picks a free port. The bound
    /// address is announced in the hello (`peer` field).
    pub peer_listen: Option<std::net::SocketAddr>,
    /// The node secret, for a server with an auth file: the node announces
    /// the `auth` feature and answers the server's challenge with it.
    pub secret: Option<corefarm_smp::auth::Secret>,
    /// Counters for `--metrics-listen` ([`metrics`]); `None`: none kept.
    pub telemetry: Option<std::sync::Arc<metrics::NodeTelemetry>>,
    /// Streaming handlers: chunk size and handler threads ([`spin`]).
    pub spin: spin::SpinOptions,
    /// TLS to the server's node port (`--tls-ca`, `--tls-server-name`);
    /// `None`: plain TCP. Peer links between nodes stay plain TCP.
    pub tls: Option<corefarm_smp::tls::ClientTls>,
    /// Chunks on the server link (so an urgent message need not wait behind
    /// a whole bulk one): offered in the hello with this
    /// size (the server answers with the size in force), and in the peer
    /// hello of a group's links; 0: not offered.
    pub chunk_size: u32,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            server: "127.0.0.1:8888".into(),
            name: "node".into(),
            hello: true,
            memory_limit: 512 * 1024 * 1024,
            max_message: corefarm_smp::DEFAULT_MAX_MESSAGE,
            reconnect: true,
            reconfigure_delay: std::time::Duration::ZERO,
            load: LoadOptions::default(),
            loader: CoreLoader::default(),
            peer_listen: Some(std::net::SocketAddr::from(([0, 0, 0, 0], 0))),
            secret: None,
            telemetry: None,
            spin: spin::SpinOptions::default(),
            tls: None,
            chunk_size: corefarm_smp::stream::DEFAULT_CHUNK_SIZE,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    // `cause`, not `source`: the message carries it already, and as a
    // source too it would be printed twice in an error chain.
    #[error("cannot connect to server {addr}: {cause}")]
    Connect { addr: String, cause: std::io::Error },
    #[error("TLS handshake with server {addr} failed: {detail}")]
    Tls { addr: String, detail: String },
    #[error("connection to server lost: {0}")]
    Io(#[from] std::io::Error),
    #[error("server sent an invalid message: {0}")]
    Protocol(#[from] corefarm_smp::ProtocolError),
    /// The server refused this node in place of its hello's answer.
    #[error("the server refused this node ({}): {reason}", code.name())]
    Refused {
        code: corefarm_smp::ErrorCode,
        reason: String,
    },
    /// The server asks for a secret and none was given.
    #[error(
        "the server requires authentication: give the node secret (--secret-file or COREFARM_SECRET)"
    )]
    NoSecret,
    #[error("{0}")]
    Session(String),
}

impl NodeError {
    /// A failure that reconnecting cannot mend: a secret the server does not
    /// accept, or none where one is needed. The node exits with the reason
    /// rather than retrying (and logging) for ever; a supervisor restarts it
    /// once the operator fixed the secret.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            NodeError::NoSecret
                | NodeError::Refused {
                    code: corefarm_smp::ErrorCode::Unauthorized,
                    ..
                }
        )
    }
}

/// The addresses of a server list (`a,b`), in order; blanks around an
/// address and empty entries are ignored. An empty list is one empty
/// address, which fails to connect with the usual error.
pub fn servers(list: &str) -> Vec<String> {
    let v: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect();
    if v.is_empty() {
        vec![list.trim().to_string()]
    } else {
        v
    }
}

/// Runs one node manager until `stop` is cancelled (or, without
/// `reconnect`, until its connection ends, or every address failed to
/// answer once).
///
/// With several server addresses, every attempt after a failed connection
/// or an ended session goes to the next address in the list (round-robin),
/// one attempt per back-off step: a node whose active server died moves
/// to a standby within the back-off, and belongs to the server it
/// connected to until that connection ends. The function the node loaded
/// is kept across reconnections (see [`session::serve`]): the same
/// configuration from the next server is answered without loading it.
pub async fn run(opts: NodeOptions, stop: CancellationToken) -> Result<(), NodeError> {
    let mut backoff = Backoff::default();
    // Bound once, on the first connection, and kept across reconnections so
    // the advertised address stays valid; every session's groups use it.
    let mut peer: Option<std::sync::Arc<peer::PeerListener>> = None;
    let mut kept = None;
    let mut opts = opts;
    let addrs = servers(&opts.server);
    let mut at = 0;
    // Addresses that did not answer in a row.
    let mut unanswered = 0;
    loop {
        let server = addrs[at % addrs.len()].as_str();
        let attempt = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            r = TcpStream::connect(server) => r,
        };
        let began = tokio::time::Instant::now();
        let mut answered = false;
        let result = match attempt {
            Ok(stream) => {
                if let (None, Some(want)) = (&peer, opts.peer_listen) {
                    let stats = (opts.telemetry.as_ref()).map(|t| t.node(&opts.name).peer_port());
                    let l = bind_peer(want, &stream, stats.unwrap_or_default()).await?;
                    opts.peer_listen = Some(l.local_addr());
                    tracing::info!(node = %opts.name, peer = %l.local_addr(), "peer port");
                    peer = Some(std::sync::Arc::new(l));
                }
                tracing::info!(node = %opts.name, %server, "connected");
                let (stop, peer, kept) = (stop.clone(), peer.clone(), &mut kept);
                let answered = &mut answered;
                match &opts.tls {
                    None => match stream.set_nodelay(true) {
                        Ok(()) => {
                            let (rd, wr) = stream.into_split();
                            session::serve(rd, wr, &opts, stop, peer, kept, answered).await
                        }
                        Err(e) => Err(e.into()),
                    },
                    Some(tls) => match tls_handshake(tls, server, stream).await {
                        Ok(s) => {
                            let (rd, wr) = tokio::io::split(s);
                            session::serve(rd, wr, &opts, stop, peer, kept, answered).await
                        }
                        Err(e) => Err(e),
                    },
                }
            }
            Err(e) => Err(NodeError::Connect {
                addr: server.to_string(),
                cause: e,
            }),
        };
        // The next attempt goes to the next address, whatever happened:
        // a server that ended the session may be the one going away.
        at = (at + 1) % addrs.len();
        match &result {
            Ok(()) => tracing::info!(node = %opts.name, "session ended"),
            Err(e) => tracing::warn!(node = %opts.name, "session ended: {e}"),
        }
        // Without `reconnect`, one session: each address is tried once
        // until one answers.
        unanswered = match &result {
            Err(NodeError::Connect { .. }) => unanswered + 1,
            _ => 0,
        };
        let untried = unanswered > 0 && unanswered < addrs.len();
        if (!opts.reconnect && !untried) || stop.is_cancelled() {
            return result;
        }
        if let Err(e) = &result {
            if e.is_permanent() {
                tracing::error!(node = %opts.name, "giving up: {e}");
                return result;
            }
        }
        let wait = backoff.next(answered, began.elapsed());
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// How long a node waits before its next connection attempt.
///
/// A session with a server that answered the node's hello (or, for a
/// seed-format server, that lasted [`Backoff::LASTED`]) starts the back-off
/// again from its shortest step: a server that dies and is replaced is
/// reached again at once, however often that happens. A session that failed
/// before any answer doubles it up to [`Backoff::LONGEST`]: a node given the
/// wrong port, or refused, would otherwise reconnect (and log) twenty times
/// a second for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Backoff {
    current: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            current: Backoff::SHORTEST,
        }
    }
}

impl Backoff {
    const SHORTEST: Duration = Duration::from_millis(50);
    const LONGEST: Duration = Duration::from_secs(2);
    /// A session at least this long counts as having worked even without
    /// a hello answer (seed-format servers send none).
    const LASTED: Duration = Duration::from_secs(10);

    /// The wait before the next attempt, after a session that got an
    /// answer from its server (`answered`) or not, and lasted `lasted`.
    fn next(&mut self, answered: bool, lasted: Duration) -> Duration {
        if answered || lasted >= Backoff::LASTED {
            self.current = Backoff::SHORTEST;
        }
        let wait = self.current;
        self.current = (self.current * 2).min(Backoff::LONGEST);
        wait
    }
}

/// Longest time the TLS handshake with the server may take.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn tls_handshake(
    tls: &corefarm_smp::tls::ClientTls,
    addr: &str,
    stream: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, NodeError> {
    let fail = |detail: String| NodeError::Tls {
        addr: addr.to_string(),
        detail,
    };
    stream.set_nodelay(true)?;
    let name = tls.server_name(addr).map_err(|e| fail(e.to_string()))?;
    let connect = tokio_rustls::TlsConnector::from(tls.config()).connect(name, stream);
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, connect).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(fail(corefarm_smp::tls::explain(&e))),
        Err(_) => Err(fail(format!(
            "not done within {TLS_HANDSHAKE_TIMEOUT:?} (is the server's port plain TCP? then \
             connect without --tls-ca)"
        ))),
    }
}

/// Binds the peer port; an unspecified IP becomes the one the node reaches the server from.
async fn bind_peer(
    want: std::net::SocketAddr,
    server: &TcpStream,
    stats: std::sync::Arc<peer::PortStats>,
) -> Result<peer::PeerListener, NodeError> {
    let mut addr = want;
    if addr.ip().is_unspecified() {
        addr.set_ip(server.local_addr()?.ip());
    }
    peer::PeerListener::bind_counted(addr, peer::DEFAULT_MAX_FRAME, stats)
        .await
        .map_err(|e| NodeError::Session(e.to_string()))
}

/// Runs `count` independent node managers (separate connections) in this
/// process, named `<name>-<i>`; used to simulate many nodes on few cores.
pub async fn run_many(
    opts: NodeOptions,
    count: usize,
    stop: CancellationToken,
) -> Result<(), NodeError> {
    if count == 1 {
        return run(opts, stop).await;
    }
    let mut set = tokio::task::JoinSet::new();
    for i in 0..count {
        let mut o = opts.clone();
        o.name = format!("{}-{}", opts.name, i);
        set.spawn(run(o, stop.clone()));
    }
    let mut first_err = None;
    while let Some(r) = set.join_next().await {
        if let Ok(Err(e)) = r {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Servers killed one after another, each having answered the node,
    /// cost the node the shortest wait every time; refusals double it.
    #[test]
    fn backoff_restarts_after_an_answered_session() {
        let mut b = Backoff::default();
        let quick = Duration::from_millis(5);
        let refused: Vec<u128> = (0..7).map(|_| b.next(false, quick).as_millis()).collect();
        assert_eq!(refused, [50, 100, 200, 400, 800, 1600, 2000]);
        // Killed 4 s after it answered: the next server is tried at once.
        for _ in 0..5 {
            assert_eq!(b.next(true, Duration::from_secs(4)), Backoff::SHORTEST);
        }
        // Unanswered but long: a seed-format server that served a while.
        b.next(false, quick);
        b.next(false, quick);
        assert_eq!(b.next(false, Backoff::LASTED), Backoff::SHORTEST);
    }

    /// A server that closes every connection at once (a node given the
    /// wrong port is told no more than that) is retried with a growing
    /// back-off, not every 50 ms for good. Real time, bounded below only:
    /// a gap between two connections is at least the back-off slept before
    /// the second (a paused clock could jump past a session's own timers).
    #[tokio::test]
    async fn a_session_that_fails_at_once_backs_off() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let opts = NodeOptions {
            server: l.local_addr().unwrap().to_string(),
            peer_listen: None,
            ..NodeOptions::default()
        };
        let stop = CancellationToken::new();
        let node = tokio::spawn(run(opts, stop.clone()));
        let mut at = Vec::new();
        for _ in 0..6 {
            let (s, _) = l.accept().await.unwrap();
            at.push(tokio::time::Instant::now());
            drop(s);
        }
        stop.cancel();
        node.await.unwrap().unwrap();
        let gaps: Vec<u128> = at.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
        for (i, &g) in gaps.iter().enumerate() {
            assert!(g >= 50 << i, "gaps between connections, ms: {gaps:?}");
        }
    }
}

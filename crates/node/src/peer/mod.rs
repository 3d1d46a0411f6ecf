//! The node fabric (seed 001): links between the node managers of
//! a group, over which peer messages (type 0x15) travel.
//!
//! - [`PeerListener`] is a node's peer port: it accepts links, checks their
//!   hello and hands each to the group it names. Until its hello, a
//!   connection holds one of a few places, briefly (`admission`): a
//!   stranger's connections cost little and cannot keep a member out.
//! - [`Fabric`] is one node's membership in a group: links to its
//!   neighbours in the group's [`Topology`], forwarding through intermediate
//!   nodes by a [`Router`], a [`LinkScheduler`] per class on each link
//!   ([`outq`]: classes, chunks where both ends agreed), duplicate
//!   rejection per source ([`dedup`]), and an inbox of collective chunks for
//!   [`crate::collective`].
//!
//! Only corefarm nodes ever connect to a peer port; the server and users
//! never see peer messages.

mod admission;
pub mod dedup;
mod fabric;
pub(crate) mod link;
pub mod outq;
pub mod router;
pub mod sched;
pub mod topology;

pub use admission::{PortStats, Refusal};
pub use fabric::{Event, Fabric, FabricStats};
pub use router::{Router, ShortestPath};
pub use sched::{LinkScheduler, Queued, RoundRobin, SchedulerFactory};
pub use topology::{Topology, TopologyError};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corefarm_smp::codec::FrameReader;
use corefarm_smp::peer::{COLL_HEADER_LEN, MAX_PEER_TEXT, PEER_HEADER_LEN};
use corefarm_smp::{PeerBody, PeerHeader, PeerKind, PeerMsg, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle};

use admission::Admission;

/// Largest peer payload a node accepts by default: a 1 MiB chunk and its headers.
pub const DEFAULT_MAX_FRAME: u32 = (1 << 20) + 128;
/// Accepted connections that have not said hello yet, at most: a newer
/// one takes an older one's place rather than wait (`admission`).
const MAX_PENDING: usize = 64;
/// Of those, the most one source address holds before its own oldest
/// yields: a quarter, so one flooding address leaves the rest to others,
/// while a host running many members (`--count`) can still dial at once.
const MAX_PENDING_PER_SOURCE: usize = 16;
/// How long an accepted connection has to send its hello. Members and
/// direct users send it as soon as they are connected, so it takes a
/// round trip at most; a stranger holds a place no longer than this.
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// Read timeout of a begun frame on an accepted connection.
const FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest hello: its routing header, the token and a name of at most
/// [`MAX_PEER_TEXT`] bytes. A connection announcing more is refused before
/// anything is read into memory for it, so a stranger's connection never
/// costs a frame's worth (a megabyte) while it waits.
const MAX_HELLO: u32 = (PEER_HEADER_LEN + 8 + MAX_PEER_TEXT) as u32;

/// A member of a group: its name (for messages) and peer address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub addr: SocketAddr,
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.addr)
    }
}

/// What a node needs to join a group; every member gets the same spec
/// except `rank`.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// Identifies the group on every peer port it uses.
    pub group: u32,
    /// This node's rank: its index in `members`.
    pub rank: u32,
    pub members: Vec<Member>,
    pub topology: Topology,
    /// How long joining may take (every neighbour linked).
    pub connect_timeout: Duration,
    /// Bytes of this node's own messages that may wait on one link.
    pub link_budget: usize,
    /// The group's secret (from the server's `join`): links are opened
    /// and admitted only with it, so a stranger who reaches a peer port
    /// cannot join or feed a collective.
    pub token: u64,
    /// Largest chunk this node sends and accepts on its links (0: whole
    /// messages only); a link uses the smaller of both ends',
    /// so neither receives a chunk larger than it agreed to hold.
    pub chunk_size: u32,
}

impl GroupSpec {
    pub fn new(group: u32, rank: u32, members: Vec<Member>, topology: Topology) -> Self {
        GroupSpec {
            group,
            rank,
            members,
            topology,
            connect_timeout: Duration::from_secs(10),
            link_budget: 8 << 20,
            token: 0,
            chunk_size: corefarm_smp::stream::DEFAULT_CHUNK_SIZE,
        }
    }

    pub fn size(&self) -> u32 {
        self.members.len() as u32
    }

    pub fn with_token(mut self, token: u64) -> Self {
        self.token = token;
        self
    }

    pub fn with_chunk_size(mut self, size: u32) -> Self {
        self.chunk_size = size;
        self
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum FabricError {
    #[error("group {group}: {reason}")]
    Spec { group: u32, reason: SpecError },
    #[error("group {group}: cannot link to rank {rank} ({member}) within {timeout:?}: {reason}")]
    Join {
        group: u32,
        rank: u32,
        member: String,
        timeout: Duration,
        reason: LinkError,
    },
    #[error("no route to rank {rank} ({member}): its links are down")]
    NoRoute { rank: u32, member: String },
    #[error("message of {size} bytes is over the peer frame limit of {max}")]
    TooLarge { size: usize, max: u32 },
    #[error("peer listener: {0}")]
    Listen(String),
}

/// What is wrong with a group's description, or with joining it here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("rank {rank} in a group of {n}")]
    NoSuchRank { rank: u32, n: u32 },
    #[error("this node is already joining that group")]
    AlreadyJoining,
}

/// Why a peer link did not open, or was dropped. Logged; a dialer's last
/// one is the reason a join failed (shared, hence the `Arc`s).
#[derive(Debug, Clone, thiserror::Error)]
pub enum LinkError {
    #[error("no answer to its hello within {0:?}")]
    NoAnswer(Duration),
    #[error("{0}")]
    Connect(Arc<std::io::Error>),
    #[error("closed before its hello")]
    ClosedBeforeHello,
    #[error("no hello within {0:?}")]
    NoHello(Duration),
    #[error("{0}")]
    Read(Arc<corefarm_smp::codec::ReadError>),
    #[error("sent a {0} message instead of a peer hello")]
    NotPeer(&'static str),
    #[error("sent a peer {0} before its hello")]
    BeforeHello(PeerKind),
    #[error("{0}")]
    Invalid(corefarm_smp::ProtocolError),
    #[error("answered without the group's token")]
    NoToken,
    #[error(
        "answered as rank {src} of group {group} to rank {dst}, expected rank {want_src} of \
         group {want_group} to rank {want_dst}"
    )]
    WrongEnd {
        src: u32,
        group: u32,
        dst: u32,
        want_src: u32,
        want_group: u32,
        want_dst: u32,
    },
    #[error("sent a message of group {got}, not {ours}")]
    OtherGroup { got: u32, ours: u32 },
    #[error("sent a message from rank {src} to rank {dst} in a group of {n}")]
    NoSuchRank { src: u32, dst: u32, n: u32 },
    #[error("sent a second hello")]
    SecondHello,
    #[error("dialing task failed: {0}")]
    Dialer(String),
    #[error("it did not link")]
    NotLinked,
}

/// A link whose hello has been read, waiting for its group.
pub(crate) struct Incoming {
    /// Where it came from (for refusals).
    pub from: SocketAddr,
    pub hello: PeerHeader,
    /// The group token it showed (checked by whoever takes the link).
    pub token: u64,
    /// The name it gave, bounded (it only shows in logs).
    pub name: String,
    /// The chunk size its hello offered (0: none).
    pub chunk_size: u32,
    pub reader: FrameReader<OwnedReadHalf>,
    pub writer: OwnedWriteHalf,
}

type Registry = Arc<Mutex<HashMap<u32, mpsc::Sender<Incoming>>>>;

/// A node's peer port.
pub struct PeerListener {
    addr: SocketAddr,
    max_frame: u32,
    registry: Registry,
    stats: Arc<PortStats>,
    task: JoinHandle<()>,
}

impl Drop for PeerListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PeerListener {
    /// Listens on `addr` (port 0: any free port).
    pub async fn bind(addr: SocketAddr) -> Result<Self, FabricError> {
        Self::bind_with(addr, DEFAULT_MAX_FRAME).await
    }

    pub async fn bind_with(addr: SocketAddr, max_frame: u32) -> Result<Self, FabricError> {
        Self::bind_counted(addr, max_frame, Arc::default()).await
    }

    /// Counts what the port refuses into `stats` (a node manager's metrics).
    pub async fn bind_counted(
        addr: SocketAddr,
        max_frame: u32,
        stats: Arc<PortStats>,
    ) -> Result<Self, FabricError> {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| FabricError::Listen(format!("cannot listen on {addr}: {e}")))?;
        let addr = l
            .local_addr()
            .map_err(|e| FabricError::Listen(e.to_string()))?;
        let registry = Registry::default();
        let port = Port {
            max_frame,
            registry: registry.clone(),
            stats: stats.clone(),
            admission: Arc::new(Mutex::new(Admission::new(
                MAX_PENDING,
                MAX_PENDING_PER_SOURCE,
            ))),
        };
        let task = tokio::spawn(accept_loop(l, port));
        Ok(PeerListener {
            addr,
            max_frame,
            registry,
            stats,
            task,
        })
    }

    /// What this port refused so far, by reason.
    pub fn stats(&self) -> &Arc<PortStats> {
        &self.stats
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn max_frame(&self) -> u32 {
        self.max_frame
    }

    /// Largest collective chunk that fits a frame of this listener.
    pub fn max_chunk(&self) -> usize {
        self.max_frame as usize - corefarm_smp::peer::PEER_HEADER_LEN - COLL_HEADER_LEN
    }

    /// Routes links naming `group` to the returned receiver until the guard drops.
    pub(crate) fn register(
        &self,
        group: u32,
    ) -> Result<(mpsc::Receiver<Incoming>, RegistryGuard), FabricError> {
        let (tx, rx) = mpsc::channel(64);
        let mut reg = self.registry.lock().expect("registry lock");
        if reg.contains_key(&group) {
            return Err(FabricError::Spec {
                group,
                reason: SpecError::AlreadyJoining,
            });
        }
        reg.insert(group, tx);
        Ok((
            rx,
            RegistryGuard {
                group,
                registry: self.registry.clone(),
            },
        ))
    }
}

pub(crate) struct RegistryGuard {
    group: u32,
    registry: Registry,
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        self.registry
            .lock()
            .expect("registry lock")
            .remove(&self.group);
    }
}

/// What the accept loop and its handshakes share.
#[derive(Clone)]
struct Port {
    max_frame: u32,
    registry: Registry,
    stats: Arc<PortStats>,
    admission: Arc<Mutex<Admission<AbortHandle>>>,
}

/// Accepts every connection at once (none waits in the kernel's backlog
/// behind strangers), reading each one's hello in a task of its own.
async fn accept_loop(l: TcpListener, port: Port) {
    loop {
        let (stream, from) = match l.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors, typically: strangers' connections
                // end within the hello deadline, so wait a little for one.
                tracing::warn!("peer port: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let full = port.lock().victim(from.ip()).is_some();
        if full {
            // Handshakes whose hello has arrived finish first and free
            // their places, so only connections still silent yield.
            tokio::task::yield_now().await;
        }
        let mut adm = port.lock();
        if let Some(old) = adm.victim(from.ip()).and_then(|id| adm.remove(id)) {
            // Counted before it closes: whoever sees it closed sees it counted.
            let why = format_args!("no hello yet: its place went to a newer connection");
            port.stats.refuse(Refusal::Evicted, old.from, &why);
            old.handle.abort();
        }
        let id = adm.next_id();
        // Takes itself off the list once it has its hello (it waits for
        // this lock until it is on it).
        let task = tokio::spawn(handshake(stream, from, id, port.clone()));
        adm.admit(id, from, task.abort_handle());
    }
}

impl Port {
    fn lock(&self) -> std::sync::MutexGuard<'_, Admission<AbortHandle>> {
        self.admission.lock().expect("admission lock")
    }
}

/// Reads a connection's hello within [`HELLO_TIMEOUT`] and hands it to the
/// group it names.
async fn handshake(stream: TcpStream, from: SocketAddr, id: u64, port: Port) {
    let _ = stream.set_nodelay(true);
    let (rd, writer) = stream.into_split();
    let hello = first_hello(rd, port.max_frame).await;
    if port.lock().remove(id).is_none() {
        // Its place went to a newer connection meanwhile (counted there).
        return;
    }
    let stats = &port.stats;
    let (reader, (hello, token, raw)) = match hello {
        Ok(h) => h,
        Err((why, e)) => return stats.refuse(why, from, &e),
    };
    let (name, chunk_size) = link::split_name(&raw);
    let name = corefarm_telemetry::bounded(&name).into_owned();
    let tx = port
        .registry
        .lock()
        .expect("registry lock")
        .get(&hello.group)
        .cloned();
    match tx {
        Some(tx) => {
            let _ = tx
                .send(Incoming {
                    from,
                    hello,
                    token,
                    name,
                    chunk_size,
                    reader,
                    writer,
                })
                .await;
        }
        // The group may not be joined here yet: the dialer retries.
        None => {
            let why = format_args!("unknown group {}", hello.group);
            stats.refuse(Refusal::UnknownGroup, from, &why);
        }
    }
}

/// An accepted connection's hello, read within [`HELLO_TIMEOUT`], and the
/// reader of the rest of its frames (up to `max_frame` bytes each); or why
/// the connection is refused.
async fn first_hello<R: AsyncRead + Unpin>(
    mut rd: R,
    max_frame: u32,
) -> Result<(FrameReader<R>, (PeerHeader, u64, String)), (Refusal, LinkError)> {
    let read = async {
        // The header alone first: its size is checked against a hello's
        // before the reader reserves room for the payload.
        let mut head = [0u8; HEADER_LEN];
        if let Err(e) = rd.read_exact(&mut head).await {
            return Err(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => LinkError::ClosedBeforeHello,
                _ => LinkError::Read(Arc::new(e.into())),
            });
        }
        corefarm_smp::Header::decode(&head, MAX_HELLO).map_err(LinkError::Invalid)?;
        let mut reader = FrameReader::new(rd, max_frame)
            .with_read_timeout(FRAME_TIMEOUT)
            .with_prefix(&head);
        let hello = read_hello(&mut reader).await?;
        Ok((reader, hello))
    };
    match tokio::time::timeout(HELLO_TIMEOUT, read).await {
        Ok(Ok(h)) => Ok(h),
        Ok(Err(e @ LinkError::ClosedBeforeHello)) => Err((Refusal::NoHello, e)),
        Ok(Err(e)) => Err((Refusal::BadHello, e)),
        Err(_) => Err((Refusal::NoHello, LinkError::NoHello(HELLO_TIMEOUT))),
    }
}

/// Reads the first message of a link, which must be a peer hello.
pub(crate) async fn read_hello<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
) -> Result<(PeerHeader, u64, String), LinkError> {
    let f = match reader.read_frame().await {
        Ok(Some(f)) => f,
        Ok(None) => return Err(LinkError::ClosedBeforeHello),
        Err(e) => return Err(LinkError::Read(Arc::new(e))),
    };
    if f.ty != corefarm_smp::MsgType::Peer {
        return Err(LinkError::NotPeer(f.ty.name()));
    }
    match PeerMsg::parse(f.payload) {
        Ok(PeerMsg {
            header,
            body: PeerBody::Hello { token, name },
        }) if header.kind == PeerKind::Hello => Ok((header, token, name)),
        Ok(m) => Err(LinkError::BeforeHello(m.header.kind)),
        Err(e) => Err(LinkError::Invalid(e)),
    }
}

/// Bytes of the SMP header and routing header in front of a chunk's data.
pub const CHUNK_OVERHEAD: usize =
    HEADER_LEN + corefarm_smp::peer::PEER_HEADER_LEN + COLL_HEADER_LEN;

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::time::Instant;

    async fn first(
        rd: tokio::io::DuplexStream,
    ) -> Result<(PeerHeader, u64, String), (Refusal, LinkError)> {
        first_hello(rd, DEFAULT_MAX_FRAME).await.map(|(_, h)| h)
    }

    /// A connection that says nothing, or stops halfway through its hello,
    /// holds its place for the hello deadline only, not for a begun
    /// frame's read timeout.
    #[tokio::test(start_paused = true)]
    async fn a_silent_or_stalled_stranger_is_given_up_at_the_hello_deadline() {
        let (_silent, rd) = tokio::io::duplex(1024);
        let began = Instant::now();
        let e = first(rd).await.expect_err("no hello");
        assert_eq!(e.0, Refusal::NoHello, "{}", e.1);
        assert!(matches!(e.1, LinkError::NoHello(_)), "{}", e.1);
        assert_eq!(began.elapsed(), HELLO_TIMEOUT);
        assert!(HELLO_TIMEOUT <= Duration::from_secs(1));

        let (mut half, rd) = tokio::io::duplex(1024);
        let f = link::hello(3, 0, 1, 7, "a", 0).to_frame().unwrap().to_vec();
        half.write_all(&f[..f.len() / 2]).await.unwrap();
        let began = Instant::now();
        let e = first(rd).await.expect_err("half a hello");
        assert_eq!(e.0, Refusal::NoHello, "{}", e.1);
        assert_eq!(began.elapsed(), HELLO_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hello_is_taken_and_anything_else_refused_at_once() {
        let (mut w, rd) = tokio::io::duplex(1024);
        let f = link::hello(3, 0, 1, 7, "a", 0).to_frame().unwrap().to_vec();
        w.write_all(&f).await.unwrap();
        let began = Instant::now();
        let (h, token, name) = first(rd).await.unwrap();
        assert_eq!(
            (h.group, h.src, h.dst, token, name.as_str()),
            (3, 0, 1, 7, "a")
        );
        assert_eq!(began.elapsed(), Duration::ZERO);

        let (mut w, rd) = tokio::io::duplex(1024);
        let data = corefarm_smp::OutFrame::data(1, bytes::Bytes::new()).unwrap();
        w.write_all(&data.to_vec()).await.unwrap();
        let e = first(rd).await.expect_err("not a hello");
        assert_eq!(e.0, Refusal::BadHello, "{}", e.1);

        // A header announcing more than a hello is refused on its 8 bytes.
        let (mut w, rd) = tokio::io::duplex(1024);
        let big = corefarm_smp::Header::new(corefarm_smp::MsgType::Peer, MAX_HELLO + 1);
        w.write_all(&big.encode()).await.unwrap();
        let e = first(rd).await.expect_err("too large for a hello");
        assert_eq!(e.0, Refusal::BadHello, "{}", e.1);
        assert!(
            matches!(
                e.1,
                LinkError::Invalid(corefarm_smp::ProtocolError::TooLarge { .. })
            ),
            "{}",
            e.1
        );
        // The largest hello there is fits.
        let (mut w, rd) = tokio::io::duplex(4096);
        let name = "n".repeat(MAX_PEER_TEXT);
        let f = link::hello(3, 0, 1, 7, &name, 0)
            .to_frame()
            .unwrap()
            .to_vec();
        w.write_all(&f).await.unwrap();
        assert_eq!(first(rd).await.unwrap().2, name);

        let (w, rd) = tokio::io::duplex(1024);
        drop(w);
        let e = first(rd).await.expect_err("closed");
        assert_eq!(e.0, Refusal::NoHello, "{}", e.1);
        assert!(matches!(e.1, LinkError::ClosedBeforeHello), "{}", e.1);
        assert_eq!(began.elapsed(), Duration::ZERO);
    }
}

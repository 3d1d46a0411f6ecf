//! The node fabric (seed 001): links between the node managers of
//! a group, over which peer messages (type 0x15) travel.
//!
//! - [`PeerListener`] is a node's peer port: it accepts links, checks their
//!   hello and hands each to the group it names.
//! - [`Fabric`] is one node's membership in a group: links to its
//!   neighbours in the group's [`Topology`], forwarding through intermediate
//!   nodes by a [`Router`], a [`LinkScheduler`] per class on each link
//!   ([`outq`]: classes, chunks where both ends agreed), duplicate
//!   rejection per source ([`dedup`]), and an inbox of collective chunks for
//!   [`crate::collective`].
//!
//! Only corefarm nodes ever connect to a peer port; the server and users
//! never see peer messages.

pub mod dedup;
mod fabric;
pub(crate) mod link;
pub mod outq;
pub mod router;
pub mod sched;
pub mod topology;

pub use fabric::{Event, Fabric, FabricStats};
pub use router::{Router, ShortestPath};
pub use sched::{LinkScheduler, Queued, RoundRobin, SchedulerFactory};
pub use topology::{Topology, TopologyError};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corefarm_smp::codec::FrameReader;
use corefarm_smp::peer::COLL_HEADER_LEN;
use corefarm_smp::{PeerBody, PeerHeader, PeerKind, PeerMsg, HEADER_LEN};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

/// Largest peer payload a node accepts by default: a 1 MiB chunk and its headers.
pub const DEFAULT_MAX_FRAME: u32 = (1 << 20) + 128;
/// Links being opened at once by unknown peers; more wait their turn.
const MAX_HANDSHAKES: usize = 64;
/// How long an accepted connection has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

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
    #[error("no attempt")]
    NoAttempt,
    #[error("{0}")]
    Connect(Arc<std::io::Error>),
    #[error("closed before its hello")]
    ClosedBeforeHello,
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
    pub hello: PeerHeader,
    /// The group token it showed (checked by whoever takes the link).
    pub token: u64,
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
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| FabricError::Listen(format!("cannot listen on {addr}: {e}")))?;
        let addr = l
            .local_addr()
            .map_err(|e| FabricError::Listen(e.to_string()))?;
        let registry = Registry::default();
        let task = tokio::spawn(accept_loop(l, max_frame, registry.clone()));
        Ok(PeerListener {
            addr,
            max_frame,
            registry,
            task,
        })
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

async fn accept_loop(l: TcpListener, max_frame: u32, registry: Registry) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, from) = match l.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("peer port: accept failed: {e}");
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = stream.set_nodelay(true);
            let (rd, writer) = stream.into_split();
            let mut reader = FrameReader::new(rd, max_frame).with_read_timeout(HELLO_TIMEOUT);
            let (hello, token, raw) =
                match tokio::time::timeout(HELLO_TIMEOUT, read_hello(&mut reader)).await {
                    Ok(Ok(h)) => h,
                    Ok(Err(e)) => return tracing::warn!("peer port: {from}: {e}"),
                    Err(_) => {
                        return tracing::warn!(
                            "peer port: {from}: no hello within {HELLO_TIMEOUT:?}"
                        )
                    }
                };
            let (name, chunk_size) = link::split_name(&raw);
            let tx = registry
                .lock()
                .expect("registry lock")
                .get(&hello.group)
                .cloned();
            match tx {
                Some(tx) => {
                    let _ = tx
                        .send(Incoming {
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
                None => tracing::debug!("peer port: {from}: unknown group {}", hello.group),
            }
        });
    }
}

/// Reads the first message of a link, which must be a peer hello.
pub(crate) async fn read_hello(
    reader: &mut FrameReader<OwnedReadHalf>,
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

//! Bad peers mixed into the soak: each connects to a server port, misbehaves
//! in one way, and expects the server to cut it off (or answer with an
//! error) within a bound. A server that keeps such a peer, or dies of it,
//! fails the soak.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use corefarm_smp::hello::features;
use corefarm_smp::stream::{Chunk, ChunkHeader};
use corefarm_smp::{Hello, MsgType};

/// The ways a peer misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Misbehaviour {
    /// A header with an unknown message type.
    UnknownType,
    /// A data header announcing more than any `--max-message`.
    Oversized,
    /// A header sent one byte every half second (cut by `--read-timeout`).
    Trickle,
    /// A hello whose payload is not JSON.
    MalformedHello,
    /// A seed-format user's data before any configuration.
    DataFirst,
    /// A hello that is JSON but whose fields have the wrong types (the
    /// documented `malformed` error, then the close).
    WrongFieldTypes,
    /// A node that agreed 512-byte chunks and sends a 1000-byte one.
    NodeChunkOverAgreed,
    /// Connects and never sends a byte (closed after `--read-timeout`).
    Silent,
    /// A user's hello, then silence (closed after `--user-idle-timeout`).
    HelloOnly,
    /// A `chunks` user that configures, sends the first chunk of a message
    /// and nothing more (closed after `--message-timeout`, its memory
    /// released). Shared mode only: configuring takes no node from the
    /// soak's users there.
    UnfinishedChunk,
    /// A node whose hello names it with 1 MiB: admitted, its name shown cut
    /// to 64 characters. Counts as played when the server answers it (or
    /// closes); the soak's memory checks see the rest.
    HugeNodeName,
    /// A group user that opens a group of two, holds silent connections
    /// to a member's peer port (a stranger without the token), then sends a
    /// barrier to rank 0 only: the strangers must be dropped, the failure
    /// blamed on the user (no culprit), and the group closed. Shared mode
    /// only, where a group borrows nodes beside the soak's users.
    GroupMisuse,
}

pub const ALL: [Misbehaviour; 12] = [
    Misbehaviour::UnknownType,
    Misbehaviour::Oversized,
    Misbehaviour::Trickle,
    Misbehaviour::MalformedHello,
    Misbehaviour::DataFirst,
    Misbehaviour::WrongFieldTypes,
    Misbehaviour::NodeChunkOverAgreed,
    Misbehaviour::Silent,
    Misbehaviour::HelloOnly,
    Misbehaviour::UnfinishedChunk,
    Misbehaviour::HugeNodeName,
    Misbehaviour::GroupMisuse,
];

/// The server port a misbehaviour is played against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Users,
    Nodes,
}

impl Misbehaviour {
    /// Whether it can be played against a server in `--sharing exclusive`.
    pub fn in_exclusive_mode(self) -> bool {
        !matches!(
            self,
            Misbehaviour::UnfinishedChunk | Misbehaviour::GroupMisuse
        )
    }

    /// The ports it makes sense on: a node's own misbehaviour only at the
    /// nodes port, the rest at either.
    pub fn ports(self) -> &'static [Port] {
        match self {
            Misbehaviour::NodeChunkOverAgreed | Misbehaviour::HugeNodeName => &[Port::Nodes],
            // At the nodes port a silent peer is a seed-format node (taken
            // after a short grace), a different case.
            Misbehaviour::HelloOnly
            | Misbehaviour::Silent
            | Misbehaviour::UnfinishedChunk
            | Misbehaviour::GroupMisuse => &[Port::Users],
            _ => &[Port::Users, Port::Nodes],
        }
    }
}

fn header(t: u8, size: u32) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[0] = t;
    h[4..].copy_from_slice(&size.to_le_bytes());
    h
}

/// Why a bad peer's play failed the soak.
#[derive(Debug, thiserror::Error)]
pub enum PlayError {
    #[error("{0:?}: connect: {1}")]
    Connect(Misbehaviour, std::io::Error),
    #[error("{0:?}: send: {1}")]
    Send(Misbehaviour, std::io::Error),
    /// A member was blamed for a collective the user sent to one rank only.
    #[error("{bad:?}: a member was blamed for the user's mistake: {reason}")]
    Blamed { bad: Misbehaviour, reason: String },
    /// Strangers on a member's peer port were still connected after its
    /// hello deadline.
    #[error("{bad:?}: {kept} of {of} strangers on a peer port still connected after {after:?}")]
    StrangersKept {
        bad: Misbehaviour,
        kept: usize,
        of: usize,
        after: Duration,
    },
    /// The server neither cut the peer off nor answered it in time.
    #[error("{bad:?}: the server kept the connection for {within:?}")]
    Kept { bad: Misbehaviour, within: Duration },
}

/// How a play ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Played {
    /// The server (or node) dealt with the misbehaviour as it should.
    CutOff,
    /// Nothing to test this time (a group could not open: too few free
    /// nodes at that moment).
    Untestable,
}

/// Plays `bad` against `addr`; `Ok` when the server closed the connection
/// (after an error message or not) within `within`.
pub fn play(
    bad: Misbehaviour,
    port: Port,
    addr: &str,
    within: Duration,
) -> Result<Played, PlayError> {
    let mut s = TcpStream::connect(addr).map_err(|e| PlayError::Connect(bad, e))?;
    let role = match port {
        Port::Users => "user",
        Port::Nodes => "node",
    };
    let _ = s.set_nodelay(true);
    let deadline = Instant::now() + within;
    let sent = match bad {
        Misbehaviour::UnknownType => s.write_all(&header(0x7F, 4)),
        Misbehaviour::Oversized => s.write_all(&header(MsgType::Data as u8, u32::MAX)),
        Misbehaviour::MalformedHello => {
            let body = b"{this is not json";
            s.write_all(&header(MsgType::Hello as u8, body.len() as u32))
                .and_then(|_| s.write_all(body))
        }
        Misbehaviour::DataFirst => s
            .write_all(&header(MsgType::Data as u8, 8))
            .and_then(|_| s.write_all(&[0; 8])),
        Misbehaviour::WrongFieldTypes => {
            let body = format!(r#"{{"version":"1","role":"{role}","features":"error"}}"#);
            s.write_all(&header(MsgType::Hello as u8, body.len() as u32))
                .and_then(|_| s.write_all(body.as_bytes()))
        }
        Misbehaviour::NodeChunkOverAgreed => over_agreed_chunk(&mut s, within),
        Misbehaviour::Silent => Ok(()),
        Misbehaviour::UnfinishedChunk => unfinished_chunk(&mut s, within),
        Misbehaviour::GroupMisuse => return group_misuse(&mut s, within),
        // Answered (admitted, its name cut) or closed: either is right;
        // kept unanswered is not.
        Misbehaviour::HugeNodeName => {
            return match huge_node_name(&mut s, within) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    Err(PlayError::Kept { bad, within })
                }
                _ => Ok(Played::CutOff),
            };
        }
        Misbehaviour::HelloOnly => {
            let mut h = Hello::new("user");
            h.features = vec![features::ERROR.into()];
            h.nodes = Some(0);
            s.write_all(&h.to_frame().to_vec())
        }
        Misbehaviour::Trickle => {
            // A valid hello header, one byte at a time, never completed.
            let body = Hello::new("user").encode();
            let h = header(MsgType::Hello as u8, body.len() as u32);
            for b in h.iter().take(7) {
                if s.write_all(&[*b]).is_err() {
                    // Already cut off: that is the expected outcome.
                    return Ok(Played::CutOff);
                }
                if closed_within(&mut s, Duration::from_millis(500)) {
                    return Ok(Played::CutOff);
                }
                if Instant::now() > deadline {
                    break;
                }
            }
            Ok(())
        }
    };
    if let Err(e) = sent {
        // A reset while sending is the server refusing us.
        return if e.kind() == std::io::ErrorKind::BrokenPipe
            || e.kind() == std::io::ErrorKind::ConnectionReset
        {
            Ok(Played::CutOff)
        } else {
            Err(PlayError::Send(bad, e))
        };
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if closed_within(&mut s, left) {
        Ok(Played::CutOff)
    } else {
        Err(PlayError::Kept { bad, within })
    }
}

/// Says hello as a node agreeing 512-byte chunks, waits for the server's
/// hello, then sends a 1000-byte chunk.
fn over_agreed_chunk(s: &mut TcpStream, within: Duration) -> std::io::Result<()> {
    let mut h = Hello::new("node");
    h.features = vec![features::ERROR.into(), features::CHUNKS.into()];
    h.chunk_size = Some(512);
    s.write_all(&h.to_frame().to_vec())?;
    // The server's hello (its header and payload) comes first.
    s.set_read_timeout(Some(within))?;
    let mut head = [0u8; 8];
    s.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    std::io::copy(&mut (&mut *s).take(len as u64), &mut std::io::sink())?;
    let c = Chunk {
        head: ChunkHeader::at(7, 4, 0, 1000, 1000),
        data: bytes::Bytes::from(vec![1; 1000]),
    };
    let frame = c
        .to_frame()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    s.write_all(&frame.to_vec())
}

/// A node hello with a 1 MiB name, and the server's answer.
fn huge_node_name(s: &mut TcpStream, within: Duration) -> std::io::Result<()> {
    let mut h = Hello::new("node");
    h.features = vec![features::ERROR.into()];
    h.name = Some("n".repeat(1 << 20));
    s.write_all(&h.to_frame().to_vec())?;
    s.set_read_timeout(Some(within))?;
    read_until(s, MsgType::Hello)
}

/// Reads the next frame: its type and payload.
fn read_frame(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 8];
    s.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    let mut payload = vec![0; len.min(1 << 20)];
    s.read_exact(&mut payload)?;
    Ok((head[0], payload))
}

/// See [`Misbehaviour::GroupMisuse`]. A group the server cannot open (too
/// few free nodes with a peer port at that moment) is nothing to test.
fn group_misuse(s: &mut TcpStream, within: Duration) -> Result<Played, PlayError> {
    use corefarm_smp::group::{Cmd, GroupCmd, GroupCtl, GroupReply, NO_CULPRIT};
    let bad = Misbehaviour::GroupMisuse;
    let io = |e: std::io::Error| PlayError::Send(bad, e);
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into(), features::GROUP.into()];
    h.nodes = Some(0);
    s.write_all(&h.to_frame().to_vec()).map_err(io)?;
    s.set_read_timeout(Some(within)).map_err(io)?;
    read_until(s, MsgType::Hello).map_err(io)?;
    let open = GroupCtl::Open {
        nodes: 2,
        topology: None,
    };
    s.write_all(&open.to_frame().to_vec()).map_err(io)?;
    let members = loop {
        match read_frame(s) {
            Ok((t, p)) if t == MsgType::GroupCtl as u8 => match GroupCtl::decode(&p) {
                Ok(GroupCtl::Opened { members, .. }) => break members,
                _ => return Ok(Played::Untestable),
            },
            Ok((t, _)) if t == MsgType::Error as u8 => return Ok(Played::Untestable),
            Ok(_) => continue,
            Err(_) => return Ok(Played::Untestable),
        }
    };
    // Strangers without the token on rank 1's peer port.
    let strangers: Vec<TcpStream> = members
        .iter()
        .find(|m| m.rank == 1)
        .and_then(|m| m.peer.parse::<std::net::SocketAddr>().ok())
        .map(|at| {
            (0..20)
                .filter_map(|_| TcpStream::connect(at).ok())
                .collect()
        })
        .unwrap_or_default();
    let mut barrier = GroupCmd::new(1, 0, Cmd::Barrier);
    barrier.algo = Some(corefarm_smp::Algo::Linear);
    barrier.timeout_ms = 300;
    let frame = barrier.to_frame().map_err(|e| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            e.to_string(),
        ))
    })?;
    s.write_all(&frame.to_vec()).map_err(io)?;
    loop {
        let (t, p) = read_frame(s).map_err(io)?;
        if t != MsgType::GroupReply as u8 {
            continue;
        }
        let r = GroupReply::parse(bytes::Bytes::from(p)).map_err(|e| {
            io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e.to_string(),
            ))
        })?;
        // A member lost to a node kill meanwhile is blamed rightly.
        if r.status != 0 && r.culprit != NO_CULPRIT && !r.reason().contains("lost") {
            return Err(PlayError::Blamed {
                bad,
                reason: r.reason().to_string(),
            });
        }
        break;
    }
    // A member's hello deadline is 1 s: every stranger is gone well within 3.
    let after = Duration::from_secs(3);
    let of = strangers.len();
    let deadline = Instant::now() + after;
    let kept = strangers
        .into_iter()
        .map(|mut st| {
            let left = deadline.saturating_duration_since(Instant::now());
            closed_within(&mut st, left.max(Duration::from_millis(10)))
        })
        .filter(|closed| !closed)
        .count();
    match kept {
        0 => Ok(Played::CutOff),
        kept => Err(PlayError::StrangersKept {
            bad,
            kept,
            of,
            after,
        }),
    }
}

/// Reads frames until one of type `ty`; an error if the connection ends first.
fn read_until(s: &mut TcpStream, ty: MsgType) -> std::io::Result<()> {
    loop {
        let mut head = [0u8; 8];
        s.read_exact(&mut head)?;
        let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as u64;
        std::io::copy(&mut (&mut *s).take(len), &mut std::io::sink())?;
        if head[0] == ty as u8 {
            return Ok(());
        }
    }
}

/// A `chunks` user: hello, a benchmarking configuration, then the first
/// 4 KiB chunk of a 64 KiB message, and silence.
fn unfinished_chunk(s: &mut TcpStream, within: Duration) -> std::io::Result<()> {
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into(), features::CHUNKS.into()];
    h.chunk_size = Some(4096);
    s.write_all(&h.to_frame().to_vec())?;
    s.set_read_timeout(Some(within))?;
    read_until(s, MsgType::Hello)?;
    let cfg = corefarm_smp::BenchmarkConfig {
        input_size: 16,
        output_size: 16,
        delay_us: 0,
    };
    let invalid = |e: corefarm_smp::ProtocolError| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())
    };
    s.write_all(&cfg.to_configuration().to_frame().map_err(invalid)?.to_vec())?;
    read_until(s, MsgType::ConfigurationResponse)?;
    let c = Chunk {
        head: ChunkHeader::at(1, 4, 0, 65536, 4096),
        data: bytes::Bytes::from(vec![7; 4096]),
    };
    s.write_all(&c.to_frame().map_err(invalid)?.to_vec())
}

/// Reads (discarding an error message, if any) until EOF or `t` passes.
fn closed_within(s: &mut TcpStream, t: Duration) -> bool {
    let deadline = Instant::now() + t;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let _ = s.set_read_timeout(Some(left));
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

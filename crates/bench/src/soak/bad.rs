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
}

pub const ALL: [Misbehaviour; 11] = [
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
        self != Misbehaviour::UnfinishedChunk
    }

    /// The ports it makes sense on: a node's own misbehaviour only at the
    /// nodes port, the rest at either.
    pub fn ports(self) -> &'static [Port] {
        match self {
            Misbehaviour::NodeChunkOverAgreed | Misbehaviour::HugeNodeName => &[Port::Nodes],
            // At the nodes port a silent peer is a seed-format node (taken
            // after a short grace), a different case.
            Misbehaviour::HelloOnly | Misbehaviour::Silent | Misbehaviour::UnfinishedChunk => {
                &[Port::Users]
            }
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
    /// The server neither cut the peer off nor answered it in time.
    #[error("{bad:?}: the server kept the connection for {within:?}")]
    Kept { bad: Misbehaviour, within: Duration },
}

/// Plays `bad` against `addr`; `Ok` when the server closed the connection
/// (after an error message or not) within `within`.
pub fn play(bad: Misbehaviour, port: Port, addr: &str, within: Duration) -> Result<(), PlayError> {
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
                _ => Ok(()),
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
                    return Ok(());
                }
                if closed_within(&mut s, Duration::from_millis(500)) {
                    return Ok(());
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
            Ok(())
        } else {
            Err(PlayError::Send(bad, e))
        };
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if closed_within(&mut s, left) {
        Ok(())
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

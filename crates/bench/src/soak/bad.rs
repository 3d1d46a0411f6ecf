//! Bad peers mixed into the soak: each connects to a server port, misbehaves
//! in one way, and expects the server to cut it off (or answer with an
//! error) within a bound. A server that keeps such a peer, or dies of it,
//! fails the soak.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use corefarm_smp::{Hello, MsgType};

/// The ways a peer misbehaves.
#[derive(Debug, Clone, Copy, serde::Serialize)]
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
}

pub const ALL: [Misbehaviour; 5] = [
    Misbehaviour::UnknownType,
    Misbehaviour::Oversized,
    Misbehaviour::Trickle,
    Misbehaviour::MalformedHello,
    Misbehaviour::DataFirst,
];

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
pub fn play(bad: Misbehaviour, addr: &str, within: Duration) -> Result<(), PlayError> {
    let mut s = TcpStream::connect(addr).map_err(|e| PlayError::Connect(bad, e))?;
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

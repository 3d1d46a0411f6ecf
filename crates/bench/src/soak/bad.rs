//! Bad peers mixed into the soak: each connects to a server port, misbehaves
//! in one way, and expects the server to cut it off (or answer with an
//! error) within a bound, or, for a node that only overdoes notifications,
//! to keep it and bound what it relays. A server that keeps such a peer,
//! drops a node it should keep, or dies of it, fails the soak.
//!
//! With authentication (`--auth-file`), every bad peer that misbehaves past
//! the way in first proves its role's secret, so it tests the same thing
//! as without.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use corefarm_smp::auth::{AuthChallenge, AuthResponse, Secret};
use corefarm_smp::hello::features;
use corefarm_smp::stream::{Chunk, ChunkHeader};
use corefarm_smp::{ErrorCode, ErrorMsg, Hello, MsgType};

use super::procs;

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
    /// Answers the challenge of a server with `--auth-file` wrongly
    /// [`WRONG_ANSWERS`] times in a row from one address of its own, on the
    /// user and the node port in turn: each connection must end with an
    /// `unauthorized` error, each refusal held at least as long as
    /// docs/operations.md promises for that many failures from one address,
    /// every one counted in `errors_total{kind="auth_failed"}`, and only
    /// every power of two of them logged. Only with authentication.
    WrongAuthAnswer,
    /// A node that joins, computes correct results for the soak's users,
    /// and sends [`FLOOD_NOTES`] notifications (more than the 256 allowed)
    /// before each: the server must keep it (the messages and their results
    /// are unaffected) and relay at most 256 of each message's
    /// notifications; the soak checks the relayed total at the end. Shared
    /// mode only: in exclusive mode this node would become a user's only
    /// node, and its leaving at the end of the play ends that user's
    /// session (as documented), which the soak counts as a failure.
    NotificationFlood,
}

pub const ALL: [Misbehaviour; 14] = [
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
    Misbehaviour::WrongAuthAnswer,
    Misbehaviour::NotificationFlood,
];

/// Wrong answers a [`Misbehaviour::WrongAuthAnswer`] play gives in a row.
pub const WRONG_ANSWERS: u32 = 8;
/// Notifications a [`Misbehaviour::NotificationFlood`] node sends per message.
pub const FLOOD_NOTES: u32 = 300;
/// Data messages a [`Misbehaviour::NotificationFlood`] node answers at most per play.
pub const FLOOD_MESSAGES: u64 = 64;
/// The most the server relays of one message's notifications (docs/protocol.md).
pub const NOTES_RELAYED_PER_MESSAGE: u64 = 256;

/// The secrets of the soak's server when it runs with `--auth-file`.
#[derive(Debug, Clone)]
pub struct Secrets {
    pub users: Secret,
    pub nodes: Secret,
}

/// What a bad peer is played against.
pub struct Target<'a> {
    pub users: &'a str,
    pub nodes: &'a str,
    /// The server's metrics endpoint.
    pub metrics: &'a str,
    /// The server's log.
    pub log: &'a Path,
    /// The server's `--read-timeout` (it bounds a refusal's hold).
    pub read_timeout: Duration,
    /// With `--auth-file`: the secrets the soak's peers hold.
    pub secrets: Option<&'a Secrets>,
    /// A loopback address of this play's own, so that the server's counting
    /// per source address sees this peer apart from the soak's users and
    /// nodes (which connect from 127.0.0.1).
    pub source: Ipv4Addr,
}

impl Target<'_> {
    fn addr(&self, port: Port) -> &str {
        match port {
            Port::Users => self.users,
            Port::Nodes => self.nodes,
        }
    }

    /// The secret a peer of `port`'s role proves, with authentication.
    fn secret(&self, port: Port) -> Option<&Secret> {
        self.secrets.map(|s| match port {
            Port::Users => &s.users,
            Port::Nodes => &s.nodes,
        })
    }
}

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
            Misbehaviour::UnfinishedChunk
                | Misbehaviour::GroupMisuse
                | Misbehaviour::NotificationFlood
        )
    }

    /// Whether it can be played against a server without `--auth-file`
    /// (which asks no secret, so there is no answer to get wrong).
    pub fn without_auth(self) -> bool {
        self != Misbehaviour::WrongAuthAnswer
    }

    /// The ports it makes sense on: a node's own misbehaviour only at the
    /// nodes port, the rest at either.
    pub fn ports(self) -> &'static [Port] {
        match self {
            Misbehaviour::NodeChunkOverAgreed
            | Misbehaviour::HugeNodeName
            | Misbehaviour::NotificationFlood => &[Port::Nodes],
            // Both in turn, within one play.
            Misbehaviour::WrongAuthAnswer => &[Port::Users],
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
    /// A wrong answer to the challenge was not refused with `unauthorized`.
    #[error("{bad:?}: wrong answer {attempt} on the {port:?} port: {got}")]
    NotRefused {
        bad: Misbehaviour,
        attempt: u32,
        port: Port,
        got: String,
    },
    /// A refusal came sooner than the documented hold for that many
    /// failures from one address.
    #[error(
        "{bad:?}: wrong answer {attempt} refused after {after:?}, before the {hold:?} promised"
    )]
    NotSlowed {
        bad: Misbehaviour,
        attempt: u32,
        after: Duration,
        hold: Duration,
    },
    /// The server's metrics endpoint did not answer.
    #[error("{0:?}: the server's /metrics did not answer")]
    NoMetrics(Misbehaviour),
    /// `errors_total{kind="auth_failed"}` grew less than the refusals.
    #[error("{bad:?}: {refused} refused, errors_total{{kind=\"auth_failed\"}} grew by {counted}")]
    NotCounted {
        bad: Misbehaviour,
        refused: u32,
        counted: f64,
    },
    /// More refusals of one address logged at warn level than the powers
    /// of two among their counts.
    #[error(
        "{bad:?}: {logged} warn lines for {refused} refusals from {source_ip} (at most {most})"
    )]
    LogFlooded {
        bad: Misbehaviour,
        logged: usize,
        refused: u32,
        most: usize,
        source_ip: Ipv4Addr,
    },
    /// The server dropped a node whose every answer was correct, for
    /// notifications beyond the bound (it must drop those, not the node).
    #[error("{bad:?}: the node was dropped after {answered} correct answers: {how}")]
    NodeDropped {
        bad: Misbehaviour,
        answered: u64,
        how: String,
    },
}

/// How a play ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Played {
    /// The server (or node) dealt with the misbehaviour as it should.
    CutOff,
    /// Nothing to test this time (a group could not open: too few free
    /// nodes at that moment; a flooding node that got no work).
    Untestable,
    /// A [`Misbehaviour::NotificationFlood`] node kept by the server while
    /// it answered this many data messages, each after [`FLOOD_NOTES`]
    /// notifications.
    Flooded(u64),
}

/// Plays `bad` against `port` of `t`; `Ok` when the server closed the
/// connection (after an error message or not) within `within`, or dealt
/// with the misbehaviour otherwise as it should.
pub fn play(
    bad: Misbehaviour,
    port: Port,
    t: &Target,
    within: Duration,
) -> Result<Played, PlayError> {
    match bad {
        Misbehaviour::WrongAuthAnswer => return wrong_auth_answers(t, within),
        Misbehaviour::NotificationFlood => return notification_flood(t, within),
        _ => {}
    }
    let secret = t.secret(port);
    let mut s = TcpStream::connect(t.addr(port)).map_err(|e| PlayError::Connect(bad, e))?;
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
        Misbehaviour::NodeChunkOverAgreed => over_agreed_chunk(&mut s, secret, within),
        Misbehaviour::Silent => Ok(()),
        Misbehaviour::UnfinishedChunk => unfinished_chunk(&mut s, secret, within),
        Misbehaviour::GroupMisuse => return group_misuse(&mut s, secret, within),
        Misbehaviour::WrongAuthAnswer | Misbehaviour::NotificationFlood => {
            unreachable!("played above")
        }
        // Answered (admitted, its name cut) or closed: either is right;
        // kept unanswered is not.
        Misbehaviour::HugeNodeName => {
            return match huge_node_name(&mut s, secret, within) {
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
            handshake(&mut s, h, secret, within)
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

/// Sends `h` and reads up to the server's hello. With a `secret`, the
/// hello offers `auth` and the server's challenge is answered with it.
fn handshake(
    s: &mut TcpStream,
    mut h: Hello,
    secret: Option<&Secret>,
    within: Duration,
) -> std::io::Result<()> {
    if secret.is_some() {
        h.features.push(features::AUTH.into());
    }
    // An answer covers the hello's exact bytes.
    let sent = h.encode();
    s.write_all(&h.to_frame().to_vec())?;
    s.set_read_timeout(Some(within))?;
    if let Some(secret) = secret {
        let c = challenge(s)?;
        s.write_all(
            &AuthResponse::answer(secret, &c, &h.role, &sent)
                .to_frame()
                .to_vec(),
        )?;
    }
    read_until(s, MsgType::Hello)
}

/// Reads the server's challenge (an error if anything else comes).
fn challenge(s: &mut TcpStream) -> std::io::Result<AuthChallenge> {
    let (t, p) = read_frame(s)?;
    if t != MsgType::AuthChallenge as u8 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("expected an auth challenge, got message type {t:#x}"),
        ));
    }
    AuthChallenge::parse(&p)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

/// Says hello as a node agreeing 512-byte chunks, waits for the server's
/// hello, then sends a 1000-byte chunk.
fn over_agreed_chunk(
    s: &mut TcpStream,
    secret: Option<&Secret>,
    within: Duration,
) -> std::io::Result<()> {
    let mut h = Hello::new("node");
    h.features = vec![features::ERROR.into(), features::CHUNKS.into()];
    h.chunk_size = Some(512);
    handshake(s, h, secret, within)?;
    let c = Chunk {
        head: ChunkHeader::at(7, 4, 0, 1000, 1000),
        data: bytes::Bytes::from(vec![1; 1000]),
    };
    let frame = c
        .to_frame()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    s.write_all(&frame.to_vec())
}

/// A node hello with a 1 MiB name, and the server's answer. With
/// authentication, 32 KiB: a hello must stay under 64 KiB to be answered
/// a challenge, and that is still far past the 64 characters shown.
fn huge_node_name(
    s: &mut TcpStream,
    secret: Option<&Secret>,
    within: Duration,
) -> std::io::Result<()> {
    let mut h = Hello::new("node");
    h.features = vec![features::ERROR.into()];
    h.name = Some("n".repeat(if secret.is_some() { 32 << 10 } else { 1 << 20 }));
    handshake(s, h, secret, within)
}

/// Reads the next frame: its type and payload (at most 64 MiB: more
/// than any soak message).
fn read_frame(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 8];
    s.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    if len > 64 << 20 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes"),
        ));
    }
    let mut payload = vec![0; len];
    s.read_exact(&mut payload)?;
    Ok((head[0], payload))
}

/// A TCP connection to `addr` from `source` (any port).
fn connect_from(source: Ipv4Addr, addr: &str) -> std::io::Result<TcpStream> {
    let to: SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{e}")))?;
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.bind(&SocketAddr::from((source, 0)).into())?;
    sock.connect(&to.into())?;
    Ok(sock.into())
}

/// How long the server holds its refusal of an address's `n`th failure in
/// a row: 100 ms, doubling, at most 2 s and a quarter of `--read-timeout`
/// (docs/operations.md, "Every limit at a glance").
fn promised_hold(n: u32, read_timeout: Duration) -> Duration {
    let doubled = Duration::from_millis(100).saturating_mul(1 << n.saturating_sub(1).min(16));
    doubled.min(Duration::from_secs(2)).min(read_timeout / 4)
}

/// See [`Misbehaviour::WrongAuthAnswer`]. Odd attempts go to the user port
/// with the node secret, even ones to the node port with the user secret
/// (each the other role's: a user posing as a node, and back).
fn wrong_auth_answers(t: &Target, within: Duration) -> Result<Played, PlayError> {
    let bad = Misbehaviour::WrongAuthAnswer;
    let Some(secrets) = t.secrets else {
        return Ok(Played::Untestable);
    };
    let counted = || {
        procs::metric(t.metrics, r#"corefarm_errors_total{kind="auth_failed"}"#)
            .ok_or(PlayError::NoMetrics(bad))
    };
    let before = counted()?;
    for attempt in 1..=WRONG_ANSWERS {
        let (port, role, wrong) = if attempt % 2 == 1 {
            (Port::Users, "user", &secrets.nodes)
        } else {
            (Port::Nodes, "node", &secrets.users)
        };
        let refused = |got: String| PlayError::NotRefused {
            bad,
            attempt,
            port,
            got,
        };
        let mut s = match connect_from(t.source, t.addr(port)) {
            Ok(s) => s,
            // No loopback address but 127.0.0.1 here: the per-address
            // counting cannot be told apart from the soak's own peers.
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
                return Ok(Played::Untestable)
            }
            Err(e) => return Err(PlayError::Connect(bad, e)),
        };
        let _ = s.set_nodelay(true);
        let mut h = Hello::new(role);
        h.name = Some("soak-wrong-answer".into());
        h.features = vec![features::ERROR.into(), features::AUTH.into()];
        if port == Port::Users {
            h.nodes = Some(0);
        }
        let sent = h.encode();
        s.write_all(&h.to_frame().to_vec())
            .and_then(|_| s.set_read_timeout(Some(within)))
            .map_err(|e| PlayError::Send(bad, e))?;
        let c = challenge(&mut s).map_err(|e| refused(format!("no challenge: {e}")))?;
        let answer = AuthResponse::answer(wrong, &c, role, &sent).to_frame();
        let at = Instant::now();
        s.write_all(&answer.to_vec())
            .map_err(|e| PlayError::Send(bad, e))?;
        match read_frame(&mut s) {
            Ok((ty, p)) if ty == MsgType::Error as u8 => match ErrorMsg::parse(&p) {
                Ok(e) if e.code() == Some(ErrorCode::Unauthorized) => {}
                Ok(e) => return Err(refused(format!("error {}: {}", e.code, e.reason))),
                Err(e) => return Err(refused(format!("an error that does not parse: {e}"))),
            },
            Ok((ty, _)) => return Err(refused(format!("message type {ty:#x}"))),
            Err(e) => return Err(refused(format!("no error: {e}"))),
        }
        let after = at.elapsed();
        // The refusal is the connection's end.
        if !closed_within(&mut s, within) {
            return Err(PlayError::Kept { bad, within });
        }
        let hold = promised_hold(attempt, t.read_timeout);
        if after < hold {
            return Err(PlayError::NotSlowed {
                bad,
                attempt,
                after,
                hold,
            });
        }
    }
    // Counted as each refusal is decided, before its answer is sent.
    let grew = counted()? - before;
    if grew < f64::from(WRONG_ANSWERS) {
        return Err(PlayError::NotCounted {
            bad,
            refused: WRONG_ANSWERS,
            counted: grew,
        });
    }
    // This play's address is its own: every line naming it is of this play.
    let log = std::fs::read_to_string(t.log).unwrap_or_default();
    let at = format!("={}:", t.source);
    let logged = log
        .lines()
        .filter(|l| l.contains(&at) && l.contains("connection refused"))
        .count();
    // Powers of two up to WRONG_ANSWERS: 1, 2, 4, 8.
    let most = WRONG_ANSWERS.ilog2() as usize + 1;
    if logged > most {
        return Err(PlayError::LogFlooded {
            bad,
            logged,
            refused: WRONG_ANSWERS,
            most,
            source_ip: t.source,
        });
    }
    Ok(Played::CutOff)
}

/// See [`Misbehaviour::NotificationFlood`]: a node that takes benchmarking
/// configurations only (what the soak's users configure) and computes
/// their results as the benchmarking core does (each output the first 16
/// bytes of its input, then zeros), for `within` or until it answered
/// [`FLOOD_MESSAGES`] messages, then leaves (its work in flight goes to
/// other nodes, as after a kill).
fn notification_flood(t: &Target, within: Duration) -> Result<Played, PlayError> {
    use corefarm_smp::{Configuration, ConfigurationResponse, Data, Notification, OutFrame};
    let bad = Misbehaviour::NotificationFlood;
    let mut s = TcpStream::connect(t.nodes).map_err(|e| PlayError::Connect(bad, e))?;
    let _ = s.set_nodelay(true);
    let mut h = Hello::new("node");
    h.name = Some("soak-notification-flood".into());
    h.features = vec![features::ERROR.into(), features::SPIN_NOTIFY.into()];
    handshake(&mut s, h, t.secret(Port::Nodes), within).map_err(|e| PlayError::Send(bad, e))?;
    let deadline = Instant::now() + within;
    let mut cfg: Option<corefarm_smp::BenchmarkConfig> = None;
    let mut answered = 0u64;
    let dropped = |answered, how: String| PlayError::NodeDropped { bad, answered, how };
    while answered < FLOOD_MESSAGES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let _ = s.set_read_timeout(Some(left));
        let (ty, p) = match read_frame(&mut s) {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => return Err(dropped(answered, e.to_string())),
        };
        let sent = if ty == MsgType::Configuration as u8 {
            cfg = Configuration::parse(bytes::Bytes::from(p))
                .ok()
                .and_then(|c| c.benchmark());
            let status = if cfg.is_some() {
                ConfigurationResponse::OK
            } else {
                ConfigurationResponse::FAILED
            };
            s.write_all(&ConfigurationResponse { status }.to_frame().to_vec())
        } else if ty == MsgType::Data as u8 {
            let Some(c) = cfg else {
                return Err(dropped(answered, "data before a configuration".into()));
            };
            let d = Data::parse(bytes::Bytes::from(p))
                .map_err(|e| dropped(answered, format!("data that does not parse: {e}")))?;
            let (i, o) = (c.input_size as usize, c.output_size as usize);
            let mut out = vec![0u8; d.data.len() / i * o];
            for (input, output) in d.data.chunks_exact(i).zip(out.chunks_exact_mut(o)) {
                output[..corefarm_smp::BENCH_ECHO_LEN]
                    .copy_from_slice(&input[..corefarm_smp::BENCH_ECHO_LEN]);
            }
            let mut frames = Vec::new();
            for n in 0..FLOOD_NOTES {
                let note = Notification {
                    id: d.id,
                    set: 0,
                    data: bytes::Bytes::copy_from_slice(&n.to_le_bytes()),
                };
                frames.extend_from_slice(&note.to_frame().expect("a small notification").to_vec());
            }
            let result = OutFrame::data(d.id, bytes::Bytes::from(out))
                .map_err(|e| dropped(answered, format!("a result too large: {e}")))?;
            frames.extend_from_slice(&result.to_vec());
            answered += 1;
            s.write_all(&frames)
        } else {
            // Nothing else is asked of a node that agreed no other feature.
            Ok(())
        };
        sent.map_err(|e| dropped(answered, format!("writing: {e}")))?;
    }
    Ok(if answered == 0 {
        Played::Untestable
    } else {
        Played::Flooded(answered)
    })
}

/// See [`Misbehaviour::GroupMisuse`]. A group the server cannot open (too
/// few free nodes with a peer port at that moment) is nothing to test.
fn group_misuse(
    s: &mut TcpStream,
    secret: Option<&Secret>,
    within: Duration,
) -> Result<Played, PlayError> {
    use corefarm_smp::group::{Cmd, GroupCmd, GroupCtl, GroupReply, NO_CULPRIT};
    let bad = Misbehaviour::GroupMisuse;
    let io = |e: std::io::Error| PlayError::Send(bad, e);
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into(), features::GROUP.into()];
    h.nodes = Some(0);
    handshake(s, h, secret, within).map_err(io)?;
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
fn unfinished_chunk(
    s: &mut TcpStream,
    secret: Option<&Secret>,
    within: Duration,
) -> std::io::Result<()> {
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into(), features::CHUNKS.into()];
    h.chunk_size = Some(4096);
    handshake(s, h, secret, within)?;
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

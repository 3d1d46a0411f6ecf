//! The user session's rules of the conversation, whatever its placement:
//! which frame a user may send in which phase, how its hello is read, and
//! what the server agrees to in reply.

use corefarm_smp::hello::features;
use corefarm_smp::{ErrorCode, Hello, MsgType, UserPhase};

use crate::chunked::{Inbound, Outbound};

/// What a frame from a user asks for, given where the session is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Asked {
    Hello,
    Configuration,
    Data,
    Chunk,
    Status,
    /// Not allowed now: the error to send, and why.
    Refused(ErrorCode, String),
}

/// Where a user session is, as far as what it may receive goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Session {
    pub phase: UserPhase,
    /// A hello was answered.
    pub greeted: bool,
    /// A configuration was accepted at some point.
    pub configured: bool,
    /// Chunks were agreed.
    pub chunks: bool,
    /// The status extension was agreed.
    pub status: bool,
}

impl Session {
    /// A session in `phase` whose hello was answered with `agreed` (if it
    /// was), with a configuration accepted or not, chunks agreed or not.
    pub fn new(phase: UserPhase, agreed: Option<&Hello>, configured: bool, chunks: bool) -> Self {
        Session {
            phase,
            greeted: agreed.is_some(),
            configured,
            chunks,
            status: agreed.is_some_and(|h| h.has(features::STATUS)),
        }
    }
}

pub(crate) fn classify(ty: MsgType, s: Session) -> Asked {
    let routing = s.phase == UserPhase::Routing;
    match ty {
        MsgType::Hello if s.phase == UserPhase::Initial && !s.greeted && !s.configured => {
            Asked::Hello
        }
        MsgType::Configuration if s.phase != UserPhase::Configuring => Asked::Configuration,
        MsgType::Data if routing => Asked::Data,
        MsgType::Chunk if s.chunks && routing => Asked::Chunk,
        MsgType::Data | MsgType::Chunk if ty == MsgType::Data || s.chunks => Asked::Refused(
            ErrorCode::NotConfigured,
            "data message before a successful configuration".into(),
        ),
        MsgType::StatusRequest if s.status => Asked::Status,
        other => Asked::Refused(
            ErrorCode::UnexpectedMessage,
            format!("unexpected {} message from the user", other.name()),
        ),
    }
}

/// Why a hello was refused, and whether its sender reads error messages.
#[derive(Debug)]
pub(crate) struct Refused {
    pub code: ErrorCode,
    pub reason: String,
    /// Its sender is told why in an error message although nothing was
    /// agreed: a hello that could not be read (docs/protocol.md, `bad_hello`
    /// or `too-large`; only a peer that speaks the extensions sends type
    /// 0x10, and a seed peer's negative configuration response would answer
    /// a configuration it never sent), or one that decoded and offered
    /// `error` (a node pointed at the user port, say, which would otherwise
    /// see only a closed connection).
    pub reads_errors: bool,
}

/// A hello frame that could not be read at all (over the size limit, or
/// its reading broke off): told like one that did not decode.
pub(crate) fn unreadable(code: ErrorCode, reason: String) -> Refused {
    Refused {
        code,
        reason,
        reads_errors: true,
    }
}

/// A user's hello, which must say it is one.
pub(crate) fn user_hello(payload: &[u8]) -> Result<Hello, Refused> {
    match Hello::decode(payload) {
        Ok(h) if h.role == "user" => Ok(h),
        Ok(h) => {
            let hint = if h.role == "node" {
                ": nodes connect to the server's node port (--nodes-listen, 8888 by default)"
            } else {
                ""
            };
            Err(Refused {
                code: ErrorCode::Malformed,
                reason: format!("hello with role {:?} on the user port{hint}", h.role),
                reads_errors: h.has(features::ERROR),
            })
        }
        Err(e) => Err(unreadable(e.code(), e.to_string())),
    }
}

/// The server's answer to a user's hello, and the chunk size agreed.
pub(crate) struct Agreed {
    pub hello: Hello,
    pub chunks: Option<Chunks>,
}

/// The two halves of a user link that agreed chunks.
pub(crate) struct Chunks {
    pub size: u32,
    pub inbound: Inbound,
    pub outbound: Outbound,
}

/// Agrees to those of `offered` the user at `peer` asked for, and to
/// chunks if it asked for a size the server takes; messages of at most
/// `max_message`.
pub(crate) fn agree(
    user: &Hello,
    offered: &[&str],
    max_message: u32,
    peer: std::net::SocketAddr,
) -> Agreed {
    let mut hello = Hello::new("server");
    hello.features = offered
        .iter()
        .filter(|f| user.has(f))
        .map(|f| f.to_string())
        .collect();
    hello.max_message = Some(max_message);
    let mut chunks = None;
    if user.has(features::CHUNKS) {
        match crate::chunked::chunk_size(user) {
            Some(size) => {
                hello.features.push(features::CHUNKS.into());
                hello.chunk_size = Some(size);
                chunks = Some(Chunks {
                    size,
                    inbound: crate::chunked::inbound(size, max_message),
                    outbound: Outbound::new(size),
                });
            }
            None => tracing::info!(
                user = %peer,
                "chunks not agreed: chunk size {:?} under {} bytes",
                user.chunk_size,
                crate::chunked::MIN_CHUNK_SIZE
            ),
        }
    }
    Agreed { hello, chunks }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(phase: UserPhase) -> Session {
        Session {
            phase,
            greeted: false,
            configured: false,
            chunks: false,
            status: false,
        }
    }

    #[test]
    fn frames_are_taken_only_in_their_phase() {
        let init = session(UserPhase::Initial);
        assert_eq!(classify(MsgType::Hello, init), Asked::Hello);
        let greeted = Session {
            greeted: true,
            ..init
        };
        assert!(matches!(
            classify(MsgType::Hello, greeted),
            Asked::Refused(ErrorCode::UnexpectedMessage, _)
        ));
        assert!(matches!(
            classify(MsgType::Data, init),
            Asked::Refused(ErrorCode::NotConfigured, _)
        ));
        // A chunk is data only where chunks were agreed.
        assert!(matches!(
            classify(MsgType::Chunk, init),
            Asked::Refused(ErrorCode::UnexpectedMessage, _)
        ));
        let routing = Session {
            chunks: true,
            ..session(UserPhase::Routing)
        };
        assert_eq!(classify(MsgType::Chunk, routing), Asked::Chunk);
        assert_eq!(classify(MsgType::Data, routing), Asked::Data);
        assert!(matches!(
            classify(MsgType::Configuration, session(UserPhase::Configuring)),
            Asked::Refused(ErrorCode::UnexpectedMessage, _)
        ));
        assert!(matches!(
            classify(MsgType::StatusRequest, routing),
            Asked::Refused(..)
        ));
        let status = Session {
            status: true,
            ..routing
        };
        assert_eq!(classify(MsgType::StatusRequest, status), Asked::Status);
    }

    #[test]
    fn a_hello_is_a_users_and_the_answer_takes_only_what_was_offered() {
        let node = Hello::new("node").encode();
        let r = user_hello(&node).unwrap_err();
        assert!(r.code == ErrorCode::Malformed && !r.reads_errors, "{r:?}");
        let mut talking = Hello::new("node");
        talking.features = vec![features::ERROR.into()];
        assert!(user_hello(&talking.encode()).unwrap_err().reads_errors);
        // One that does not decode is `bad_hello`, told in an error.
        for bad in [&b"{"[..], b"", br#"{"version":1,"role":"admin"}"#] {
            let r = user_hello(bad).unwrap_err();
            assert!(r.code == ErrorCode::Malformed && r.reads_errors, "{r:?}");
        }
        let mut h = Hello::new("user");
        h.features = vec![
            features::CREDIT.into(),
            "nonsense".into(),
            features::CHUNKS.into(),
        ];
        h.chunk_size = Some(100);
        let h = user_hello(&h.encode()).unwrap();
        let peer = "127.0.0.1:9".parse().unwrap();
        let a = agree(&h, &[features::ERROR, features::CREDIT], 1 << 20, peer);
        assert_eq!(a.hello.features, [features::CREDIT]);
        assert!(a.chunks.is_none(), "100-byte chunks are refused");
        assert_eq!(a.hello.max_message, Some(1 << 20));
        let mut h = h;
        h.chunk_size = Some(4096);
        let a = agree(&h, &[features::ERROR], 1 << 20, peer);
        assert_eq!(a.hello.features, [features::CHUNKS]);
        assert_eq!(a.chunks.map(|c| c.size), Some(4096));
    }
}

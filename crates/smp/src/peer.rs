//! Peer messages (type 0x15, the `peer` feature): node-to-node traffic of the
//! node fabric. They travel only on a node's peer port, between corefarm
//! nodes of one group, so a seed peer or a user never sees one.
//!
//! A peer payload is a 24-byte routing header (kind, hops left, group,
//! source, destination, sequence) and a body whose layout depends on the
//! kind. The unique id of a message is (source, sequence): a source numbers
//! its messages 1, 2, 3… across all destinations, and receivers reject
//! duplicates within a window (seed 001 §III-A). Collective chunks add a
//! 40-byte collective header (seed 003: operation, algorithm, chunk offset).
//! Parsing is check-then-parse; see docs/protocol.md for the bytes.

use bytes::{Buf, Bytes};

use crate::error::ProtocolError;
use crate::header::{Header, MsgType, HEADER_LEN};
use crate::outframe::Inline;
use crate::priority::{class_field, class_from_field};
use crate::stream::DEFAULT_CLASS;

/// Length of the routing header at the start of every peer payload.
pub const PEER_HEADER_LEN: usize = 24;
/// Length of the collective header after the routing header of a chunk.
pub const COLL_HEADER_LEN: usize = 40;
/// Longest node name in a peer hello, longest reason in an abort.
pub const MAX_PEER_TEXT: usize = 1024;

const HEAD_CAP: usize = HEADER_LEN + PEER_HEADER_LEN + COLL_HEADER_LEN;

fn bad(what: impl Into<String>) -> ProtocolError {
    ProtocolError::BadPeer(what.into())
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

macro_rules! wire_enum {
    ($(#[$m:meta])* $name:ident, $what:literal { $($(#[$vm:meta])* $v:ident = $n:literal => $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name { $($(#[$vm])* $v = $n),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$v),+];

            pub fn from_u8(v: u8) -> Result<Self, ProtocolError> {
                match v {
                    $($n => Ok($name::$v),)+
                    other => Err(bad(format!(concat!("unknown ", $what, " {}"), other))),
                }
            }

            pub fn name(self) -> &'static str {
                match self { $($name::$v => $s),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

wire_enum!(
    /// What a peer message carries.
    PeerKind, "peer message kind" {
        /// Opens a link: the dialer's identity; the acceptor answers with its own.
        Hello = 1 => "hello",
        /// One chunk of a collective operation.
        Collective = 2 => "collective",
        /// A collective failed: names the rank held responsible, so every
        /// member reports the same culprit instead of timing out.
        Abort = 3 => "abort",
    }
);

wire_enum!(
    /// Collective operations (seed 003 chapter 4).
    CollOp, "collective operation" {
        Barrier = 1 => "barrier",
        Bcast = 2 => "bcast",
        Reduce = 3 => "reduce",
        Allreduce = 4 => "allreduce",
        Gather = 5 => "gather",
        Scatter = 6 => "scatter",
        Allgather = 7 => "allgather",
    }
);

wire_enum!(
    /// Logical trees a collective runs over (seed 003 §4.2.2.4).
    Algo, "collective algorithm" {
        /// A chain root → 1 → 2 …, pipelined chunk by chunk.
        Linear = 1 => "linear",
        Binomial = 2 => "binomial",
        /// The root talks to every member directly (routed over the fabric).
        Star = 3 => "star",
    }
);

wire_enum!(
    /// Element type of a reduction; 0 for collectives that only move bytes.
    DType, "element type" {
        Bytes = 0 => "bytes",
        I8 = 1 => "i8", I16 = 2 => "i16", I32 = 3 => "i32", I64 = 4 => "i64",
        U8 = 5 => "u8", U16 = 6 => "u16", U32 = 7 => "u32", U64 = 8 => "u64",
        F32 = 9 => "f32", F64 = 10 => "f64",
    }
);

wire_enum!(
    /// Reduction operator; 0 for collectives that do not reduce.
    ReduceOp, "reduction" {
        None = 0 => "none",
        Sum = 1 => "sum",
        Prod = 2 => "prod",
        Min = 3 => "min",
        Max = 4 => "max",
    }
);

impl DType {
    /// Bytes per element (1 for raw bytes).
    pub fn size(self) -> usize {
        match self {
            DType::Bytes | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }
}

/// The routing header every peer message starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerHeader {
    pub kind: PeerKind,
    /// Hops the message may still take; a node forwarding a message with
    /// none left drops it (a routing loop cannot circulate forever).
    pub ttl: u16,
    pub group: u32,
    pub src: u32,
    pub dst: u32,
    /// Per-source sequence number; (src, seq) is the message's unique id.
    pub seq: u64,
}

/// Collective header of a chunk: which collective, which part of which block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollHeader {
    /// Collective sequence number within the group (every member counts its calls).
    pub seq: u32,
    pub op: CollOp,
    /// Step of a composite operation (allreduce: 0 reduce, 1 broadcast).
    pub phase: u8,
    pub algo: Algo,
    pub dtype: DType,
    pub reduce: ReduceOp,
    pub root: u32,
    /// Gather: the rank the block comes from; scatter: the rank it goes to.
    pub block: u32,
    /// Offset of this chunk in its block, and the block's whole length.
    pub offset: u64,
    pub total: u64,
    /// Priority class of the collective, 0 most urgent … 7: the
    /// links it crosses order its data by it. A chunk from a node that
    /// predates classes reads as [`DEFAULT_CLASS`].
    pub class: u8,
}

/// Body of a peer message, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerBody {
    /// Opens a link. `token` is the group's secret from the server's `join`
    /// (and the user's `opened`): a peer port admits only links showing it.
    Hello {
        token: u64,
        name: String,
    },
    Collective {
        coll: CollHeader,
        data: Bytes,
    },
    Abort {
        culprit: u32,
        coll_seq: u32,
        reason: String,
    },
}

/// A whole peer message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerMsg {
    pub header: PeerHeader,
    pub body: PeerBody,
}

fn text(b: &[u8], what: &str) -> Result<String, ProtocolError> {
    if b.len() > MAX_PEER_TEXT {
        return Err(bad(format!(
            "{what} of {} bytes is over {MAX_PEER_TEXT}",
            b.len()
        )));
    }
    std::str::from_utf8(b)
        .map(str::to_string)
        .map_err(|_| bad(format!("{what} is not UTF-8")))
}

fn need(what: &'static str, got: usize, need: usize) -> Result<(), ProtocolError> {
    if got < need {
        return Err(ProtocolError::Truncated { what, got, need });
    }
    Ok(())
}

impl CollHeader {
    /// The whole of a linear broadcast #1 from rank 0, one block of
    /// `total` bytes: the simplest chunk header (tests build on it).
    pub fn bcast(total: u64) -> CollHeader {
        CollHeader {
            seq: 1,
            op: CollOp::Bcast,
            phase: 0,
            algo: Algo::Linear,
            dtype: DType::Bytes,
            reduce: ReduceOp::None,
            root: 0,
            block: 0,
            offset: 0,
            total,
            class: DEFAULT_CLASS,
        }
    }

    /// The class of a collective chunk on its way out, read from its
    /// routing and collective headers (`head`, the payload's first bytes):
    /// a forwarding node queues it by the class its source gave it.
    pub fn class_in(head: &[u8]) -> Option<u8> {
        let b = *head.get(PEER_HEADER_LEN + 9)?;
        Some(class_from_field(b).unwrap_or(DEFAULT_CLASS))
    }

    fn parse(b: &[u8], data_len: usize) -> Result<Self, ProtocolError> {
        let c = CollHeader {
            seq: u32_at(b, 0),
            op: CollOp::from_u8(b[4])?,
            phase: b[5],
            algo: Algo::from_u8(b[6])?,
            dtype: DType::from_u8(b[7])?,
            reduce: ReduceOp::from_u8(b[8])?,
            root: u32_at(b, 12),
            block: u32_at(b, 16),
            offset: u64_at(b, 24),
            total: u64_at(b, 32),
            // Formerly reserved and ignored on input: a value no sender
            // writes is still ignored.
            class: class_from_field(b[9]).unwrap_or(DEFAULT_CLASS),
        };
        let end = c.offset.checked_add(data_len as u64);
        if end.is_none_or(|e| e > c.total) {
            return Err(bad(format!(
                "chunk of {data_len} bytes at offset {} overruns its block of {}",
                c.offset, c.total
            )));
        }
        Ok(c)
    }

    fn encode(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.seq.to_le_bytes());
        out[4..9].copy_from_slice(&[
            self.op as u8,
            self.phase,
            self.algo as u8,
            self.dtype as u8,
            self.reduce as u8,
        ]);
        out[9] = class_field(self.class);
        out[10..12].fill(0);
        out[12..16].copy_from_slice(&self.root.to_le_bytes());
        out[16..20].copy_from_slice(&self.block.to_le_bytes());
        out[20..24].fill(0);
        out[24..32].copy_from_slice(&self.offset.to_le_bytes());
        out[32..40].copy_from_slice(&self.total.to_le_bytes());
    }
}

impl PeerMsg {
    /// The token of a hello.
    pub fn token(&self) -> Option<u64> {
        match self.body {
            PeerBody::Hello { token, .. } => Some(token),
            _ => None,
        }
    }

    /// Parses a peer payload (after the SMP header). Never panics.
    pub fn parse(mut payload: Bytes) -> Result<Self, ProtocolError> {
        need("peer message", payload.len(), PEER_HEADER_LEN)?;
        let h = &payload[..PEER_HEADER_LEN];
        let header = PeerHeader {
            kind: PeerKind::from_u8(h[0])?,
            ttl: u16::from_le_bytes([h[2], h[3]]),
            group: u32_at(h, 4),
            src: u32_at(h, 8),
            dst: u32_at(h, 12),
            seq: u64_at(h, 16),
        };
        if h[1] != 0 {
            return Err(bad(format!("unknown peer flags {:#x}", h[1])));
        }
        payload.advance(PEER_HEADER_LEN);
        let body = match header.kind {
            PeerKind::Hello => {
                need("peer hello", payload.len(), 8)?;
                PeerBody::Hello {
                    token: u64_at(&payload, 0),
                    name: text(&payload[8..], "peer name")?,
                }
            }
            PeerKind::Collective => {
                need("collective chunk", payload.len(), COLL_HEADER_LEN)?;
                let data = payload.split_off(COLL_HEADER_LEN);
                let coll = CollHeader::parse(&payload, data.len())?;
                PeerBody::Collective { coll, data }
            }
            PeerKind::Abort => {
                need("abort", payload.len(), 8)?;
                PeerBody::Abort {
                    culprit: u32_at(&payload, 0),
                    coll_seq: u32_at(&payload, 4),
                    reason: text(&payload[8..], "abort reason")?,
                }
            }
        };
        Ok(PeerMsg { header, body })
    }

    /// The message ready to write: SMP header, routing header and collective
    /// header inline, chunk data shared (forwarding never copies it).
    pub fn to_frame(&self) -> Result<PeerFrame, ProtocolError> {
        let mut head = [0u8; HEAD_CAP];
        let mut fixed = PEER_HEADER_LEN;
        let body = match &self.body {
            PeerBody::Hello { token, name } => {
                // What a receiver refuses is refused here, with the reason,
                // rather than sent to a peer that closes the link unanswered.
                if name.len() > MAX_PEER_TEXT {
                    return Err(bad(format!(
                        "peer name of {} bytes is over {MAX_PEER_TEXT}",
                        name.len()
                    )));
                }
                let mut b = Vec::with_capacity(8 + name.len());
                b.extend_from_slice(&token.to_le_bytes());
                b.extend_from_slice(name.as_bytes());
                Bytes::from(b)
            }
            PeerBody::Collective { coll, data } => {
                let at = HEADER_LEN + PEER_HEADER_LEN;
                coll.encode(&mut head[at..at + COLL_HEADER_LEN]);
                fixed += COLL_HEADER_LEN;
                data.clone()
            }
            PeerBody::Abort {
                culprit,
                coll_seq,
                reason,
            } => {
                let mut end = reason.len().min(MAX_PEER_TEXT);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                let mut v = Vec::with_capacity(8 + end);
                v.extend_from_slice(&culprit.to_le_bytes());
                v.extend_from_slice(&coll_seq.to_le_bytes());
                v.extend_from_slice(&reason.as_bytes()[..end]);
                Bytes::from(v)
            }
        };
        let len = fixed + body.len();
        let size = u32::try_from(len).map_err(|_| ProtocolError::Unrepresentable(len))?;
        head[..HEADER_LEN].copy_from_slice(&Header::new(MsgType::Peer, size).encode());
        let h = &self.header;
        let r = &mut head[HEADER_LEN..HEADER_LEN + PEER_HEADER_LEN];
        r[0] = h.kind as u8;
        r[2..4].copy_from_slice(&h.ttl.to_le_bytes());
        r[4..8].copy_from_slice(&h.group.to_le_bytes());
        r[8..12].copy_from_slice(&h.src.to_le_bytes());
        r[12..16].copy_from_slice(&h.dst.to_le_bytes());
        r[16..24].copy_from_slice(&h.seq.to_le_bytes());
        Ok(PeerFrame::from_parts(head, HEADER_LEN + fixed, body))
    }
}

/// A peer message on its way out: routing and collective headers inline,
/// data shared (the same wire form as [`crate::OutFrame`]).
pub type PeerFrame = Inline<HEAD_CAP>;

impl PeerFrame {
    /// The routing header's hop count, rewritten when a node forwards the frame.
    pub fn set_ttl(&mut self, ttl: u16) {
        self.head_mut()[HEADER_LEN + 2..HEADER_LEN + 4].copy_from_slice(&ttl.to_le_bytes());
    }
}

/// A hello's name field offering chunks: `name\0chunks=N`,
/// the option docs/protocol.md describes for node links and the direct
/// path; `chunk_size` 0 offers nothing and leaves the name as it was.
pub fn hello_name(name: &str, chunk_size: u32) -> String {
    match chunk_size {
        0 => name.to_string(),
        n => format!("{name}\0chunks={n}"),
    }
}

/// The chunk size both ends of a peer or direct connection agree on: the
/// smaller offer, or 0 (whole messages) if either offered none.
pub fn agree_chunks(ours: u32, theirs: u32) -> u32 {
    if ours == 0 || theirs == 0 {
        0
    } else {
        ours.min(theirs)
    }
}

/// A hello's name field split into the name and the chunk size it offers
/// (0: none, or an option this end cannot read). Options after the NUL
/// are `;`-separated; unknown ones are ignored.
pub fn split_hello_name(raw: &str) -> (&str, u32) {
    let Some((name, opts)) = raw.split_once('\0') else {
        return (raw, 0);
    };
    let chunks = opts
        .split(';')
        .find_map(|o| o.strip_prefix("chunks="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    (name, chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_names_carry_the_chunk_option_and_old_names_none() {
        assert_eq!(hello_name("user", 0), "user");
        let n = hello_name("user", 65536);
        assert_eq!(n, "user\0chunks=65536");
        assert_eq!(split_hello_name(&n), ("user", 65536));
        assert_eq!(split_hello_name("rank 3"), ("rank 3", 0));
        assert_eq!(agree_chunks(65536, 0), 0, "an old end");
        assert_eq!(agree_chunks(0, 4096), 0);
        assert_eq!(agree_chunks(65536, 4096), 4096);
        assert_eq!(agree_chunks(4096, 65536), 4096);
        assert_eq!(split_hello_name("n\0x=1;chunks=8;y"), ("n", 8));
        for unreadable in ["n\0chunks=", "n\0chunks=-1", "n\0chunks=99999999999", "n\0"] {
            assert_eq!(split_hello_name(unreadable), ("n", 0), "{unreadable:?}");
        }
    }

    fn hdr(kind: PeerKind) -> PeerHeader {
        PeerHeader {
            kind,
            ttl: 3,
            group: 7,
            src: 1,
            dst: 2,
            seq: 42,
        }
    }

    fn round_trip(m: &PeerMsg) -> Vec<u8> {
        let wire = m.to_frame().unwrap().to_vec();
        assert_eq!(wire[0], MsgType::Peer as u8);
        assert_eq!(u32_at(&wire, 4) as usize, wire.len() - HEADER_LEN);
        let back = PeerMsg::parse(Bytes::copy_from_slice(&wire[HEADER_LEN..])).unwrap();
        assert_eq!(&back, m);
        wire
    }

    #[test]
    fn every_kind_round_trips() {
        round_trip(&PeerMsg {
            header: hdr(PeerKind::Hello),
            body: PeerBody::Hello {
                token: 0x0123_4567_89ab_cdef,
                name: "n1".into(),
            },
        });
        let coll = CollHeader {
            seq: 9,
            op: CollOp::Allreduce,
            phase: 1,
            algo: Algo::Binomial,
            dtype: DType::F64,
            reduce: ReduceOp::Max,
            root: 0,
            block: 3,
            offset: 16,
            total: 40,
            class: 2,
        };
        let wire = round_trip(&PeerMsg {
            header: hdr(PeerKind::Collective),
            body: PeerBody::Collective {
                coll,
                data: Bytes::from_static(&[1; 24]),
            },
        });
        assert_eq!(
            wire.len(),
            HEADER_LEN + PEER_HEADER_LEN + COLL_HEADER_LEN + 24
        );
        round_trip(&PeerMsg {
            header: hdr(PeerKind::Abort),
            body: PeerBody::Abort {
                culprit: 4,
                coll_seq: 9,
                reason: "link lost".into(),
            },
        });
    }

    #[test]
    fn a_collective_class_rides_in_a_formerly_reserved_byte() {
        let chunk = |class| PeerMsg {
            header: hdr(PeerKind::Collective),
            body: PeerBody::Collective {
                coll: CollHeader {
                    class,
                    ..CollHeader::bcast(3)
                },
                data: Bytes::from_static(b"abc"),
            },
        };
        let at = HEADER_LEN + PEER_HEADER_LEN + 9;
        // The default class is the bytes an older node writes (0).
        let old = round_trip(&chunk(DEFAULT_CLASS));
        assert_eq!(old[at], 0);
        for class in [0, 1, 6, 7] {
            let wire = round_trip(&chunk(class));
            assert_eq!(wire[at], 8 | class);
            assert_eq!(CollHeader::class_in(&wire[HEADER_LEN..]), Some(class));
        }
        // A value no sender writes is ignored, as the reserved byte was.
        let mut odd = old.clone();
        odd[at] = 3;
        let m = PeerMsg::parse(Bytes::copy_from_slice(&odd[HEADER_LEN..])).unwrap();
        assert_eq!(m, chunk(DEFAULT_CLASS));
        assert_eq!(
            CollHeader::class_in(&odd[HEADER_LEN..]),
            Some(DEFAULT_CLASS)
        );
    }

    #[test]
    fn chunk_overrunning_its_block_is_rejected() {
        let coll = CollHeader {
            offset: u64::MAX - 2,
            ..CollHeader::bcast(u64::MAX)
        };
        let m = PeerMsg {
            header: hdr(PeerKind::Collective),
            body: PeerBody::Collective {
                coll,
                data: Bytes::from_static(b"abcd"),
            },
        };
        let wire = m.to_frame().unwrap().to_vec();
        let e = PeerMsg::parse(Bytes::copy_from_slice(&wire[HEADER_LEN..])).unwrap_err();
        assert_eq!(e.kind(), "bad_peer");
    }

    #[test]
    fn a_hello_name_the_receiver_would_refuse_is_not_encoded() {
        let hello = |name: String| PeerMsg {
            header: hdr(PeerKind::Hello),
            body: PeerBody::Hello { token: 1, name },
        };
        // At the limit (the chunk option counts: it is part of the field).
        let most = hello_name(&"n".repeat(MAX_PEER_TEXT - 14), 131072);
        assert_eq!(most.len(), MAX_PEER_TEXT);
        round_trip(&hello(most.clone()));
        let over = hello(most + "x");
        let e = over.to_frame().unwrap_err();
        assert_eq!(e.kind(), "bad_peer");
        assert!(e.to_string().contains("over 1024"), "{e}");
    }

    #[test]
    fn ttl_rewrite_changes_only_the_hop_count() {
        let m = PeerMsg {
            header: hdr(PeerKind::Hello),
            body: PeerBody::Hello {
                token: 1,
                name: "x".into(),
            },
        };
        let mut f = m.to_frame().unwrap();
        f.set_ttl(1);
        let back = PeerMsg::parse(Bytes::copy_from_slice(&f.to_vec()[HEADER_LEN..])).unwrap();
        assert_eq!(back.header.ttl, 1);
        assert_eq!(back.header.seq, 42);
    }
}

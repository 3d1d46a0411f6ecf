//! Control-channel messages between a node and a core worker. The channel
//! is a `SOCK_SEQPACKET` socketpair, so every message is one datagram; the
//! first byte is its tag. Everything is little-endian. Sizes are bounded
//! and the node checks every message from the worker (it runs user code).
//! Jobs and their completions do not use it (see `doorbell`), only the
//! start-up and the reason a job failed.

use serde::{Deserialize, Serialize};

/// Largest datagram either side sends or accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Longest reason text a worker may send; longer ones are cut.
pub const MAX_REASON: usize = 2048;

/// What the worker runs: sent once, right after it starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Init {
    /// "native" or "rtl".
    pub kind: String,
    /// Native entry symbol, or the RTL top module ("" = not checked).
    pub entry: String,
    pub input_size: u32,
    pub output_size: u32,
    /// This core's (control, input, output) base addresses (RTL address map).
    pub core: [u32; 3],
    /// The driver's job timeout inside the worker (RTL), in microseconds.
    pub timeout_us: u64,
    pub poll_us: u64,
    /// Bytes of the shared region the node created (checked by the worker).
    pub region_len: u64,
    /// Input/output slots in the region (checked by the worker).
    pub slots: u32,
    /// Kind "spin": the handler sets to load from the artifact.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spin: Vec<crate::spin::HandlerSet>,
    /// Kind "spin": handler threads.
    #[serde(default)]
    pub spin_threads: u32,
    /// The core's control protocol and arguments (`None`: the Avalon CSR).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<crate::image::Control>,
}

/// Largest chunk or output piece in one spin datagram.
pub const MAX_PIECE: usize = MAX_MESSAGE - 64;

/// How a spin message ended (`F` datagram).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpinEnd {
    /// The `O` pieces before it are the result.
    Result = 0,
    Forward = 1,
    Dropped = 2,
    Failed = 3,
    /// A handler overran its time budget; the worker ends itself.
    Overrun = 4,
}

/// Why a worker could not load its core (mirrors [`crate::LoadError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    Unsupported = 0,
    Invalid = 1,
    Backend = 2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// node → worker: `I` + JSON [`Init`].
    Init(Init),
    /// worker → node: `R`, the core is loaded.
    Ready,
    /// worker → node: `E` + kind + reason; the worker then exits.
    Refused(RefusalKind, String),
    /// worker → node, just before it completes a job with `DONE_FAILED`:
    /// `D` + seq u64 + last input's cycles u64 (u64::MAX: none) + status u8
    /// (0 ok, 1 failed) + reason.
    Done {
        seq: u64,
        cycles: Option<u64>,
        error: Option<String>,
    },
    /// node → spin worker: `B` + id u32 + message length u64 + eom u8 + the
    /// first chunk.
    Begin {
        id: u32,
        len: u64,
        eom: bool,
        data: Vec<u8>,
    },
    /// node → spin worker: `C` + eom u8 + the next chunk.
    Chunk { eom: bool, data: Vec<u8> },
    /// spin worker → node: `O` + a piece of the result.
    Output(Vec<u8>),
    /// spin worker → node: `N` + a notification.
    Notify(Vec<u8>),
    /// spin worker → node, after the notifications: `M` + u64, how many
    /// more the handlers sent past the per-message limit (dropped).
    NotesDropped(u64),
    /// spin worker → node: `F` + [`SpinEnd`] u8 + reason.
    Finished(SpinEnd, String),
    /// spin worker → node, from its fault handler: `X` + context u32 +
    /// stage u8 (0 head, 1 payload, 2 tail) of the crashing handler.
    Fault { context: u32, stage: u8 },
}

fn cut(s: &str) -> &str {
    if s.len() <= MAX_REASON {
        return s;
    }
    let mut end = MAX_REASON;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Msg {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32);
        match self {
            Msg::Init(i) => {
                b.push(b'I');
                b.extend(serde_json::to_vec(i).expect("Init serialises"));
            }
            Msg::Ready => b.push(b'R'),
            Msg::Refused(k, why) => {
                b.extend([b'E', *k as u8]);
                b.extend(cut(why).as_bytes());
            }
            Msg::Done { seq, cycles, error } => {
                b.push(b'D');
                b.extend(seq.to_le_bytes());
                b.extend(cycles.unwrap_or(u64::MAX).to_le_bytes());
                match error {
                    None => b.push(0),
                    Some(e) => {
                        b.push(1);
                        b.extend(cut(e).as_bytes());
                    }
                }
            }
            Msg::Begin { id, len, eom, data } => {
                b.push(b'B');
                b.extend(id.to_le_bytes());
                b.extend(len.to_le_bytes());
                b.push(*eom as u8);
                b.extend(data);
            }
            Msg::Chunk { eom, data } => {
                b.extend([b'C', *eom as u8]);
                b.extend(data);
            }
            Msg::Output(d) => {
                b.push(b'O');
                b.extend(d);
            }
            Msg::Notify(d) => {
                b.push(b'N');
                b.extend(d);
            }
            Msg::NotesDropped(n) => {
                b.push(b'M');
                b.extend(n.to_le_bytes());
            }
            Msg::Finished(end, why) => {
                b.extend([b'F', *end as u8]);
                b.extend(cut(why).as_bytes());
            }
            Msg::Fault { context, stage } => {
                b.push(b'X');
                b.extend(context.to_le_bytes());
                b.push(*stage);
            }
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Msg, DecodeError> {
        let u64_at = |o: usize| -> Result<u64, DecodeError> {
            b.get(o..o + 8)
                .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
                .ok_or(DecodeError::Short(b.len()))
        };
        let text = |s: &[u8]| String::from_utf8_lossy(cut_bytes(s)).into_owned();
        match b.first() {
            Some(b'I') => serde_json::from_slice(&b[1..])
                .map(Msg::Init)
                .map_err(|e| DecodeError::Init(e.to_string())),
            Some(b'R') if b.len() == 1 => Ok(Msg::Ready),
            Some(b'E') if b.len() >= 2 => {
                let kind = match b[1] {
                    0 => RefusalKind::Unsupported,
                    1 => RefusalKind::Invalid,
                    _ => RefusalKind::Backend,
                };
                Ok(Msg::Refused(kind, text(&b[2..])))
            }
            Some(b'D') if b.len() >= 18 => {
                let cycles = Some(u64_at(9)?).filter(|&c| c != u64::MAX);
                let error = match b[17] {
                    0 if b.len() == 18 => None,
                    1 => Some(text(&b[18..])),
                    _ => return Err(DecodeError::CompletionStatus),
                };
                Ok(Msg::Done {
                    seq: u64_at(1)?,
                    cycles,
                    error,
                })
            }
            Some(b'B') if b.len() >= 14 => Ok(Msg::Begin {
                id: u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")),
                len: u64_at(5)?,
                eom: b[13] != 0,
                data: b[14..].to_vec(),
            }),
            Some(b'C') if b.len() >= 2 => Ok(Msg::Chunk {
                eom: b[1] != 0,
                data: b[2..].to_vec(),
            }),
            Some(b'O') => Ok(Msg::Output(b[1..].to_vec())),
            Some(b'N') => Ok(Msg::Notify(b[1..].to_vec())),
            Some(b'M') if b.len() == 9 => Ok(Msg::NotesDropped(u64_at(1)?)),
            Some(b'F') if b.len() >= 2 => {
                let end = match b[1] {
                    0 => SpinEnd::Result,
                    1 => SpinEnd::Forward,
                    2 => SpinEnd::Dropped,
                    3 => SpinEnd::Failed,
                    4 => SpinEnd::Overrun,
                    e => return Err(DecodeError::SpinOutcome(e)),
                };
                Ok(Msg::Finished(end, text(&b[2..])))
            }
            Some(b'X') if b.len() == 6 && b[5] <= 2 => Ok(Msg::Fault {
                context: u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")),
                stage: b[5],
            }),
            Some(&tag) => Err(DecodeError::Unexpected { len: b.len(), tag }),
            None => Err(DecodeError::Empty),
        }
    }
}

/// A message on a worker's channel that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("empty message")]
    Empty,
    #[error("{0}-byte message is too short")]
    Short(usize),
    #[error("bad init message: {0}")]
    Init(String),
    #[error("bad status in a completion")]
    CompletionStatus,
    #[error("bad spin outcome {0}")]
    SpinOutcome(u8),
    #[error("unexpected {len}-byte message with tag {tag:#04x}")]
    Unexpected { len: usize, tag: u8 },
}

fn cut_bytes(s: &[u8]) -> &[u8] {
    &s[..s.len().min(MAX_REASON)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let init = Init {
            kind: "rtl".into(),
            entry: "vadd".into(),
            input_size: 2048,
            output_size: 1024,
            core: [0xC000_0000, 0xC000_1000, 0xC000_2000],
            timeout_us: 10_000_000,
            poll_us: 1000,
            region_len: 1 << 16,
            slots: 3,
            spin: vec![],
            spin_threads: 0,
            control: None,
        };
        for m in [
            Msg::Init(init),
            Msg::Ready,
            Msg::Refused(RefusalKind::Invalid, "no entry".into()),
            Msg::Done {
                seq: 7,
                cycles: Some(513),
                error: None,
            },
            Msg::Done {
                seq: u64::MAX - 1,
                cycles: None,
                error: Some("timed out".into()),
            },
            Msg::Begin {
                id: 9,
                len: 1 << 40,
                eom: true,
                data: vec![1, 2, 3],
            },
            Msg::Chunk {
                eom: false,
                data: vec![],
            },
            Msg::Output(vec![7; 100]),
            Msg::Notify(vec![]),
            Msg::NotesDropped(300),
            Msg::Finished(SpinEnd::Overrun, "ran over".into()),
            Msg::Fault {
                context: 3,
                stage: 2,
            },
        ] {
            assert_eq!(Msg::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn malformed_messages_are_errors() {
        for b in [
            &b""[..],
            b"J123",
            b"Dshort",
            b"R?",
            b"Z",
            b"I{not json",
            b"Bshort",
            b"F\x09",
            b"X\x01\x00\x00\x00\x07",
            &[b'D', 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9],
        ] {
            assert!(Msg::decode(b).is_err(), "{b:?}");
        }
        assert_eq!(Msg::decode(b""), Err(DecodeError::Empty));
        assert_eq!(
            Msg::decode(b"Z"),
            Err(DecodeError::Unexpected { len: 1, tag: b'Z' })
        );
        assert_eq!(Msg::decode(b"F\x09"), Err(DecodeError::SpinOutcome(9)));
        let long = Msg::Refused(RefusalKind::Backend, "x".repeat(10_000)).encode();
        assert_eq!(long.len(), 2 + MAX_REASON);
    }
}

//! Typed SMP payloads. Parsing is check-then-parse: every length is checked
//! against the bytes actually present before anything is read or allocated,
//! so arbitrary input yields an error, never a panic.

use bytes::{Buf, Bytes};

use crate::error::{ErrorCode, ProtocolError};
use crate::header::{Header, MsgType, HEADER_LEN};
use crate::hello::Hello;
use crate::{BENCH_ECHO_LEN, DATA_ID_LEN};

/// A whole message as read from a stream: its type and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub ty: MsgType,
    pub payload: Bytes,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// One entry of the core table (seed 000 §3.2.2): base addresses of a core's
/// control/status registers, input memory and output memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CoreInfo {
    pub control: u32,
    pub input: u32,
    pub output: u32,
}

/// Configuration message (type 1): sizes, core table, then the bitstream
/// (raw bytes to the seed; corefarm images start with a magic, see docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configuration {
    pub input_size: u32,
    pub output_size: u32,
    pub cores: Vec<CoreInfo>,
    pub bitstream: Bytes,
}

/// The benchmarking configuration of seed 000 §4.2.2: zero cores and a
/// 4-byte "bitstream" holding the processing delay in microseconds per input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchmarkConfig {
    pub input_size: u32,
    pub output_size: u32,
    pub delay_us: u32,
}

impl Configuration {
    const FIXED: usize = 12;
    const CORE: usize = 12;

    pub fn parse(payload: Bytes) -> Result<Self, ProtocolError> {
        if payload.len() < Self::FIXED {
            return Err(ProtocolError::Truncated {
                what: "configuration",
                got: payload.len(),
                need: Self::FIXED,
            });
        }
        let input_size = u32_at(&payload, 0);
        let output_size = u32_at(&payload, 4);
        let ncores = u32_at(&payload, 8);
        let room = payload.len() - Self::FIXED;
        // Checked before allocating the table: a hostile count cannot force a large Vec.
        if (ncores as u64) * (Self::CORE as u64) > room as u64 {
            return Err(ProtocolError::CoreTableTooLong {
                cores: ncores,
                room,
            });
        }
        if input_size == 0 {
            return Err(ProtocolError::ZeroInputSize);
        }
        let cores = (0..ncores as usize)
            .map(|i| {
                let o = Self::FIXED + i * Self::CORE;
                CoreInfo {
                    control: u32_at(&payload, o),
                    input: u32_at(&payload, o + 4),
                    output: u32_at(&payload, o + 8),
                }
            })
            .collect::<Vec<_>>();
        let bitstream = payload.slice(Self::FIXED + ncores as usize * Self::CORE..);
        let cfg = Configuration {
            input_size,
            output_size,
            cores,
            bitstream,
        };
        if cfg.cores.is_empty() && cfg.bitstream.len() == 4 {
            let (i, o) = (cfg.input_size, cfg.output_size);
            if (i as usize) < BENCH_ECHO_LEN || (o as usize) < BENCH_ECHO_LEN {
                return Err(ProtocolError::BenchmarkTooSmall {
                    input: i,
                    output: o,
                });
            }
        }
        Ok(cfg)
    }

    /// The benchmarking configuration, if this is one (zero cores, 16-byte payload).
    pub fn benchmark(&self) -> Option<BenchmarkConfig> {
        if self.cores.is_empty() && self.bitstream.len() == 4 {
            Some(BenchmarkConfig {
                input_size: self.input_size,
                output_size: self.output_size,
                delay_us: u32_at(&self.bitstream, 0),
            })
        } else {
            None
        }
    }

    pub fn encode_payload(&self) -> Vec<u8> {
        let mut v =
            Vec::with_capacity(Self::FIXED + self.cores.len() * Self::CORE + self.bitstream.len());
        v.extend_from_slice(&self.input_size.to_le_bytes());
        v.extend_from_slice(&self.output_size.to_le_bytes());
        v.extend_from_slice(&(self.cores.len() as u32).to_le_bytes());
        for c in &self.cores {
            v.extend_from_slice(&c.control.to_le_bytes());
            v.extend_from_slice(&c.input.to_le_bytes());
            v.extend_from_slice(&c.output.to_le_bytes());
        }
        v.extend_from_slice(&self.bitstream);
        v
    }

    pub fn to_frame(&self) -> OutFrame {
        OutFrame::new(MsgType::Configuration, Bytes::from(self.encode_payload()))
    }

    /// Validates a data payload (without its id) against this configuration
    /// and returns the number of inputs it holds.
    pub fn count_inputs(&self, data_len: usize) -> Result<u32, ProtocolError> {
        count_units(data_len, self.input_size, "inputs")
    }

    /// Same for a result coming back from a node.
    pub fn count_outputs(&self, data_len: usize) -> Result<u32, ProtocolError> {
        count_units(data_len, self.output_size, "outputs")
    }
}

impl BenchmarkConfig {
    pub fn to_configuration(&self) -> Configuration {
        Configuration {
            input_size: self.input_size,
            output_size: self.output_size,
            cores: Vec::new(),
            bitstream: Bytes::copy_from_slice(&self.delay_us.to_le_bytes()),
        }
    }
}

fn count_units(len: usize, unit: u32, what: &'static str) -> Result<u32, ProtocolError> {
    if unit == 0 {
        return if len == 0 {
            Ok(0)
        } else {
            Err(ProtocolError::NotMultiple { len, unit, what })
        };
    }
    if len == 0 {
        return Err(ProtocolError::EmptyData(what));
    }
    if !len.is_multiple_of(unit as usize) {
        return Err(ProtocolError::NotMultiple { len, unit, what });
    }
    Ok((len / unit as usize) as u32)
}

/// Configuration response (type 2): one status byte, 0 = success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigurationResponse {
    pub status: u8,
}

impl ConfigurationResponse {
    pub const OK: u8 = 0;
    /// Generic failure status used by corefarm; the reason travels in an
    /// `Error` message to peers that negotiated it.
    pub const FAILED: u8 = 1;

    pub fn parse(payload: &[u8]) -> Result<Self, ProtocolError> {
        match payload.first() {
            Some(&status) => Ok(ConfigurationResponse { status }),
            None => Err(ProtocolError::Truncated {
                what: "configuration response",
                got: 0,
                need: 1,
            }),
        }
    }

    pub fn ok(&self) -> bool {
        self.status == Self::OK
    }

    pub fn to_frame(&self) -> OutFrame {
        OutFrame::with_prefix(MsgType::ConfigurationResponse, &[self.status], Bytes::new())
    }
}

/// Data message (type 3): `u32` id then a whole number of inputs or outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data {
    pub id: u32,
    pub data: Bytes,
}

impl Data {
    pub fn parse(mut payload: Bytes) -> Result<Self, ProtocolError> {
        if payload.len() < DATA_ID_LEN {
            return Err(ProtocolError::Truncated {
                what: "data",
                got: payload.len(),
                need: DATA_ID_LEN,
            });
        }
        let id = payload.get_u32_le();
        Ok(Data { id, data: payload })
    }

    pub fn to_frame(&self) -> OutFrame {
        OutFrame::data(self.id, self.data.clone())
    }
}

/// Error message (type 0x11, extension): `u32` id of the data it concerns
/// (`NO_ID` if none), `u32` code, then a UTF-8 reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorMsg {
    pub id: u32,
    pub code: u32,
    pub reason: String,
}

impl ErrorMsg {
    pub const NO_ID: u32 = u32::MAX;

    pub fn new(id: u32, code: ErrorCode, reason: impl Into<String>) -> Self {
        ErrorMsg {
            id,
            code: code as u32,
            reason: reason.into(),
        }
    }

    pub fn parse(payload: &[u8]) -> Result<Self, ProtocolError> {
        if payload.len() < 8 {
            return Err(ProtocolError::Truncated {
                what: "error",
                got: payload.len(),
                need: 8,
            });
        }
        let reason = std::str::from_utf8(&payload[8..]).map_err(|_| ProtocolError::BadReason)?;
        Ok(ErrorMsg {
            id: u32_at(payload, 0),
            code: u32_at(payload, 4),
            reason: reason.to_string(),
        })
    }

    pub fn code(&self) -> Option<ErrorCode> {
        ErrorCode::from_u32(self.code)
    }

    pub fn to_frame(&self) -> OutFrame {
        let mut p = Vec::with_capacity(8);
        p.extend_from_slice(&self.id.to_le_bytes());
        p.extend_from_slice(&self.code.to_le_bytes());
        OutFrame::with_prefix(
            MsgType::Error,
            &p,
            Bytes::from(self.reason.clone().into_bytes()),
        )
    }
}

impl std::fmt::Display for ErrorMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let code = self.code().map(|c| c.name()).unwrap_or("unknown");
        if self.id == Self::NO_ID {
            write!(f, "{} ({}): {}", code, self.code, self.reason)
        } else {
            write!(
                f,
                "{} ({}) for data id {}: {}",
                code, self.code, self.id, self.reason
            )
        }
    }
}

/// Credit message (type 0x12, extension): the receiver may send this many
/// more data messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credit {
    pub messages: u32,
}

impl Credit {
    pub fn parse(payload: &[u8]) -> Result<Self, ProtocolError> {
        if payload.len() < 4 {
            return Err(ProtocolError::Truncated {
                what: "credit",
                got: payload.len(),
                need: 4,
            });
        }
        Ok(Credit {
            messages: u32_at(payload, 0),
        })
    }

    pub fn to_frame(&self) -> OutFrame {
        OutFrame::with_prefix(MsgType::Credit, &self.messages.to_le_bytes(), Bytes::new())
    }
}

impl Hello {
    pub fn to_frame(&self) -> OutFrame {
        OutFrame::new(MsgType::Hello, Bytes::from(self.encode()))
    }
}

/// Longest fixed prefix an [`OutFrame`] carries inline (header + id/status/...).
const HEAD_CAP: usize = HEADER_LEN + 8;

/// A message ready to be written: header and a short fixed prefix inline, the
/// body as a shared `Bytes`. Implements [`Buf`] with vectored chunks, so a
/// writer sends header and body in one `writev` without copying the body.
#[derive(Debug, Clone)]
pub struct OutFrame {
    head: [u8; HEAD_CAP],
    head_len: u8,
    head_pos: u8,
    body: Bytes,
}

impl OutFrame {
    pub fn new(ty: MsgType, payload: Bytes) -> Self {
        Self::with_prefix(ty, &[], payload)
    }

    /// Frame whose payload is `prefix` (at most 8 bytes) followed by `body`.
    pub fn with_prefix(ty: MsgType, prefix: &[u8], body: Bytes) -> Self {
        assert!(prefix.len() <= HEAD_CAP - HEADER_LEN);
        let size = prefix.len() + body.len();
        let size = u32::try_from(size).expect("SMP payloads are limited to u32::MAX bytes");
        let mut head = [0u8; HEAD_CAP];
        head[..HEADER_LEN].copy_from_slice(&Header::new(ty, size).encode());
        head[HEADER_LEN..HEADER_LEN + prefix.len()].copy_from_slice(prefix);
        OutFrame {
            head,
            head_len: (HEADER_LEN + prefix.len()) as u8,
            head_pos: 0,
            body,
        }
    }

    /// Data message with the given id and body.
    pub fn data(id: u32, body: Bytes) -> Self {
        Self::with_prefix(MsgType::Data, &id.to_le_bytes(), body)
    }

    /// Total bytes on the wire.
    pub fn wire_len(&self) -> usize {
        self.head_len as usize + self.body.len()
    }

    /// The whole encoded message as one contiguous buffer (tests, small frames).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.wire_len());
        v.extend_from_slice(&self.head[..self.head_len as usize]);
        v.extend_from_slice(&self.body);
        v
    }
}

impl Buf for OutFrame {
    fn remaining(&self) -> usize {
        (self.head_len - self.head_pos) as usize + self.body.len()
    }

    fn chunk(&self) -> &[u8] {
        if self.head_pos < self.head_len {
            &self.head[self.head_pos as usize..self.head_len as usize]
        } else {
            &self.body
        }
    }

    fn advance(&mut self, mut cnt: usize) {
        let in_head = (self.head_len - self.head_pos) as usize;
        let h = cnt.min(in_head);
        self.head_pos += h as u8;
        cnt -= h;
        self.body.advance(cnt);
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut n = 0;
        if n < dst.len() && self.head_pos < self.head_len {
            dst[n] =
                std::io::IoSlice::new(&self.head[self.head_pos as usize..self.head_len as usize]);
            n += 1;
        }
        if n < dst.len() && !self.body.is_empty() {
            dst[n] = std::io::IoSlice::new(&self.body);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg_payload(cores: u32, table: usize, bit: &[u8]) -> Bytes {
        let mut v = Vec::new();
        v.extend_from_slice(&32768u32.to_le_bytes());
        v.extend_from_slice(&16384u32.to_le_bytes());
        v.extend_from_slice(&cores.to_le_bytes());
        v.extend(std::iter::repeat_n(0xAB, table));
        v.extend_from_slice(bit);
        Bytes::from(v)
    }

    #[test]
    fn configuration_round_trip() {
        let c = Configuration {
            input_size: 32768,
            output_size: 16384,
            cores: vec![CoreInfo {
                control: 0xC000_0000,
                input: 0xC001_0000,
                output: 0xC002_0000,
            }],
            bitstream: Bytes::from_static(b"rbf-bytes"),
        };
        let back = Configuration::parse(Bytes::from(c.encode_payload())).unwrap();
        assert_eq!(back, c);
        assert!(back.benchmark().is_none());
    }

    #[test]
    fn core_table_longer_than_payload_is_rejected() {
        let e = Configuration::parse(cfg_payload(2, 12, b"")).unwrap_err();
        assert_eq!(e, ProtocolError::CoreTableTooLong { cores: 2, room: 12 });
        // A count that would overflow 32-bit arithmetic must not wrap around.
        let e = Configuration::parse(cfg_payload(u32::MAX, 0, b"")).unwrap_err();
        assert!(matches!(e, ProtocolError::CoreTableTooLong { .. }));
    }

    #[test]
    fn benchmark_configuration_detected() {
        let b = BenchmarkConfig {
            input_size: 32768,
            output_size: 16384,
            delay_us: 919,
        };
        let c = b.to_configuration();
        assert_eq!(c.encode_payload().len(), 16);
        let back = Configuration::parse(Bytes::from(c.encode_payload())).unwrap();
        assert_eq!(back.benchmark(), Some(b));
    }

    #[test]
    fn benchmark_configuration_needs_16_byte_sizes() {
        let c = BenchmarkConfig {
            input_size: 8,
            output_size: 16,
            delay_us: 0,
        }
        .to_configuration();
        assert!(matches!(
            Configuration::parse(Bytes::from(c.encode_payload())),
            Err(ProtocolError::BenchmarkTooSmall { .. })
        ));
    }

    #[test]
    fn input_counting() {
        let c = BenchmarkConfig {
            input_size: 16,
            output_size: 32,
            delay_us: 0,
        }
        .to_configuration();
        assert_eq!(c.count_inputs(48), Ok(3));
        assert!(c.count_inputs(47).is_err());
        assert!(c.count_inputs(0).is_err());
        assert_eq!(c.count_outputs(96), Ok(3));
    }

    #[test]
    fn data_and_outframe() {
        let f = OutFrame::data(7, Bytes::from_static(b"abcd"));
        let v = f.to_vec();
        assert_eq!(
            v,
            [3, 0, 0, 0, 8, 0, 0, 0, 7, 0, 0, 0, b'a', b'b', b'c', b'd']
        );
        let d = Data::parse(Bytes::copy_from_slice(&v[8..])).unwrap();
        assert_eq!(
            d,
            Data {
                id: 7,
                data: Bytes::from_static(b"abcd")
            }
        );
        // Advancing across the head/body boundary keeps the remaining bytes right.
        let mut f2 = f.clone();
        f2.advance(10);
        assert_eq!(f2.remaining(), 6);
        assert_eq!(f2.chunk(), &[0, 0]);
        f2.advance(3);
        assert_eq!(f2.chunk(), b"bcd");
    }

    #[test]
    fn error_message_round_trip() {
        let e = ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::NoNodes, "every node failed");
        let v = e.to_frame().to_vec();
        assert_eq!(ErrorMsg::parse(&v[8..]).unwrap(), e);
        assert!(e.to_string().contains("no-nodes"));
    }
}

/// Several frames written with one vectored write: a writer that finds more
/// than one frame queued sends them together (a result and the credit that
/// follows it cost one syscall, not two).
#[derive(Debug, Default)]
pub struct FrameBatch {
    frames: std::collections::VecDeque<OutFrame>,
    remaining: usize,
}

impl FrameBatch {
    /// Frames per batch: two iovecs each, well under IOV_MAX.
    pub const MAX_FRAMES: usize = 32;

    pub fn push(&mut self, f: OutFrame) {
        self.remaining += f.remaining();
        self.frames.push_back(f);
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.frames.len() >= Self::MAX_FRAMES
    }
}

impl Buf for FrameBatch {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.frames.front().map_or(&[], |f| f.chunk())
    }

    fn advance(&mut self, mut cnt: usize) {
        self.remaining -= cnt;
        while cnt > 0 {
            let f = self.frames.front_mut().expect("advance within remaining");
            let n = cnt.min(f.remaining());
            f.advance(n);
            cnt -= n;
            if !f.has_remaining() {
                self.frames.pop_front();
            }
        }
        while self.frames.front().is_some_and(|f| !f.has_remaining()) {
            self.frames.pop_front();
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut n = 0;
        for f in &self.frames {
            if n == dst.len() {
                break;
            }
            n += f.chunks_vectored(&mut dst[n..]);
        }
        n
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;

    #[test]
    fn batch_concatenates_frames_across_partial_advances() {
        let frames: Vec<OutFrame> = (0..5u32)
            .map(|i| OutFrame::data(i, Bytes::from(vec![i as u8; i as usize * 3])))
            .collect();
        let expect: Vec<u8> = frames.iter().flat_map(|f| f.to_vec()).collect();
        for step in [1usize, 5, 13, 100] {
            let mut b = FrameBatch::default();
            frames.iter().cloned().for_each(|f| b.push(f));
            let mut got = Vec::new();
            while b.has_remaining() {
                let mut slices = [std::io::IoSlice::new(&[]); 64];
                let cnt = b.chunks_vectored(&mut slices);
                let flat: Vec<u8> = slices[..cnt]
                    .iter()
                    .flat_map(|s| s.iter().copied())
                    .collect();
                assert_eq!(flat.len(), b.remaining());
                let n = step.min(flat.len());
                got.extend_from_slice(&flat[..n]);
                b.advance(n);
            }
            assert_eq!(got, expect, "step {step}");
            assert!(b.is_empty());
        }
    }
}

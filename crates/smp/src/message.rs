//! Typed SMP payloads. Parsing is check-then-parse: every length is checked
//! against the bytes actually present before anything is read or allocated,
//! so arbitrary input yields an error, never a panic.

use bytes::{Buf, Bytes};

use crate::error::{ErrorCode, ProtocolError};
use crate::header::MsgType;
use crate::hello::Hello;
use crate::outframe::OutFrame;
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

/// Most hardware cores one configuration may declare: more than any
/// design has, and a bound on what a node spends checking and starting a
/// table (a thread or worker process per core).
pub const MAX_CORES: u32 = 1024;

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
        if ncores > MAX_CORES {
            return Err(ProtocolError::TooManyCores {
                cores: ncores,
                max: MAX_CORES,
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

    /// Refused only if the bitstream makes the payload larger than a header can describe.
    pub fn to_frame(&self) -> Result<OutFrame, ProtocolError> {
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

    /// Checks that data for this configuration can travel on a link whose
    /// payloads are limited to `max_message` bytes: one input and one output
    /// (each after the 4-byte id) must fit, and a core configuration must
    /// produce output. Called where a configuration enters (server from a
    /// user, node from its server), so an impossible size is refused with a
    /// reason instead of surfacing later as a huge allocation.
    pub fn check_limits(&self, max_message: u32) -> Result<(), ProtocolError> {
        let room = (max_message as u64).saturating_sub(DATA_ID_LEN as u64);
        for (what, size) in [("input", self.input_size), ("output", self.output_size)] {
            if size as u64 > room {
                return Err(ProtocolError::SizeOverLimit {
                    what,
                    size,
                    max: max_message,
                });
            }
        }
        if self.output_size == 0 && self.benchmark().is_none() {
            return Err(ProtocolError::ZeroOutputSize);
        }
        Ok(())
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
        OutFrame::small(MsgType::ConfigurationResponse, &[self.status], Bytes::new())
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

    pub fn to_frame(&self) -> Result<OutFrame, ProtocolError> {
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
    /// Longest reason sent on the wire.
    pub const MAX_REASON: usize = 4096;

    /// `reason` cut to [`ErrorMsg::MAX_REASON`] bytes on a character
    /// boundary: what goes on the wire, and what a log line should hold of
    /// a reason a peer may have made long.
    pub fn clip(reason: &str) -> &str {
        let mut end = reason.len().min(Self::MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        &reason[..end]
    }

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

    /// The reason is cut to [`ErrorMsg::MAX_REASON`] bytes (on a character
    /// boundary): reasons often quote peer input, which must not make an
    /// error message unbounded.
    pub fn to_frame(&self) -> OutFrame {
        let mut p = [0u8; 8];
        p[..4].copy_from_slice(&self.id.to_le_bytes());
        p[4..].copy_from_slice(&self.code.to_le_bytes());
        let end = Self::clip(&self.reason).len();
        OutFrame::small(
            MsgType::Error,
            &p,
            Bytes::copy_from_slice(&self.reason.as_bytes()[..end]),
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
        OutFrame::small(MsgType::Credit, &self.messages.to_le_bytes(), Bytes::new())
    }
}

impl Hello {
    pub fn to_frame(&self) -> OutFrame {
        OutFrame::small(MsgType::Hello, &[], Bytes::from(self.encode()))
    }
}

/// Base address of the first core in the default core table.
pub const DEFAULT_CORE_BASE: u32 = 0xC000_0000;

/// The default core table (docs/images.md, "Default core table"): base [`DEFAULT_CORE_BASE`],
/// S = next power of two ≥ max(input_size, output_size, 4096); core i at
/// control = base + 4·S·i, input = control + S, output = control + 2·S.
/// Fails if the table would not fit the 32-bit address space.
pub fn default_core_table(
    n: u32,
    input_size: u32,
    output_size: u32,
) -> Result<Vec<CoreInfo>, ProtocolError> {
    let s = (input_size.max(output_size).max(4096) as u64).next_power_of_two();
    // Checked: 4 · 2^32 · (2^32 − 1) does not fit a u64.
    let end = (4 * s)
        .checked_mul(n as u64)
        .and_then(|w| w.checked_add(DEFAULT_CORE_BASE as u64));
    if end.is_none_or(|e| e > 1 << 32) {
        return Err(ProtocolError::CoreTable(format!(
            "{n} cores with {s}-byte windows do not fit the 32-bit address space above {DEFAULT_CORE_BASE:#x}"
        )));
    }
    Ok((0..n as u64)
        .map(|i| {
            let control = DEFAULT_CORE_BASE as u64 + 4 * s * i;
            CoreInfo {
                control: control as u32,
                input: (control + s) as u32,
                output: (control + 2 * s) as u32,
            }
        })
        .collect())
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
        let f = OutFrame::data(7, Bytes::from_static(b"abcd")).unwrap();
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

    #[test]
    fn limits_refuse_sizes_that_cannot_travel() {
        let bench = |i, o| {
            BenchmarkConfig {
                input_size: i,
                output_size: o,
                delay_us: 0,
            }
            .to_configuration()
        };
        assert!(bench(32, 0xFFFF_FFF0).check_limits(1 << 20).is_err());
        assert!(bench(1 << 20, 16).check_limits(1 << 20).is_err());
        assert!(bench((1 << 20) - 4, 16).check_limits(1 << 20).is_ok());
        // A core table of more than MAX_CORES is refused before it is built
        // (too large for the shared vectors' 1 KiB payloads).
        let many = Configuration {
            input_size: 16,
            output_size: 16,
            cores: vec![
                CoreInfo {
                    control: 0,
                    input: 0,
                    output: 0
                };
                MAX_CORES as usize + 1
            ],
            bitstream: Bytes::new(),
        };
        let e = Configuration::parse(many.encode_payload().into()).unwrap_err();
        assert_eq!(e.kind(), "too_many_cores");
        assert_eq!(e.code(), crate::ErrorCode::ConfigurationFailed);
        let most = Configuration {
            cores: many.cores[..MAX_CORES as usize].to_vec(),
            ..many
        };
        assert!(Configuration::parse(most.encode_payload().into()).is_ok());
        let mut c = Configuration::parse(cfg_payload(1, 12, b"xx")).unwrap();
        c.output_size = 0;
        assert_eq!(c.check_limits(1 << 20), Err(ProtocolError::ZeroOutputSize));
    }

    #[test]
    fn default_core_table_layout() {
        let t = default_core_table(2, 32768, 16384).unwrap();
        assert_eq!(t[1].control, 0xC000_0000 + 4 * 32768);
        assert_eq!(t[0].input, 0xC000_8000);
        assert!(default_core_table(64, 1 << 24, 16).is_err());
    }

    #[test]
    fn a_default_core_table_too_large_to_count_is_refused_not_wrapped() {
        // 4 · 2^32 · 2^30 bytes of windows is 2^64: the check must not
        // overflow (a panic in a debug build, a wrapped "fits" and a huge
        // table in a release one).
        for (n, size) in [(1 << 30, u32::MAX), (u32::MAX, u32::MAX), (u32::MAX, 1)] {
            let e = default_core_table(n, size, 16).unwrap_err();
            assert_eq!(e.kind(), "core_table", "{n} cores of {size} bytes");
        }
        assert_eq!(default_core_table(0, u32::MAX, u32::MAX).unwrap(), []);
    }
}

//! The chunk message (type 0x1D). Payload:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | message id (the data message's id) |
//! | 4 | 1 | flags: bit 0 first chunk, bit 1 last chunk; others 0 |
//! | 5 | 1 | class: 0 (most urgent) … 7 |
//! | 6 | 2 | reserved: 0 on output, ignored on input |
//! | 8 | 8 | offset of these bytes in the message's data |
//! | 16 | 8 | length of the message's data |
//! | 24 | … | the bytes |
//!
//! Every chunk repeats the whole message's length, so a receiver can check
//! each one on its own: the first starts at 0, the last ends at the length,
//! and only the last may be empty (a message of no data is one chunk).

use bytes::{Buf, Bytes};

use crate::error::ProtocolError;
use crate::header::{Header, MsgType, HEADER_LEN};
use crate::outframe::Inline;

pub const CHUNK_HEADER_LEN: usize = 24;
/// Priority classes: 0 is served first.
pub const CLASSES: u8 = 8;
/// The class of a data message sent whole (not as chunks) on a link that
/// negotiated chunks, and of every message of a peer that did not: the
/// middle, so that a user can mark work both more and less urgent.
pub const DEFAULT_CLASS: u8 = 4;
/// The chunk size a link uses unless the hello says otherwise, chosen by
/// benchmark (`bench suite streams` sweeps it): side by
/// side, 128 KiB chunks kept 0.95–0.98 of unchunked bulk throughput where
/// 64 KiB kept 0.90–0.94, and urgent messages behind that bulk waited no
/// longer (docs/benchmarks.md, "Streams").
pub const DEFAULT_CHUNK_SIZE: u32 = 128 * 1024;
/// The largest chunk size a server agrees to with a user that asks for
/// more than the default: larger chunks cost bulk messages less (fewer
/// frames and wake-ups) and urgent ones more (each waits behind up to a
/// few chunks), the trade-off the suite's chunk-size sweep measures.
pub const MAX_CHUNK_SIZE: u32 = 1 << 20;

const FIRST: u8 = 1;
const LAST: u8 = 2;

/// One chunk of a data message: its header and its data (`head.len` is
/// `data.len()`; [`Chunk::new`] sets it, and framing goes by the data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub head: ChunkHeader,
    pub data: Bytes,
}

fn bad(why: String) -> ProtocolError {
    ProtocolError::BadChunk(why)
}

/// A chunk's header and the length of its data: what a reader that puts
/// the data straight into its message's buffer checks before the data
/// has arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub id: u32,
    pub class: u8,
    pub first: bool,
    pub last: bool,
    pub offset: u64,
    pub total: u64,
    /// Bytes of the message's data this chunk carries.
    pub len: u64,
}

impl ChunkHeader {
    /// Refuses a chunk of more than `max` data bytes, the chunk size agreed
    /// on its link: every receiver of chunks holds them to it here, so a
    /// peer cannot make one frame carry more than the link agreed.
    pub fn within(&self, max: u64) -> Result<(), ProtocolError> {
        if self.len > max {
            return Err(bad(format!(
                "message {}: a chunk of {} bytes, over the {max} agreed",
                self.id, self.len
            )));
        }
        Ok(())
    }

    /// The header of `len` bytes at `offset` of message `id`'s `total`;
    /// whether it is the first or the last chunk follows from where it lies.
    pub fn at(id: u32, class: u8, offset: u64, total: u64, len: u64) -> ChunkHeader {
        ChunkHeader {
            id,
            class,
            first: offset == 0,
            last: offset.saturating_add(len) == total,
            offset,
            total,
            len,
        }
    }

    /// Parses the header of a chunk that carries `len` bytes of data and
    /// checks the rules every chunk obeys by itself.
    pub fn parse(h: &[u8; CHUNK_HEADER_LEN], len: usize) -> Result<ChunkHeader, ProtocolError> {
        let id = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes"));
        let (flags, class) = (h[4], h[5]);
        if flags & !(FIRST | LAST) != 0 {
            return Err(bad(format!("message {id}: unknown chunk flags {flags:#x}")));
        }
        let c = ChunkHeader {
            id,
            class,
            first: flags & FIRST != 0,
            last: flags & LAST != 0,
            offset: u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")),
            total: u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")),
            len: len as u64,
        };
        c.check()?;
        Ok(c)
    }

    /// The frame header and chunk header that go before this chunk's
    /// `len` bytes of data on the wire, checked as a receiver checks them:
    /// a writer that has the data elsewhere (borrowed memory) sends these
    /// and then the data, without gathering them into one buffer.
    pub fn encode(&self) -> Result<[u8; HEADER_LEN + CHUNK_HEADER_LEN], ProtocolError> {
        self.check()?;
        let len = (CHUNK_HEADER_LEN as u64).saturating_add(self.len);
        let size = u32::try_from(len).map_err(|_| ProtocolError::Unrepresentable(len as usize))?;
        let mut head = [0u8; HEADER_LEN + CHUNK_HEADER_LEN];
        head[..HEADER_LEN].copy_from_slice(&Header::new(MsgType::Chunk, size).encode());
        let h = &mut head[HEADER_LEN..];
        h[0..4].copy_from_slice(&self.id.to_le_bytes());
        h[4] = (u8::from(self.first) * FIRST) | (u8::from(self.last) * LAST);
        h[5] = self.class;
        h[8..16].copy_from_slice(&self.offset.to_le_bytes());
        h[16..24].copy_from_slice(&self.total.to_le_bytes());
        Ok(head)
    }

    /// The rules every chunk obeys by itself.
    fn check(&self) -> Result<(), ProtocolError> {
        let id = self.id;
        if self.class >= CLASSES {
            return Err(bad(format!(
                "message {id}: class {} (0 to {} exist)",
                self.class,
                CLASSES - 1
            )));
        }
        let end = self.offset.checked_add(self.len);
        if end.is_none_or(|e| e > self.total) {
            return Err(bad(format!(
                "message {id}: {} bytes at offset {} overrun its {} bytes",
                self.len, self.offset, self.total
            )));
        }
        if self.first != (self.offset == 0) {
            return Err(bad(format!(
                "message {id}: the first chunk must start at offset 0 (offset {})",
                self.offset
            )));
        }
        if self.last != (end == Some(self.total)) {
            return Err(bad(format!(
                "message {id}: the last chunk must end the message ({} of {} bytes)",
                end.unwrap_or(u64::MAX),
                self.total
            )));
        }
        if self.len == 0 && !self.last {
            return Err(bad(format!(
                "message {id}: an empty chunk that is not the last"
            )));
        }
        Ok(())
    }
}

impl Chunk {
    /// Check-then-parse of a chunk payload; the data is shared, not copied.
    pub fn parse(mut payload: Bytes) -> Result<Chunk, ProtocolError> {
        if payload.len() < CHUNK_HEADER_LEN {
            return Err(ProtocolError::Truncated {
                what: "chunk",
                got: payload.len(),
                need: CHUNK_HEADER_LEN,
            });
        }
        let h = payload[..CHUNK_HEADER_LEN].try_into().expect("checked");
        let h = ChunkHeader::parse(h, payload.len() - CHUNK_HEADER_LEN)?;
        payload.advance(CHUNK_HEADER_LEN);
        Ok(Chunk {
            head: h,
            data: payload,
        })
    }

    /// The chunk of message `id` that carries `data` at `offset` of its
    /// `total` bytes; whether it is the first or the last follows from
    /// where it lies.
    pub fn new(id: u32, class: u8, offset: u64, total: u64, data: Bytes) -> Chunk {
        let head = ChunkHeader::at(id, class, offset, total, data.len() as u64);
        Chunk { head, data }
    }

    /// This chunk's header, its length that of the data.
    pub fn header(&self) -> ChunkHeader {
        ChunkHeader {
            len: self.data.len() as u64,
            ..self.head
        }
    }

    /// The chunk ready to write: headers inline, data shared.
    pub fn to_frame(&self) -> Result<ChunkFrame, ProtocolError> {
        let head = self.header().encode()?;
        Ok(ChunkFrame::from_parts(
            head,
            HEADER_LEN + CHUNK_HEADER_LEN,
            self.data.clone(),
        ))
    }
}

/// A chunk on its way out (the same wire form as [`crate::OutFrame`]).
pub type ChunkFrame = Inline<{ HEADER_LEN + CHUNK_HEADER_LEN }>;

// A chunk frame is an `OutFrame`: the sinks that write data messages write
// chunks unchanged, without copying their data into a new buffer.
const _: () = assert!(CHUNK_HEADER_LEN == crate::outframe::MAX_PREFIX);

/// The chunks of one message, each at most `size` bytes of its data, in
/// order; every chunk shares the message's buffer.
#[derive(Debug, Clone)]
pub struct Chunks {
    id: u32,
    class: u8,
    data: Bytes,
    total: u64,
    size: usize,
    offset: u64,
    done: bool,
}

impl Chunks {
    /// `size` 0 is taken as 1; `class` must be below [`CLASSES`].
    pub fn new(id: u32, class: u8, data: Bytes, size: usize) -> Result<Chunks, ProtocolError> {
        if class >= CLASSES {
            return Err(bad(format!("message {id}: class {class} (0 to 7 exist)")));
        }
        Ok(Chunks {
            id,
            class,
            total: data.len() as u64,
            data,
            size: size.max(1),
            offset: 0,
            done: false,
        })
    }
}

impl Iterator for Chunks {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        if self.done {
            return None;
        }
        let n = self.size.min(self.data.len());
        let data = self.data.split_to(n);
        let c = Chunk::new(self.id, self.class, self.offset, self.total, data);
        self.offset += n as u64;
        self.done = c.head.last;
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(c: &Chunk) -> Bytes {
        Bytes::from(c.to_frame().unwrap().to_vec()[HEADER_LEN..].to_vec())
    }

    #[test]
    fn a_message_cut_and_parsed_back_shares_its_buffer() {
        let data = Bytes::from((0..=255u8).cycle().take(1000).collect::<Vec<u8>>());
        let chunks: Vec<Chunk> = Chunks::new(7, 3, data.clone(), 300).unwrap().collect();
        assert_eq!(
            chunks
                .iter()
                .map(|c| (c.head.offset, c.data.len(), c.head.first, c.head.last))
                .collect::<Vec<_>>(),
            [
                (0, 300, true, false),
                (300, 300, false, false),
                (600, 300, false, false),
                (900, 100, false, true)
            ]
        );
        // Zero copy: each chunk points into the message's buffer.
        assert_eq!(chunks[1].data.as_ptr(), data[300..].as_ptr());
        for c in &chunks {
            assert_eq!(&Chunk::parse(wire(c)).unwrap(), c);
        }
        let empty: Vec<Chunk> = Chunks::new(1, 0, Bytes::new(), 64).unwrap().collect();
        assert_eq!(empty.len(), 1);
        let h = empty[0].head;
        assert!(h.first && h.last && h.total == 0);
        assert_eq!(Chunk::parse(wire(&empty[0])).unwrap(), empty[0]);
    }

    #[test]
    fn chunks_that_break_a_rule_are_refused_with_the_reason() {
        let good = Chunk::new(5, 1, 0, 10, Bytes::from_static(b"abcd"));
        let raw = |f: &dyn Fn(&mut [u8])| {
            let mut v = wire(&good).to_vec();
            f(&mut v);
            Chunk::parse(Bytes::from(v)).unwrap_err().to_string()
        };
        assert!(raw(&|v| v[4] |= 4).contains("unknown chunk flags"));
        assert!(raw(&|v| v[5] = 8).contains("class 8"));
        assert!(raw(&|v| v[16] = 3).contains("overrun"));
        assert!(raw(&|v| v[4] = 0).contains("first chunk must start"));
        assert!(raw(&|v| v[16] = 4).contains("last chunk must end"));
        assert!(raw(&|v| v[8..16].copy_from_slice(&u64::MAX.to_le_bytes())).contains("overrun"));
        let e = Chunk::parse(Bytes::from_static(&[0; 23])).unwrap_err();
        assert_eq!(e.kind(), "truncated");
        let empty_middle = Chunk::new(5, 1, 4, 10, Bytes::new());
        assert!(empty_middle.to_frame().is_err());
        assert!(Chunks::new(1, 8, Bytes::new(), 4).is_err());
    }
}

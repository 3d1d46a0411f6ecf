//! Putting chunked messages back together. A link delivers the chunks of
//! one message in order (TCP), interleaved with other messages' chunks;
//! everything else — a chunk of a message never opened, a gap, a length or
//! class that changes midway — is a protocol error that ends the link.
//! What a peer can make the receiver hold is bounded twice: messages open
//! at once, and bytes held across them (a peer cannot reserve memory by
//! announcing a large length: buffers grow with the bytes that arrive,
//! unless [`Reassembler::reserve_whole`] counts the announced length as
//! held from the first chunk).

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};

use super::chunk::{Chunk, ChunkHeader};
use super::place::Place;
use crate::error::ProtocolError;

/// A whole message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: u32,
    pub class: u8,
    pub data: Bytes,
}

struct Partial {
    class: u8,
    total: u64,
    /// A `Vec`, not a `BytesMut`: a whole reservation can fail with an
    /// error (`try_reserve_exact`) instead of aborting, and it becomes
    /// `Bytes` without a copy.
    buf: Vec<u8>,
    /// Bytes counted in `held` for this message: what arrived, or its
    /// whole length once reserved.
    charged: u64,
}

pub struct Reassembler {
    max_message: u64,
    max_open: usize,
    max_held: u64,
    open: HashMap<u32, Partial>,
    held: u64,
    /// See [`Reassembler::with_id_prefix`].
    prefix: usize,
    /// See [`Reassembler::preallocate`].
    prealloc: u64,
    /// See [`Reassembler::reserve_whole`].
    reserve: bool,
    /// See [`Reassembler::chunk_limit`].
    max_chunk: u64,
}

fn bad(why: String) -> ProtocolError {
    ProtocolError::BadChunk(why)
}

/// A whole message as the data message it stands for (its class aside).
impl From<Message> for crate::Data {
    fn from(m: Message) -> Self {
        crate::Data {
            id: m.id,
            data: m.data,
        }
    }
}

impl Reassembler {
    /// Messages of at most `max_message` bytes, at most `max_open` of them
    /// incomplete at once, holding at most `max_held` bytes between them.
    pub fn new(max_message: u64, max_open: usize, max_held: u64) -> Self {
        Reassembler {
            max_message,
            max_open,
            max_held,
            open: HashMap::new(),
            held: 0,
            prefix: 0,
            prealloc: 0,
            reserve: false,
            max_chunk: u64::MAX,
        }
    }

    /// Whole messages come out as a data message's payload, the 4-byte id
    /// then the data, so a receiver hands them on like a data frame it read
    /// whole (a message of one chunk is then copied once; only small
    /// messages outside the default class travel as one chunk).
    pub fn with_id_prefix(mut self) -> Self {
        self.prefix = crate::DATA_ID_LEN;
        self
    }

    /// A message's buffer is allocated for up to `bytes` of its announced
    /// length at its first chunk, instead of growing with what arrives: for
    /// a receiver that has already accounted for the whole length (a node's
    /// memory guard), so large messages are not copied as their buffer grows.
    pub fn preallocate(mut self, bytes: u64) -> Self {
        self.prealloc = bytes;
        self
    }

    /// A message's buffer is its whole announced length, allocated and
    /// counted as held at its first chunk: chunks are copied into place
    /// and the buffer never grows. For a receiver of untrusted peers (a
    /// user link): growing a 16 MiB message's buffer copied megabytes at
    /// once and held the receiving task for milliseconds, and every urgent
    /// message behind it (bench/manual/streams.md); counting the
    /// reservation keeps what a peer can make it reserve within the
    /// held-bytes bound, and a reservation the allocator refuses is an
    /// error, not an abort.
    pub fn reserve_whole(mut self) -> Self {
        self.reserve = true;
        self
    }

    /// Chunks of at most `max` data bytes, the size agreed on the link: a
    /// larger one is an error, placed or pushed.
    pub fn chunk_limit(mut self, max: u64) -> Self {
        self.max_chunk = max;
        self
    }

    /// Messages begun and not finished.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// Bytes held for unfinished messages.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Takes the next chunk; returns the message it completes. A message
    /// of one chunk is handed on without a copy.
    pub fn push(&mut self, c: Chunk) -> Result<Option<Message>, ProtocolError> {
        let id = c.head.id;
        self.check(&c.header())?;
        if c.head.first {
            if c.head.last {
                // `open_message` makes this check for longer messages.
                if self.open.contains_key(&id) {
                    return Err(bad(format!(
                        "message {id} begun again before its last chunk"
                    )));
                }
                let data = if self.prefix == 0 {
                    c.data
                } else {
                    let mut b = BytesMut::with_capacity(self.prefix + c.data.len());
                    b.extend_from_slice(&id.to_le_bytes());
                    b.extend_from_slice(&c.data);
                    b.freeze()
                };
                return Ok(Some(Message {
                    id,
                    class: c.head.class,
                    data,
                }));
            }
            self.open_message(&c.header())?
                .buf
                .extend_from_slice(&c.data);
            return Ok(None);
        }
        let p = self.take(&c.header())?;
        p.buf.extend_from_slice(&c.data);
        if !c.head.last {
            return Ok(None);
        }
        Ok(Some(self.finish(id)))
    }

    /// Opens the message a first chunk (not also its last) begins: checks
    /// the bounds on open messages and held bytes, counts the chunk (with
    /// `reserve_whole`, the whole message) as held, and allocates its
    /// buffer, which holds the id prefix if any and room for the chunk.
    fn open_message(&mut self, h: &ChunkHeader) -> Result<&mut Partial, ProtocolError> {
        let id = h.id;
        if self.open.contains_key(&id) {
            return Err(bad(format!(
                "message {id} begun again before its last chunk"
            )));
        }
        if self.open.len() >= self.max_open {
            return Err(bad(format!(
                "message {id}: more than {} messages open at once",
                self.max_open
            )));
        }
        let len = h.len;
        let charged = if self.reserve { h.total.max(len) } else { len };
        self.hold(id, charged)?;
        let mut buf = Vec::new();
        let reserved = if self.reserve {
            buf.try_reserve_exact(self.prefix + charged as usize)
        } else {
            let cap = (len * 2).max(h.total.min(self.prealloc));
            buf.try_reserve(self.prefix + cap as usize)
        };
        if reserved.is_err() {
            self.held -= charged;
            return Err(bad(format!(
                "message {id}: cannot allocate {} bytes for it",
                h.total
            )));
        }
        if self.prefix > 0 {
            buf.extend_from_slice(&id.to_le_bytes());
        }
        let p = Partial {
            class: h.class,
            total: h.total,
            buf,
            charged,
        };
        Ok(self.open.entry(id).or_insert(p))
    }

    /// Checks a chunk that continues an open message against it and counts
    /// its bytes as held: the message, ready for the chunk's data.
    fn take(&mut self, c: &ChunkHeader) -> Result<&mut Partial, ProtocolError> {
        let id = c.id;
        let Some(p) = self.open.get(&id) else {
            return Err(bad(format!(
                "chunk at offset {} of message {id}, which was not begun",
                c.offset
            )));
        };
        if (c.total, c.class) != (p.total, p.class) {
            return Err(bad(format!(
                "message {id} changed from {} bytes in class {} to {} bytes in class {}",
                p.total, p.class, c.total, c.class
            )));
        }
        let at = (p.buf.len() - self.prefix) as u64;
        if c.offset != at {
            return Err(bad(format!(
                "message {id}: chunk at offset {}, expected {at}",
                c.offset
            )));
        }
        let grown = (at + c.len).saturating_sub(p.charged);
        if grown > 0 {
            self.hold(id, grown)?;
        }
        let p = self.open.get_mut(&id).expect("checked");
        p.charged += grown;
        Ok(p)
    }

    /// Closes a message whose last chunk is in.
    fn finish(&mut self, id: u32) -> Message {
        let p = self.open.remove(&id).expect("an open message");
        self.held -= p.charged;
        Message {
            id,
            class: p.class,
            data: Bytes::from(p.buf),
        }
    }

    /// The bounds any chunk is held to, whichever way it is read: its
    /// length, and the length its message announces.
    fn check(&self, h: &ChunkHeader) -> Result<(), ProtocolError> {
        h.within(self.max_chunk)?;
        if h.total > self.max_message {
            return Err(bad(format!(
                "message {} of {} bytes exceeds the limit of {} bytes",
                h.id, h.total, self.max_message
            )));
        }
        Ok(())
    }

    /// Where an open message's bytes are (a test sees whether they moved).
    #[cfg(test)]
    pub(crate) fn buffer_at(&self, id: u32) -> Option<*const u8> {
        self.open.get(&id).map(|p| p.buf.as_ptr())
    }

    fn hold(&mut self, id: u32, len: u64) -> Result<(), ProtocolError> {
        if self.held + len > self.max_held {
            return Err(bad(format!(
                "message {id}: over {} bytes of unfinished messages held",
                self.max_held
            )));
        }
        self.held += len;
        Ok(())
    }
}

/// Every open message is placed: its buffer is where its data ends up.
// SAFETY: a message's buffer lives in its `Open` entry from its first
// chunk until it completes or is dropped with the message; only the reader
// extends it (`try_reserve` reserves once, before the first placed read).
unsafe impl Place for Reassembler {
    type Whole = Message;

    /// A message of one chunk stays a frame: handed on as it came, it is
    /// not copied at all.
    fn begin(&mut self, h: &ChunkHeader) -> Result<Option<&mut Vec<u8>>, ProtocolError> {
        if h.last {
            return Ok(None);
        }
        self.check(h)?;
        Ok(Some(&mut self.open_message(h)?.buf))
    }

    fn place(&mut self, h: &ChunkHeader) -> Result<Option<&mut Vec<u8>>, ProtocolError> {
        self.check(h)?;
        let p = self.take(h)?;
        // Grows as `push` would (amortised); a refused growth is an error.
        if p.buf.try_reserve(h.len as usize).is_err() {
            return Err(bad(format!(
                "message {}: cannot allocate {} bytes for it",
                h.id, h.total
            )));
        }
        Ok(Some(&mut p.buf))
    }

    fn resume(&mut self, id: u32) -> Option<&mut Vec<u8>> {
        self.open.get_mut(&id).map(|p| &mut p.buf)
    }

    fn placed(&mut self, h: &ChunkHeader) -> Option<Message> {
        h.last.then(|| self.finish(h.id))
    }
}

#[cfg(test)]
mod tests {
    use super::super::chunk::Chunks;
    use super::*;

    fn chunks(id: u32, class: u8, n: usize, size: usize) -> Vec<Chunk> {
        let data = Bytes::from(
            (0..n)
                .map(|i| (i * 7 + id as usize) as u8)
                .collect::<Vec<u8>>(),
        );
        Chunks::new(id, class, data, size).unwrap().collect()
    }

    #[test]
    fn interleaved_messages_come_out_whole_and_the_held_bytes_go_back_to_zero() {
        let mut r = Reassembler::new(1 << 20, 4, 1 << 20);
        let (a, b) = (chunks(1, 5, 1000, 256), chunks(2, 0, 100, 64));
        let mut out = Vec::new();
        for c in [&a[0], &b[0], &a[1], &b[1], &a[2], &a[3]] {
            out.extend(r.push(c.clone()).unwrap());
        }
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].id, out[0].class, out[0].data.len()), (2, 0, 100));
        assert_eq!((out[1].id, out[1].class, out[1].data.len()), (1, 5, 1000));
        let whole: Vec<u8> = a.iter().flat_map(|c| c.data.to_vec()).collect();
        assert_eq!(out[1].data, whole);
        assert_eq!((r.open(), r.held()), (0, 0));
        // One chunk: handed on as it came.
        let one = chunks(3, 1, 10, 64);
        let m = r.push(one[0].clone()).unwrap().unwrap();
        assert_eq!(m.data.as_ptr(), one[0].data.as_ptr());
    }

    #[test]
    fn with_an_id_prefix_messages_come_out_as_data_payloads() {
        let mut r = Reassembler::new(1 << 20, 4, 1 << 20)
            .with_id_prefix()
            .preallocate(1 << 20);
        let a = chunks(0x0102_0304, 1, 1000, 300);
        let mut out = None;
        for c in &a {
            out = r.push(c.clone()).unwrap();
        }
        let m = out.unwrap();
        let whole: Vec<u8> = a.iter().flat_map(|c| c.data.to_vec()).collect();
        assert_eq!(&m.data[..4], &0x0102_0304u32.to_le_bytes());
        assert_eq!(&m.data[4..], &whole[..]);
        assert_eq!((r.open(), r.held()), (0, 0));
        let one = chunks(9, 0, 10, 64);
        let m = r.push(one[0].clone()).unwrap().unwrap();
        assert_eq!(
            (&m.data[..4], &m.data[4..]),
            (&[9u8, 0, 0, 0][..], &one[0].data[..])
        );
    }

    #[test]
    fn what_a_peer_can_make_it_hold_is_bounded_and_misordered_chunks_refused() {
        let big = chunks(1, 0, 4000, 1000);
        let mut r = Reassembler::new(3000, 4, 1 << 20);
        assert!(r
            .push(big[0].clone())
            .unwrap_err()
            .to_string()
            .contains("exceeds the limit"));

        let mut r = Reassembler::new(1 << 20, 2, 1500);
        r.push(chunks(1, 0, 4000, 1000)[0].clone()).unwrap();
        r.push(chunks(2, 0, 4000, 400)[0].clone()).unwrap();
        let e = r.push(chunks(3, 0, 4000, 10)[0].clone()).unwrap_err();
        assert!(e.to_string().contains("more than 2 messages open"), "{e}");
        let e = r.push(chunks(2, 0, 4000, 400)[1].clone()).unwrap_err();
        assert!(e.to_string().contains("over 1500 bytes"), "{e}");

        let mut r = Reassembler::new(1 << 20, 4, 1 << 20);
        let m = chunks(9, 2, 300, 100);
        let e = r.push(m[1].clone()).unwrap_err();
        assert!(e.to_string().contains("not begun"), "{e}");
        r.push(m[0].clone()).unwrap();
        let e = r.push(m[2].clone()).unwrap_err();
        assert!(e.to_string().contains("offset 200, expected 100"), "{e}");
        let e = r.push(m[0].clone()).unwrap_err();
        assert!(e.to_string().contains("begun again"), "{e}");
        let mut other_class = m[1].clone();
        other_class.head.class = 3;
        let e = r.push(other_class).unwrap_err();
        assert!(
            e.to_string().contains("changed from 300 bytes in class 2"),
            "{e}"
        );
    }

    #[test]
    fn a_reserved_message_is_copied_into_place_and_its_length_held_from_the_first_chunk() {
        let m = chunks(4, 7, 1 << 20, 64 << 10);
        let mut r = Reassembler::new(2 << 20, 4, 2 << 20).reserve_whole();
        assert!(r.push(m[0].clone()).unwrap().is_none());
        assert_eq!(r.held(), 1 << 20, "the whole length is held at once");
        let at = r.buffer_at(4).unwrap();
        let mut out = None;
        for c in &m[1..] {
            out = r.push(c.clone()).unwrap();
            if out.is_none() {
                assert_eq!(r.buffer_at(4), Some(at), "the buffer grew");
            }
        }
        let out = out.unwrap();
        assert_eq!(out.data.as_ptr(), at, "handed on without a copy");
        let whole: Vec<u8> = m.iter().flat_map(|c| c.data.to_vec()).collect();
        assert_eq!(out.data, whole);
        assert_eq!((r.open(), r.held()), (0, 0));
        // Announcing more than may be held fails at the first chunk.
        r.push(chunks(5, 0, 1 << 20, 1000)[0].clone()).unwrap();
        let e = r
            .push(chunks(6, 0, (1 << 20) + 1, 1000)[0].clone())
            .unwrap_err();
        assert!(e.to_string().contains("over 2097152 bytes"), "{e}");
        assert_eq!(r.held(), 1 << 20);
    }

    #[test]
    fn a_first_chunk_opened_in_place_is_checked_and_held_as_push_would() {
        let cs = chunks(4, 2, 3000, 1000);
        let mut r = Reassembler::new(1 << 20, 1, 1 << 20).reserve_whole();
        // A message of one chunk stays a frame.
        let one = chunks(5, 2, 10, 64);
        assert!(r.begin(&one[0].header()).unwrap().is_none());
        let buf = r.begin(&cs[0].header()).unwrap().expect("opened");
        assert!(buf.is_empty() && buf.capacity() >= 3000);
        buf.extend_from_slice(&cs[0].data);
        assert!(r.placed(&cs[0].header()).is_none());
        // The whole message is held from its first chunk.
        assert_eq!((r.open(), r.held()), (1, 3000));
        // Begun twice, or one message too many: push's errors.
        let e = r.begin(&cs[0].header()).unwrap_err();
        assert!(e.to_string().contains("begun again"), "{e}");
        let other = chunks(6, 2, 3000, 1000);
        let e = r.begin(&other[0].header()).unwrap_err();
        assert!(e.to_string().contains("more than 1 messages open"), "{e}");
        for c in &cs[1..] {
            let buf = r.place(&c.header()).unwrap().unwrap();
            buf.extend_from_slice(&c.data);
        }
        let m = r.placed(&cs[2].header()).expect("whole");
        let whole: Vec<u8> = cs.iter().flat_map(|c| c.data.to_vec()).collect();
        assert_eq!(m.data, whole);
        assert_eq!((r.open(), r.held()), (0, 0));
    }
}

//! Messages on their way out: [`OutFrame`] keeps the header and a short
//! fixed prefix inline and the body as a shared `Bytes`, so forwarding a
//! payload never copies it; [`FrameBatch`] lets a writer send several queued
//! frames with one vectored write.

use bytes::{Buf, Bytes};

use crate::error::ProtocolError;
use crate::header::{Header, MsgType, HEADER_LEN};

/// Longest fixed prefix (id, status, code, a chunk's header...) an
/// [`OutFrame`] carries inline: 24 so that a chunk (type 0x1D) is an
/// `OutFrame` too and goes through every writer without its data copied.
pub const MAX_PREFIX: usize = 24;
const HEAD_CAP: usize = HEADER_LEN + MAX_PREFIX;

/// Up to `N` bytes of headers inline and a shared body: the wire form of
/// every outgoing message type ([`OutFrame`], [`crate::peer::PeerFrame`]).
/// Implements [`Buf`] with vectored chunks, so a writer sends headers and
/// body in one `writev` without copying the body.
#[derive(Debug, Clone)]
pub struct Inline<const N: usize> {
    head: [u8; N],
    head_len: u8,
    head_pos: u8,
    body: Bytes,
}

impl<const N: usize> Inline<N> {
    /// `head_len` bytes of `head` (at most `N`, at most 255) then `body`.
    pub(crate) fn from_parts(head: [u8; N], head_len: usize, body: Bytes) -> Self {
        debug_assert!(head_len <= N && head_len <= u8::MAX as usize);
        Inline {
            head,
            head_len: head_len.min(N) as u8,
            head_pos: 0,
            body,
        }
    }

    /// The inline headers, for in-place rewrites (a forwarded hop count).
    pub(crate) fn head_mut(&mut self) -> &mut [u8; N] {
        &mut self.head
    }

    /// Total bytes on the wire.
    pub fn wire_len(&self) -> usize {
        self.head_len as usize + self.body.len()
    }

    /// A frame not yet begun on the wire: the inline part of its payload
    /// (the headers after the SMP header) and its shared body, so a link
    /// can cut any message into chunks without copying the body.
    pub fn payload_parts(&self) -> Option<(&[u8], &Bytes)> {
        (self.head_pos == 0 && self.head_len as usize >= HEADER_LEN)
            .then(|| (&self.head[HEADER_LEN..self.head_len as usize], &self.body))
    }

    /// The whole encoded message as one contiguous buffer (tests, small frames).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.wire_len());
        v.extend_from_slice(&self.head[..self.head_len as usize]);
        v.extend_from_slice(&self.body);
        v
    }
}

impl<const N: usize> Buf for Inline<N> {
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

    fn advance(&mut self, cnt: usize) {
        let h = cnt.min((self.head_len - self.head_pos) as usize);
        self.head_pos += h as u8;
        self.body.advance(cnt - h);
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

/// A message ready to be written: header and a short fixed prefix inline
/// (id, status, code), the body shared.
pub type OutFrame = Inline<HEAD_CAP>;

impl OutFrame {
    /// Frame carrying `payload`; refused if the payload cannot be described
    /// by the header's `u32` size.
    pub fn new(ty: MsgType, payload: Bytes) -> Result<Self, ProtocolError> {
        Self::with_prefix(ty, &[], payload)
    }

    /// Frame whose payload is `prefix` (at most [`MAX_PREFIX`] bytes)
    /// followed by `body`.
    pub fn with_prefix(ty: MsgType, prefix: &[u8], body: Bytes) -> Result<Self, ProtocolError> {
        if prefix.len() > MAX_PREFIX {
            return Err(ProtocolError::PrefixTooLong(prefix.len()));
        }
        let len = prefix.len() + body.len();
        let size = u32::try_from(len).map_err(|_| ProtocolError::Unrepresentable(len))?;
        Ok(Self::build(ty, prefix, size, body))
    }

    /// Data message with the given id and body.
    pub fn data(id: u32, body: Bytes) -> Result<Self, ProtocolError> {
        Self::with_prefix(MsgType::Data, &id.to_le_bytes(), body)
    }

    /// A data message not yet begun on the wire: its id and body (the body
    /// shared), so a link that negotiated chunks can send it as chunks.
    pub fn as_data(&self) -> Option<(u32, &Bytes)> {
        let whole = self.head_pos == 0 && self.head_len as usize == HEADER_LEN + 4;
        (whole && self.head[0] == MsgType::Data as u8).then(|| {
            let id =
                u32::from_le_bytes(self.head[HEADER_LEN..HEADER_LEN + 4].try_into().expect("4"));
            (id, &self.body)
        })
    }

    /// Frames whose size is bounded by construction (responses, credits,
    /// errors with a capped reason, hellos): a body that could not be
    /// described is cut to what can, so this never panics, and a peer sees at
    /// worst a malformed message it rejects.
    pub(crate) fn small(ty: MsgType, prefix: &[u8], mut body: Bytes) -> Self {
        let prefix = &prefix[..prefix.len().min(MAX_PREFIX)];
        let room = u32::MAX as usize - prefix.len();
        body.truncate(room);
        let size = (prefix.len() + body.len()) as u32;
        Self::build(ty, prefix, size, body)
    }

    fn build(ty: MsgType, prefix: &[u8], size: u32, body: Bytes) -> Self {
        let mut head = [0u8; HEAD_CAP];
        head[..HEADER_LEN].copy_from_slice(&Header::new(ty, size).encode());
        head[HEADER_LEN..HEADER_LEN + prefix.len()].copy_from_slice(prefix);
        Inline::from_parts(head, HEADER_LEN + prefix.len(), body)
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
mod tests {
    use super::*;

    #[test]
    fn oversized_prefix_is_an_error_not_a_panic() {
        assert_eq!(
            OutFrame::with_prefix(MsgType::Data, &[0; 25], Bytes::new()).unwrap_err(),
            ProtocolError::PrefixTooLong(25)
        );
    }

    #[test]
    fn small_frames_are_byte_exact() {
        let f = OutFrame::small(MsgType::Credit, &7u32.to_le_bytes(), Bytes::new());
        assert_eq!(f.to_vec(), [0x12, 0, 0, 0, 4, 0, 0, 0, 7, 0, 0, 0]);
    }

    #[test]
    fn batch_concatenates_frames_across_partial_advances() {
        let frames: Vec<OutFrame> = (0..5u32)
            .map(|i| OutFrame::data(i, Bytes::from(vec![i as u8; i as usize * 3])).unwrap())
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

//! Reading a run of one message's chunks with one syscall.
//!
//! A placing reader reads each chunk's data straight into its message's
//! buffer, which costs one `recv` per chunk: with 64 KiB chunks, most of
//! what a bulk message costs beyond an unchunked one (every read also sends
//! the peer a window update). On a TCP socket, the read that finishes a
//! chunk therefore also asks for the next chunks of the same message,
//! guessing that they follow back to back: their headers into small
//! arrays, their data into the message's buffer right after the chunk
//! being placed (`readv`). What the guess got wrong (another frame came
//! next, or a shorter chunk) goes back to the decoder in stream order, as
//! the bytes past a placed chunk always have.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::CHUNK_HEAD;
use crate::header::{Header, MsgType, HEADER_LEN};
use crate::stream::{ChunkHeader, CHUNK_HEADER_LEN};

/// A stream whose reads may fill several buffers with one syscall.
pub trait ReadVectored {
    /// The TCP socket under the stream, if it is one; streams without one
    /// (TLS sessions, in-memory pipes) read one buffer at a time.
    fn tcp(&self) -> Option<&TcpStream> {
        None
    }
}

impl ReadVectored for TcpStream {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

impl ReadVectored for tokio::net::tcp::OwnedReadHalf {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl ReadVectored for tokio::io::DuplexStream {}
/// A split stream (TLS) reads through its lock, one buffer at a time.
impl<T> ReadVectored for tokio::io::ReadHalf<T> {}
impl ReadVectored for &[u8] {}

/// Most chunks one read takes beyond the one it finishes: at the default
/// 128 KiB, 1 MiB, more than a loopback socket's receive buffer usually
/// holds at once (a read takes what is there).
pub(crate) const RUN: usize = 8;

/// Chunks read ahead of their turn, all of the message being placed.
#[derive(Debug, Default)]
pub(crate) struct Ahead {
    /// Each chunk's checked header, where its data starts in the message's
    /// buffer, and how many of its data bytes are there.
    pub(crate) chunks: VecDeque<(ChunkHeader, usize, usize)>,
    /// The buffer's address when they were read: a buffer that moved
    /// since lost them.
    pub(crate) at: usize,
    heads: [[u8; CHUNK_HEAD]; RUN],
    /// Chunks taken ahead so far.
    #[cfg(test)]
    pub(crate) taken: usize,
}

/// The data sizes to ask for after the chunk being placed: chunks like it
/// (`len` bytes), as many as the message has left (`left` bytes) and its
/// buffer can hold (`room`), at most [`RUN`]. On the stack: this runs on
/// every read of a chunk's data.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    len: [usize; RUN],
    n: usize,
}

impl Slots {
    pub(crate) fn new(len: u64, left: u64, room: usize) -> Slots {
        let mut s = Slots::default();
        let mut end = left.min(room as u64);
        while end > 0 && s.n < RUN && len > 0 {
            let l = end.min(len);
            s.len[s.n] = l as usize;
            s.n += 1;
            end -= l;
        }
        s
    }

    pub(crate) fn as_slice(&self) -> &[usize] {
        &self.len[..self.n]
    }
}

/// One part of what a run read, in stream order.
#[derive(Clone, Copy)]
enum Seg {
    /// `n` bytes into the message's buffer at `at`.
    Data { at: usize, n: usize },
    /// `n` bytes into header array `i`.
    Head { i: usize, n: usize },
}

impl Ahead {
    /// Reads the `rest` bytes of the chunk being placed into `buf` (after
    /// its length), then a header and `slots[i]` bytes of data for each
    /// slot, the data laid out back to back after `end` (the chunk's end).
    /// Returns the bytes read, 0 at the end of the stream.
    pub(crate) async fn read(
        &mut self,
        tcp: &TcpStream,
        buf: &mut Vec<u8>,
        rest: usize,
        end: usize,
        slots: &[usize],
    ) -> io::Result<usize> {
        // Checked in release builds too: the `readv` below writes there.
        assert!(slots.len() <= RUN && buf.len() + rest == end);
        assert!(end + slots.iter().sum::<usize>() <= buf.capacity());
        let fd = tcp.as_raw_fd();
        let n = loop {
            tcp.readable().await?;
            // Raw pointers are made per attempt, not held across the wait
            // (the future stays `Send`).
            match tcp.try_io(Interest::READABLE, || self.readv(fd, buf, rest, end, slots)) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        let (len, got) = (buf.len(), n.min(rest));
        // SAFETY: the kernel wrote the first `got` bytes after `len`.
        unsafe { buf.set_len(len + got) };
        self.at = buf.as_ptr() as usize;
        Ok(n)
    }

    /// The `readv` of [`Ahead::read`].
    fn readv(
        &mut self,
        fd: i32,
        buf: &mut Vec<u8>,
        rest: usize,
        end: usize,
        slots: &[usize],
    ) -> io::Result<usize> {
        let base = buf.as_mut_ptr();
        let none = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut iov = [none; 2 * RUN + 1];
        // SAFETY (pointer offsets): every data range lies within the
        // buffer's capacity (asserted by the caller), past its length.
        iov[0] = libc::iovec {
            iov_base: unsafe { base.add(buf.len()) }.cast(),
            iov_len: rest,
        };
        let mut at = end;
        for (i, &s) in slots.iter().enumerate() {
            iov[1 + 2 * i] = libc::iovec {
                iov_base: self.heads[i].as_mut_ptr().cast(),
                iov_len: CHUNK_HEAD,
            };
            iov[2 + 2 * i] = libc::iovec {
                iov_base: unsafe { base.add(at) }.cast(),
                iov_len: s,
            };
            at += s;
        }
        let used = 1 + 2 * slots.len();
        // SAFETY: the iovecs point into `buf`'s spare capacity and into
        // `self.heads`, both borrowed mutably for this call.
        let r = unsafe { libc::readv(fd, iov.as_ptr(), used as libc::c_int) };
        match r {
            r if r < 0 => Err(io::Error::last_os_error()),
            r => Ok(r as usize),
        }
    }

    /// Takes the `extra` bytes a run read past the placed chunk (`head`,
    /// ending at `end` in the buffer): the chunks of the same message it
    /// guessed right go into `self.chunks`; from the first wrong guess on,
    /// the bytes go to `put_back` in stream order.
    #[allow(clippy::too_many_arguments, clippy::ptr_arg)] // the Vec: see `buf_slice`
    pub(crate) fn take(
        &mut self,
        head: &ChunkHeader,
        buf: &Vec<u8>,
        end: usize,
        extra: usize,
        slots: &[usize],
        max_payload: u32,
        mut put_back: impl FnMut(&[u8]),
    ) {
        // What the read filled, in stream order.
        let mut segs = [Seg::Data { at: 0, n: 0 }; 2 * RUN];
        let (mut left, mut at) = (extra, end);
        for (i, &s) in slots.iter().enumerate() {
            let h = CHUNK_HEAD.min(left);
            left -= h;
            let d = s.min(left);
            left -= d;
            segs[2 * i] = Seg::Head { i, n: h };
            segs[2 * i + 1] = Seg::Data { at, n: d };
            at += s;
        }
        let segs = &segs[..2 * slots.len()];
        let (mut offset, mut k) = (head.offset + head.len, 0);
        while k + 1 < segs.len() {
            let (Seg::Head { i, n: hn }, Seg::Data { at, n: dn }) = (segs[k], segs[k + 1]) else {
                unreachable!("header then data");
            };
            let h = (hn == CHUNK_HEAD)
                .then(|| continuation(&self.heads[i], max_payload, head, offset))
                .flatten();
            // A longer chunk than its slot would need its data moved: read
            // on as the decoder reads any chunk.
            let Some(h) = h.filter(|h| h.len as usize <= slots[i]) else {
                break;
            };
            let used = dn.min(h.len as usize);
            self.chunks.push_back((h, at, used));
            #[cfg(test)]
            {
                self.taken += 1;
            }
            offset += h.len;
            if used < dn {
                // A chunk shorter than its slot: the next frame follows it.
                put_back(buf_slice(buf, at + used, dn - used));
                k += 2;
                return self.put_back_from(&segs[k..], buf, put_back);
            }
            if used < h.len as usize {
                return; // the read ended inside this chunk's data
            }
            k += 2;
        }
        self.put_back_from(&segs[k..], buf, put_back);
    }

    #[allow(clippy::ptr_arg)] // the Vec: see `buf_slice`
    fn put_back_from(&self, segs: &[Seg], buf: &Vec<u8>, mut put_back: impl FnMut(&[u8])) {
        for &s in segs {
            match s {
                Seg::Head { i, n } => put_back(&self.heads[i][..n]),
                Seg::Data { at, n } => put_back(buf_slice(buf, at, n)),
            }
        }
    }
}

/// `n` bytes the kernel wrote into `buf`'s spare capacity at `at`. A
/// `&Vec`, not a slice: the bytes lie past its length, within the
/// allocation only the vector's own pointer covers.
#[allow(clippy::ptr_arg)]
fn buf_slice(buf: &Vec<u8>, at: usize, n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    assert!(at + n <= buf.capacity());
    // SAFETY: a run read wrote these bytes (within the vector's
    // allocation, past its length) just before; nothing wrote there since.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().add(at), n) }
}

/// The header of the chunk that continues `prev`'s message at `offset`,
/// if `h` is that.
fn continuation(
    h: &[u8; CHUNK_HEAD],
    max_payload: u32,
    prev: &ChunkHeader,
    offset: u64,
) -> Option<ChunkHeader> {
    let fh = Header::decode(h[..HEADER_LEN].try_into().ok()?, max_payload).ok()?;
    if fh.ty != MsgType::Chunk || (fh.size as usize) < CHUNK_HEADER_LEN {
        return None;
    }
    let ch = h[HEADER_LEN..].try_into().ok()?;
    let c = ChunkHeader::parse(ch, fh.size as usize - CHUNK_HEADER_LEN).ok()?;
    (c.id == prev.id
        && !c.first
        && c.offset == offset
        && c.total == prev.total
        && c.class == prev.class)
        .then_some(c)
}

#[cfg(test)]
mod tests;

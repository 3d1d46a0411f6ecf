//! Async framing of SMP messages over tokio byte streams.
//!
//! Reads go into one growing `BytesMut`; once a header is known the buffer
//! reserves room for the whole message so the kernel copies the payload
//! straight into the memory the frame will live in, and the frame is split
//! off without another copy. `read_frame` is cancel-safe (partial data stays
//! in the buffer), so it can sit in a `tokio::select!`.
//!
//! `read_placing` also reads the data of a chunk that continues an open
//! message straight into that message's buffer ([`crate::stream::place`]),
//! cancel-safe as well: the reader remembers which chunk it is placing and
//! the message's buffer length says how far it got.

use std::io;
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::error::ProtocolError;
use crate::header::{Header, MsgType, HEADER_LEN};
use crate::message::Frame;
use crate::outframe::OutFrame;
use crate::stream::{ChunkHeader, Place, CHUNK_HEADER_LEN};

mod run;
pub use run::ReadVectored;

/// A frame header and a chunk header: what a placing reader needs to see
/// before it decides where a chunk's data goes.
pub(crate) const CHUNK_HEAD: usize = HEADER_LEN + CHUNK_HEADER_LEN;

/// Smallest read we ask the kernel for, so that streams of small messages
/// are read many per syscall.
const MIN_READ: usize = 16 * 1024;

/// Frames up to this size are read many per syscall (and a partial one is
/// cheap to copy into the next buffer). Larger frames are read one per
/// syscall: a read asks for the rest of the current frame plus the next
/// header, so nothing of the next payload lands in this frame's buffer
/// (where it would have to be copied out once that buffer is shared).
const SMALL_FRAME: usize = MIN_READ / 4;

/// Largest frame size remembered for the read at the next frame boundary.
const MAX_READ_AHEAD: usize = 1 << 20;

/// A metered reader ([`FrameReader::with_meter`]) reserves a frame's whole
/// announced size only up to this; past it the buffer doubles with what
/// arrives, so a peer that announces a large frame and trickles it makes
/// the reader reserve about what it sent. Frames up to this size (most data
/// messages) are still read straight into a buffer of their size.
pub const METERED_RESERVE: usize = 4 << 20;

/// What a reader holds of frames it has begun and not finished, reported
/// to its owner's accounting (a server's memory budget): a refusal fails
/// the read with the meter's error, so only the peer that sent too much is
/// refused.
pub trait Meter: Send + Sync + std::fmt::Debug {
    /// The reader now holds `bytes` of unfinished frames.
    fn hold(&mut self, bytes: usize) -> Result<(), ProtocolError>;

    /// The reader holds nothing and waits for its peer: whatever a meter
    /// keeps in hand to spare the shared count small changes goes back.
    fn idle(&mut self) {}
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolError),
}

/// Incremental frame decoder shared by the async and blocking readers.
#[derive(Debug)]
pub struct Decoder {
    buf: BytesMut,
    max_payload: u32,
    /// Wire size of the last complete frame (bounded by `max_payload` and
    /// [`MAX_READ_AHEAD`]): what a read at the next frame boundary expects.
    last_frame: usize,
    /// How many bytes the next read should take (see [`Decoder::read_limit`]).
    want: usize,
    /// Bytes a read of a large frame takes past it: the next header, or
    /// both headers of a chunk for a placing reader.
    ahead: usize,
    /// Most of a frame's announced size reserved ahead of its bytes (see
    /// [`METERED_RESERVE`]).
    reserve_max: usize,
    /// Chunk data copied from this buffer into a message's.
    #[cfg(test)]
    pub(crate) copied: usize,
}

impl Decoder {
    pub fn new(max_payload: u32) -> Self {
        Decoder {
            buf: BytesMut::with_capacity(MIN_READ),
            max_payload,
            last_frame: 0,
            want: MIN_READ,
            ahead: HEADER_LEN,
            reserve_max: usize::MAX,
            #[cfg(test)]
            copied: 0,
        }
    }

    pub fn max_payload(&self) -> u32 {
        self.max_payload
    }

    /// Extracts one complete frame if the buffer holds one. On a partial
    /// frame it reserves room for the rest and returns `None`.
    pub fn decode(&mut self) -> Result<Option<Frame>, ProtocolError> {
        if self.buf.len() < HEADER_LEN {
            // A frame like the last one and the header after it, or many small ones.
            let expect = MIN_READ.max(self.last_frame + HEADER_LEN);
            self.want = expect - self.buf.len();
            self.buf.reserve(self.want);
            return Ok(None);
        }
        let hb: [u8; HEADER_LEN] = self.buf[..HEADER_LEN].try_into().expect("8 bytes");
        let header = Header::decode(&hb, self.max_payload)?;
        let total = HEADER_LEN + header.size as usize;
        if self.buf.len() < total {
            // Room for the rest of this frame (its size is validated above)
            // and the next header, so the kernel copies the payload straight
            // into the memory the frame will live in; past a reservation
            // bound, room for as much again as has arrived.
            let ahead = if total < SMALL_FRAME {
                SMALL_FRAME
            } else {
                self.ahead
            };
            let (have, rest) = (self.buf.len(), total - self.buf.len());
            let rest = rest.min(self.reserve_max.max(2 * have) - have);
            self.want = rest + ahead;
            self.buf.reserve(self.want);
            return Ok(None);
        }
        self.last_frame = total.min(MAX_READ_AHEAD);
        self.buf.advance(HEADER_LEN);
        let payload = self.buf.split_to(header.size as usize).freeze();
        Ok(Some(Frame {
            ty: header.ty,
            payload,
        }))
    }

    /// How many bytes the next read should take at most, as computed by the
    /// last [`Decoder::decode`] that returned `None`: the rest of the frame
    /// and the next header (the capacity reserved may be larger).
    pub fn read_limit(&self) -> usize {
        self.want.max(1)
    }

    /// Buffer the next read should fill.
    pub fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// The header of the chunk at the start of the buffer, once both
    /// headers are in and valid.
    pub(crate) fn chunk_at_start(&self) -> Result<Option<ChunkHeader>, ProtocolError> {
        let b = &self.buf;
        if b.len() < CHUNK_HEAD {
            return Ok(None);
        }
        let hb = b[..HEADER_LEN].try_into().expect("8 bytes");
        let header = Header::decode(hb, self.max_payload)?;
        if header.ty != MsgType::Chunk || (header.size as usize) < CHUNK_HEADER_LEN {
            return Ok(None);
        }
        let ch = b[HEADER_LEN..CHUNK_HEAD].try_into().expect("24 bytes");
        // A bad chunk header goes on as a frame: the caller's parse reports it.
        Ok(ChunkHeader::parse(ch, header.size as usize - CHUNK_HEADER_LEN).ok())
    }

    /// Moves the headers of the chunk at the start of the buffer out, and
    /// as much of its `len` data bytes as the buffer holds into `to`:
    /// returns how many data bytes that was.
    pub(crate) fn take_placed(&mut self, len: usize, to: &mut Vec<u8>) -> usize {
        let have = (self.buf.len() - CHUNK_HEAD).min(len);
        to.extend_from_slice(&self.buf[CHUNK_HEAD..CHUNK_HEAD + have]);
        self.buf.advance(CHUNK_HEAD + have);
        #[cfg(test)]
        {
            self.copied += have;
        }
        have
    }

    /// Reads of a large frame take a chunk's headers past it, so that a
    /// placing reader sees whether the next chunk is placed before any of
    /// its data is read into this buffer.
    pub(crate) fn read_chunk_headers_ahead(&mut self) {
        self.ahead = CHUNK_HEAD;
    }

    /// Bytes read past a placed chunk's end: the next frame's start.
    pub(crate) fn put_back(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// At most how many bytes a placing reader's next read should take:
    /// only the rest of the headers while the frame at the start of the
    /// buffer is a chunk (or, with the buffer empty after a placed chunk,
    /// likely one), so that its data can be placed rather than copied.
    pub(crate) fn placing_limit(&self, after_placed: bool) -> usize {
        let chunk = match self.buf.first() {
            Some(&t) => t == MsgType::Chunk as u8,
            None => after_placed,
        };
        if chunk && self.buf.len() < CHUNK_HEAD {
            CHUNK_HEAD - self.buf.len()
        } else {
            usize::MAX
        }
    }

    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// What [`FrameReader::read_placing`] read.
#[derive(Debug)]
pub enum Read<W> {
    /// An ordinary frame (chunks `Place` did not take among them).
    Frame(Frame),
    /// A chunk whose data went into its message's buffer (its header, for
    /// the caller's accounting), and the message it completed, if it was
    /// the last.
    Placed {
        chunk: ChunkHeader,
        whole: Option<W>,
    },
}

/// The chunk whose data is being read into its message's buffer.
#[derive(Debug, Clone, Copy)]
struct Placing {
    head: ChunkHeader,
    /// The buffer's length once the chunk's data is all in.
    end: usize,
}

/// When a read of a begun frame times out, and what it is waiting for.
struct Deadline {
    at: Instant,
    t: Duration,
    in_header: bool,
}

/// Reads frames from an async byte stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    dec: Decoder,
    /// See [`FrameReader::with_read_timeout`].
    read_timeout: Option<Duration>,
    /// When the reader first waited for the rest of the current frame.
    frame_started: Option<Instant>,
    /// When the reader started waiting for the next bytes of a begun frame.
    /// Kept across cancellations, so a `select!` that drops and re-creates
    /// the read does not extend the peer's deadline.
    waiting_since: Option<Instant>,
    /// The chunk being placed; kept across cancellations.
    placing: Option<Placing>,
    /// The last thing read was a placed chunk: a read at the next frame
    /// boundary takes only the headers (see [`Decoder::placing_limit`]).
    after_placed: bool,
    /// Chunks of the message being placed that a run read took ahead.
    run: run::Ahead,
    /// See [`FrameReader::with_meter`].
    meter: Option<Box<dyn Meter>>,
    /// See [`FrameReader::release_when_idle`].
    release_idle: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max_payload: u32) -> Self {
        FrameReader {
            inner,
            dec: Decoder::new(max_payload),
            read_timeout: None,
            frame_started: None,
            waiting_since: None,
            placing: None,
            after_placed: false,
            run: run::Ahead::default(),
            meter: None,
            release_idle: false,
        }
    }

    /// Between frames, a [`FrameReader::read_with`] on a TCP socket with
    /// nothing to read waits for the socket without a read buffer (and
    /// tells the meter it holds nothing): an idle peer then costs no
    /// buffer, where a server with thousands of idle node links would
    /// otherwise keep a read buffer each. A busy link keeps its buffer: it
    /// is released only when a read finds nothing.
    pub fn release_when_idle(mut self) -> Self {
        self.release_idle = true;
        self
    }

    /// Reports the bytes of unfinished frames this reader holds to `m` as
    /// they arrive and as frames complete, and reserves at most
    /// [`METERED_RESERVE`] of a frame ahead of its bytes: for a reader of
    /// untrusted peers, whose memory is what they actually sent, counted.
    pub fn with_meter(mut self, m: Box<dyn Meter>) -> Self {
        self.meter = Some(m);
        self.dec.reserve_max = METERED_RESERVE;
        self
    }

    /// Starts with `bytes` already read from the stream (by an authentication
    /// step that had to look at the first message before handing it on).
    pub fn with_prefix(mut self, bytes: &[u8]) -> Self {
        self.dec.buf.extend_from_slice(bytes);
        self
    }

    /// Bounds how long a begun frame may take: its header must be complete
    /// within `t` of its first byte, and the rest must make progress at least
    /// every `t`. A peer that trickles a header one byte at a time, or stops
    /// in the middle of a message, gets an `io::ErrorKind::TimedOut` error.
    /// Waiting *between* frames is not bounded (that is an idle timeout, the
    /// owner's business).
    pub fn with_read_timeout(mut self, t: Duration) -> Self {
        self.read_timeout = Some(t);
        self
    }

    /// Next frame; `Ok(None)` on a clean end of stream between messages.
    ///
    /// A chunk half placed by a cancelled [`FrameReader::read_placing`] can
    /// only be finished by another `read_placing`: asked here instead, it is
    /// an error (the stream's position is inside that chunk's data).
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, ReadError> {
        let half = self.placing.map(|st| st.head);
        if let Some(h) = half.or_else(|| self.run.chunks.front().map(|c| c.0)) {
            return Err(ProtocolError::BadChunk(format!(
                "message {}: a chunk is half placed; only read_placing can finish it",
                h.id
            ))
            .into());
        }
        loop {
            if let Some(f) = self.decode()? {
                return Ok(Some(f));
            }
            let limit = self.dec.read_limit();
            if self.fill(limit).await? == 0 {
                return self.end_of_stream();
            }
            self.metered()?;
        }
    }

    /// Next frame, or the next chunk `p` takes in place (a message's first
    /// chunk if [`Place::begin`] opens it, a continuing one if
    /// [`Place::place`] takes it): its data is read into the message's buffer
    /// (the part already read into the decoder's buffer copied there, the
    /// rest read from the stream straight into it). `Ok(None)` on a clean
    /// end of stream between messages.
    ///
    /// Cancel-safe like `read_frame`, as long as the next read after a
    /// cancelled one is a `read_placing` with the same `p`. A chunk is
    /// placed only once its headers are valid and the frame is within
    /// `max_payload`; one that is not reaches the caller as a frame, whose
    /// parsing reports it as before.
    ///
    /// On a TCP socket ([`ReadVectored`]) the read that finishes a chunk
    /// also takes the next chunks of its message if they follow it (see
    /// `codec::run`); they come out one per call, as if read one by one.
    pub async fn read_placing<P: Place>(
        &mut self,
        p: &mut P,
    ) -> Result<Option<Read<P::Whole>>, ReadError>
    where
        R: ReadVectored,
    {
        self.dec.read_chunk_headers_ahead();
        loop {
            if let Some(st) = self.placing {
                let Some(buf) = p.resume(st.head.id) else {
                    return Err(placing_lost(st.head.id).into());
                };
                let left = st.end.checked_sub(buf.len());
                let Some(left) = left.filter(|&n| n <= st.head.len as usize) else {
                    return Err(placing_lost(st.head.id).into());
                };
                if left == 0 {
                    self.placing = None;
                    self.frame_started = None;
                    self.waiting_since = None;
                    self.after_placed = true;
                    return Ok(Some(Read::Placed {
                        chunk: st.head,
                        whole: p.placed(&st.head),
                    }));
                }
                let more = st.head.total - (st.head.offset + st.head.len);
                let slots = match self.inner.tcp() {
                    Some(_) => run::Slots::new(st.head.len, more, buf.capacity() - st.end),
                    None => run::Slots::default(),
                };
                let slots = slots.as_slice();
                if !slots.is_empty() {
                    let deadline = self.deadline(false);
                    let tcp = self.inner.tcp().expect("checked above");
                    let read = self.run.read(tcp, buf, left, st.end, slots);
                    let n = by_deadline(read, deadline).await?;
                    if n == 0 {
                        let got = CHUNK_HEAD + st.head.len as usize - left;
                        return Err(ProtocolError::TruncatedStream(got).into());
                    }
                    if n > left {
                        let dec = &mut self.dec;
                        let max = dec.max_payload();
                        let extra = n - left;
                        self.run
                            .take(&st.head, buf, st.end, extra, slots, max, |b| {
                                dec.put_back(b)
                            });
                    }
                    self.waiting_since = None;
                    continue;
                }
                // As a read of a frame does, this one also takes the next
                // frame's headers, into the buffer's room past the chunk
                // (the rest of the message), and hands them to the decoder.
                let ahead = buf.capacity().saturating_sub(st.end).min(CHUNK_HEAD);
                let deadline = self.deadline(false);
                let n = read_by(&mut self.inner, &mut buf.limit(left + ahead), deadline).await?;
                if n == 0 {
                    let got = CHUNK_HEAD + st.head.len as usize - left;
                    return Err(ProtocolError::TruncatedStream(got).into());
                }
                if buf.len() > st.end {
                    self.dec.put_back(&buf[st.end..]);
                    buf.truncate(st.end);
                }
                self.waiting_since = None;
                continue;
            }
            if let Some((h, at, got)) = self.run.chunks.pop_front() {
                // Read ahead by a run: its data is in the buffer already.
                let Some(buf) = p.place(&h)? else {
                    return Err(placing_lost(h.id).into());
                };
                let same = buf.as_ptr() as usize == self.run.at;
                if !same || buf.len() != at || buf.capacity() < at + h.len as usize {
                    return Err(placing_lost(h.id).into());
                }
                // SAFETY: the run read wrote `got` bytes at `at` of this
                // allocation (same address, checked); `Place` only lets
                // the reader append to a message's buffer meanwhile.
                unsafe { buf.set_len(at + got) };
                self.placing = Some(Placing {
                    head: h,
                    end: at + h.len as usize,
                });
                continue;
            }
            if let Some(h) = self.dec.chunk_at_start()? {
                let buf = if h.first { p.begin(&h)? } else { p.place(&h)? };
                if let Some(buf) = buf {
                    let len = h.len as usize;
                    self.placing = Some(Placing {
                        head: h,
                        end: buf.len() + len,
                    });
                    self.dec.take_placed(len, buf);
                    continue;
                }
            }
            if let Some(f) = self.decode()? {
                self.after_placed = false;
                return Ok(Some(Read::Frame(f)));
            }
            let limit = self
                .dec
                .read_limit()
                .min(self.dec.placing_limit(self.after_placed));
            if self.fill(limit).await? == 0 {
                return Ok(self.end_of_stream()?.map(Read::Frame));
            }
            self.metered()?;
        }
    }

    /// [`FrameReader::read_placing`] into `p`, or without one (a link that
    /// did not agree to chunks) [`FrameReader::read_frame`]'s frame.
    pub async fn read_with<P: Place>(
        &mut self,
        p: Option<&mut P>,
    ) -> Result<Option<Read<P::Whole>>, ReadError>
    where
        R: ReadVectored,
    {
        self.wait_idle().await?;
        match p {
            Some(p) => self.read_placing(p).await,
            None => Ok(self.read_frame().await?.map(Read::Frame)),
        }
    }

    /// [`FrameReader::release_when_idle`]: at a frame boundary with nothing
    /// buffered, one read; if the socket has nothing, the buffer goes and
    /// the wait is for readiness alone. Cancel-safe: nothing is read during
    /// the wait, and what the read took stays in the buffer.
    async fn wait_idle(&mut self) -> Result<(), ReadError>
    where
        R: ReadVectored,
    {
        let boundary = self.dec.buffered() == 0 && self.placing.is_none();
        if !self.release_idle || !boundary || !self.run.chunks.is_empty() {
            return Ok(());
        }
        let Some(tcp) = self.inner.tcp() else {
            return Ok(());
        };
        loop {
            // Reserves what a read at a frame boundary takes.
            self.dec.decode()?;
            let limit = self.dec.read_limit();
            match tcp.try_read_buf(&mut (&mut self.dec.buf).limit(limit)) {
                // Bytes, or the end of the stream: the frame read takes them.
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.dec.buf = BytesMut::new();
                    if let Some(m) = &mut self.meter {
                        m.idle();
                    }
                    tcp.readable().await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if self.dec.buffered() > 0 {
            self.waiting_since = None;
            self.metered()?;
        }
        Ok(())
    }

    fn decode(&mut self) -> Result<Option<Frame>, ProtocolError> {
        let f = self.dec.decode()?;
        if f.is_some() {
            self.frame_started = None;
            self.waiting_since = None;
            // What the frame held is the caller's now.
            self.metered()?;
        }
        Ok(f)
    }

    /// Tells the meter, if any, what the decoder's buffer holds now.
    fn metered(&mut self) -> Result<(), ProtocolError> {
        match &mut self.meter {
            Some(m) => m.hold(self.dec.buffered()),
            None => Ok(()),
        }
    }

    fn end_of_stream(&self) -> Result<Option<Frame>, ReadError> {
        match self.dec.buffered() {
            0 => Ok(None),
            n => Err(ProtocolError::TruncatedStream(n).into()),
        }
    }

    /// One read of at most `limit` bytes into the decoder's buffer, bounded
    /// by the deadlines of `with_read_timeout` once a frame is begun.
    async fn fill(&mut self, limit: usize) -> io::Result<usize> {
        let deadline = match self.dec.buffered() {
            0 => None,
            n => self.deadline(n < HEADER_LEN),
        };
        let n = read_by(
            &mut self.inner,
            &mut self.dec.buffer().limit(limit),
            deadline,
        )
        .await?;
        if n > 0 {
            self.waiting_since = None;
        }
        Ok(n)
    }

    /// The deadline of the next read of a begun frame, if reads have one.
    fn deadline(&mut self, in_header: bool) -> Option<Deadline> {
        let t = self.read_timeout?;
        let now = Instant::now();
        let started = *self.frame_started.get_or_insert(now);
        let waiting = *self.waiting_since.get_or_insert(now);
        let at = if in_header {
            (waiting + t).min(started + t)
        } else {
            waiting + t
        };
        Some(Deadline { at, t, in_header })
    }

    /// The type byte of a frame begun and not yet read (its header is in,
    /// or its first byte): after an error, what kind of frame the peer was
    /// sending, so a refusal can be worded for it (a hello's sender reads
    /// errors, a seed peer does not).
    pub fn begun_type(&self) -> Option<u8> {
        self.dec.buf.first().copied()
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// One read into `buf`, within `deadline` if there is one.
async fn read_by<R: AsyncRead + Unpin, B: BufMut>(
    r: &mut R,
    buf: &mut B,
    deadline: Option<Deadline>,
) -> io::Result<usize> {
    by_deadline(r.read_buf(buf), deadline).await
}

/// A read, within `deadline` if there is one.
async fn by_deadline(
    read: impl std::future::Future<Output = io::Result<usize>>,
    deadline: Option<Deadline>,
) -> io::Result<usize> {
    let Some(d) = deadline else {
        return read.await;
    };
    match tokio::time::timeout_at(d.at, read).await {
        Ok(r) => r,
        Err(_) if d.in_header => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("a message header was not complete within {:?}", d.t),
        )),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("a message made no progress for {:?}", d.t),
        )),
    }
}

/// The placer no longer has the buffer of the chunk being placed (it was
/// used otherwise between a cancelled read and its resumption).
fn placing_lost(id: u32) -> ProtocolError {
    ProtocolError::BadChunk(format!(
        "message {id}: its buffer changed while a chunk was being placed"
    ))
}

/// Writes one frame with vectored writes (header and body in one syscall).
///
/// Ends with a flush: a TLS stream accepts plaintext it cannot send yet
/// and sends it only on the next write or a flush, so a frame written
/// before the writer waits would otherwise stay in the session (on plain
/// TCP the flush does nothing).
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, mut frame: OutFrame) -> io::Result<()> {
    while frame.has_remaining() {
        w.write_buf(&mut frame).await.and_then(|n| {
            if n == 0 {
                Err(io::ErrorKind::WriteZero.into())
            } else {
                Ok(())
            }
        })?;
    }
    w.flush().await
}

/// Writes `first` and whatever `more` yields right away (up to a batch) with
/// vectored writes, so queued frames share syscalls. Returns the number of
/// frames written. `more` should not wait: pass a channel's `try_recv`.
pub async fn write_batch<W: AsyncWrite + Unpin>(
    w: &mut W,
    first: OutFrame,
    mut more: impl FnMut() -> Option<OutFrame>,
) -> io::Result<usize> {
    let mut batch = crate::outframe::FrameBatch::default();
    batch.push(first);
    while !batch.is_full() {
        match more() {
            Some(f) => batch.push(f),
            None => break,
        }
    }
    let n = batch.len();
    while batch.has_remaining() {
        if w.write_buf(&mut batch).await? == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    // As in `write_frame`: what a TLS session holds goes out now.
    w.flush().await?;
    Ok(n)
}

#[cfg(test)]
mod tests;

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
            // into the memory the frame will live in.
            let ahead = if total < SMALL_FRAME {
                SMALL_FRAME
            } else {
                self.ahead
            };
            self.want = total - self.buf.len() + ahead;
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

    /// The header of the chunk at the start of the buffer if it does not
    /// begin its message, once both headers are in and valid.
    pub(crate) fn continuing_chunk(&self) -> Result<Option<ChunkHeader>, ProtocolError> {
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
        match ChunkHeader::parse(ch, header.size as usize - CHUNK_HEADER_LEN) {
            Ok(h) if !h.first => Ok(Some(h)),
            _ => Ok(None),
        }
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
    /// An ordinary frame (first chunks and chunks not placed among them).
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
        }
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
    /// # Panics
    /// If a cancelled [`FrameReader::read_placing`] left a chunk half
    /// placed: only another `read_placing` can finish it.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, ReadError> {
        assert!(
            self.placing.is_none(),
            "a chunk is half placed: resume it with read_placing"
        );
        loop {
            if let Some(f) = self.decode()? {
                return Ok(Some(f));
            }
            let limit = self.dec.read_limit();
            if self.fill(limit).await? == 0 {
                return self.end_of_stream();
            }
        }
    }

    /// Next frame, or the next chunk that continues a message `p` takes in
    /// place ([`Place::place`]): its data is read into the message's buffer
    /// (the part already read into the decoder's buffer copied there, the
    /// rest read from the stream straight into it). `Ok(None)` on a clean
    /// end of stream between messages.
    ///
    /// Cancel-safe like `read_frame`, as long as the next read after a
    /// cancelled one is a `read_placing` with the same `p`. A chunk is
    /// placed only once its headers are valid and the frame is within
    /// `max_payload`; one that is not reaches the caller as a frame, whose
    /// parsing reports it as before.
    pub async fn read_placing<P: Place>(
        &mut self,
        p: &mut P,
    ) -> Result<Option<Read<P::Whole>>, ReadError> {
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
            if let Some(h) = self.dec.continuing_chunk()? {
                if let Some(buf) = p.place(&h)? {
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
        }
    }

    fn decode(&mut self) -> Result<Option<Frame>, ProtocolError> {
        let f = self.dec.decode()?;
        if f.is_some() {
            self.frame_started = None;
            self.waiting_since = None;
        }
        Ok(f)
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
    let Some(d) = deadline else {
        return r.read_buf(buf).await;
    };
    match tokio::time::timeout_at(d.at, r.read_buf(buf)).await {
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
mod tests {
    use super::*;
    use crate::header::MsgType;
    use bytes::Bytes;

    /// A buffering writer stands for a TLS stream whose socket was full:
    /// it sends only when flushed. Both writers must leave nothing behind.
    #[tokio::test]
    async fn written_frames_leave_nothing_in_a_buffering_writer() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut w = tokio::io::BufWriter::with_capacity(1 << 16, a);
        write_frame(
            &mut w,
            OutFrame::data(1, Bytes::from_static(b"one")).unwrap(),
        )
        .await
        .unwrap();
        let mut second = Some(OutFrame::data(3, Bytes::from_static(b"three")).unwrap());
        let first = OutFrame::data(2, Bytes::from_static(b"two")).unwrap();
        assert_eq!(
            write_batch(&mut w, first, || second.take()).await.unwrap(),
            2
        );
        assert!(w.buffer().is_empty(), "everything was flushed");
        drop(w);
        let mut r = FrameReader::new(b, 1024);
        for (id, body) in [(1u32, &b"one"[..]), (2, b"two"), (3, b"three")] {
            let f = r.read_frame().await.unwrap().unwrap();
            assert_eq!(
                (f.ty, &f.payload[..4], &f.payload[4..]),
                (MsgType::Data, &id.to_le_bytes()[..], body)
            );
        }
    }

    #[tokio::test]
    async fn reads_frames_across_arbitrary_splits() {
        let mut wire = Vec::new();
        for i in 0..50u32 {
            wire.extend(
                OutFrame::data(i, Bytes::from(vec![i as u8; i as usize * 97]))
                    .unwrap()
                    .to_vec(),
            );
        }
        let (mut a, b) = tokio::io::duplex(333);
        let writer = tokio::spawn(async move {
            for chunk in wire.chunks(1000) {
                a.write_all(chunk).await.unwrap();
            }
        });
        let mut r = FrameReader::new(b, 1 << 20);
        for i in 0..50u32 {
            let f = r.read_frame().await.unwrap().unwrap();
            assert_eq!(f.ty, MsgType::Data);
            assert_eq!(&f.payload[..4], &i.to_le_bytes());
            assert_eq!(f.payload.len(), 4 + i as usize * 97);
        }
        writer.await.unwrap();
        assert!(r.read_frame().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn truncated_stream_is_an_error() {
        let wire = OutFrame::data(1, Bytes::from_static(b"abcdef"))
            .unwrap()
            .to_vec();
        let mut r = FrameReader::new(&wire[..wire.len() - 2], 1024);
        assert!(matches!(
            r.read_frame().await,
            Err(ReadError::Protocol(ProtocolError::TruncatedStream(_)))
        ));
    }

    #[tokio::test]
    async fn oversize_header_fails_before_allocating() {
        let wire = [3u8, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF];
        let mut r = FrameReader::new(&wire[..], 1024);
        assert!(matches!(
            r.read_frame().await,
            Err(ReadError::Protocol(ProtocolError::TooLarge { .. }))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn read_timeout_cuts_a_trickled_header_but_not_an_idle_peer() {
        let t = Duration::from_secs(10);
        let (mut a, b) = tokio::io::duplex(64);
        let mut r = FrameReader::new(b, 1024).with_read_timeout(t);
        // Idle between frames: no deadline (the read is still pending long after t).
        let idle = tokio::time::timeout(t * 3, r.read_frame()).await;
        assert!(
            idle.is_err(),
            "an idle peer is not cut off by the read timeout"
        );
        // One header byte every 3 s: each read makes progress, but the header
        // as a whole takes longer than t.
        let trickle = tokio::spawn(async move {
            for b in [3u8, 0, 0, 0, 2, 0, 0, 0] {
                a.write_all(&[b]).await.unwrap();
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            a
        });
        let e = r.read_frame().await.unwrap_err();
        match e {
            ReadError::Io(e) => {
                assert_eq!(e.kind(), io::ErrorKind::TimedOut);
                assert!(e.to_string().contains("header"), "{e}");
            }
            other => panic!("expected a timeout, got {other}"),
        }
        drop(trickle);
    }

    #[tokio::test(start_paused = true)]
    async fn read_timeout_needs_payload_progress_not_speed() {
        let t = Duration::from_secs(10);
        let (mut a, b) = tokio::io::duplex(64);
        let mut r = FrameReader::new(b, 1024).with_read_timeout(t);
        let wire = OutFrame::data(7, Bytes::from(vec![1u8; 20]))
            .unwrap()
            .to_vec();
        let (head, rest) = wire.split_at(12);
        a.write_all(head).await.unwrap();
        // Payload bytes every 5 s (each gap < t): slow, but always progressing.
        let rest = rest.to_vec();
        let writer = tokio::spawn(async move {
            for chunk in rest.chunks(4) {
                tokio::time::sleep(Duration::from_secs(5)).await;
                a.write_all(chunk).await.unwrap();
            }
            // Then half a message and silence.
            a.write_all(&[3, 0, 0, 0, 9, 0, 0, 0, 1]).await.unwrap();
            a
        });
        let f = r.read_frame().await.unwrap().unwrap();
        assert_eq!(f.payload.len(), 24);
        let e = r.read_frame().await.unwrap_err();
        assert!(e.to_string().contains("no progress"), "{e}");
        drop(writer);
    }

    mod placing {
        use super::*;
        use crate::stream::{Chunk, Chunks, Message, Reassembler};
        use std::pin::Pin;
        use std::task::{Context, Poll};

        fn message(id: u32, n: usize) -> Bytes {
            Bytes::from(
                (0..n)
                    .map(|i| (i * 31 + id as usize) as u8)
                    .collect::<Vec<u8>>(),
            )
        }

        fn chunks(id: u32, class: u8, data: &Bytes, size: usize) -> Vec<Chunk> {
            Chunks::new(id, class, data.clone(), size)
                .unwrap()
                .collect()
        }

        fn wire(c: &Chunk) -> Vec<u8> {
            c.to_frame().unwrap().to_vec()
        }

        /// Hands out its bytes in pieces of the sizes given, in turn.
        struct Pieces {
            data: Vec<u8>,
            at: usize,
            sizes: Vec<usize>,
            turn: usize,
        }

        impl AsyncRead for Pieces {
            fn poll_read(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                let size = self.sizes[self.turn % self.sizes.len()];
                self.turn += 1;
                let n = size.min(buf.remaining()).min(self.data.len() - self.at);
                buf.put_slice(&self.data[self.at..self.at + n]);
                self.at += n;
                Poll::Ready(Ok(()))
            }
        }

        /// Reads everything: whole messages and ordinary frames, in order.
        async fn read_all<R: AsyncRead + Unpin>(
            r: &mut FrameReader<R>,
            re: &mut Reassembler,
        ) -> Result<(Vec<Message>, Vec<Frame>), ReadError> {
            let (mut whole, mut frames) = (Vec::new(), Vec::new());
            while let Some(got) = r.read_placing(re).await? {
                match got {
                    Read::Placed { whole: m, .. } => whole.extend(m),
                    Read::Frame(f) if f.ty == MsgType::Chunk => {
                        whole.extend(re.push(Chunk::parse(f.payload)?)?);
                    }
                    Read::Frame(f) => frames.push(f),
                }
            }
            Ok((whole, frames))
        }

        #[tokio::test]
        async fn a_chunked_message_read_in_odd_pieces_comes_out_whole_and_in_place() {
            let data = message(7, 100_000);
            let cs = chunks(7, 3, &data, 4096);
            let stream: Vec<u8> = cs.iter().flat_map(wire).collect();
            // Splits inside frame headers, chunk headers and data, and
            // pieces longer than a chunk.
            for sizes in [
                vec![3, 5, 7, 11, 13, 1000, 17],
                vec![1],
                vec![9000, 31],
                vec![32, 4096],
                vec![1 << 20],
            ] {
                let pieces = Pieces {
                    data: stream.clone(),
                    at: 0,
                    sizes: sizes.clone(),
                    turn: 0,
                };
                let mut r = FrameReader::new(pieces, 1 << 20);
                let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
                // The first chunk opens the message as ever.
                let Read::Frame(f) = r.read_placing(&mut re).await.unwrap().unwrap() else {
                    panic!("a first chunk is placed");
                };
                assert!(re.push(Chunk::parse(f.payload).unwrap()).unwrap().is_none());
                let at = re.buffer_at(7).unwrap();
                let (whole, frames) = read_all(&mut r, &mut re).await.unwrap();
                assert!(frames.is_empty());
                assert_eq!(whole.len(), 1, "{sizes:?}");
                assert_eq!((whole[0].id, whole[0].class), (7, 3));
                assert_eq!(whole[0].data, data, "{sizes:?}");
                assert_eq!(whole[0].data.as_ptr(), at, "the buffer moved");
                assert_eq!((re.open(), re.held()), (0, 0));
            }
        }

        #[tokio::test]
        async fn chunk_data_the_stream_has_not_delivered_is_read_in_place() {
            let size = 64 << 10;
            let data = message(1, 16 * size);
            let cs = chunks(1, 0, &data, size);
            let (mut a, b) = tokio::io::duplex(4 << 20);
            for (i, c) in cs.iter().enumerate() {
                a.write_all(&wire(c)).await.unwrap();
                if i == 5 {
                    let f = OutFrame::data(9, Bytes::from_static(b"between"));
                    a.write_all(&f.unwrap().to_vec()).await.unwrap();
                }
            }
            drop(a);
            let mut r = FrameReader::new(b, 1 << 20);
            let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
            let (whole, frames) = read_all(&mut r, &mut re).await.unwrap();
            assert_eq!(whole[0].data, data);
            assert_eq!(&frames[0].payload[4..], b"between");
            // Reads take the next chunk's headers along, or only them: no
            // chunk data is read into the decoder's buffer after the first.
            assert_eq!(r.dec.copied, 0);
        }

        #[tokio::test]
        async fn interleaved_messages_and_frames_come_out_whole() {
            let (da, db) = (message(1, 50_000), message(2, 9_000));
            let (a, b) = (chunks(1, 6, &da, 4000), chunks(2, 0, &db, 1000));
            let mut stream = Vec::new();
            let mut order = Vec::new();
            for i in 0..a.len().max(b.len()) {
                for c in [a.get(i), b.get(i)].into_iter().flatten() {
                    order.push(c.id);
                    stream.extend(wire(c));
                }
                if i % 3 == 0 {
                    let f = OutFrame::data(100 + i as u32, Bytes::from(vec![i as u8; i * 10]));
                    stream.extend(f.unwrap().to_vec());
                }
            }
            let pieces = Pieces {
                data: stream,
                at: 0,
                sizes: vec![7, 4001, 29, 333],
                turn: 0,
            };
            let mut r = FrameReader::new(pieces, 1 << 20);
            let mut re = Reassembler::new(1 << 20, 4, 1 << 20)
                .with_id_prefix()
                .preallocate(1 << 20);
            let (whole, frames) = read_all(&mut r, &mut re).await.unwrap();
            let ids: Vec<u32> = whole.iter().map(|m| m.id).collect();
            assert_eq!(ids, [2, 1]);
            assert_eq!(&whole[0].data[4..], &db[..]);
            assert_eq!(&whole[1].data[..4], &1u32.to_le_bytes());
            assert_eq!(&whole[1].data[4..], &da[..]);
            assert_eq!(frames.len(), 5);
            for (k, f) in frames.iter().enumerate() {
                let i = k * 3;
                assert_eq!(&f.payload[..4], &(100 + i as u32).to_le_bytes());
                assert_eq!(&f.payload[4..], &vec![i as u8; i * 10][..]);
            }
        }

        /// The error a placed chunk gets, and the one `push` gives.
        async fn both_errors(
            first: &Chunk,
            bad: &Chunk,
            re: impl Fn() -> Reassembler,
        ) -> (String, String) {
            let mut pushed = re();
            pushed.push(first.clone()).unwrap();
            let want = pushed.push(bad.clone()).unwrap_err().to_string();
            let mut stream = wire(first);
            stream.extend(wire(bad));
            let mut r = FrameReader::new(&stream[..], 1 << 20);
            let mut placed = re();
            let got = read_all(&mut r, &mut placed).await.unwrap_err();
            assert!(
                matches!(got, ReadError::Protocol(ProtocolError::BadChunk(_))),
                "{got}"
            );
            let got = got.to_string();
            (got.trim_start_matches("protocol error: ").to_string(), want)
        }

        #[tokio::test]
        async fn a_placed_chunk_is_refused_as_push_refuses_it() {
            let data = message(3, 3000);
            let cs = chunks(3, 2, &data, 1000);
            let re = || Reassembler::new(1 << 20, 4, 1 << 20);
            let cases = [
                (cs[2].clone(), "offset 2000, expected 1000"),
                (
                    Chunk {
                        class: 5,
                        ..cs[1].clone()
                    },
                    "changed from 3000 bytes in class 2",
                ),
                (
                    Chunk {
                        total: 2500,
                        last: false,
                        ..cs[1].clone()
                    },
                    "changed from 3000 bytes",
                ),
            ];
            for (bad, why) in cases {
                let (got, want) = both_errors(&cs[0], &bad, re).await;
                assert_eq!(got, want);
                assert!(got.contains(why), "{got}");
            }
            // Over the held bound: the second chunk would hold 2000 of 1500.
            let (got, want) =
                both_errors(&cs[0], &cs[1], || Reassembler::new(1 << 20, 4, 1500)).await;
            assert_eq!(got, want);
            assert!(got.contains("over 1500 bytes"), "{got}");
            // A message never begun: the chunk is not placed, push reports it.
            let stray = wire(&cs[1]);
            let mut r = FrameReader::new(&stray[..], 1 << 20);
            let got = read_all(&mut r, &mut re()).await.unwrap_err();
            assert!(got.to_string().contains("not begun"), "{got}");
        }

        #[tokio::test]
        async fn a_chunk_over_max_payload_is_refused_before_it_is_placed() {
            let data = message(4, 3000);
            let cs = chunks(4, 0, &data, 1000);
            let first = chunks(4, 0, &data, 1000)[0].clone();
            let big = Chunk {
                data: data.slice(1000..3000),
                last: true,
                ..cs[1].clone()
            };
            let mut stream = wire(&first);
            stream.extend(wire(&big));
            let mut r = FrameReader::new(&stream[..], 1500);
            let got = read_all(&mut r, &mut Reassembler::new(1 << 20, 4, 1 << 20)).await;
            assert!(matches!(
                got,
                Err(ReadError::Protocol(ProtocolError::TooLarge { .. }))
            ));
        }

        #[tokio::test(start_paused = true)]
        async fn a_read_cancelled_mid_chunk_resumes_where_it_was() {
            let data = message(5, 40_000);
            let cs = chunks(5, 1, &data, 16_000);
            let (mut a, b) = tokio::io::duplex(1 << 20);
            let mut r = FrameReader::new(b, 1 << 20);
            let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
            a.write_all(&wire(&cs[0])).await.unwrap();
            let Read::Frame(f) = r.read_placing(&mut re).await.unwrap().unwrap() else {
                panic!("a first chunk is placed");
            };
            re.push(Chunk::parse(f.payload).unwrap()).unwrap();
            let at = re.buffer_at(5).unwrap();
            let rest: Vec<u8> = cs[1..].iter().flat_map(wire).collect();
            let (mut sent, mut given_up) = (0, 0);
            // Stall mid-header, mid-data and at the boundary, each read
            // given up (the future dropped) and begun again.
            for cut in [
                20,
                5000,
                16_000 + CHUNK_HEAD,
                16_000 + CHUNK_HEAD + 3,
                rest.len(),
            ] {
                a.write_all(&rest[sent..cut]).await.unwrap();
                sent = cut;
                let t = Duration::from_secs(1);
                match tokio::time::timeout(t, r.read_placing(&mut re)).await {
                    Err(_) => given_up += 1,
                    Ok(got) => match got.unwrap().unwrap() {
                        Read::Placed { whole: None, .. } => continue,
                        Read::Placed { whole: Some(m), .. } => {
                            assert_eq!((sent, given_up), (rest.len(), 3));
                            assert_eq!(m.data, data);
                            assert_eq!(m.data.as_ptr(), at, "the buffer moved");
                            return;
                        }
                        Read::Frame(f) => panic!("{f:?}"),
                    },
                }
            }
            // The last placed chunk may need one more read to complete.
            let Read::Placed { whole: Some(m), .. } =
                r.read_placing(&mut re).await.unwrap().unwrap()
            else {
                panic!("the message is not whole");
            };
            assert_eq!(m.data, data);
            assert_eq!(m.data.as_ptr(), at, "the buffer moved");
        }

        #[tokio::test(start_paused = true)]
        async fn a_trickling_peer_still_meets_the_read_deadline() {
            let t = Duration::from_secs(10);
            let data = message(6, 3000);
            let cs = chunks(6, 0, &data, 1000);
            let (mut a, b) = tokio::io::duplex(1 << 16);
            let mut r = FrameReader::new(b, 1 << 20).with_read_timeout(t);
            let mut re = Reassembler::new(1 << 20, 4, 1 << 20);
            let mut stream = wire(&cs[0]);
            stream.extend(wire(&cs[1]));
            let third = wire(&cs[2]);
            a.write_all(&stream).await.unwrap();
            let writer = tokio::spawn(async move {
                // The third chunk's headers and data 100 bytes every 5 s
                // (slow, always progressing), then silence with 500 left.
                a.write_all(&third[..CHUNK_HEAD + 100]).await.unwrap();
                for piece in third[CHUNK_HEAD + 100..CHUNK_HEAD + 500].chunks(100) {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    a.write_all(piece).await.unwrap();
                }
                a
            });
            let Read::Frame(f) = r.read_placing(&mut re).await.unwrap().unwrap() else {
                panic!("a first chunk is placed");
            };
            re.push(Chunk::parse(f.payload).unwrap()).unwrap();
            assert!(matches!(
                r.read_placing(&mut re).await.unwrap(),
                Some(Read::Placed { whole: None, .. })
            ));
            let started = Instant::now();
            let e = r.read_placing(&mut re).await.unwrap_err();
            let ReadError::Io(e) = e else {
                panic!("expected a timeout, got {e}")
            };
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
            assert!(e.to_string().contains("no progress"), "{e}");
            let took = started.elapsed();
            assert!(
                took >= Duration::from_secs(20) + t && took < Duration::from_secs(40),
                "{took:?}"
            );
            drop(writer);
        }
    }

    #[tokio::test]
    async fn write_frame_is_byte_exact() {
        let mut out = Vec::new();
        write_frame(
            &mut out,
            OutFrame::data(0x01020304, Bytes::from_static(b"xy")).unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(out, [3, 0, 0, 0, 6, 0, 0, 0, 4, 3, 2, 1, b'x', b'y']);
    }
}

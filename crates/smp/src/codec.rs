//! Async framing of SMP messages over tokio byte streams.
//!
//! Reads go into one growing `BytesMut`; once a header is known the buffer
//! reserves room for the whole message so the kernel copies the payload
//! straight into the memory the frame will live in, and the frame is split
//! off without another copy. `read_frame` is cancel-safe (partial data stays
//! in the buffer), so it can sit in a `tokio::select!`.

use std::io;
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::error::ProtocolError;
use crate::header::{Header, HEADER_LEN};
use crate::message::Frame;
use crate::outframe::OutFrame;

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
}

impl Decoder {
    pub fn new(max_payload: u32) -> Self {
        Decoder {
            buf: BytesMut::with_capacity(MIN_READ),
            max_payload,
            last_frame: 0,
            want: MIN_READ,
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
                HEADER_LEN
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

    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
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
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max_payload: u32) -> Self {
        FrameReader {
            inner,
            dec: Decoder::new(max_payload),
            read_timeout: None,
            frame_started: None,
            waiting_since: None,
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
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, ReadError> {
        loop {
            if let Some(f) = self.dec.decode()? {
                self.frame_started = None;
                self.waiting_since = None;
                return Ok(Some(f));
            }
            let n = match self.read_timeout {
                Some(t) if self.dec.buffered() > 0 => self.read_within(t).await?,
                _ => {
                    let limit = self.dec.read_limit();
                    self.inner
                        .read_buf(&mut self.dec.buffer().limit(limit))
                        .await?
                }
            };
            if n == 0 {
                return match self.dec.buffered() {
                    0 => Ok(None),
                    n => Err(ProtocolError::TruncatedStream(n).into()),
                };
            }
            self.waiting_since = None;
        }
    }

    /// One read of a begun frame, bounded by the deadlines of `with_read_timeout`.
    async fn read_within(&mut self, t: Duration) -> io::Result<usize> {
        let now = Instant::now();
        let started = *self.frame_started.get_or_insert(now);
        let waiting = *self.waiting_since.get_or_insert(now);
        let in_header = self.dec.buffered() < HEADER_LEN;
        let deadline = if in_header {
            (waiting + t).min(started + t)
        } else {
            waiting + t
        };
        let limit = self.dec.read_limit();
        let mut buf = self.dec.buffer().limit(limit);
        match tokio::time::timeout_at(deadline, self.inner.read_buf(&mut buf)).await {
            Ok(r) => r,
            Err(_) if in_header => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("a message header was not complete within {t:?}"),
            )),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("a message made no progress for {t:?}"),
            )),
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    pub fn into_inner(self) -> R {
        self.inner
    }
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

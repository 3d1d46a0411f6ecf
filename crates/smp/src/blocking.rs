//! SMP framing over blocking `std::io` streams, for synchronous peers such as
//! the client library (which is also what the Python package wraps).
//!
//! `read_placing` reads a chunk's data straight into its message's buffer
//! when the receiver takes it in place, as the async reader's does ([`crate::stream::place`]).

use std::io::{self, IoSlice, Read, Write};

use bytes::Buf;

use crate::codec::{Decoder, Read as Got, ReadError};
use crate::error::ProtocolError;
use crate::header::{Header, MsgType, HEADER_LEN};
use crate::message::Frame;
use crate::outframe::OutFrame;
use crate::stream::Place;
use crate::DATA_ID_LEN;

/// Reads frames from a blocking byte stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    dec: Decoder,
    /// Size of the zeroed window offered to the next `read`: it follows what
    /// reads actually return, so large messages are read in large steps
    /// without zeroing much more than is filled.
    window: usize,
    /// The last thing read was a placed chunk (see the async reader's).
    after_placed: bool,
}

/// Bounds of the read window.
const MIN_WINDOW: usize = 16 * 1024;
const MAX_WINDOW: usize = 4 * 1024 * 1024;

impl<R: Read> FrameReader<R> {
    pub fn new(inner: R, max_payload: u32) -> Self {
        FrameReader {
            inner,
            dec: Decoder::new(max_payload),
            window: MIN_WINDOW,
            after_placed: false,
        }
    }

    /// Next frame; `Ok(None)` on a clean end of stream between messages.
    pub fn read_frame(&mut self) -> Result<Option<Frame>, ReadError> {
        loop {
            if let Some(f) = self.dec.decode()? {
                return Ok(Some(f));
            }
            if self.fill(usize::MAX)? == 0 {
                return self.end_of_stream();
            }
        }
    }

    /// Next frame, or the next chunk `p` takes in place: as
    /// [`crate::codec::FrameReader::read_placing`], its data read
    /// straight into the message's buffer (zeroed first: `Read::read` may
    /// look at the slice it is given).
    pub fn read_placing<P: Place>(
        &mut self,
        p: &mut P,
    ) -> Result<Option<Got<P::Whole>>, ReadError> {
        self.dec.read_chunk_headers_ahead();
        loop {
            if let Some(h) = self.dec.chunk_at_start()? {
                let buf = if h.first { p.begin(&h)? } else { p.place(&h)? };
                if let Some(buf) = buf {
                    let len = h.len as usize;
                    let begun = buf.len();
                    let end = begun + len;
                    self.dec.take_placed(len, buf);
                    let mut at = buf.len();
                    // The next frame's headers too, as the async reader reads them.
                    let ahead = buf
                        .capacity()
                        .saturating_sub(end)
                        .min(crate::codec::CHUNK_HEAD);
                    buf.resize(end + ahead, 0);
                    while at < end {
                        let n = match self.inner.read(&mut buf[at..end + ahead]) {
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => {
                                buf.truncate(at);
                                return Err(e.into());
                            }
                            Ok(n) => n,
                        };
                        if n == 0 {
                            buf.truncate(at);
                            let got = crate::codec::CHUNK_HEAD + at - begun;
                            return Err(ProtocolError::TruncatedStream(got).into());
                        }
                        at += n;
                    }
                    self.dec.put_back(&buf[end..at]);
                    buf.truncate(end);
                    self.after_placed = true;
                    let whole = p.placed(&h);
                    return Ok(Some(Got::Placed { chunk: h, whole }));
                }
            }
            if let Some(f) = self.dec.decode()? {
                self.after_placed = false;
                return Ok(Some(Got::Frame(f)));
            }
            let cap = self.dec.placing_limit(self.after_placed);
            if self.fill(cap)? == 0 {
                return Ok(self.end_of_stream()?.map(Got::Frame));
            }
        }
    }

    /// One read into the decoder's buffer of at most `cap` bytes.
    fn fill(&mut self, cap: usize) -> io::Result<usize> {
        // `Read::read` may look at the slice it is given, so it must be
        // initialised: the spare capacity is zeroed (safe `resize`), but
        // only a window sized by recent reads, not the whole reservation.
        let buf = self.dec.buffer();
        let start = buf.len();
        let want = buf
            .capacity()
            .saturating_sub(start)
            .max(1)
            .min(self.window)
            .min(cap);
        buf.resize(start + want, 0);
        let r = loop {
            match self.inner.read(&mut buf[start..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let n = *r.as_ref().unwrap_or(&0);
        buf.truncate(start + n);
        let n = r?;
        // A read capped below the window says nothing of what the stream has.
        if want < cap {
            self.window = if n == want {
                (want * 2).min(MAX_WINDOW)
            } else {
                (n * 2).clamp(MIN_WINDOW, MAX_WINDOW)
            };
        }
        Ok(n)
    }

    fn end_of_stream(&self) -> Result<Option<Frame>, ReadError> {
        match self.dec.buffered() {
            0 => Ok(None),
            n => Err(ProtocolError::TruncatedStream(n).into()),
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }
}

/// Writes one frame with vectored writes.
pub fn write_frame<W: Write>(w: &mut W, frame: OutFrame) -> io::Result<()> {
    write_all_buf(w, frame)
}

/// Writes a data message whose body is borrowed from the caller (a Python
/// buffer, a slice of a larger array): header and id from a small stack
/// buffer, the body straight from `body`, no copy.
pub fn write_data_borrowed<W: Write>(w: &mut W, id: u32, body: &[u8]) -> io::Result<()> {
    let len = body.len() + DATA_ID_LEN;
    let size = u32::try_from(len).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            ProtocolError::Unrepresentable(len),
        )
    })?;
    let mut head = [0u8; HEADER_LEN + DATA_ID_LEN];
    head[..HEADER_LEN].copy_from_slice(&Header::new(MsgType::Data, size).encode());
    head[HEADER_LEN..].copy_from_slice(&id.to_le_bytes());
    write_all_buf(w, Buf::chain(&head[..], body))
}

fn write_all_buf<W: Write>(w: &mut W, mut b: impl Buf) -> io::Result<()> {
    while b.has_remaining() {
        let mut slices = [IoSlice::new(&[]); 2];
        let cnt = b.chunks_vectored(&mut slices);
        let n = match w.write_vectored(&slices[..cnt]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        b.advance(n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn blocking_round_trip() {
        let mut wire = Vec::new();
        for i in 0..10u32 {
            write_frame(
                &mut wire,
                OutFrame::data(i, Bytes::from(vec![7u8; 40_000])).unwrap(),
            )
            .unwrap();
        }
        let mut r = FrameReader::new(&wire[..], 1 << 20);
        for i in 0..10u32 {
            let f = r.read_frame().unwrap().unwrap();
            assert_eq!(&f.payload[..4], &i.to_le_bytes());
            assert_eq!(f.payload.len(), 40_004);
        }
        assert!(r.read_frame().unwrap().is_none());
    }

    #[test]
    fn borrowed_writer_matches_outframe() {
        let body = vec![9u8; 70_000];
        let mut a = Vec::new();
        write_data_borrowed(&mut a, 42, &body).unwrap();
        let b = OutFrame::data(42, Bytes::from(body)).unwrap().to_vec();
        assert_eq!(a, b);
    }

    /// A writer that takes at most 3 bytes per call exercises partial writes
    /// across the header/body boundary.
    struct Dribble(Vec<u8>);
    impl Write for Dribble {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let n = b.len().min(3);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_are_resumed() {
        let mut d = Dribble(Vec::new());
        write_data_borrowed(&mut d, 7, b"hello world").unwrap();
        assert_eq!(
            d.0,
            OutFrame::data(7, Bytes::from_static(b"hello world"))
                .unwrap()
                .to_vec()
        );
    }

    /// A reader that returns one byte at a time still yields whole frames.
    #[test]
    fn byte_by_byte_reader() {
        let wire = OutFrame::data(1, Bytes::from(vec![5u8; 100_000]))
            .unwrap()
            .to_vec();
        struct OneByte<'a>(&'a [u8]);
        impl Read for OneByte<'_> {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                if self.0.is_empty() || b.is_empty() {
                    return Ok(0);
                }
                b[0] = self.0[0];
                self.0 = &self.0[1..];
                Ok(1)
            }
        }
        let mut r = FrameReader::new(OneByte(&wire[..1000]), 1 << 20);
        assert!(matches!(
            r.read_frame(),
            Err(ReadError::Protocol(ProtocolError::TruncatedStream(1000)))
        ));
        let mut r = FrameReader::new(OneByte(&wire), 1 << 20);
        assert_eq!(r.read_frame().unwrap().unwrap().payload.len(), 100_004);
    }

    /// Hands out its bytes in pieces of the sizes given, in turn.
    struct Pieces<'a>(&'a [u8], &'a [usize], usize);
    impl Read for Pieces<'_> {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            let size = self.1[self.2 % self.1.len()];
            self.2 += 1;
            let n = size.min(b.len()).min(self.0.len());
            b[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn placed_chunks_come_out_whole_in_place_and_checked_as_push_checks() {
        use crate::stream::{Chunk, Chunks, Reassembler};
        let data = Bytes::from((0..70_000u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>());
        let cs: Vec<Chunk> = Chunks::new(3, 1, data.clone(), 8192).unwrap().collect();
        let wire: Vec<u8> = cs
            .iter()
            .flat_map(|c| c.to_frame().unwrap().to_vec())
            .collect();
        for sizes in [&[1][..], &[5, 19, 8000, 3], &[1 << 20]] {
            let mut r = FrameReader::new(Pieces(&wire, sizes, 0), 1 << 20);
            let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
            // The first chunk opens the message in place.
            let first = r.read_placing(&mut re).unwrap();
            assert!(matches!(first, Some(Got::Placed { whole: None, .. })));
            let at = re.buffer_at(3).unwrap();
            let mut placed = 0;
            let m = loop {
                match r.read_placing(&mut re).unwrap().unwrap() {
                    Got::Placed { whole: Some(m), .. } => break m,
                    Got::Placed { whole: None, .. } => placed += 1,
                    Got::Frame(f) => {
                        if let Some(m) = re.push(Chunk::parse(f.payload).unwrap()).unwrap() {
                            break m;
                        }
                    }
                }
            };
            assert_eq!(m.data, data, "{sizes:?}");
            assert_eq!(m.data.as_ptr(), at, "the buffer moved");
            assert!(placed >= cs.len() - 3, "{placed} placed");
            assert!(r.read_placing(&mut re).unwrap().is_none());
        }
        // A chunk out of order: push's error.
        let mut bad = cs[0].to_frame().unwrap().to_vec();
        bad.extend(cs[2].to_frame().unwrap().to_vec());
        let mut r = FrameReader::new(&bad[..], 1 << 20);
        let mut re = Reassembler::new(1 << 20, 4, 1 << 20);
        let first = r.read_placing(&mut re).unwrap();
        assert!(matches!(first, Some(Got::Placed { whole: None, .. })));
        let e = r.read_placing(&mut re).unwrap_err();
        assert!(e.to_string().contains("offset 16384, expected 8192"), "{e}");
        // Cut short in a placed chunk's data.
        let short = &wire[..8192 + 32 + 32 + 100];
        let mut r = FrameReader::new(short, 1 << 20);
        let mut re = Reassembler::new(1 << 20, 4, 1 << 20);
        let first = r.read_placing(&mut re).unwrap();
        assert!(matches!(first, Some(Got::Placed { whole: None, .. })));
        assert!(matches!(
            r.read_placing(&mut re),
            Err(ReadError::Protocol(ProtocolError::TruncatedStream(132)))
        ));
    }
}

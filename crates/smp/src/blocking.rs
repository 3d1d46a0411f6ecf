//! SMP framing over blocking `std::io` streams, for synchronous peers such as
//! the client library (which is also what the Python package wraps).

use std::io::{self, IoSlice, Read, Write};

use bytes::{Buf, BufMut};

use crate::codec::{Decoder, ReadError};
use crate::error::ProtocolError;
use crate::message::{Frame, OutFrame};

/// Reads frames from a blocking byte stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    dec: Decoder,
}

impl<R: Read> FrameReader<R> {
    pub fn new(inner: R, max_payload: u32) -> Self {
        FrameReader {
            inner,
            dec: Decoder::new(max_payload),
        }
    }

    /// Next frame; `Ok(None)` on a clean end of stream between messages.
    pub fn read_frame(&mut self) -> Result<Option<Frame>, ReadError> {
        loop {
            if let Some(f) = self.dec.decode()? {
                return Ok(Some(f));
            }
            let buf = self.dec.buffer();
            let spare = buf.chunk_mut();
            // SAFETY: `read` only writes into the slice; we expose exactly the
            // bytes it reports as written. The spare capacity is treated as
            // uninitialised memory that `Read` implementations must not read.
            let n = unsafe {
                let s = std::slice::from_raw_parts_mut(spare.as_mut_ptr(), spare.len());
                loop {
                    match self.inner.read(s) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            if n == 0 {
                return match self.dec.buffered() {
                    0 => Ok(None),
                    n => Err(ProtocolError::TruncatedStream(n).into()),
                };
            }
            // SAFETY: `n` bytes were just written by `read`.
            unsafe { self.dec.buffer().advance_mut(n) };
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }
}

/// Writes one frame with vectored writes.
pub fn write_frame<W: Write>(w: &mut W, mut frame: OutFrame) -> io::Result<()> {
    while frame.has_remaining() {
        let mut slices = [IoSlice::new(&[]); 2];
        let cnt = frame.chunks_vectored(&mut slices);
        let n = match w.write_vectored(&slices[..cnt]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        frame.advance(n);
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
            write_frame(&mut wire, OutFrame::data(i, Bytes::from(vec![7u8; 40_000]))).unwrap();
        }
        let mut r = FrameReader::new(&wire[..], 1 << 20);
        for i in 0..10u32 {
            let f = r.read_frame().unwrap().unwrap();
            assert_eq!(&f.payload[..4], &i.to_le_bytes());
            assert_eq!(f.payload.len(), 40_004);
        }
        assert!(r.read_frame().unwrap().is_none());
    }
}

//! Chunk data read straight into its message's buffer: a receiver that
//! reassembles messages lets [`crate::codec::FrameReader::read_placing`]
//! put a chunk's data where the message is gathered, instead
//! of reading the chunk into the decoder's buffer and copying it from
//! there (that copy cost a tenth of bulk throughput).

use super::chunk::ChunkHeader;
use crate::error::ProtocolError;

/// A receiver of chunked messages that takes their chunks in place. A
/// message's first chunk arrives as an ordinary frame unless the receiver
/// begins the message for it ([`Place::begin`]).
///
/// # Safety
///
/// The reader extends a returned buffer's length over bytes it read into
/// the buffer's spare capacity ahead of time. An implementation must keep
/// each message's buffer the same allocation (never freed, moved or
/// reallocated, its length changed only by the reader) from one `begin` or
/// `place` of the message to the next; a buffer that is another allocation
/// at the same address would expose bytes nobody wrote.
pub unsafe trait Place {
    /// What a completed message comes out as.
    type Whole;

    /// The first chunk of a message, with header `h`, is next on the link.
    /// Either make every check an ordinary first chunk gets, open the
    /// message, count its bytes, and return its buffer (empty but for any
    /// prefix of the receiver's own, with room for `h.len` bytes), to have
    /// the chunk's data read into it; or return `Ok(None)` to have the
    /// chunk read as an ordinary frame, changing nothing (the default: a
    /// receiver that decides where a message goes from its first chunk's
    /// data, or a message of one chunk, which as a frame is not copied).
    fn begin(&mut self, h: &ChunkHeader) -> Result<Option<&mut Vec<u8>>, ProtocolError> {
        let _ = h;
        Ok(None)
    }

    /// A chunk that continues a message, with header `h`, is next on the
    /// link. Either check it against its open message exactly as an
    /// ordinary chunk would be, count its bytes, and return the buffer its
    /// `h.len` bytes are to be appended to (with room for them); or return
    /// `Ok(None)` to have the chunk read as an ordinary frame (a message
    /// that is not placed, or one that was never opened: the ordinary path
    /// reports that); `Ok(None)` changes nothing, as the reader may ask
    /// again.
    ///
    /// The buffer must stay where it is (no reallocation) from one `begin`
    /// or `place` of a message to the next: a reader on a TCP socket may
    /// have read the following chunks' data into its spare capacity
    /// already. Reserving the whole message at its first chunk guarantees
    /// that.
    fn place(&mut self, h: &ChunkHeader) -> Result<Option<&mut Vec<u8>>, ProtocolError>;

    /// The buffer of message `id` while its chunk is being placed (the read
    /// may be cancelled and resumed between `place` and `placed`).
    fn resume(&mut self, id: u32) -> Option<&mut Vec<u8>>;

    /// All of the chunk `h` that `place` accepted is in its buffer: the
    /// message it completes, if it was the last.
    fn placed(&mut self, h: &ChunkHeader) -> Option<Self::Whole>;
}

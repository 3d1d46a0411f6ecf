//! Messages as streams (seeds 001 and 004): a data message may
//! travel as a sequence of chunks (type 0x1D) that interleave with the
//! chunks of other messages on one link, each carrying a priority class.
//!
//! - [`chunk`]: the chunk message, and cutting a message into chunks
//!   without copying it.
//! - [`reassemble`]: putting messages back together on the receiving side,
//!   bounded in open messages and held bytes.
//! - [`classes`]: strict-priority queues with an anti-starvation guard, the
//!   order in which a link sends what waits for it.
//!
//! - [`place`]: reading continuing chunks straight into their message's
//!   buffer.
//! - [`outbox`]: what a link sends next: whole frames and messages cut
//!   into chunks, by class.
//!
//! The server↔node link negotiates chunks (`features::CHUNKS`);
//! docs/streams.md says what else is wired.
//!
//! Chunks have a 24-byte header of their own rather than reusing the
//! collective chunk fields of the peer header: the peer header's routing
//! and collective fields mean nothing on a user or server link, and a
//! second decoder of the same bytes with half its fields ignored would be
//! the harder thing to keep correct. Both ride the inline-header frame
//! ([`crate::outframe::Inline`], whose prefix holds up to 24 bytes for this
//! reason), so every writer sends a chunk without copying its data.

pub mod chunk;
pub mod classes;
pub mod outbox;
pub mod place;
pub mod reassemble;

pub use chunk::{
    Chunk, ChunkFrame, ChunkHeader, Chunks, CHUNK_HEADER_LEN, CLASSES, DEFAULT_CHUNK_SIZE,
    DEFAULT_CLASS, MAX_CHUNK_SIZE,
};
pub use classes::{ClassPicker, ClassQueues, MESSAGE_GUARD};
pub use outbox::Outbox;
pub use place::Place;
pub use reassemble::{Message, Reassembler};

//! Data messages that arrive as chunks (type 0x1D) on a link that
//! negotiated them: each message is checked chunk by chunk and, from its
//! first chunk, either streamed to the handler lane (its first chunk
//! matched a ruleset: the handlers start before the rest has arrived) or
//! reassembled for the cores, which take it whole as before.
//!
//! What the server can make the node hold is bounded: a message's whole
//! length (its inputs and its result) is reserved in the memory guard at
//! its first chunk (a handler result longer than count × output size takes
//! the rest when it is ready, [`crate::spin`]), and at most [`MAX_OPEN`] messages are open at once. A
//! message is refused (with a per-message error, its remaining chunks
//! discarded) when its reservation could never be granted while the other
//! open messages hold theirs: they need chunks that are behind this one on
//! the wire, so waiting could not end.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use corefarm_smp::stream::Chunk;
use corefarm_smp::ProtocolError;

use crate::guard::Reservation;
use crate::spin::StreamJob;

/// Messages begun and not finished at once.
pub const MAX_OPEN: usize = 64;

/// Where the rest of an open message goes.
pub enum Dest {
    /// Gathered for the cores.
    Cores {
        buf: BytesMut,
        count: usize,
        reservation: Reservation,
    },
    /// Fed to the handler lane as it arrives.
    Spin(std::sync::mpsc::Sender<Bytes>),
    /// Refused at its first chunk: the rest is read and dropped.
    Discard,
}

struct Open {
    class: u8,
    total: u64,
    next: u64,
    /// Guard bytes this message holds while it is open.
    reserved: usize,
    dest: Dest,
}

/// What a chunk means for the session.
pub enum Step {
    /// The first chunk of a new message: the session decides its
    /// destination ([`Inbound::open`]) with this chunk in hand.
    Begin(Chunk),
    /// Taken (fed to the lane, gathered, or dropped).
    Taken,
    /// The chunk completed a message for the cores.
    Whole {
        id: u32,
        class: u8,
        data: Bytes,
        count: usize,
        reservation: Reservation,
    },
}

#[derive(Default)]
pub struct Inbound {
    open: HashMap<u32, Open>,
    /// Guard bytes held by the open messages.
    reserved: usize,
}

fn bad(why: String) -> ProtocolError {
    ProtocolError::BadChunk(why)
}

impl Inbound {
    /// Messages open.
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Guard bytes the open messages hold: a new message can only count on
    /// the rest of the guard.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// Checks a chunk against its message and takes it; a first chunk is
    /// handed back for the session to open the message.
    pub fn push(&mut self, c: Chunk) -> Result<Step, ProtocolError> {
        let id = c.id;
        if c.first {
            if self.open.contains_key(&id) {
                return Err(bad(format!(
                    "message {id} begun again before its last chunk"
                )));
            }
            if !c.last && self.open.len() >= MAX_OPEN {
                return Err(bad(format!(
                    "message {id}: more than {MAX_OPEN} messages open at once"
                )));
            }
            return Ok(Step::Begin(c));
        }
        let Some(o) = self.open.get_mut(&id) else {
            return Err(bad(format!(
                "chunk at offset {} of message {id}, which was not begun",
                c.offset
            )));
        };
        if (c.total, c.class) != (o.total, o.class) {
            return Err(bad(format!(
                "message {id} changed from {} bytes in class {} to {} bytes in class {}",
                o.total, o.class, c.total, c.class
            )));
        }
        if c.offset != o.next {
            return Err(bad(format!(
                "message {id}: chunk at offset {}, expected {}",
                c.offset, o.next
            )));
        }
        o.next += c.data.len() as u64;
        match &mut o.dest {
            Dest::Cores { buf, .. } => buf.extend_from_slice(&c.data),
            // A lane that stopped reading is the session ending; the chunk
            // has nowhere to go.
            Dest::Spin(tx) => {
                let _ = tx.send(c.data);
            }
            Dest::Discard => {}
        }
        if !c.last {
            return Ok(Step::Taken);
        }
        let o = self.open.remove(&id).expect("found above");
        self.reserved -= o.reserved;
        match o.dest {
            Dest::Cores {
                buf,
                count,
                reservation,
            } => Ok(Step::Whole {
                id,
                class: o.class,
                data: buf.freeze(),
                count,
                reservation,
            }),
            Dest::Spin(_) | Dest::Discard => Ok(Step::Taken),
        }
    }

    /// Opens message `first.id` (not its last chunk) toward `dest`, holding
    /// `reserved` guard bytes until its last chunk.
    pub fn open(&mut self, first: &Chunk, reserved: usize, dest: Dest) {
        self.reserved += reserved;
        self.open.insert(
            first.id,
            Open {
                class: first.class,
                total: first.total,
                next: first.data.len() as u64,
                reserved,
                dest,
            },
        );
    }
}

/// A streamed message for the lane, and the sender its chunks go through.
pub fn stream_job(
    first: &Chunk,
    count: usize,
    reservation: Reservation,
) -> (StreamJob, std::sync::mpsc::Sender<Bytes>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let _ = tx.send(first.data.clone());
    let job = StreamJob {
        id: first.id,
        class: first.class,
        count,
        total: first.total,
        reservation,
        chunks: rx,
    };
    (job, tx)
}

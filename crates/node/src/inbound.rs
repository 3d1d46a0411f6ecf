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

use bytes::Bytes;
use corefarm_smp::stream::{Chunk, ChunkHeader, Place};
use corefarm_smp::ProtocolError;

use crate::guard::Reservation;
use crate::spin::StreamJob;

/// Messages begun and not finished at once.
pub const MAX_OPEN: usize = 64;

/// Where the rest of an open message goes.
pub enum Dest {
    /// Gathered for the cores; the session reads its chunks after the
    /// first straight into `buf` ([`Place`]).
    Cores {
        buf: Vec<u8>,
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

pub struct Inbound {
    open: HashMap<u32, Open>,
    /// Guard bytes held by the open messages.
    reserved: usize,
    /// The chunk size agreed with the server: a larger chunk is refused.
    max_chunk: u64,
}

fn bad(why: String) -> ProtocolError {
    ProtocolError::BadChunk(why)
}

impl Inbound {
    /// Chunks of at most `max_chunk` data bytes, the size agreed in the
    /// server's hello.
    pub fn new(max_chunk: u32) -> Self {
        Inbound {
            open: HashMap::new(),
            reserved: 0,
            max_chunk: u64::from(max_chunk),
        }
    }

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
        let id = c.head.id;
        c.head.within(self.max_chunk)?;
        if c.head.first {
            if self.open.contains_key(&id) {
                return Err(bad(format!(
                    "message {id} begun again before its last chunk"
                )));
            }
            if !c.head.last && self.open.len() >= MAX_OPEN {
                return Err(bad(format!(
                    "message {id}: more than {MAX_OPEN} messages open at once"
                )));
            }
            return Ok(Step::Begin(c));
        }
        let o = self.take(&c.header())?;
        match &mut o.dest {
            Dest::Cores { buf, .. } => buf.extend_from_slice(&c.data),
            // A lane that stopped reading is the session ending; the chunk
            // has nowhere to go.
            Dest::Spin(tx) => {
                let _ = tx.send(c.data);
            }
            Dest::Discard => {}
        }
        if !c.head.last {
            return Ok(Step::Taken);
        }
        Ok(self.finish(id))
    }

    /// Checks a chunk that continues an open message against it and moves
    /// the message past it: the message, ready for the chunk's data.
    fn take(&mut self, c: &ChunkHeader) -> Result<&mut Open, ProtocolError> {
        let id = c.id;
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
        o.next += c.len;
        Ok(o)
    }

    /// Closes a message whose last chunk is in.
    fn finish(&mut self, id: u32) -> Step {
        let o = self.open.remove(&id).expect("an open message");
        self.reserved -= o.reserved;
        match o.dest {
            Dest::Cores {
                buf,
                count,
                reservation,
            } => Step::Whole {
                id,
                class: o.class,
                data: Bytes::from(buf),
                count,
                reservation,
            },
            Dest::Spin(_) | Dest::Discard => Step::Taken,
        }
    }

    /// A configuration ends every message still arriving: each is dropped
    /// (its buffer and reservation; a lane stream ends, and the lane sends
    /// nothing for it) and its remaining chunks are read and discarded.
    /// Returns the ids of the messages not answered yet, in order.
    pub fn abandon(&mut self) -> Vec<u32> {
        let mut ids = Vec::new();
        for (&id, o) in self.open.iter_mut() {
            if !matches!(o.dest, Dest::Discard) {
                o.dest = Dest::Discard;
                ids.push(id);
            }
            o.reserved = 0;
        }
        self.reserved = 0;
        ids.sort_unstable();
        ids
    }

    /// Opens message `first.id` (not its last chunk) toward `dest`, holding
    /// `reserved` guard bytes until its last chunk.
    pub fn open(&mut self, first: &Chunk, reserved: usize, dest: Dest) {
        self.reserved += reserved;
        self.open.insert(
            first.head.id,
            Open {
                class: first.head.class,
                total: first.head.total,
                next: first.data.len() as u64,
                reserved,
                dest,
            },
        );
    }
}

/// Messages for the cores are placed: their chunks after the first are
/// read into the buffer the cores take. Streamed and discarded ones are
/// not (the lane takes each chunk as it comes).
// SAFETY: a message's buffer is its `Dest::Cores` vector, allocated whole
// at the first chunk and left in place until the last; only the reader
// extends it.
unsafe impl Place for Inbound {
    type Whole = Step;

    fn place(&mut self, h: &ChunkHeader) -> Result<Option<&mut Vec<u8>>, ProtocolError> {
        h.within(self.max_chunk)?;
        let cores = self
            .open
            .get(&h.id)
            .is_some_and(|o| matches!(o.dest, Dest::Cores { .. }));
        if !cores {
            return Ok(None);
        }
        match &mut self.take(h)?.dest {
            // Allocated for the whole message at its first chunk, and the
            // chunk ends within it (checked by the codec and `take`).
            Dest::Cores { buf, .. } => Ok(Some(buf)),
            _ => unreachable!("checked above"),
        }
    }

    fn resume(&mut self, id: u32) -> Option<&mut Vec<u8>> {
        match &mut self.open.get_mut(&id)?.dest {
            Dest::Cores { buf, .. } => Some(buf),
            _ => None,
        }
    }

    fn placed(&mut self, h: &ChunkHeader) -> Option<Step> {
        h.last.then(|| self.finish(h.id))
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
        id: first.head.id,
        class: first.head.class,
        count,
        total: first.head.total,
        reservation,
        chunks: rx,
    };
    (job, tx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::MemoryGuard;
    use corefarm_smp::codec::{FrameReader, Read};
    use corefarm_smp::stream::Chunks;

    fn chunks(id: u32, n: usize, size: usize) -> Vec<Chunk> {
        let data = Bytes::from(
            (0..n)
                .map(|i| (i * 13) as u8 ^ id as u8)
                .collect::<Vec<u8>>(),
        );
        Chunks::new(id, 2, data, size).unwrap().collect()
    }

    /// A chunk over the agreed size is refused, first or continuing, pushed
    /// or placed: the server cannot make one frame carry more.
    #[tokio::test]
    async fn chunks_over_the_agreed_size_are_refused() {
        let over = |e: ProtocolError| matches!(&e, ProtocolError::BadChunk(w) if w.contains("over the 4096 agreed"));
        let mut inb = Inbound::new(4096);
        let big = chunks(1, 20_000, 8192);
        assert!(over(inb.push(big[0].clone()).err().expect("refused")));
        // A continuing chunk of an open message, pushed and placed.
        let ok = chunks(2, 20_000, 4096);
        assert!(matches!(inb.push(ok[0].clone()), Ok(Step::Begin(_))));
        inb.open(&ok[0], 0, Dest::Discard);
        let wide = Chunk {
            head: ChunkHeader::at(2, 2, 4096, 20_000, 8192),
            data: Bytes::from(vec![0; 8192]),
        };
        assert!(over(inb.push(wide.clone()).err().expect("refused")));
        assert!(over(inb.place(&wide.head).expect_err("refused")));
        // At the size, it is taken.
        assert!(matches!(inb.push(ok[1].clone()), Ok(Step::Taken)));
    }

    /// A message for the cores is read into its buffer; a streamed one
    /// still reaches the lane chunk by chunk.
    #[tokio::test]
    async fn messages_for_the_cores_are_placed_and_streamed_ones_are_not() {
        let guard = MemoryGuard::new(1 << 20);
        let (cores, spin) = (chunks(1, 40_000, 8192), chunks(2, 30_000, 8192));
        let mut wire = Vec::new();
        for i in 1..cores.len().max(spin.len()) {
            for c in [cores.get(i), spin.get(i)].into_iter().flatten() {
                wire.extend(c.to_frame().unwrap().to_vec());
            }
        }
        let mut inb = Inbound::new(8192);
        let mut first = Vec::with_capacity(40_000);
        first.extend_from_slice(&cores[0].data);
        let at = first.as_ptr();
        let reservation = guard.reserve(40_000).await;
        inb.open(
            &cores[0],
            0,
            Dest::Cores {
                buf: first,
                count: 1,
                reservation,
            },
        );
        let (job, tx) = stream_job(&spin[0], 1, guard.reserve(0).await);
        inb.open(&spin[0], 0, Dest::Spin(tx));
        let mut r = FrameReader::new(&wire[..], 1 << 20);
        let (mut whole, mut frames) = (None, 0);
        while let Some(read) = r.read_placing(&mut inb).await.unwrap() {
            match read {
                Read::Placed {
                    whole: Some(Step::Whole { data, .. }),
                    ..
                } => whole = Some(data),
                Read::Placed { .. } => {}
                Read::Frame(f) => {
                    frames += 1;
                    match inb.push(Chunk::parse(f.payload).unwrap()).unwrap() {
                        Step::Taken => {}
                        _ => panic!("a streamed chunk is taken"),
                    }
                }
            }
        }
        let want: Vec<u8> = cores.iter().flat_map(|c| c.data.to_vec()).collect();
        let whole = whole.unwrap();
        assert_eq!(whole, want);
        assert_eq!(whole.as_ptr(), at, "the cores' buffer moved");
        assert_eq!(
            frames,
            spin.len() - 1,
            "every streamed chunk came as a frame"
        );
        let got: Vec<u8> = job.chunks.try_iter().flat_map(|b| b.to_vec()).collect();
        let sent: Vec<u8> = spin.iter().flat_map(|c| c.data.to_vec()).collect();
        assert_eq!(got, sent);
        assert_eq!(inb.open_count(), 0);
    }
}

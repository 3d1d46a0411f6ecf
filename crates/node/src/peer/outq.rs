//! What a peer link sends next (issue 11 on node↔node links): messages wait
//! by priority class, and within a class in the link's [`LinkScheduler`]
//! (seed 001's replaceable module: round robin between destinations). On a
//! link that negotiated chunks, a message larger than the chunk size goes
//! out one chunk (type 0x1D) at a time, so a more urgent message queued
//! after it passes between two of its chunks — control traffic (aborts and
//! empty collective chunks: barriers) rides in class 0, above collective
//! data in the default class.
//!
//! One message per class is cut at a time: the scheduler of a class sees
//! the next message only once the previous one has left, as it did when
//! every message left whole, so its order per destination holds.
//!
//! A chunked peer message is its payload (routing and collective headers,
//! then data) cut into chunks: the headers go as a small first chunk of
//! their own, the data as slices of its buffer, so nothing is copied.

use bytes::Bytes;
use corefarm_smp::stream::{Chunk, ClassPicker, CLASSES, DEFAULT_CLASS};
use corefarm_smp::PeerFrame;
use tokio::sync::OwnedSemaphorePermit;

use super::sched::{LinkScheduler, Queued, SchedulerFactory};

/// Class of control traffic on a peer link.
pub const CONTROL_CLASS: u8 = 0;
/// Class of collective data on a peer link.
pub const DATA_CLASS: u8 = DEFAULT_CLASS;
/// Chunks of a more urgent class that may pass a waiting class in a row
/// before it sends one (the links' guard, as on the server↔node link).
pub const GUARD: u32 = corefarm_smp::stream::outbox::STARVATION_GUARD;

/// Either kind of frame the writer sends; both are `Buf`s without copies.
pub enum Frame {
    Whole(PeerFrame),
    Chunk(corefarm_smp::stream::ChunkFrame),
}

/// A message being cut into chunks.
struct Stream {
    id: u32,
    class: u8,
    head: Bytes,
    body: Bytes,
    total: u64,
    /// Bytes of the payload already sent.
    sent: u64,
    /// Held until the last chunk has been taken.
    permit: Option<OwnedSemaphorePermit>,
}

impl Stream {
    fn next(&mut self, size: usize) -> Chunk {
        let hl = self.head.len() as u64;
        let data = if self.sent < hl {
            self.head.clone()
        } else {
            let from = (self.sent - hl) as usize;
            let to = (from + size).min(self.body.len());
            self.body.slice(from..to)
        };
        let c = Chunk {
            id: self.id,
            class: self.class,
            first: self.sent == 0,
            last: self.sent + data.len() as u64 == self.total,
            offset: self.sent,
            total: self.total,
            data,
        };
        self.sent += c.data.len() as u64;
        c
    }
}

pub struct PeerOutbox {
    factory: SchedulerFactory,
    scheds: Vec<Option<Box<dyn LinkScheduler>>>,
    queued: [usize; CLASSES as usize],
    current: Vec<Option<Stream>>,
    picker: ClassPicker,
    chunk_size: usize,
    next_id: u32,
}

impl PeerOutbox {
    /// `chunk_size` 0: every message whole (a peer without chunks).
    pub fn new(factory: SchedulerFactory, chunk_size: usize) -> Self {
        PeerOutbox {
            factory,
            scheds: (0..CLASSES).map(|_| None).collect(),
            queued: [0; CLASSES as usize],
            current: (0..CLASSES).map(|_| None).collect(),
            picker: ClassPicker::new(GUARD),
            chunk_size,
            next_id: 0,
        }
    }

    pub fn push(&mut self, q: Queued) {
        let c = q.class.min(CLASSES - 1) as usize;
        let factory = &self.factory;
        self.scheds[c].get_or_insert_with(|| factory()).push(q);
        self.queued[c] += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.queued.iter().all(|&n| n == 0) && self.current.iter().all(Option::is_none)
    }

    /// The next frame to write; the permit it returns (if any) is released
    /// once the frame is written.
    pub fn pop(&mut self) -> Option<(Frame, Option<OwnedSemaphorePermit>)> {
        let (queued, current) = (&self.queued, &self.current);
        let c = self
            .picker
            .pick(|c| queued[c] > 0 || current[c].is_some())?;
        if self.current[c].is_none() {
            let q = self.scheds[c].as_mut()?.pop()?;
            self.queued[c] -= 1;
            match self.cut(q, c as u8) {
                Ok(s) => self.current[c] = Some(s),
                Err(whole) => return Some(whole),
            }
        }
        let s = self.current[c].as_mut().expect("set above");
        let chunk = s.next(self.chunk_size);
        // Cut from a message that fits a frame: every rule holds.
        let frame = chunk.to_frame().expect("a valid chunk");
        let permit = if chunk.last {
            self.current[c].take().and_then(|s| s.permit)
        } else {
            None
        };
        Some((Frame::Chunk(frame), permit))
    }

    /// A message as chunks, or whole when its data fits one chunk (or
    /// chunks are off): collectives cut blocks into chunks of their own,
    /// 64 KiB by default, which would otherwise each cost a second frame
    /// for their headers and gain no earlier turn for anyone.
    #[allow(clippy::result_large_err)]
    fn cut(
        &mut self,
        q: Queued,
        class: u8,
    ) -> Result<Stream, (Frame, Option<OwnedSemaphorePermit>)> {
        let size = self.chunk_size;
        let parts = q
            .frame
            .payload_parts()
            .map(|(head, body)| (head.len() + body.len(), head, body));
        match parts {
            Some((len, head, body)) if size > 0 && body.len() > size => {
                let id = self.next_id;
                self.next_id = self.next_id.wrapping_add(1);
                Ok(Stream {
                    id,
                    class,
                    head: Bytes::copy_from_slice(head),
                    body: body.clone(),
                    total: len as u64,
                    sent: 0,
                    permit: q.permit,
                })
            }
            _ => Err((Frame::Whole(q.frame), q.permit)),
        }
    }
}

impl bytes::Buf for Frame {
    fn remaining(&self) -> usize {
        match self {
            Frame::Whole(f) => f.remaining(),
            Frame::Chunk(f) => f.remaining(),
        }
    }

    fn chunk(&self) -> &[u8] {
        match self {
            Frame::Whole(f) => f.chunk(),
            Frame::Chunk(f) => f.chunk(),
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        match self {
            Frame::Whole(f) => f.chunks_vectored(dst),
            Frame::Chunk(f) => f.chunks_vectored(dst),
        }
    }

    fn advance(&mut self, n: usize) {
        match self {
            Frame::Whole(f) => f.advance(n),
            Frame::Chunk(f) => f.advance(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::sched::round_robin;
    use super::*;
    use corefarm_smp::stream::Reassembler;
    use corefarm_smp::{CollHeader, PeerBody, PeerHeader, PeerKind, PeerMsg, HEADER_LEN};

    fn msg(dst: u32, seq: u64, data: &[u8]) -> PeerMsg {
        let coll = CollHeader::bcast(data.len() as u64);
        PeerMsg {
            header: PeerHeader {
                kind: PeerKind::Collective,
                ttl: 2,
                group: 1,
                src: 0,
                dst,
                seq,
            },
            body: PeerBody::Collective {
                coll,
                data: Bytes::copy_from_slice(data),
            },
        }
    }

    fn queued(m: &PeerMsg) -> Queued {
        Queued::new(m.header.dst, m.to_frame().unwrap(), None)
    }

    /// What the receiving side makes of the frames: whole peer messages.
    fn receive(frames: Vec<Frame>) -> Vec<PeerMsg> {
        let mut r = Reassembler::new(1 << 20, 8, 1 << 20);
        let mut out = Vec::new();
        for f in frames {
            let v = match f {
                Frame::Whole(f) => f.to_vec(),
                Frame::Chunk(f) => f.to_vec(),
            };
            let payload = Bytes::copy_from_slice(&v[HEADER_LEN..]);
            if v[0] == corefarm_smp::MsgType::Peer as u8 {
                out.push(PeerMsg::parse(payload).unwrap());
            } else if let Some(m) = r.push(Chunk::parse(payload).unwrap()).unwrap() {
                out.push(PeerMsg::parse(m.data).unwrap());
            }
        }
        out
    }

    #[test]
    fn an_urgent_message_passes_a_large_one_between_two_chunks() {
        let mut o = PeerOutbox::new(round_robin(), 1000);
        let big: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let big = msg(1, 1, &big);
        o.push(queued(&big));
        let mut frames = vec![o.pop().unwrap().0, o.pop().unwrap().0];
        assert!(matches!(frames[0], Frame::Chunk(_)), "cut into chunks");
        let abort = PeerMsg {
            header: PeerHeader {
                kind: PeerKind::Abort,
                ..big.header
            },
            body: PeerBody::Abort {
                culprit: 2,
                coll_seq: 1,
                reason: "stop".into(),
            },
        };
        o.push(queued(&abort));
        frames.push(o.pop().unwrap().0);
        assert!(matches!(frames[2], Frame::Whole(_)), "small: whole");
        while let Some((f, _)) = o.pop() {
            frames.push(f);
        }
        assert!(o.is_empty());
        // The head chunk, one data chunk, the abort, four more data chunks.
        assert_eq!(frames.len(), 2 + 1 + 4);
        assert_eq!(receive(frames), [abort, big], "the abort arrives first");
    }

    #[test]
    fn within_a_class_the_scheduler_keeps_each_destinations_order() {
        let mut o = PeerOutbox::new(round_robin(), 300);
        let ms = [
            msg(1, 1, &[1; 700]),
            msg(1, 2, &[2; 10]),
            msg(2, 3, &[3; 700]),
            msg(1, 4, &[4; 10]),
        ];
        ms.iter().for_each(|m| o.push(queued(m)));
        let frames: Vec<Frame> = std::iter::from_fn(|| o.pop().map(|p| p.0)).collect();
        let seqs: Vec<u64> = receive(frames).iter().map(|m| m.header.seq).collect();
        // Round robin between destinations 1 and 2, each in order.
        assert_eq!(seqs, [1, 3, 2, 4]);
    }

    #[test]
    fn without_chunks_messages_leave_whole() {
        let mut o = PeerOutbox::new(round_robin(), 0);
        let m = msg(1, 1, &[9; 5000]);
        o.push(queued(&m));
        let (f, _) = o.pop().unwrap();
        assert!(matches!(f, Frame::Whole(_)));
        assert_eq!(receive(vec![f]), [m]);
        assert!(o.pop().is_none());
    }
}

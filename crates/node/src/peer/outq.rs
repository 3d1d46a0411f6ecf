//! What a peer link sends next, by priority class as on the server link:
//! messages wait
//! in lanes, and within a lane in the link's [`LinkScheduler`] (seed 001's
//! replaceable module: round robin between destinations). Control traffic
//! (aborts and empty collective chunks: barriers) has a lane above all
//! data, served first whenever it waits: it is small and rare, and a
//! collective's failure or barrier must not queue behind anyone's data.
//! Collective data waits in the lane of its collective's priority class
//! (the user's, carried by the group command and the collective header),
//! served by strict priority with the links' anti-starvation guard
//! ([`ClassPicker`], as on the other links). On a link that negotiated
//! chunks, a message larger than the chunk size goes out one chunk (type
//! 0x1D) at a time, so a more urgent message queued after it passes
//! between two of its chunks.
//!
//! Passing reorders a source's sequence numbers, and a receiver drops a
//! message more than its duplicate window ([`super::dedup::WINDOW`]) older
//! than the newest it has seen from that source. So a message that has
//! seen a link's `max_passed` messages leave since it was queued goes
//! next, whatever its lane: [`max_passed`] shares the window among the
//! hops of the longest route a message may take (its time to live), so
//! every route stays inside it.
//!
//! One message per lane is cut at a time: the scheduler of a lane sees
//! the next message only once the previous one has left, as it did when
//! every message left whole, so its order per destination holds.
//!
//! A chunked peer message is its payload (routing and collective headers,
//! then data) cut into chunks: the headers go as a small first chunk of
//! their own, the data as slices of its buffer, so nothing is copied.

use bytes::Bytes;
use corefarm_smp::stream::{Chunk, ClassPicker, CLASSES};
use corefarm_smp::PeerFrame;
use tokio::sync::OwnedSemaphorePermit;

use super::sched::{LinkScheduler, Queued, SchedulerFactory};

/// Chunks of a more urgent class that may pass a waiting class in a row
/// before it sends one (the links' guard, as on the server↔node link).
pub const GUARD: u32 = corefarm_smp::stream::outbox::STARVATION_GUARD;

/// Where a message waits on a peer link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Aborts and empty collective chunks: above every data class.
    Control,
    /// Collective data of priority class 0 (most urgent) … 7.
    Data(u8),
}

impl Lane {
    /// Index into the outbox's lanes: control first, then the classes.
    fn index(self) -> usize {
        match self {
            Lane::Control => 0,
            Lane::Data(c) => 1 + c.min(CLASSES - 1) as usize,
        }
    }

    /// The class its chunks carry on the wire: control as the most urgent.
    fn wire_class(index: usize) -> u8 {
        index.saturating_sub(1) as u8
    }
}

const LANES: usize = 1 + CLASSES as usize;

/// Messages that may leave a link while one queued on it waits, for a
/// group whose messages take at most `hops` links: the duplicate window
/// shared among them (at least 1).
pub fn max_passed(hops: u32) -> u64 {
    (super::dedup::WINDOW / u64::from(hops.max(1))).max(1)
}

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
    /// Its [`Queued::ticket`]: it counts as waiting until its last chunk.
    ticket: u64,
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
        let c = Chunk::new(self.id, self.class, self.sent, self.total, data);
        self.sent += c.data.len() as u64;
        c
    }
}

pub struct PeerOutbox {
    factory: SchedulerFactory,
    /// Per lane ([`Lane::index`]): its scheduler, how many wait in it, the
    /// message being cut.
    scheds: Vec<Option<Box<dyn LinkScheduler>>>,
    queued: [usize; LANES],
    current: Vec<Option<Stream>>,
    /// Between the data classes only: control never waits for data.
    picker: ClassPicker,
    /// Messages that have left the link (whole or their last chunk).
    done: u64,
    /// Every message not yet wholly sent, by ticket (the order they were
    /// queued in): `done` when it was queued, and its lane.
    unsent: std::collections::BTreeMap<u64, (u64, usize)>,
    /// The next ticket.
    pushed: u64,
    chunk_size: usize,
    next_id: u32,
    /// [`max_passed`] for this link's group.
    max_passed: u64,
}

impl PeerOutbox {
    /// `chunk_size` 0: every message whole (a peer without chunks).
    /// `max_passed`: see [`max_passed`].
    pub fn new(factory: SchedulerFactory, chunk_size: usize, max_passed: u64) -> Self {
        PeerOutbox {
            factory,
            scheds: (0..LANES).map(|_| None).collect(),
            queued: [0; LANES],
            current: (0..LANES).map(|_| None).collect(),
            picker: ClassPicker::new(GUARD),
            done: 0,
            unsent: std::collections::BTreeMap::new(),
            pushed: 0,
            chunk_size,
            next_id: 0,
            max_passed: max_passed.max(1),
        }
    }

    pub fn push(&mut self, mut q: Queued) {
        let c = q.lane.index();
        q.ticket = self.pushed;
        self.pushed += 1;
        self.unsent.insert(q.ticket, (self.done, c));
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
        let waiting = |l: usize| queued[l] > 0 || current[l].is_some();
        // The oldest message, once passed by max_passed, takes its lane's turn.
        let overdue = self
            .unsent
            .first_key_value()
            .filter(|(_, (at, _))| self.done - at >= self.max_passed)
            .map(|(_, &(_, lane))| lane);
        let c = match overdue {
            Some(lane) => lane,
            None if waiting(0) => 0,
            None => 1 + self.picker.pick(|class| waiting(1 + class))?,
        };
        if self.current[c].is_none() {
            let q = self.scheds[c].as_mut()?.pop()?;
            self.queued[c] -= 1;
            match self.cut(q, Lane::wire_class(c)) {
                Ok(s) => self.current[c] = Some(s),
                Err((whole, ticket)) => {
                    self.left(ticket);
                    return Some(whole);
                }
            }
        }
        let s = self.current[c].as_mut().expect("set above");
        let chunk = s.next(self.chunk_size);
        // Cut from a message that fits a frame: every rule holds.
        let frame = chunk.to_frame().expect("a valid chunk");
        let permit = if chunk.head.last {
            let s = self.current[c].take().expect("set above");
            self.left(s.ticket);
            s.permit
        } else {
            None
        };
        Some((Frame::Chunk(frame), permit))
    }

    /// The message with `ticket` has wholly left the link.
    fn left(&mut self, ticket: u64) {
        self.unsent.remove(&ticket);
        self.done += 1;
    }

    /// A message as chunks, or whole when its data fits one chunk (or
    /// chunks are off): collectives cut blocks into chunks of their own,
    /// 64 KiB by default, which would otherwise each cost a second frame
    /// for their headers and gain no earlier turn for anyone.
    #[allow(clippy::result_large_err, clippy::type_complexity)]
    fn cut(
        &mut self,
        q: Queued,
        class: u8,
    ) -> Result<Stream, ((Frame, Option<OwnedSemaphorePermit>), u64)> {
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
                    ticket: q.ticket,
                    permit: q.permit,
                })
            }
            _ => Err(((Frame::Whole(q.frame), q.permit), q.ticket)),
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
    use crate::peer::dedup::WINDOW;
    use corefarm_smp::stream::Reassembler;
    use corefarm_smp::{CollHeader, PeerBody, PeerHeader, PeerKind, PeerMsg, HEADER_LEN};

    fn msg(dst: u32, seq: u64, data: &[u8]) -> PeerMsg {
        msg_of(corefarm_smp::stream::DEFAULT_CLASS, dst, seq, data)
    }

    fn msg_of(class: u8, dst: u32, seq: u64, data: &[u8]) -> PeerMsg {
        let coll = CollHeader {
            class,
            ..CollHeader::bcast(data.len() as u64)
        };
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

    /// A frame as it arrives: whether it is a whole peer message (else a
    /// chunk), and its payload.
    fn decoded(f: Frame) -> (bool, Bytes) {
        let v = match f {
            Frame::Whole(f) => f.to_vec(),
            Frame::Chunk(f) => f.to_vec(),
        };
        let peer = v[0] == corefarm_smp::MsgType::Peer as u8;
        (peer, Bytes::copy_from_slice(&v[HEADER_LEN..]))
    }

    /// What the receiving side makes of the frames: whole peer messages.
    fn receive(frames: Vec<Frame>) -> Vec<PeerMsg> {
        let mut r = Reassembler::new(1 << 20, 8, 1 << 20);
        let mut out = Vec::new();
        for f in frames {
            let (peer, payload) = decoded(f);
            if peer {
                out.push(PeerMsg::parse(payload).unwrap());
            } else if let Some(m) = r.push(Chunk::parse(payload).unwrap()).unwrap() {
                out.push(PeerMsg::parse(m.data).unwrap());
            }
        }
        out
    }

    #[test]
    fn an_urgent_message_passes_a_large_one_between_two_chunks() {
        let mut o = PeerOutbox::new(round_robin(), 1000, max_passed(4));
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

    /// The class of each frame in the order they leave, with the peer
    /// sequence number of its message (chunks: read from the reassembled
    /// message, attributed to every chunk of it by chunk id).
    fn classes_in_order(o: &mut PeerOutbox) -> Vec<(u8, u64)> {
        let frames: Vec<Frame> = std::iter::from_fn(|| o.pop().map(|p| p.0)).collect();
        let mut out = Vec::new();
        for f in frames {
            let (peer, payload) = decoded(f);
            if peer {
                let m = PeerMsg::parse(payload).unwrap();
                let class = match m.body {
                    PeerBody::Collective { coll, .. } => coll.class,
                    _ => 99,
                };
                out.push((class, m.header.seq));
            } else {
                let c = Chunk::parse(payload).unwrap();
                out.push((c.head.class, 1000 + c.head.id as u64));
            }
        }
        out
    }

    #[test]
    fn urgent_collective_data_passes_bulk_data_queued_before_it() {
        let mut o = PeerOutbox::new(round_robin(), 1000, max_passed(4));
        // Bulk (class 7) collective data queued first, two messages of five
        // chunks each, then urgent (class 0) and default data: one chunk of
        // bulk has left when the others arrive.
        o.push(queued(&msg_of(7, 1, 1, &[7; 5000])));
        o.push(queued(&msg_of(7, 1, 2, &[7; 5000])));
        let first = o.pop().unwrap().0;
        assert!(matches!(first, Frame::Chunk(_)));
        o.push(queued(&msg_of(
            corefarm_smp::stream::DEFAULT_CLASS,
            2,
            3,
            &[4; 2500],
        )));
        o.push(queued(&msg_of(0, 2, 4, &[0; 2500])));
        o.push(queued(&msg_of(0, 1, 5, &[0; 10])));
        let order = classes_in_order(&mut o);
        let classes: Vec<u8> = order.iter().map(|c| c.0).collect();
        // Urgent (its head chunk, three data chunks; then the small one
        // whole), then the default class (four chunks), then the rest of
        // the bulk: five chunks of the first message, six of the second.
        let mut want = vec![0; 5];
        want.extend([4; 4]);
        want.extend([7; 11]);
        assert_eq!(classes, want, "{order:?}");
        assert_eq!(order[4], (0, 5), "whole, after the cut one of its class");
    }

    #[test]
    fn control_passes_every_data_class_and_the_guard_serves_bulk() {
        let mut o = PeerOutbox::new(round_robin(), 100, max_passed(4));
        // One bulk message of 100 chunks and a stream of urgent ones.
        o.push(queued(&msg_of(7, 1, 1, &[7; 100 * 100])));
        for seq in 0..200 {
            o.push(queued(&msg_of(0, 2, 10 + seq, &[0; 100])));
        }
        let abort = PeerMsg {
            header: PeerHeader {
                kind: PeerKind::Abort,
                ttl: 2,
                group: 1,
                src: 0,
                dst: 3,
                seq: 500,
            },
            body: PeerBody::Abort {
                culprit: 2,
                coll_seq: 1,
                reason: "stop".into(),
            },
        };
        o.push(queued(&abort));
        let order = classes_in_order(&mut o);
        assert_eq!(order[0], (99, 500), "the abort first, above class 0");
        // Then urgent data, except that bulk (class 7) goes once after
        // every GUARD urgent frames.
        let bulk_at: Vec<usize> = order
            .iter()
            .enumerate()
            .filter(|(_, c)| c.0 == 7)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(bulk_at[0], 1 + GUARD as usize, "{order:?}");
        assert_eq!(bulk_at[1], 2 + 2 * GUARD as usize);
        assert_eq!(order.iter().filter(|c| c.0 == 0).count(), 200);
    }

    #[test]
    fn a_message_is_passed_by_at_most_max_passed_others() {
        let mut o = PeerOutbox::new(round_robin(), 0, max_passed(4));
        // 20 bulk messages to one destination and a flood of urgent ones:
        // by the guard alone the last bulk one would wait for about
        // 20 × 64 urgent ones, more than a receiver's window tolerates.
        for seq in 0..20 {
            o.push(queued(&msg_of(7, 1, seq, &[7; 10])));
        }
        for seq in 100..2100 {
            o.push(queued(&msg_of(0, 2, seq, &[0; 10])));
        }
        let order = classes_in_order(&mut o);
        assert_eq!(order.len(), 2020);
        let bulk: Vec<(usize, u64)> = order
            .iter()
            .enumerate()
            .filter(|(_, c)| c.0 == 7)
            .map(|(i, c)| (i, c.1))
            .collect();
        assert_eq!(
            bulk.iter().map(|b| b.1).collect::<Vec<_>>(),
            (0..20).collect::<Vec<_>>()
        );
        // Passed by urgent ones: those that left before it; at most the
        // link's share of the receivers' window (here, for 4 hops).
        let bound = max_passed(4);
        for (k, &(at, seq)) in bulk.iter().enumerate() {
            let passed = (at - k) as u64;
            assert!(passed <= bound, "bulk {seq} passed by {passed}");
        }
        // The guard still gave the first ones their turns among urgent ones.
        assert_eq!(bulk[0].0, GUARD as usize);
        // Every hop's share fits the window together, whatever the length.
        for hops in [1, 2, 4, 17, 65, 5000] {
            let p = max_passed(hops);
            assert!(
                p >= 1 && (p * u64::from(hops) <= WINDOW || p == 1),
                "{hops}: {p}"
            );
        }
        assert_eq!(max_passed(0), WINDOW);
    }

    #[test]
    fn within_a_class_the_scheduler_keeps_each_destinations_order() {
        let mut o = PeerOutbox::new(round_robin(), 300, max_passed(4));
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
        let mut o = PeerOutbox::new(round_robin(), 0, max_passed(4));
        let m = msg(1, 1, &[9; 5000]);
        o.push(queued(&m));
        let (f, _) = o.pop().unwrap();
        assert!(matches!(f, Frame::Whole(_)));
        assert_eq!(receive(vec![f]), [m]);
        assert!(o.pop().is_none());
    }
}

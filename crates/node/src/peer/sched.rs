//! Link scheduling (seed 001 §III-B: a separate, replaceable scheduler
//! module). Each outgoing link queues messages per final destination; the
//! scheduler picks which goes next, so one long transfer does not starve
//! messages forwarded for other nodes.

use std::collections::{HashMap, VecDeque};

use corefarm_smp::{CollHeader, PeerFrame, PeerKind};
use tokio::sync::OwnedSemaphorePermit;

use super::outq::Lane;

/// A message waiting for its link.
#[derive(Debug)]
pub struct Queued {
    /// Final destination (not the next hop).
    pub dst: u32,
    pub frame: PeerFrame,
    /// Held while the message is queued: locally originated messages count
    /// against the link's byte budget; forwarded ones do not (a forwarding
    /// node must never wait on its own queue, or routes that form a cycle
    /// could deadlock).
    pub permit: Option<OwnedSemaphorePermit>,
    /// Where it waits on the link: collective data in the class its
    /// collective header carries, everything else (aborts, empty chunks
    /// such as a barrier's) in the control lane above every class.
    pub lane: Lane,
    /// Its place in the order its link queued messages (set by the
    /// outbox, which tracks by it how far a waiting message was passed).
    pub(crate) ticket: u64,
}

impl Queued {
    pub fn new(dst: u32, frame: PeerFrame, permit: Option<OwnedSemaphorePermit>) -> Self {
        // Read from the frame, not passed in: a forwarded message keeps the
        // class its source gave it.
        let class = frame.payload_parts().and_then(|(head, body)| {
            let data = head.first() == Some(&(PeerKind::Collective as u8)) && !body.is_empty();
            data.then(|| CollHeader::class_in(head)).flatten()
        });
        let lane = class.map_or(Lane::Control, Lane::Data);
        Queued {
            dst,
            frame,
            permit,
            lane,
            ticket: 0,
        }
    }
}

/// Orders the messages queued on one link. Messages to the same
/// destination must leave in the order they were pushed.
pub trait LinkScheduler: Send + 'static {
    fn push(&mut self, q: Queued);
    fn pop(&mut self) -> Option<Queued>;
}

/// Round-robin between destinations with queued messages (the default).
#[derive(Debug, Default)]
pub struct RoundRobin {
    queues: HashMap<u32, VecDeque<Queued>>,
    turn: VecDeque<u32>,
}

impl LinkScheduler for RoundRobin {
    fn push(&mut self, q: Queued) {
        let dst = q.dst;
        let queue = self.queues.entry(dst).or_default();
        if queue.is_empty() {
            self.turn.push_back(dst);
        }
        queue.push_back(q);
    }

    fn pop(&mut self) -> Option<Queued> {
        let dst = self.turn.pop_front()?;
        let queue = self.queues.get_mut(&dst).expect("a turn has a queue");
        let q = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(&dst);
        } else {
            self.turn.push_back(dst);
        }
        q
    }
}

/// Makes one scheduler per link.
pub type SchedulerFactory = std::sync::Arc<dyn Fn() -> Box<dyn LinkScheduler> + Send + Sync>;

pub fn round_robin() -> SchedulerFactory {
    std::sync::Arc::new(|| Box::new(RoundRobin::default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use corefarm_smp::{PeerBody, PeerHeader, PeerKind, PeerMsg};

    fn q(dst: u32, seq: u64) -> Queued {
        let m = PeerMsg {
            header: PeerHeader {
                kind: PeerKind::Hello,
                ttl: 1,
                group: 0,
                src: 0,
                dst,
                seq,
            },
            body: PeerBody::Hello {
                token: 0,
                name: String::new(),
            },
        };
        Queued::new(dst, m.to_frame().unwrap(), None)
    }

    fn seq(q: &Queued) -> u64 {
        u64::from_le_bytes(q.frame.to_vec()[24..32].try_into().unwrap())
    }

    #[test]
    fn alternates_between_destinations_keeping_each_in_order() {
        let mut s = RoundRobin::default();
        for i in 0..3 {
            s.push(q(5, i));
        }
        s.push(q(6, 10));
        s.push(q(6, 11));
        let order: Vec<(u32, u64)> = std::iter::from_fn(|| s.pop())
            .map(|x| (x.dst, seq(&x)))
            .collect();
        assert_eq!(order, vec![(5, 0), (6, 10), (5, 1), (6, 11), (5, 2)]);
    }
}

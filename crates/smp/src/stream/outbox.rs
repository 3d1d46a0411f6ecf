//! What a link sends, in the order it sends it: whole frames and messages
//! being cut into chunks, by class ([`ClassQueues`]). A message larger
//! than the link's chunk size is taken one chunk at a time, so a more
//! urgent message queued after it goes out between two of its chunks; the
//! chunks are slices of the message's buffer, never copies.
//!
//! With chunks off (a peer that did not negotiate them) every frame waits
//! in one class (0): the link is the plain FIFO it always was. With chunks on,
//! frames other than data (configuration, group control, errors) ride in
//! class 0, above data, so control never waits behind bulk data, and a
//! data message outside the default class goes as chunks even when it is small,
//! so that its class reaches the receiver's queues.

use bytes::Bytes;

use super::chunk::{Chunks, CLASSES, DEFAULT_CLASS};
use super::classes::ClassQueues;
use crate::outframe::OutFrame;

/// Passes a waiting class gets over by more urgent ones before it is
/// served once (the anti-starvation guard of [`ClassQueues`]).
pub const STARVATION_GUARD: u32 = 64;

enum Entry<T> {
    Frame(OutFrame, T),
    Stream(Chunks, T),
}

/// The frames waiting for a link. `T` travels with each message and comes
/// back when its last byte has been taken (a write-completion tag, a memory
/// reservation held until the result is on the wire).
pub struct Outbox<T> {
    queues: ClassQueues<Entry<T>>,
    chunk_size: usize,
}

impl<T> Default for Outbox<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Outbox<T> {
    /// Chunks off until [`Outbox::set_chunk_size`].
    pub fn new() -> Self {
        Outbox {
            queues: ClassQueues::new(STARVATION_GUARD),
            chunk_size: 0,
        }
    }

    /// The chunk size the link negotiated; 0: chunks off. Frames already
    /// queued keep their place.
    pub fn set_chunk_size(&mut self, size: usize) {
        self.chunk_size = size;
    }

    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Queues `f`; a data message in `class` (0–7, clamped).
    pub fn push(&mut self, f: OutFrame, class: u8, tag: T) {
        if self.chunk_size == 0 {
            // Class 0: what was queued before chunks were turned on (a
            // hello's answer) still goes before everything queued after.
            self.queues.push(0, Entry::Frame(f, tag));
            return;
        }
        let class = class.min(CLASSES - 1);
        let entry = match f.as_data() {
            None => return self.queues.push(0, Entry::Frame(f, tag)),
            // A plain data frame carries no class (the receiver serves it
            // in the default one), so a message of any other class goes as
            // chunks however small: one chunk, 20 bytes more on the wire.
            Some((id, body)) if body.len() > self.chunk_size || class != DEFAULT_CLASS => {
                let body: Bytes = body.clone();
                match Chunks::new(id, class, body, self.chunk_size) {
                    Ok(c) => Entry::Stream(c, tag),
                    Err(_) => Entry::Frame(f, tag),
                }
            }
            Some(_) => Entry::Frame(f, tag),
        };
        self.queues.push(class, entry);
    }

    /// Queues a frame that is not data in `class` (with chunks on; class 0
    /// otherwise, like every frame): what concerns a message (a handler's
    /// notification) then stays ahead of that message's result, which
    /// takes the same class, since a class is served first in, first out.
    pub fn push_in_class(&mut self, f: OutFrame, class: u8, tag: T) {
        let class = match self.chunk_size {
            0 => 0,
            _ => class.min(CLASSES - 1),
        };
        self.queues.push(class, Entry::Frame(f, tag));
    }

    /// Messages waiting (a message being chunked counts once).
    pub fn len(&self) -> usize {
        self.queues.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// The next frame to write, and the tag of the message it completes.
    /// A chunk frame is an `OutFrame` too, so the writer batches both alike
    /// (`FrameBatch`).
    pub fn pop(&mut self) -> Option<(OutFrame, Option<T>)> {
        let (class, e) = self.queues.pop()?;
        match e {
            Entry::Frame(f, t) => Some((f, Some(t))),
            Entry::Stream(mut chunks, t) => {
                let c = chunks.next().expect("a queued stream has a chunk left");
                // Chunks cut by `Chunks` obey every rule and fit a frame.
                let frame = c.to_frame().expect("a valid chunk");
                if c.head.last {
                    Some((frame, Some(t)))
                } else {
                    self.queues.push_front(class, Entry::Stream(chunks, t));
                    Some((frame, None))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::chunk::Chunk;
    use super::*;
    use crate::header::HEADER_LEN;

    fn parse(w: &OutFrame) -> (u8, Bytes) {
        let v = w.to_vec();
        (v[0], Bytes::from(v[HEADER_LEN..].to_vec()))
    }

    #[test]
    fn an_urgent_message_overtakes_a_bulk_one_between_two_chunks() {
        let mut o = Outbox::new();
        o.set_chunk_size(100);
        let bulk = Bytes::from(vec![7u8; 350]);
        o.push(OutFrame::data(1, bulk.clone()).unwrap(), 5, "bulk");
        let (w, done) = o.pop().unwrap();
        assert!(done.is_none());
        assert_eq!(parse(&w).0, 0x1D, "a large message goes as chunks");
        o.push(
            OutFrame::data(2, Bytes::from_static(b"urgent")).unwrap(),
            0,
            "urgent",
        );
        o.push(
            OutFrame::data(3, Bytes::from_static(b"plain")).unwrap(),
            DEFAULT_CLASS,
            "plain",
        );
        let (w, done) = o.pop().unwrap();
        assert_eq!(done, Some("urgent"));
        let (ty, p) = parse(&w);
        assert_eq!(ty, 0x1D, "small but urgent: one chunk carrying its class");
        let c = Chunk::parse(p).unwrap();
        assert_eq!(
            (
                c.head.id,
                c.head.class,
                c.head.first,
                c.head.last,
                &c.data[..]
            ),
            (2, 0, true, true, &b"urgent"[..])
        );
        let (w, done) = o.pop().unwrap();
        let (ty, p) = parse(&w);
        assert_eq!(
            (ty, &p[4..], done),
            (3, &b"plain"[..], Some("plain")),
            "small in the default class: a plain data frame"
        );
        let mut rest = Vec::new();
        while let Some((w, done)) = o.pop() {
            let (ty, p) = parse(&w);
            assert_eq!(ty, 0x1D);
            let c = Chunk::parse(p).unwrap();
            assert_eq!(c.head.id, 1);
            rest.push((c.head.offset, c.head.last, done));
        }
        assert_eq!(
            rest,
            [
                (100, false, None),
                (200, false, None),
                (300, true, Some("bulk"))
            ]
        );
    }

    #[test]
    fn without_chunks_the_link_stays_fifo() {
        let mut o = Outbox::new();
        o.push(OutFrame::data(1, Bytes::from(vec![0; 1000])).unwrap(), 7, 1);
        o.push(OutFrame::data(2, Bytes::new()).unwrap(), 0, 2);
        o.push(crate::ConfigurationResponse { status: 0 }.to_frame(), 0, 3);
        let order: Vec<i32> = std::iter::from_fn(|| o.pop())
            .map(|(_, t)| t.unwrap())
            .collect();
        assert_eq!(order, [1, 2, 3]);
    }
}

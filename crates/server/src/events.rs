//! The node event streams of one owner (a session, the shared scheduler, a
//! group), keyed by node, polled only when one of them has something.
//!
//! `tokio_stream::StreamMap` polls its streams in turn until one is ready:
//! every event cost a pass over all of the owner's nodes, re-registering a
//! waker with each, and a configuration's answers from thousands of nodes
//! cost the square of their number. Here each stream waits as a future in a
//! `FuturesUnordered`, which polls only those whose channel woke it. A
//! node's stream can be taken back out (a node returned to the pool keeps
//! the events it has not read).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use futures_util::stream::FuturesUnordered;
use tokio_stream::Stream;

/// One stream waiting for its next item.
struct Next<K, S> {
    key: K,
    /// Taken out by [`EventMap::remove`], which then wakes the entry so it
    /// completes and leaves the set.
    stream: Option<S>,
    /// The waker of this entry's last poll, to wake it on removal.
    waker: Option<Waker>,
}

impl<K: Copy + Unpin, S: Stream + Unpin> Future for Next<K, S> {
    /// The key, the stream's item (None: it ended) and the stream to wait
    /// on again; no stream: removed.
    type Output = (K, Option<S::Item>, Option<S>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(s) = this.stream.as_mut() else {
            return Poll::Ready((this.key, None, None));
        };
        match Pin::new(s).poll_next(cx) {
            Poll::Ready(item) => Poll::Ready((this.key, item, this.stream.take())),
            Poll::Pending => {
                if !this.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    this.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

/// Streams by key; yields `(key, item)` from whichever has one. A stream
/// that ends is dropped, as `StreamMap` does.
pub struct EventMap<K, S> {
    live: HashMap<K, ()>,
    waiting: FuturesUnordered<Next<K, S>>,
}

impl<K, S> Default for EventMap<K, S> {
    fn default() -> Self {
        EventMap {
            live: HashMap::new(),
            waiting: FuturesUnordered::new(),
        }
    }
}

impl<K: Copy + Eq + Hash + Unpin, S: Stream + Unpin> EventMap<K, S> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Adds `stream` under `key`, replacing (and dropping) one there.
    pub fn insert(&mut self, key: K, stream: S) {
        drop(self.remove(&key));
        self.live.insert(key, ());
        self.waiting.push(Next {
            key,
            stream: Some(stream),
            waker: None,
        });
    }

    /// Takes `key`'s stream back out, with whatever it has not yielded.
    /// Linear in the streams held: nodes leave an owner far less often than
    /// they send it events.
    pub fn remove(&mut self, key: &K) -> Option<S> {
        self.live.remove(key)?;
        let entry = self
            .waiting
            .iter_mut()
            .find(|n| n.key == *key && n.stream.is_some())?;
        if let Some(w) = entry.waker.take() {
            w.wake();
        }
        entry.stream.take()
    }
}

impl<K: Copy + Eq + Hash + Unpin, S: Stream + Unpin> Stream for EventMap<K, S> {
    type Item = (K, S::Item);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            match Pin::new(&mut this.waiting).poll_next(cx) {
                Poll::Ready(Some((key, Some(item), Some(stream)))) => {
                    this.waiting.push(Next {
                        key,
                        stream: Some(stream),
                        waker: None,
                    });
                    return Poll::Ready(Some((key, item)));
                }
                // Ended: forget it. (A key given a new stream took the
                // old one out first, so this was the key's live stream.)
                Poll::Ready(Some((key, None, Some(_)))) => {
                    this.live.remove(&key);
                }
                // Removed: its stream went back to the caller.
                Poll::Ready(Some((_, _, None))) => {}
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;
    use tokio_stream::StreamExt;

    type Map = EventMap<u64, UnboundedReceiverStream<u32>>;

    fn stream() -> (mpsc::UnboundedSender<u32>, UnboundedReceiverStream<u32>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, UnboundedReceiverStream::new(rx))
    }

    #[tokio::test]
    async fn yields_each_streams_items_in_order_with_its_key() {
        let mut m = Map::new();
        let (a, sa) = stream();
        let (b, sb) = stream();
        m.insert(1, sa);
        m.insert(2, sb);
        a.send(10).unwrap();
        b.send(20).unwrap();
        a.send(11).unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(m.next().await.expect("three items sent"));
        }
        let of = |k| {
            got.iter()
                .filter(|x| x.0 == k)
                .map(|x| x.1)
                .collect::<Vec<_>>()
        };
        assert_eq!(of(1), vec![10, 11]);
        assert_eq!(of(2), vec![20]);
        assert_eq!(m.len(), 2);
    }

    #[tokio::test]
    async fn a_removed_stream_comes_back_with_what_it_had_not_yielded() {
        let mut m = Map::new();
        let (a, sa) = stream();
        let (b, sb) = stream();
        m.insert(1, sa);
        m.insert(2, sb);
        a.send(10).unwrap();
        let mut back = m.remove(&1).expect("held");
        assert!(m.remove(&1).is_none());
        assert_eq!(back.next().await, Some(10));
        // Nothing of the removed stream is yielded any more.
        a.send(11).unwrap();
        b.send(20).unwrap();
        assert_eq!(m.next().await, Some((2, 20)));
        assert_eq!(m.len(), 1);
        assert_eq!(back.next().await, Some(11));
    }

    #[tokio::test]
    async fn an_ended_stream_is_dropped_and_an_empty_map_ends() {
        let mut m = Map::new();
        let (a, sa) = stream();
        m.insert(7, sa);
        a.send(1).unwrap();
        drop(a);
        assert_eq!(m.next().await, Some((7, 1)));
        assert_eq!(m.next().await, None);
        assert!(m.is_empty());
    }

    #[tokio::test]
    async fn a_key_given_a_new_stream_keeps_only_the_new_one() {
        let mut m = Map::new();
        let (old, s_old) = stream();
        let (new, s_new) = stream();
        m.insert(3, s_old);
        m.insert(3, s_new);
        assert!(old.send(1).is_err(), "the old stream was dropped");
        new.send(2).unwrap();
        assert_eq!(m.next().await, Some((3, 2)));
        assert_eq!(m.len(), 1);
    }
}

//! The member's queue of direct data messages, by priority class as on the
//! server link: the messages of all direct connections wait by class and the
//! group's serve loop takes the most urgent first, under the node's
//! anti-starvation guard ([`ClassQueue`]), so an urgent message sent
//! behind queued bulk ones runs next. FIFO within a class: an old client
//! (every message in the default class) sees the order it always had.
//!
//! Bounded by slots: a reader takes a slot before it queues a message and
//! the serve loop frees one as it takes a message, so at most [`QUEUE`]
//! wait and a full queue stops the readers (TCP back-pressure).

use tokio::sync::mpsc;

use super::DirectJob;
use crate::jobq::ClassQueue;

/// Data messages of all direct connections waiting for a member's cores.
pub(crate) const QUEUE: usize = 16;

/// The readers' side.
#[derive(Clone)]
pub(crate) struct Submit {
    jobs: ClassQueue<DirectJob>,
    /// One `()` per queued message; its capacity is the queue's bound.
    slots: mpsc::Sender<()>,
}

/// The serve loop's side.
pub(crate) struct Take {
    jobs: ClassQueue<DirectJob>,
    slots: mpsc::Receiver<()>,
}

pub(crate) fn queue() -> (Submit, Take) {
    let jobs = ClassQueue::new();
    let (tx, rx) = mpsc::channel(QUEUE);
    (
        Submit {
            jobs: jobs.clone(),
            slots: tx,
        },
        Take { jobs, slots: rx },
    )
}

impl Submit {
    /// Queues `job` in its class once a slot is free; `Err` once the
    /// member is gone.
    pub(crate) async fn push(&self, job: DirectJob) -> Result<(), ()> {
        let slot = self.slots.reserve().await.map_err(|_| ())?;
        self.jobs.push(job.class, job).map_err(|_| ())?;
        slot.send(());
        Ok(())
    }
}

impl Take {
    /// The most urgent queued message, waiting for one. Cancel-safe (the
    /// only await is the slot channel's), so it can sit in a `select!`.
    pub(crate) async fn next(&mut self) -> Option<DirectJob> {
        self.slots.recv().await?;
        // Every slot received was sent after its message was queued.
        self.jobs.try_pop()
    }

    /// Messages waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.jobs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn job(id: u32, class: u8) -> DirectJob {
        DirectJob {
            id,
            class,
            data: Bytes::new(),
            reply: mpsc::unbounded_channel().0,
            slot: std::sync::Arc::new(tokio::sync::Semaphore::new(1))
                .try_acquire_owned()
                .unwrap(),
        }
    }

    #[tokio::test]
    async fn the_most_urgent_first_fifo_within_a_class() {
        let (tx, mut rx) = queue();
        for (id, class) in [(1, 7), (2, 4), (3, 7), (4, 0), (5, 4)] {
            tx.push(job(id, class)).await.unwrap();
        }
        let mut order = Vec::new();
        while rx.len() > 0 {
            order.push(rx.next().await.unwrap().id);
        }
        assert_eq!(order, [4, 2, 5, 1, 3]);
    }

    #[tokio::test]
    async fn a_full_queue_holds_the_reader_until_a_message_is_taken() {
        let (tx, mut rx) = queue();
        for id in 0..QUEUE as u32 {
            tx.push(job(id, 7)).await.unwrap();
        }
        let mut blocked = boxed_push(&tx, job(99, 0));
        assert!(poll_once(&mut blocked).is_none(), "no slot while full");
        assert_eq!(rx.next().await.unwrap().id, 0);
        blocked.await.unwrap();
        // The urgent one, queued last, is taken next.
        assert_eq!(rx.next().await.unwrap().id, 99);
    }

    fn boxed_push(
        tx: &Submit,
        j: DirectJob,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ()>> + Send + '_>> {
        Box::pin(tx.push(j))
    }

    /// One poll of `f`, without waiting.
    fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let w = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(w);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}

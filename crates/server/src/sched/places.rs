//! A function's bounded queue as places to take (shared mode): one
//! semaphore for the whole queue (`--queue-limit`) and, where
//! `--class-depths` sets one, one per priority class (per-class
//! buffer depths from the queueing model, `corefarm model classes`). A job
//! holds its places from admission until it is dispatched to a node.

use std::sync::Arc;

use corefarm_smp::stream::CLASSES;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Queue places of one function.
#[derive(Debug)]
pub struct Places {
    all: Arc<Semaphore>,
    limit: usize,
    /// Per class: its semaphore and configured depth.
    class: Vec<Option<(Arc<Semaphore>, u32)>>,
}

/// The places one job holds; dropping it frees them.
#[derive(Debug)]
pub struct Place {
    _all: OwnedSemaphorePermit,
    _class: Option<OwnedSemaphorePermit>,
}

/// Which bound a job found reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The function's queue (`--queue-limit`, messages).
    Queue(usize),
    /// A class's depth (`--class-depths`): class, depth.
    Class(u8, u32),
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Full::Queue(n) => write!(
                f,
                "the function's queue is full ({n} messages, --queue-limit)"
            ),
            Full::Class(k, d) => write!(
                f,
                "the function's queue for class {k} is full ({d} messages, --class-depths)"
            ),
        }
    }
}

impl Places {
    /// `depths[k]`: the most jobs of class k queued at once, if bounded.
    pub fn new(limit: usize, depths: &[Option<u32>]) -> Places {
        Places {
            all: Arc::new(Semaphore::new(limit.max(1))),
            limit: limit.max(1),
            class: (0..CLASSES as usize)
                .map(|k| {
                    let d = depths.get(k).copied().flatten()?.max(1);
                    Some((Arc::new(Semaphore::new(d as usize)), d))
                })
                .collect(),
        }
    }

    fn class_of(&self, class: u8) -> Option<&(Arc<Semaphore>, u32)> {
        self.class
            .get(class.min(CLASSES - 1) as usize)
            .and_then(Option::as_ref)
    }

    /// A place now, or the bound that is reached.
    pub fn try_take(&self, class: u8) -> Result<Place, Full> {
        let c = match self.class_of(class) {
            Some((s, d)) => Some(
                s.clone()
                    .try_acquire_owned()
                    .map_err(|_| Full::Class(class, *d))?,
            ),
            None => None,
        };
        let all = self
            .all
            .clone()
            .try_acquire_owned()
            .map_err(|_| Full::Queue(self.limit))?;
        Ok(Place {
            _all: all,
            _class: c,
        })
    }

    /// Waits for a place: the class's first, then the queue's, so a job
    /// never holds a queue place while it waits for its class.
    pub async fn take(&self, class: u8) -> Option<Place> {
        let c = match self.class_of(class) {
            Some((s, _)) => Some(s.clone().acquire_owned().await.ok()?),
            None => None,
        };
        let all = self.all.clone().acquire_owned().await.ok()?;
        Some(Place {
            _all: all,
            _class: c,
        })
    }

    /// Waits for a place in whichever of `classes` gets one first; the
    /// waits begin in the order given (most urgent first), so of two
    /// classes waiting for the queue's next free place the first takes it.
    /// The other waits are dropped, holding nothing.
    pub async fn take_first(&self, classes: &[u8]) -> (u8, Option<Place>) {
        use std::future::Future;
        let mut waits: Vec<_> = classes
            .iter()
            .map(|&c| Box::pin(async move { (c, self.take(c).await) }))
            .collect();
        std::future::poll_fn(|cx| {
            for w in waits.iter_mut() {
                if let std::task::Poll::Ready(r) = w.as_mut().poll(cx) {
                    return std::task::Poll::Ready(r);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn take_first_gets_the_class_with_room_and_prefers_the_first_listed() {
        let mut depths = vec![None; CLASSES as usize];
        depths[7] = Some(1);
        let p = Places::new(2, &depths);
        let bulk = p.try_take(7).unwrap();
        let other = p.try_take(3).unwrap();
        // Queue full: both wait; the first listed takes the freed place.
        let first = p.take_first(&[0, 3]);
        tokio::pin!(first);
        assert!(futures_poll(&mut first).await.is_none());
        drop(other);
        let (c, got) = first.await;
        assert_eq!(c, 0);
        assert!(got.is_some());
        drop(got);
        // Class 7 is at its depth, the queue has room: class 3 goes first.
        drop(bulk);
        let _again = p.try_take(7).unwrap();
        let (c, got) = p.take_first(&[7, 3]).await;
        assert_eq!((c, got.is_some()), (3, true));
    }

    #[tokio::test]
    async fn a_full_class_refuses_only_its_own_jobs_and_frees_on_drop() {
        let mut depths = vec![None; CLASSES as usize];
        depths[6] = Some(2);
        let p = Places::new(3, &depths);
        let a = p.try_take(6).unwrap();
        let _b = p.try_take(6).unwrap();
        assert_eq!(p.try_take(6).unwrap_err(), Full::Class(6, 2));
        // Other classes still have the queue's last place.
        let c = p.try_take(0).unwrap();
        assert_eq!(p.try_take(0).unwrap_err(), Full::Queue(3));
        assert!(p.try_take(6).unwrap_err().to_string().contains("class 6"));
        drop(c);
        // The class is still full, and waiting for it holds no queue place.
        let waiter = p.take(6);
        tokio::pin!(waiter);
        assert!(futures_poll(&mut waiter).await.is_none());
        let _d = p.try_take(0).unwrap();
        drop(a);
        drop(_d);
        assert!(waiter.await.is_some());
    }

    /// Polls once: `Some` if the future is ready.
    async fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        use std::task::Poll;
        std::future::poll_fn(|cx| match std::pin::Pin::new(&mut *f).poll(cx) {
            Poll::Ready(v) => Poll::Ready(Some(v)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }
}

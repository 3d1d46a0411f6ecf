//! Handler notifications (docs/streams.md, "Notifications"): what the
//! streaming handlers of a data message passed to `ops->notify`, received
//! before that message's result. They wait in a queue of their own, apart
//! from results (which go by id to their waiters), with its own lock, so
//! reading them never delays a result.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Notifications kept for [`crate::Client::recv_notification`]; when it
/// is full the oldest is dropped (and counted,
/// [`crate::Client::notifications_dropped`]), so a program that never
/// reads them cannot run out of memory.
pub const NOTIFICATION_QUEUE: usize = 1024;

/// One handler notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The id of the data message whose handlers sent it (as submitted).
    pub id: u32,
    /// Index of the handler set (in the image's list) that sent it.
    pub set: u8,
    /// Its bytes (at most 4 KiB).
    pub data: Bytes,
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Notification>,
    dropped: u64,
    /// The connection is over: nothing more will come.
    closed: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Notes {
    q: Mutex<Queue>,
    cond: Condvar,
}

impl Notes {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A notification message from the server (reader thread).
    pub fn deliver(&self, payload: Bytes) -> Result<(), corefarm_smp::ProtocolError> {
        let n = corefarm_smp::Notification::parse(payload)?;
        self.push(Notification {
            id: n.id,
            set: n.set,
            data: n.data,
        });
        Ok(())
    }

    pub fn push(&self, n: Notification) {
        let mut q = self.lock();
        if q.items.len() >= NOTIFICATION_QUEUE {
            q.items.pop_front();
            q.dropped += 1;
        }
        q.items.push_back(n);
        drop(q);
        self.cond.notify_one();
    }

    /// Wakes waiters for good (the connection ended); queued ones stay.
    pub fn close(&self) {
        self.lock().closed = true;
        self.cond.notify_all();
    }

    pub fn try_recv(&self) -> Option<Notification> {
        self.lock().items.pop_front()
    }

    /// The oldest notification, waiting up to `timeout` (`None`: until one
    /// comes or the connection ends).
    pub fn recv(&self, timeout: Option<Duration>) -> Option<Notification> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = self.lock();
        loop {
            if let Some(n) = q.items.pop_front() {
                return Some(n);
            }
            if q.closed {
                return None;
            }
            q = match deadline {
                None => self.cond.wait(q).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.cond
                        .wait_timeout(q, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(id: u32) -> Notification {
        Notification {
            id,
            set: 0,
            data: Bytes::from_static(b"n"),
        }
    }

    #[test]
    fn the_oldest_is_dropped_and_counted_when_full() {
        let n = Notes::default();
        for id in 0..NOTIFICATION_QUEUE as u32 + 3 {
            n.push(note(id));
        }
        assert_eq!(n.dropped(), 3);
        assert_eq!(n.try_recv().unwrap().id, 3);
        assert_eq!(n.recv(Some(Duration::ZERO)).unwrap().id, 4);
    }

    #[test]
    fn a_waiter_wakes_on_a_notification_and_on_close() {
        let n = std::sync::Arc::new(Notes::default());
        assert_eq!(n.recv(Some(Duration::from_millis(1))), None);
        let w = {
            let n = n.clone();
            std::thread::spawn(move || (n.recv(None), n.recv(None)))
        };
        n.push(note(7));
        n.close();
        let (first, second) = w.join().unwrap();
        assert_eq!(first.unwrap().id, 7);
        assert_eq!(second, None);
    }
}

//! The memory guard of seed 000 §3.4.2.2: a byte budget shared by queued jobs
//! and unsent results. Holding a [`Reservation`] means holding its bytes;
//! dropping it gives them back.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, Clone)]
pub struct MemoryGuard {
    sem: Arc<Semaphore>,
    limit: usize,
}

/// Bytes reserved for one job, released when the job's result has been sent.
#[derive(Debug)]
pub struct Reservation {
    permit: OwnedSemaphorePermit,
    /// The guard's whole budget, in bytes.
    limit: usize,
}

/// Why a reservation could not grow: the guard had `free` of its `limit`
/// bytes left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Short {
    pub free: usize,
    pub limit: usize,
}

impl Reservation {
    /// Bytes held (whole KiB; a job larger than the budget holds all of it).
    pub fn bytes(&self) -> usize {
        self.permit.num_permits() * 1024
    }

    /// Takes `extra` more bytes now if the guard has them, without waiting:
    /// a thread whose queued work holds reservations must not wait for
    /// memory only that work would give back. Unlike
    /// [`MemoryGuard::reserve`], nothing is granted beyond the whole budget:
    /// a job admitted alone does not get to hold more than the limit.
    /// On `Err` nothing changed.
    pub fn try_grow(&mut self, extra: usize) -> Result<(), Short> {
        let units = extra.div_ceil(1024);
        if units == 0 {
            return Ok(());
        }
        let sem = self.permit.semaphore().clone();
        let short = Short {
            free: sem.available_permits() * 1024,
            limit: self.limit,
        };
        let units = u32::try_from(units).map_err(|_| short)?;
        let more = sem.try_acquire_many_owned(units).map_err(|_| short)?;
        self.permit.merge(more);
        Ok(())
    }

    /// Gives back the whole KiB of `bytes` now (what a job turned out not to
    /// need), keeping the rest until the reservation is dropped.
    pub fn give_back(&mut self, bytes: usize) {
        let units = (bytes / 1024).min(self.permit.num_permits());
        drop(self.permit.split(units));
    }
}

impl MemoryGuard {
    pub fn new(limit: usize) -> Self {
        // Semaphore permits are counted in KiB so that any limit fits in u32 acquisitions.
        let units = limit.div_ceil(1024).clamp(1, Semaphore::MAX_PERMITS);
        MemoryGuard {
            sem: Arc::new(Semaphore::new(units)),
            limit: units * 1024,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Waits until `bytes` fit in the budget. A job larger than the whole
    /// budget takes all of it, so it runs alone instead of never.
    pub async fn reserve(&self, bytes: usize) -> Reservation {
        let units = bytes.div_ceil(1024).clamp(1, self.limit / 1024);
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        let permit = self
            .sem
            .clone()
            .acquire_many_owned(units)
            .await
            .expect("semaphore never closed");
        Reservation {
            permit,
            limit: self.limit,
        }
    }

    /// Takes `bytes` now if they fit, `None` otherwise: resident buffers
    /// fail with "full" rather than wait for memory that may never return.
    pub fn try_reserve(&self, bytes: usize) -> Option<Reservation> {
        let units = u32::try_from(bytes.div_ceil(1024)).ok()?;
        let permit = self.sem.clone().try_acquire_many_owned(units).ok()?;
        Some(Reservation {
            permit,
            limit: self.limit,
        })
    }

    /// Bytes currently free (for tests and stats).
    pub fn available(&self) -> usize {
        self.sem.available_permits() * 1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_block_until_released() {
        let g = MemoryGuard::new(10 * 1024);
        let a = g.reserve(6 * 1024).await;
        assert_eq!(g.available(), 4 * 1024);
        let g2 = g.clone();
        let waiter = tokio::spawn(async move { g2.reserve(6 * 1024).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(a);
        let _b = waiter.await.unwrap();
        assert_eq!(g.available(), 4 * 1024);
    }

    #[tokio::test]
    async fn a_reservation_grows_only_into_free_bytes_and_gives_back_whole_kib() {
        let g = MemoryGuard::new(10 * 1024);
        let mut a = g.reserve(2 * 1024).await;
        let other = g.reserve(5 * 1024).await;
        // 2.5 KiB more is 3 KiB: all that is free.
        a.try_grow(2 * 1024 + 512).unwrap();
        assert_eq!((a.bytes(), g.available()), (5 * 1024, 0));
        assert_eq!(
            a.try_grow(1),
            Err(Short {
                free: 0,
                limit: 10 * 1024
            })
        );
        assert_eq!(a.bytes(), 5 * 1024, "a failed grow changes nothing");
        // Only whole KiB go back: 1.9 KiB returns 1 KiB.
        a.give_back(1024 + 900);
        assert_eq!((a.bytes(), g.available()), (4 * 1024, 1024));
        a.give_back(1 << 30);
        assert_eq!((a.bytes(), g.available()), (0, 5 * 1024));
        drop((a, other));
        assert_eq!(g.available(), g.limit());
    }

    #[tokio::test]
    async fn nothing_grows_beyond_the_budget() {
        let g = MemoryGuard::new(4 * 1024);
        let mut a = g.reserve(1024).await;
        a.try_grow(3 * 1024).unwrap();
        assert_eq!(g.available(), 0);
        a.give_back(3 * 1024);
        let short = Short {
            free: 3 * 1024,
            limit: 4 * 1024,
        };
        assert_eq!(a.try_grow(3 * 1024 + 1), Err(short), "alone, still capped");
        let mut whole = {
            drop(a);
            g.reserve(1 << 30).await
        };
        assert_eq!(whole.bytes(), 4 * 1024, "admitted alone, as reserve does");
        assert!(whole.try_grow(1).is_err());
        drop(whole);
        assert_eq!(g.available(), g.limit());
    }

    #[tokio::test]
    async fn oversize_job_takes_whole_budget() {
        let g = MemoryGuard::new(4 * 1024);
        let r = g.reserve(1 << 30).await;
        assert_eq!(g.available(), 0);
        drop(r);
        assert_eq!(g.available(), 4 * 1024);
    }
}

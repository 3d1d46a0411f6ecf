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
    _permit: OwnedSemaphorePermit,
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
        Reservation { _permit: permit }
    }

    /// Takes `bytes` now if they fit, `None` otherwise: resident buffers
    /// fail with "full" rather than wait for memory that may never return.
    pub fn try_reserve(&self, bytes: usize) -> Option<Reservation> {
        let units = u32::try_from(bytes.div_ceil(1024)).ok()?;
        let permit = self.sem.clone().try_acquire_many_owned(units).ok()?;
        Some(Reservation { _permit: permit })
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
    async fn oversize_job_takes_whole_budget() {
        let g = MemoryGuard::new(4 * 1024);
        let r = g.reserve(1 << 30).await;
        assert_eq!(g.available(), 0);
        drop(r);
        assert_eq!(g.available(), 4 * 1024);
    }
}

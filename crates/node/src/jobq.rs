//! The node's input queue to its cores, and the handler lane's queue: jobs
//! wait by priority class (so an urgent message passes queued bulk ones)
//! and whoever serves them (the cores' tasks, the lane's threads) takes
//! the most urgent first, under the same anti-starvation policy as the
//! server's function queues (`smp::stream::ClassQueues` with
//! [`MESSAGE_GUARD`]): a bulk job is passed
//! over by at most that many more urgent ones in a row. Within a class the
//! queue is FIFO, so a link without classes (a seed-format server, or one
//! without chunks: every job in the default class) sees the FIFO it always
//! had.
//!
//! A mutex rather than a lock-free channel: the order depends on everything
//! waiting, so taking a job has to look at all classes at once. The lock
//! is held for a push or a pop only, never while a core runs, and a push
//! wakes only a waiter that is there (a lane thread on the condition
//! variable, a core's task on the notify).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use corefarm_smp::stream::{ClassQueues, MESSAGE_GUARD};

use crate::handlers::Job;

/// A queue by class, shared by whoever submits (the receiving task, the
/// handler lane forwarding to the cores) and the threads that serve it.
pub struct ClassQueue<T>(Arc<Queue<T>>);

/// The queue to the cores.
pub type JobQueue = ClassQueue<Job>;

impl<T> Clone for ClassQueue<T> {
    fn clone(&self) -> Self {
        ClassQueue(self.0.clone())
    }
}

/// The queue behind every [`ClassQueue`] handle: the jobs (under the lock)
/// and the signals for who waits on them.
struct Queue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    /// The same signal for tasks waiting in [`ClassQueue::wait_async`].
    ready_async: tokio::sync::Notify,
    /// A push while no core waits, for a busy core's task that would take
    /// the job ahead ([`ClassQueue::wait_ahead_async`]).
    ahead_async: tokio::sync::Notify,
}

struct State<T> {
    jobs: ClassQueues<T>,
    closed: bool,
    /// Threads blocked in [`JobQueue::wait`].
    idle_threads: usize,
    /// Tasks in [`ClassQueue::wait_async`].
    idle_tasks: usize,
}

impl<T> State<T> {
    /// Cores waiting for work, threads and tasks.
    fn idle(&self) -> usize {
        self.idle_threads + self.idle_tasks
    }
}

impl<T> Default for ClassQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ClassQueue<T> {
    pub fn new() -> Self {
        Self::with_guard(MESSAGE_GUARD)
    }

    /// `guard` 0: strict priority (a test's way to watch starvation happen).
    pub fn with_guard(guard: u32) -> Self {
        ClassQueue(Arc::new(Queue {
            state: Mutex::new(State {
                jobs: ClassQueues::new(guard),
                closed: false,
                idle_threads: 0,
                idle_tasks: 0,
            }),
            ready: Condvar::new(),
            ready_async: tokio::sync::Notify::new(),
            ahead_async: tokio::sync::Notify::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Nothing panics while holding it (pushes and pops of a VecDeque):
        // a poisoned state is still consistent.
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job` in `class`; gives it back once the queue is closed.
    pub fn push(&self, class: u8, job: T) -> Result<(), T> {
        let mut s = self.lock();
        if s.closed {
            return Err(job);
        }
        s.jobs.push(class, job);
        // Only the kind of waiter that is there: a condition variable's
        // notify is a system call even when no thread waits, and a node
        // of isolated cores has only tasks waiting.
        let (threads, tasks) = (s.idle_threads > 0, s.idle_tasks > 0);
        drop(s);
        if threads {
            self.0.ready.notify_one();
        }
        if tasks {
            self.0.ready_async.notify_one();
        }
        if !threads && !tasks {
            self.0.ahead_async.notify_one();
        }
        Ok(())
    }

    /// The next job by class, waiting for one (blocking: the handler
    /// lane's threads only). `None` once the queue is closed and empty.
    pub fn wait(&self) -> Option<T> {
        let mut s = self.lock();
        loop {
            if let Some((_, job)) = s.jobs.pop() {
                return Some(job);
            }
            if s.closed {
                return None;
            }
            s.idle_threads += 1;
            s = self.0.ready.wait(s).unwrap_or_else(|p| p.into_inner());
            s.idle_threads -= 1;
        }
    }

    /// [`ClassQueue::wait`] for a task (a core's, on the node's event
    /// loop): the same order, and it counts as waiting for
    /// [`ClassQueue::ahead`].
    pub async fn wait_async(&self) -> Option<T> {
        /// Keeps `idle` right if the waiting future is dropped.
        struct Idle<'a, T>(&'a ClassQueue<T>);
        impl<T> Drop for Idle<'_, T> {
            fn drop(&mut self) {
                self.0.lock().idle_tasks -= 1;
            }
        }
        loop {
            // Registered before the queue is looked at, so a push in
            // between is not missed.
            let notified = self.0.ready_async.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if let Some((_, job)) = s.jobs.pop() {
                    return Some(job);
                }
                if s.closed {
                    return None;
                }
                s.idle_tasks += 1;
            }
            let _idle = Idle(self);
            notified.await;
        }
    }

    /// [`ClassQueue::ahead`] as a wait: the next job pushed while no core
    /// waits for work, for a core that is busy but could take one more (the
    /// task of a core in a worker process, while the worker computes). Waits for good
    /// once the queue is closed and empty; a dropped wait takes nothing.
    pub async fn wait_ahead_async(&self) -> T {
        loop {
            let notified = self.0.ahead_async.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(job) = self.ahead() {
                return job;
            }
            notified.await;
        }
    }

    /// A job already queued, only if no thread is waiting for one: a job
    /// taken ahead would otherwise wait behind another while a core is free.
    pub fn ahead(&self) -> Option<T> {
        let mut s = self.lock();
        if s.idle() != 0 {
            return None;
        }
        s.jobs.pop().map(|(_, job)| job)
    }

    /// A job already queued, without waiting: for an async taker that
    /// learns of queued jobs otherwise (the direct path's slots).
    pub fn try_pop(&self) -> Option<T> {
        self.lock().jobs.pop().map(|(_, job)| job)
    }

    /// No more jobs: the threads finish what is queued, then see the end.
    pub fn close(&self) {
        self.lock().closed = true;
        self.0.ready.notify_all();
        self.0.ready_async.notify_waiters();
    }

    /// Closes the queue and drops what it holds (their reservations return
    /// to the memory guard, outside the lock).
    pub fn abort(&self) -> usize {
        let mut dropped = Vec::new();
        {
            let mut s = self.lock();
            s.closed = true;
            while let Some((_, job)) = s.jobs.pop() {
                dropped.push(job);
            }
        }
        self.0.ready.notify_all();
        self.0.ready_async.notify_waiters();
        let n = dropped.len();
        drop(dropped);
        n
    }

    /// Jobs waiting.
    pub fn len(&self) -> usize {
        self.lock().jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::MemoryGuard;
    use bytes::Bytes;

    async fn job(g: &MemoryGuard, id: u32, class: u8) -> Job {
        Job {
            id,
            class,
            data: Bytes::from_static(b"x"),
            count: 1,
            reservation: g.reserve(1).await,
            queued: std::time::Instant::now(),
        }
    }

    fn drain(q: &JobQueue) -> Vec<u32> {
        std::iter::from_fn(|| q.ahead()).map(|j| j.id).collect()
    }

    #[tokio::test]
    async fn urgent_jobs_first_fifo_within_a_class() {
        let g = MemoryGuard::new(1 << 20);
        let q = JobQueue::new();
        for (id, class) in [(1, 6), (2, 4), (3, 6), (4, 0), (5, 4), (6, 0)] {
            assert!(q.push(class, job(&g, id, class).await).is_ok());
        }
        assert_eq!(drain(&q), [4, 6, 2, 5, 1, 3]);
    }

    #[tokio::test]
    async fn a_bulk_job_waits_at_most_the_guard_under_urgent_ones() {
        let g = MemoryGuard::new(1 << 20);
        for (guard, bound) in [(MESSAGE_GUARD, Some(MESSAGE_GUARD as usize)), (0, None)] {
            let q = JobQueue::with_guard(guard);
            q.push(7, job(&g, 0, 7).await).ok().unwrap();
            let mut passed = None;
            for i in 0..4 * MESSAGE_GUARD {
                q.push(0, job(&g, 100 + i, 0).await).ok().unwrap();
                if q.ahead().unwrap().id == 0 {
                    passed = Some(i as usize);
                    break;
                }
            }
            assert_eq!(passed, bound, "guard {guard}");
        }
    }

    #[tokio::test]
    async fn closing_lets_the_threads_drain_and_abort_drops_the_rest() {
        let g = MemoryGuard::new(1 << 20);
        let q = JobQueue::new();
        for id in 0..3 {
            q.push(4, job(&g, id, 4).await).ok().unwrap();
        }
        let t = std::thread::spawn({
            let q = q.clone();
            move || std::iter::from_fn(|| q.wait()).count()
        });
        q.close();
        assert_eq!(t.join().unwrap(), 3, "queued jobs still run after close");
        assert!(q.push(4, job(&g, 9, 4).await).is_err(), "closed");
        let q = JobQueue::new();
        q.push(4, job(&g, 1, 4).await).ok().unwrap();
        q.abort();
        assert!(q.wait().is_none() && q.is_empty());
        assert_eq!(g.available(), g.limit(), "every reservation released");
    }

    #[tokio::test]
    async fn a_task_waiting_gets_the_next_push_and_counts_as_waiting() {
        let g = MemoryGuard::new(1 << 20);
        let q = JobQueue::new();
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.wait_async().await.map(|j| j.id) }
        });
        // Until the task waits, a push would simply be queued.
        while q.lock().idle() == 0 {
            tokio::task::yield_now().await;
        }
        q.push(4, job(&g, 7, 4).await).ok().unwrap();
        assert_eq!(waiter.await.unwrap(), Some(7));
        assert_eq!(q.lock().idle(), 0, "the waiter no longer counts");
        // A job taken ahead by a busy core must not pass a waiting one.
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.wait_async().await.map(|j| j.id) }
        });
        while q.lock().idle() == 0 {
            tokio::task::yield_now().await;
        }
        assert!(q.ahead().is_none(), "nothing queued");
        q.close();
        assert_eq!(waiter.await.unwrap(), None, "close ends the wait");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thread_and_a_task_waiting_side_by_side_each_get_a_push() {
        let g = MemoryGuard::new(1 << 20);
        let q = JobQueue::new();
        let thread = std::thread::spawn({
            let q = q.clone();
            move || q.wait().map(|j| j.id)
        });
        let task = tokio::spawn({
            let q = q.clone();
            async move { q.wait_async().await.map(|j| j.id) }
        });
        while {
            let s = q.lock();
            (s.idle_threads, s.idle_tasks) != (1, 1)
        } {
            tokio::task::yield_now().await;
        }
        q.push(4, job(&g, 1, 4).await).ok().unwrap();
        q.push(4, job(&g, 2, 4).await).ok().unwrap();
        let mut got = [thread.join().unwrap(), task.await.unwrap()];
        got.sort();
        assert_eq!(got, [Some(1), Some(2)], "each kind of waiter is woken");
        assert_eq!(q.lock().idle(), 0);
    }

    #[tokio::test]
    async fn a_busy_core_takes_a_job_ahead_only_while_no_core_waits() {
        let g = MemoryGuard::new(1 << 20);
        let q = JobQueue::new();
        let busy = tokio::spawn({
            let q = q.clone();
            async move { q.wait_ahead_async().await.id }
        });
        tokio::task::yield_now().await;
        q.push(4, job(&g, 1, 4).await).ok().unwrap();
        assert_eq!(
            busy.await.unwrap(),
            1,
            "no core waits: the busy one takes it"
        );
        // Now one core waits for work and another is busy: the waiting one
        // gets the job, the busy one nothing.
        let idle = tokio::spawn({
            let q = q.clone();
            async move { q.wait_async().await.map(|j| j.id) }
        });
        while q.lock().idle() == 0 {
            tokio::task::yield_now().await;
        }
        let busy = tokio::spawn({
            let q = q.clone();
            async move { q.wait_ahead_async().await.id }
        });
        tokio::task::yield_now().await;
        q.push(4, job(&g, 2, 4).await).ok().unwrap();
        assert_eq!(idle.await.unwrap(), Some(2));
        assert!(!busy.is_finished(), "the busy core did not take it");
        busy.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_wait_stops_counting() {
        let q = JobQueue::new();
        // Polled once (counted as waiting), then dropped at the timeout.
        let r = tokio::time::timeout(std::time::Duration::from_millis(1), q.wait_async()).await;
        assert!(r.is_err(), "nothing was queued");
        assert_eq!(q.lock().idle(), 0, "a cancelled wait is not a waiting core");
    }
}

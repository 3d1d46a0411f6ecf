//! The handshake between a node and its core worker: futex words in the
//! shared header instead of a control message each way.
//!
//! * `job` (node → worker): the node writes a job's entry (inputs, count),
//!   then stores `seq << 1`. The worker runs jobs in sequence order, so the
//!   node may ring job `seq + 1` while the worker still runs `seq` (the
//!   pipeline: the node copies the next inputs while the worker computes).
//!   A worker with nothing to do sets bit 0 and sleeps on the word; the
//!   node only makes the wake-up system call when that bit was set.
//! * `done` holds the worker's job thread id for the worker's whole life.
//!   The thread lists the word in its robust futex list
//!   (`set_robust_list(2)`), so if the worker dies, even between jobs, the
//!   kernel sets `OWNER_DIED` in it and wakes the node at once.
//! * `completed` (worker → node): the last job done. A node that found its
//!   job unfinished sets `WAITERS` in `done` and sleeps on it, for at most
//!   a slice of the watchdog at a time; the worker, after storing
//!   `completed`, clears `WAITERS` and wakes the node only if it was set.
//!   Both sides store, then load the other's word, all sequentially
//!   consistent: either the node sees the completion or the worker sees
//!   the node's `WAITERS`.
//!
//! The spins are short and bounded: they save the sleep and wake-up when
//! the other side answers within microseconds, and are kept short because
//! on a machine with more runnable threads than CPUs a spinning side takes
//! the CPU from the very thread it waits for.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::thread::futex::{self, Flags, OWNER_DIED, WAITERS};

/// The bits of a futex word holding a thread id.
pub const TID_MASK: u32 = 0x3fff_ffff;
/// Outcomes in a job entry's `code`; 0 and 1 are never thread ids, which
/// `worker_tid` is checked against.
pub const DONE_OK: u32 = 0;
/// The job failed; the reason is in a `Done` message on the control channel.
pub const DONE_FAILED: u32 = 1;

/// How long a worker spins for its next job before sleeping. The node
/// normally rings the next job while the worker runs the current one, so
/// a job that is not there at the end of one is not seconds away but not
/// microseconds away either: spinning longer only burns a CPU that the
/// node's threads may need to produce it.
pub const WORKER_SPIN: Duration = Duration::from_micros(5);
/// How long a node spins for a completion, only when the last job took
/// less than that (a quick core: the sleep and wake-up would dominate).
pub const NODE_SPIN: Duration = Duration::from_micros(20);
/// Job numbers travel in 31 bits of the `job` doorbell.
pub const SEQ_MASK: u32 = 0x7fff_ffff;

/// Whether job `seq` is done when `completed` is the last job completed
/// (sequence numbers wrap; at most two jobs are ever outstanding).
pub fn reached(completed: u32, seq: u32) -> bool {
    completed.wrapping_sub(seq) & SEQ_MASK < SEQ_MASK / 2
}

/// Shared words: another process maps them, so the futex calls must not be
/// process-private.
const SHARED: Flags = Flags::empty();

/// Spins until `ready(word)` or `budget` has passed; returns the last value.
fn spin(word: &AtomicU32, budget: Duration, ready: impl Fn(u32) -> bool) -> Option<u32> {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            let v = word.load(Ordering::Acquire);
            if ready(v) {
                return Some(v);
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= budget {
            return None;
        }
    }
}

/// Node: publishes job `seq` (its inputs and count already written).
pub fn ring(job: &AtomicU32, seq: u32) {
    let old = job.swap(seq << 1, Ordering::Release);
    if old & 1 != 0 {
        let _ = futex::wake(job, SHARED, 1);
    }
}

/// Worker: waits (forever) for a job other than `last`; returns the
/// newest one rung (the worker runs the one after `last` first).
pub fn next_job(job: &AtomicU32, last: u32) -> u32 {
    let idle = |v: u32| v >> 1 == last;
    loop {
        if let Some(v) = spin(job, WORKER_SPIN, |v| !idle(v)) {
            return v >> 1;
        }
        let want = last << 1 | 1;
        match job.compare_exchange(last << 1, want, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => {}
            Err(v) if v == want => {}
            Err(v) => return v >> 1,
        }
        // Returns at once if the node rang in between (the word changed).
        let _ = futex::wait(job, SHARED, want, None);
    }
}

/// Worker: reports job `seq` done (its entry already written) to a node
/// that may sleep on `done`.
pub fn complete(done: &AtomicU32, completed: &AtomicU32, seq: u32) {
    completed.store(seq, Ordering::SeqCst);
    if done.load(Ordering::SeqCst) & WAITERS != 0 {
        // Changing the word makes a node between its check and its sleep
        // return at once; the thread id stays for the kernel.
        done.fetch_and(!WAITERS, Ordering::SeqCst);
        let _ = futex::wake(done, SHARED, 1);
    }
}

/// How a node's wait for a job ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Wait {
    /// The worker completed the job (its entry holds the outcome).
    Done,
    /// The worker's job thread died (the kernel marked `done`).
    Died,
    /// `until` passed first.
    Slice,
}

/// Node: waits until job `seq` is completed, the worker dies, or `until`,
/// spinning for `spin_for` first.
pub fn wait_done(
    done: &AtomicU32,
    completed: &AtomicU32,
    seq: u32,
    until: Instant,
    spin_for: Duration,
) -> Wait {
    let finished = || reached(completed.load(Ordering::SeqCst), seq);
    if !spin_for.is_zero() {
        let start = Instant::now();
        while start.elapsed() < spin_for {
            for _ in 0..64 {
                if finished() {
                    return Wait::Done;
                }
                std::hint::spin_loop();
            }
            if done.load(Ordering::Relaxed) & OWNER_DIED != 0 {
                break;
            }
        }
    }
    loop {
        if finished() {
            return Wait::Done;
        }
        let v = done.load(Ordering::SeqCst);
        if v & OWNER_DIED != 0 {
            return Wait::Died;
        }
        if v & WAITERS == 0
            && done
                .compare_exchange(v, v | WAITERS, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            continue;
        }
        if finished() {
            return Wait::Done;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Wait::Slice;
        }
        let t = futex::Timespec {
            tv_sec: left.as_secs() as _,
            tv_nsec: left.subsec_nanos() as _,
        };
        // Woken, timed out, interrupted or the word changed: look again.
        let _ = futex::wait(done, SHARED, v | WAITERS, Some(&t));
    }
}

/// The kernel's `struct robust_list` / `robust_list_head`.
#[repr(C)]
struct RobustList {
    next: *mut RobustList,
}

#[repr(C)]
struct RobustListHead {
    list: RobustList,
    futex_offset: libc::c_long,
    list_op_pending: *mut RobustList,
}

/// Worker: makes `done` this thread's one robust futex, so that the kernel
/// marks it `OWNER_DIED` and wakes the node when the thread dies while it
/// holds its id. Replaces the C library's list for this thread: the worker
/// shares no robust mutex with another process.
pub fn watch_death(done: &'static AtomicU32) -> Result<(), String> {
    // The list lives until the process exits; its one entry points at the
    // word through the offset, as the kernel reads it.
    let entry: &'static mut RobustList = Box::leak(Box::new(RobustList {
        next: std::ptr::null_mut(),
    }));
    let head: &'static mut RobustListHead = Box::leak(Box::new(RobustListHead {
        list: RobustList {
            next: std::ptr::null_mut(),
        },
        futex_offset: (done as *const AtomicU32 as libc::c_long)
            .wrapping_sub(entry as *mut RobustList as libc::c_long),
        list_op_pending: std::ptr::null_mut(),
    }));
    // Circular: the entry leads back to the head, which ends the walk.
    entry.next = &mut head.list;
    head.list.next = entry;
    // SAFETY: registers a leaked (never freed or moved) head for the
    // calling thread, with the size the kernel expects.
    let r = unsafe {
        libc::syscall(
            libc::SYS_set_robust_list,
            head as *mut RobustListHead,
            std::mem::size_of::<RobustListHead>(),
        )
    };
    if r != 0 {
        return Err(format!(
            "set_robust_list: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// This thread's id, as the kernel compares it with a robust futex word.
pub fn tid() -> u32 {
    rustix::thread::gettid().as_raw_nonzero().get() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_job_rung_while_the_worker_sleeps_wakes_it() {
        let job = Arc::new(AtomicU32::new(0));
        let j = job.clone();
        let worker = std::thread::spawn(move || next_job(&j, 0));
        // Rung only once the worker sleeps on the word, so the wake-up path runs.
        while job.load(Ordering::Acquire) & 1 == 0 {
            std::thread::yield_now();
        }
        ring(&job, 1);
        assert_eq!(worker.join().unwrap(), 1);
        assert_eq!(job.load(Ordering::Acquire), 2);
    }

    #[test]
    fn a_job_rung_ahead_is_found_without_waiting() {
        // The node rang jobs 6 and 7 while the worker ran 5.
        let job = AtomicU32::new(7 << 1);
        assert_eq!(next_job(&job, 5), 7);
        assert_eq!(next_job(&job, 6), 7);
    }

    #[test]
    fn a_completion_wakes_a_sleeping_node() {
        let done = Arc::new(AtomicU32::new(1234));
        let completed = Arc::new(AtomicU32::new(4));
        let (d, c) = (done.clone(), completed.clone());
        let node = std::thread::spawn(move || {
            wait_done(
                &d,
                &c,
                5,
                Instant::now() + Duration::from_secs(3600),
                NODE_SPIN,
            )
        });
        while done.load(Ordering::Acquire) & WAITERS == 0 {
            std::thread::yield_now();
        }
        complete(&done, &completed, 5);
        assert_eq!(node.join().unwrap(), Wait::Done);
        // The thread id stays, for the kernel.
        assert_eq!(done.load(Ordering::Acquire), 1234);
    }

    #[test]
    fn sequence_numbers_wrap() {
        assert!(reached(5, 5) && reached(6, 5) && !reached(4, 5));
        assert!(reached(0, SEQ_MASK) && !reached(SEQ_MASK, 0));
    }

    #[test]
    fn the_kernel_marks_and_wakes_the_word_of_a_thread_that_dies() {
        let done: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(0)));
        let completed = AtomicU32::new(0);
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            watch_death(done).unwrap();
            done.store(tid(), Ordering::Release);
            tx.send(()).unwrap();
            // Ends without completing job 1: as a worker killed mid-job.
        });
        rx.recv().unwrap();
        let verdict = wait_done(
            done,
            &completed,
            1,
            Instant::now() + Duration::from_secs(600),
            NODE_SPIN,
        );
        assert_eq!(verdict, Wait::Died, "{:#x}", done.load(Ordering::Acquire));
        t.join().unwrap();
        assert_eq!(done.load(Ordering::Acquire) & TID_MASK, 0);
    }

    #[test]
    fn a_wait_ends_at_its_deadline_and_on_owner_died() {
        let done = AtomicU32::new(77);
        let completed = AtomicU32::new(0);
        assert_eq!(
            wait_done(&done, &completed, 1, Instant::now(), Duration::ZERO),
            Wait::Slice
        );
        // A job completed before the worker died is still done.
        done.store(WAITERS | OWNER_DIED, Ordering::Release);
        assert_eq!(
            wait_done(&done, &completed, 0, Instant::now(), Duration::ZERO),
            Wait::Done
        );
        assert_eq!(
            wait_done(&done, &completed, 1, Instant::now(), Duration::ZERO),
            Wait::Died
        );
    }
}

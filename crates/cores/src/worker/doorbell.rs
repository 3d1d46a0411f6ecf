//! The per-job handshake between a node and its core worker: two futex
//! words in the shared header instead of a control message each way.
//!
//! * `job` (node → worker): the node writes the job's inputs and count,
//!   then stores `seq << 1`. A worker that has been idle for longer than a
//!   short spin sets bit 0 and sleeps on the word; the node only makes the
//!   wake-up system call when that bit was set.
//! * `done` (worker → node): before ringing `job` the node stores the
//!   worker's thread id there. The worker's job thread lists the word in
//!   its robust futex list (`set_robust_list(2)`), so if the worker dies
//!   the kernel sets `OWNER_DIED` in it and wakes the node at once. A node
//!   that stops spinning sets `WAITERS` and sleeps, for at most a slice of
//!   the watchdog at a time; when the job ends the worker stores a
//!   completion code and wakes the node only if `WAITERS` was set.
//!
//! The spins are short and bounded: they save the sleep and wake-up when
//! the other side answers within microseconds (a worker fed back to back),
//! and cost nothing else.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::thread::futex::{self, Flags, OWNER_DIED, WAITERS};

/// The bits of a futex word holding a thread id.
pub const TID_MASK: u32 = 0x3fff_ffff;
/// Completion codes in `done` (never a thread id: ids 0 and 1 are not
/// worker threads).
pub const DONE_OK: u32 = 0;
/// The job failed; the reason is in a `Done` message on the control channel.
pub const DONE_FAILED: u32 = 1;

/// How long a worker spins for its next job before sleeping: long enough
/// for a node with queued inputs to copy one in; cut short after a wait it
/// had to sleep through (no job queued: spinning only burns a CPU).
pub const WORKER_SPIN: Duration = Duration::from_micros(50);
const WORKER_SPIN_IDLE: Duration = Duration::from_micros(5);
/// How long a node spins for a completion, only when the last job took
/// less than that (a quick core: the sleep and wake-up would dominate).
pub const NODE_SPIN: Duration = Duration::from_micros(20);

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

/// Worker: waits (forever) for a job other than `last`; returns its number.
/// `slept` says whether the last wait ended in a sleep, and is updated.
pub fn next_job(job: &AtomicU32, last: u32, slept: &mut bool) -> u32 {
    let idle = |v: u32| v >> 1 == last;
    let budget = if *slept {
        WORKER_SPIN_IDLE
    } else {
        WORKER_SPIN
    };
    *slept = false;
    loop {
        if let Some(v) = spin(job, budget, |v| !idle(v)) {
            return v >> 1;
        }
        *slept = true;
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

/// Worker: reports the end of the current job to a node that may sleep.
pub fn complete(done: &AtomicU32, code: u32) {
    let old = done.swap(code, Ordering::Release);
    if old & WAITERS != 0 {
        let _ = futex::wake(done, SHARED, 1);
    }
}

/// How a node's wait for `done` ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Wait {
    /// The worker stored this completion code.
    Done(u32),
    /// The worker's job thread died (the kernel marked the word).
    Died,
    /// `until` passed first.
    Slice,
}

/// Node: waits until `done` no longer holds the worker's thread id `tid`,
/// or until `until`, spinning for `spin` first.
pub fn wait_done(done: &AtomicU32, tid: u32, until: Instant, spin_for: Duration) -> Wait {
    let running = |v: u32| v & !WAITERS == tid;
    let verdict = |v: u32| {
        if v & OWNER_DIED != 0 {
            Wait::Died
        } else {
            Wait::Done(v)
        }
    };
    if !spin_for.is_zero() {
        if let Some(v) = spin(done, spin_for, |v| !running(v)) {
            return verdict(v);
        }
    }
    loop {
        let v = done.load(Ordering::Acquire);
        if !running(v) {
            return verdict(v);
        }
        if v & WAITERS == 0
            && done
                .compare_exchange(v, v | WAITERS, Ordering::Acquire, Ordering::Acquire)
                .is_err()
        {
            continue;
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
        let _ = futex::wait(done, SHARED, tid | WAITERS, Some(&t));
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
        let worker = std::thread::spawn(move || next_job(&j, 0, &mut true));
        // Rung only once the worker sleeps on the word, so the wake-up path runs.
        while job.load(Ordering::Acquire) & 1 == 0 {
            std::thread::yield_now();
        }
        ring(&job, 1);
        assert_eq!(worker.join().unwrap(), 1);
        assert_eq!(job.load(Ordering::Acquire), 2);
    }

    #[test]
    fn a_completion_wakes_a_sleeping_node() {
        let done = Arc::new(AtomicU32::new(1234));
        let d = done.clone();
        let node = std::thread::spawn(move || {
            wait_done(
                &d,
                1234,
                Instant::now() + Duration::from_secs(3600),
                NODE_SPIN,
            )
        });
        while done.load(Ordering::Acquire) & WAITERS == 0 {
            std::thread::yield_now();
        }
        complete(&done, DONE_FAILED);
        assert_eq!(node.join().unwrap(), Wait::Done(DONE_FAILED));
    }

    #[test]
    fn the_kernel_marks_and_wakes_the_word_of_a_thread_that_dies() {
        let done: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(0)));
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            watch_death(done).unwrap();
            done.store(tid(), Ordering::Release);
            tx.send(tid()).unwrap();
            // Ends without completing: as a worker killed mid-job.
        });
        let tid = rx.recv().unwrap();
        let verdict = wait_done(
            done,
            tid,
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
        assert_eq!(
            wait_done(&done, 77, Instant::now(), Duration::ZERO),
            Wait::Slice
        );
        // As the kernel leaves the word of a thread that died.
        done.store(WAITERS | OWNER_DIED, Ordering::Release);
        assert_eq!(
            wait_done(&done, 77, Instant::now(), Duration::ZERO),
            Wait::Died
        );
    }
}

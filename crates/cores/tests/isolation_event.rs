//! An isolated core waited for by an event loop (`Pipeline::ready_fd`,
//! `try_collect`, `arm`, `tick`), as the node manager drives it: the
//! completion of a job makes the ready descriptor readable, and so does a
//! crash (the worker's channel hangs up), a hang ends through the watchdog
//! applied at ticks, and the job behind a failed one runs on the
//! restarted worker. The loop here
//! waits with poll(2), as the node's runtime does with epoll. The core is
//! `cores/faulty/faulty.cpp` (fault chosen by the first input byte;
//! 0xF6 is a correct job that takes 200 ms).

use crate::support::faulty;

use corefarm_cores::{BatchError, Pipeline, PIPELINE_TICK};
use faulty::load_faulty as faulty;
use rustix::event::{poll, PollFd, PollFlags, Timespec};

fn input(first: u8, salt: u8) -> Vec<u8> {
    let mut v: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7) ^ salt).collect();
    v[0] = first;
    if first == 0xF2 {
        v[1..9].fill(0); // a null write
    }
    v
}

fn xor(inputs: &[u8]) -> Vec<u8> {
    inputs.iter().map(|b| b ^ 0x5A).collect()
}

/// How an event-loop wait went.
#[derive(Default, Debug)]
struct Waited {
    /// Times the ready descriptor turned readable.
    signals: u32,
    /// Times the wait ran out and the pipeline was ticked.
    ticks: u32,
}

/// Collects the oldest job the way the node's task does.
fn collect(pipe: &mut dyn Pipeline, out: &mut [u8], w: &mut Waited) -> Result<(), BatchError> {
    loop {
        if let Some(r) = pipe.try_collect(out) {
            return r;
        }
        if !pipe.arm() {
            continue;
        }
        let fd = pipe
            .ready_fd()
            .expect("an isolated core has a ready descriptor");
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let t = Timespec::try_from(PIPELINE_TICK).unwrap();
        if poll(&mut fds, Some(&t)).unwrap() == 0 {
            pipe.tick();
            w.ticks += 1;
            continue;
        }
        w.signals += 1;
    }
}

#[test]
fn a_slow_job_completes_through_the_ready_descriptor() {
    let Some(mut loaded) = faulty("event_slow_job", 30_000) else {
        return;
    };
    let pipe = loaded.cores[0].pipeline().unwrap();
    let slow = input(0xF6, 1);
    pipe.submit(&slow, 1);
    // The job sleeps 200 ms: unless this thread was held that long, the
    // loop has to wait, and the completion ends the wait as a signal.
    let mut out = vec![0u8; 64];
    match pipe.try_collect(&mut out) {
        Some(r) => r.expect("the slow job succeeds"),
        None => {
            let mut w = Waited::default();
            collect(pipe, &mut out, &mut w).expect("the slow job succeeds");
            assert_eq!(w.signals, 1, "{w:?}");
        }
    }
    assert_eq!(out, xor(&slow));
}

#[test]
fn hangs_and_crashes_fail_their_job_and_the_next_runs_on_a_new_worker() {
    let Some(mut loaded) = faulty("event_faults", 300) else {
        return;
    };
    let core = &mut loaded.cores[0];
    for (n, (fault, cause)) in [
        (0xF3, "no result within 300ms"),
        (0xF2, "was killed by SIGSEGV"),
        (0xF4, "SIGABRT"),
    ]
    .into_iter()
    .enumerate()
    {
        let (bad, next) = (input(fault, n as u8), input(0x11, n as u8 + 9));
        let pipe = core.pipeline().unwrap();
        pipe.submit(&bad, 1);
        pipe.submit(&next, 1);
        let mut out = vec![0x77u8; 64];
        let mut w = Waited::default();
        let e = collect(pipe, &mut out, &mut w).expect_err("the faulty job fails");
        let msg = e.error.to_string();
        assert!(msg.starts_with("core 0 (native faulty): "), "{msg}");
        assert!(msg.contains(cause), "{fault:#x}: {msg}");
        assert!(out.iter().all(|&b| b == 0x77), "nothing of it is written");
        if fault == 0xF3 {
            // Only the watchdog, applied at ticks, ends a hang.
            assert!(w.ticks >= 1, "{w:?}");
        }
        assert!(pipe.needs_start() || !pipe.arm(), "the worker is gone");
        collect(pipe, &mut out, &mut w).expect("the job behind it runs");
        assert_eq!(out, xor(&next), "{fault:#x}");
    }
    let s = core.stats();
    assert_eq!((s.resets, s.timeouts), (3, 1));
}

#[test]
fn a_crash_makes_the_ready_descriptor_readable_without_a_tick() {
    // A watchdog far beyond the wait below: only the death can end it.
    let Some(mut loaded) = faulty("event_crash_wakes", 60_000) else {
        return;
    };
    let pipe = loaded.cores[0].pipeline().unwrap();
    let bad = input(0xF2, 5);
    pipe.submit(&bad, 1);
    let mut out = vec![0u8; 64];
    let first = match pipe.try_collect(&mut out) {
        Some(r) => r,
        None => {
            if pipe.arm() {
                let fd = pipe.ready_fd().unwrap();
                let mut fds = [PollFd::new(&fd, PollFlags::IN)];
                // Never ticked: without the worker's hang-up in the set
                // this waits the whole bound (a safety net, not a timing).
                let t = Timespec {
                    tv_sec: 30,
                    tv_nsec: 0,
                };
                assert_eq!(
                    poll(&mut fds, Some(&t)).unwrap(),
                    1,
                    "the crash wakes the loop"
                );
            }
            pipe.try_collect(&mut out)
                .expect("a woken loop finds the crash without a tick")
        }
    };
    let msg = first.expect_err("the job fails").error.to_string();
    assert!(msg.contains("SIGSEGV"), "{msg}");
    // The next job runs on a new worker, and the set follows it.
    let next = input(0x11, 6);
    pipe.submit(&next, 1);
    let mut w = Waited::default();
    collect(pipe, &mut out, &mut w).expect("the next job runs");
    assert_eq!(out, xor(&next));
}

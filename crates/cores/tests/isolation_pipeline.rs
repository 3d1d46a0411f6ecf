//! An isolated core's pipeline (`Core::pipeline`): the node hands the
//! worker job i+1 while it runs job i. A job that crashes, hangs or
//! overruns fails alone, naming the core and the cause; the job waiting
//! behind it never started (its inputs are read-only to the worker), so it
//! runs on the restarted worker and succeeds; every other result is
//! correct. The core is `cores/faulty/faulty.cpp` (fault chosen by the
//! first input byte; output = input ^ 0x5A).

use crate::support::faulty;

use faulty::load_faulty as faulty;

/// `count` inputs of 64 bytes, salted by `salt`; the first byte of each is
/// `first` (a fault) or below 0x80 (a good input).
fn inputs(first: Option<u8>, salt: u8, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|k| {
            let mut v: Vec<u8> = (0..64u8)
                .map(|i| i.wrapping_mul(3) ^ salt ^ k as u8)
                .collect();
            v[0] = first.unwrap_or(v[0] & 0x7f);
            if first.is_some_and(|f| f >= 0xF0) {
                v[1..9].fill(0); // the pointer written through by 0xF2: null
            }
            v
        })
        .collect()
}

fn xor(inputs: &[u8]) -> Vec<u8> {
    inputs.iter().map(|b| b ^ 0x5A).collect()
}

#[test]
fn a_fault_in_the_running_job_fails_it_and_the_waiting_job_runs_after_the_restart() {
    let Some(mut loaded) = faulty("pipeline_fault_then_waiting_job", 300) else {
        return;
    };
    let core = &mut loaded.cores[0];
    let cases: [(u8, &str); 4] = [
        (0xF2, "was killed by SIGSEGV"),
        (0xF4, "SIGABRT"),
        (0xF3, "no result within 300ms"),
        (0xF1, "of its 64-byte output memory, past its end"),
    ];
    for (n, (fault, cause)) in cases.iter().enumerate() {
        let (salt, count) = (n as u8, 1 + n % 3);
        let bad = inputs(Some(*fault), salt, count);
        let next = inputs(None, salt + 10, count);
        let pipe = core.pipeline().expect("an isolated core has a pipeline");
        assert_eq!(pipe.depth(), 2);
        assert!(pipe.fits(count));
        pipe.submit(&bad, count);
        pipe.submit(&next, count);
        let mut out = vec![0x11u8; 64 * count];
        let e = pipe.collect(&mut out).expect_err("the faulty job fails");
        let msg = e.error.to_string();
        assert_eq!(e.index, 0, "{msg}");
        assert!(msg.starts_with("core 0 (native faulty): "), "{msg}");
        assert!(msg.contains(cause), "{fault:#x}: {msg}");
        assert!(msg.contains("restarts for the next job"), "{msg}");
        assert!(out.iter().all(|&b| b == 0x11), "nothing of it is written");
        // The job behind it never started: it runs on the new worker.
        pipe.collect(&mut out).expect("the waiting job succeeds");
        assert_eq!(out, xor(&next), "{fault:#x}");
    }
    let s = core.stats();
    assert_eq!((s.resets, s.timeouts), (4, 1));
}

#[test]
fn a_fault_in_the_waiting_job_leaves_the_running_one_correct() {
    let Some(mut loaded) = faulty("pipeline_good_then_fault", 30_000) else {
        return;
    };
    let pipe = loaded.cores[0].pipeline().unwrap();
    let good = inputs(None, 1, 3);
    pipe.submit(&good, 3);
    pipe.submit(&inputs(Some(0xF4), 2, 1), 1);
    let mut out = vec![0u8; 64 * 3];
    pipe.collect(&mut out).unwrap();
    assert_eq!(out, xor(&good));
    let mut out = vec![0x11u8; 64];
    let e = pipe.collect(&mut out).unwrap_err();
    assert!(e.error.to_string().contains("SIGABRT"), "{e}");
    assert!(out.iter().all(|&b| b == 0x11));
    // Misuse is an error, not a panic: nothing outstanding, a third job
    // while two are, a wrong output size.
    assert!(pipe.collect(&mut out).is_err());
    pipe.submit(&good[..64], 1);
    pipe.submit(&good[64..128], 1);
    pipe.submit(&good[128..], 1);
    let mut one = vec![0u8; 64];
    pipe.collect(&mut one).unwrap();
    assert_eq!(one, xor(&good[..64]));
    pipe.collect(&mut one).unwrap();
    assert_eq!(one, xor(&good[64..128]));
    let e = pipe.collect(&mut one).unwrap_err();
    assert!(e.to_string().contains("two were outstanding"), "{e}");
    pipe.submit(&good[..64], 1);
    assert!(pipe.collect(&mut out[..32]).is_err());
    pipe.submit(&good[..64], 1);
    pipe.collect(&mut one).unwrap();
    assert_eq!(one, xor(&good[..64]));
    // A batch cannot start while pipelined jobs are outstanding.
    pipe.submit(&good[..64], 1);
    let mut three = vec![0u8; 64 * 3];
    assert!(loaded.cores[0].process_batch(&good, &mut three, 3).is_err());
    let pipe = loaded.cores[0].pipeline().unwrap();
    pipe.collect(&mut one).unwrap();
    loaded.cores[0].process_batch(&good, &mut three, 3).unwrap();
    assert_eq!(three, xor(&good));
}

#[test]
fn a_stream_with_faults_keeps_two_jobs_in_flight_and_every_good_result_correct() {
    let Some(mut loaded) = faulty("pipeline_stream", 30_000) else {
        return;
    };
    let pipe = loaded.cores[0].pipeline().unwrap();
    // Faults at fixed places, some back to back (the waiting job crashes
    // too, on the new worker).
    let fault_at = |j: usize| match j {
        7 | 8 | 50 => Some(0xF2),
        31 | 99 => Some(0xF4),
        _ => None,
    };
    let jobs: Vec<(Option<u8>, Vec<u8>)> = (0..120)
        .map(|j| {
            let f = fault_at(j);
            (f, inputs(f, j as u8, 1 + j % 4))
        })
        .collect();
    let mut collected = 0;
    for j in 0..=jobs.len() {
        if j < jobs.len() {
            pipe.submit(&jobs[j].1, jobs[j].1.len() / 64);
        }
        if j == 0 {
            continue;
        }
        let (fault, data) = &jobs[collected];
        let mut out = vec![0x11u8; data.len()];
        match (fault, pipe.collect(&mut out)) {
            (None, Ok(())) => assert_eq!(out, xor(data), "job {collected}"),
            (Some(_), Err(e)) => {
                assert!(e.error.to_string().contains("was killed by SIG"), "{e}");
                assert!(out.iter().all(|&b| b == 0x11));
            }
            (f, r) => panic!("job {collected} (fault {f:?}): {r:?}"),
        }
        collected += 1;
    }
    assert_eq!(collected, jobs.len());
    assert_eq!(loaded.cores[0].stats().resets, 5);
}

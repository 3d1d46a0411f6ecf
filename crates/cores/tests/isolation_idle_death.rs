//! A worker that dies between jobs (killed from outside): the kernel marks
//! the robust futex its job thread holds for its whole life, so the node
//! notices at once, fails the next job with the signal and restarts the
//! worker. Alone in a process of its own, so that the only worker
//! processes of that process are this test's.

use crate::support::{alone, faulty};

/// Pids of this process's children, from /proc.
fn children() -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(me) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn a_worker_killed_between_jobs_fails_the_next_job_only() {
    let name = "a_worker_killed_between_jobs_fails_the_next_job_only";
    if !alone::here(module_path!(), name) {
        return;
    }
    // A job timeout far beyond the test: the death is noticed at once.
    let Some(mut loaded) = faulty::load_faulty("a_worker_killed_between_jobs", 30_000) else {
        return;
    };
    let input: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(5) & 0x7f).collect();
    let want: Vec<u8> = input.iter().map(|b| b ^ 0x5A).collect();
    let mut out = vec![0u8; 64];
    loaded.cores[0].process(&input, &mut out).unwrap();
    assert_eq!(out, want);

    let workers = children();
    assert_eq!(workers.len(), 1, "{workers:?}");
    // SAFETY: kill(2) on our own child, which is not reaped before the next job.
    assert_eq!(unsafe { libc::kill(workers[0], libc::SIGKILL) }, 0);

    // Well within the 30 s timeout: the kernel marked the worker's word.
    let mut out = vec![0x11u8; 64];
    let e = loaded.cores[0].process(&input, &mut out).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("was killed by SIGKILL"), "{msg}");
    assert!(!msg.contains("no result within"), "{msg}");
    assert!(out.iter().all(|&b| b == 0x11));
    loaded.cores[0].process(&input, &mut out).unwrap();
    assert_eq!(out, want);
    assert_eq!(loaded.cores[0].stats().resets, 1);
}

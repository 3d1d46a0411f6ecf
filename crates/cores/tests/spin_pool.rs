//! A pool of handler workers (`HandlerWorker::sibling`, what a node runs
//! with `--handler-workers N`): two messages in different workers run at
//! the same time, a crash in one worker fails only its message while the
//! other's completes, and the handler set's shared memory and counters are
//! one for the whole pool, whichever worker runs a message; an overrun
//! likewise ends only its own worker and message.
//!
//! The handler set is `tests/fixtures/spin/meet.c`: a "waiter" message's
//! head waits (bounded) until a "partner" message's head has raised a flag
//! in shared memory, so a waiter only succeeds if its partner runs while it
//! waits; nothing here waits on a clock.

use crate::support::cc;
use cc::set;

use corefarm_cores::spin::{BudgetSpec, Outcome};
use corefarm_cores::worker::HandlerWorker;
use corefarm_cores::{LoadOptions, WorkerCommand};
use corefarm_toolchain::{require_tool, Tool};

const WORD0: u32 = 0x4d;
const WAITER: u32 = 1;
const PARTNER: u32 = 2;
const CRASH: u32 = 3;
const REPORT: u32 = 4;

/// A handler set whose head never returns: the worker's monitor stops it
/// after its budget, ending the worker process.
const STALL: &str = r#"
#include <corefarm/spin.h>
int stall_head(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)a; (void)ops;
    for (volatile unsigned i = 0;; i++) {}
    return 0;
}
"#;
const STALL_WORD0: u32 = 0x53;

/// `size` workers of one pool running `meet` and `stall`.
fn pool(dir: &std::path::Path, size: usize) -> Vec<HandlerWorker> {
    let stall = dir.join("stall.c");
    std::fs::write(&stall, STALL).unwrap();
    let meet = cc::root().join("tests/fixtures/spin/meet.c");
    let so = cc::shared_object(&[meet, stall], "c11", &[], &dir.join("meet.so"));
    let meet = BudgetSpec {
        scratch: 64,
        shared: 16,
        counters: 1,
        per_call_ms: 60_000,
        ..BudgetSpec::default()
    };
    let stall = BudgetSpec {
        per_call_ms: 100,
        ..BudgetSpec::default()
    };
    let sets = vec![set("meet", WORD0, meet), set("stall", STALL_WORD0, stall)];
    let opts = LoadOptions {
        worker: WorkerCommand::Program(env!("CARGO_BIN_EXE_corefarm-core-worker").into()),
        ..LoadOptions::default()
    };
    let first = HandlerWorker::start(&std::fs::read(so).unwrap(), sets, 2, &opts).unwrap();
    let mut all = vec![first];
    for _ in 1..size {
        all.push(all[0].sibling().unwrap());
    }
    all
}

/// A message of role `role` and `len` bytes (a multiple of 16); a waiter
/// gives up after `wait_ms`.
fn msg(role: u32, wait_ms: u32, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = [WORD0, role, wait_ms, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    m.resize(len.max(16), 0xab);
    m
}

fn begin(w: &mut HandlerWorker, id: u32, m: &[u8]) {
    let ctx = w.select(&m[..16]).expect("a set matches");
    w.begin(ctx, id, m.len() as u64).unwrap();
    w.feed(m, 32);
}

fn own_length(m: &[u8]) -> Outcome {
    Outcome::Result((m.len() as u64).to_le_bytes().to_vec())
}

/// Counter 0 and the byte total, as a report message sees them.
fn report(w: &mut HandlerWorker, id: u32) -> (u64, u64, usize) {
    let m = msg(REPORT, 0, 16);
    begin(w, id, &m);
    match w.finish().outcome {
        Outcome::Result(b) if b.len() == 16 => (
            u64::from_le_bytes(b[..8].try_into().unwrap()),
            u64::from_le_bytes(b[8..].try_into().unwrap()),
            m.len(),
        ),
        other => panic!("report: {other:?}"),
    }
}

#[test]
fn two_messages_in_two_workers_run_at_the_same_time() {
    if !require_tool(Tool::Cxx, "two_messages_in_two_workers") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut p = pool(dir.path(), 2);
    let (a, b) = p.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    assert_ne!(a.pid(), b.pid());
    // The waiter's head blocks its worker until the partner's head, in the
    // other worker, raises the flag: it succeeds only if both overlap (one
    // worker would fail it with "returned 7" after the wait).
    let waiter = msg(WAITER, 50_000, 64);
    let partner = msg(PARTNER, 0, 48);
    begin(a, 1, &waiter);
    begin(b, 2, &partner);
    assert_eq!(b.finish().outcome, own_length(&partner));
    assert_eq!(a.finish().outcome, own_length(&waiter));
}

#[test]
fn one_worker_runs_one_message_at_a_time() {
    if !require_tool(Tool::Cxx, "one_worker_runs_one_message_at_a_time") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut p = pool(dir.path(), 1);
    let w = &mut p[0];
    // The partner is queued behind the waiter, which cannot see it.
    let waiter = msg(WAITER, 200, 64);
    let ctx = w.select(&waiter[..16]).unwrap();
    match w.run(ctx, 1, &waiter, 32).outcome {
        Outcome::Failed(why) => {
            assert!(
                why.contains("meet: Head handler failed: returned 7"),
                "{why}"
            )
        }
        other => panic!("the waiter fails alone, got {other:?}"),
    }
    let partner = msg(PARTNER, 0, 16);
    assert_eq!(w.run(ctx, 2, &partner, 32).outcome, own_length(&partner));
}

#[test]
fn a_crash_fails_only_its_message_while_the_other_worker_completes() {
    if !require_tool(Tool::Cxx, "a_crash_fails_only_its_message") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut p = pool(dir.path(), 2);
    let (a, b) = p.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    // The crashing message raises the flag, so the waiter in the other
    // worker is running when its worker dies.
    let waiter = msg(WAITER, 50_000, 96);
    let crash = msg(CRASH, 0, 32);
    begin(a, 1, &waiter);
    begin(b, 2, &crash);
    let crashed = b.pid();
    match b.finish().outcome {
        Outcome::Failed(why) => assert!(
            why.contains("handler set meet: the payload handler crashed")
                && why.contains("SIGSEGV"),
            "{why}"
        ),
        other => panic!("the crash fails its message, got {other:?}"),
    }
    assert_eq!(a.finish().outcome, own_length(&waiter));
    // The crashed worker is replaced for its next message; the shared
    // memory outlives it: the counter has all four heads (waiter, crash,
    // this partner, the report) and the total every completed payload's
    // bytes (not the crashed one's 32).
    let partner = msg(PARTNER, 0, 16);
    begin(b, 3, &partner);
    assert_eq!(b.finish().outcome, own_length(&partner));
    assert_ne!(b.pid(), crashed);
    let (count, total, own) = report(a, 4);
    assert_eq!(count, 4);
    assert_eq!(total, (waiter.len() + partner.len() + own) as u64);
}

#[test]
fn handler_memory_is_one_for_the_whole_pool() {
    if !require_tool(Tool::Cxx, "handler_memory_is_one_for_the_whole_pool") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut p = pool(dir.path(), 2);
    // Alternate workers, two messages in flight at a time.
    let mut want_bytes = 0u64;
    let n = 20u32;
    for pair in 0..n / 2 {
        let (a, b) = p.split_at_mut(1);
        let (a, b) = (&mut a[0], &mut b[0]);
        let m1 = msg(PARTNER, 0, 16 * (1 + pair as usize));
        let m2 = msg(PARTNER, 0, 16 * (7 + 3 * pair as usize));
        begin(a, 2 * pair, &m1);
        begin(b, 2 * pair + 1, &m2);
        assert_eq!(a.finish().outcome, own_length(&m1));
        assert_eq!(b.finish().outcome, own_length(&m2));
        want_bytes += (m1.len() + m2.len()) as u64;
    }
    // Each worker's report sees every message, not only its own half.
    let (count, total, own) = report(&mut p[0], 100);
    assert_eq!(count, n as u64 + 1);
    assert_eq!(total, want_bytes + own as u64);
    let (count, total, own2) = report(&mut p[1], 101);
    assert_eq!(count, n as u64 + 2);
    assert_eq!(total, want_bytes + (own + own2) as u64);
}

#[test]
fn an_overrun_fails_only_its_message_while_the_other_worker_completes() {
    if !require_tool(Tool::Cxx, "an_overrun_fails_only_its_message") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut p = pool(dir.path(), 2);
    let (a, b) = p.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    // The waiter runs in one worker while the other's handler overruns and
    // that worker is ended; the partner then runs in its replacement.
    let waiter = msg(WAITER, 50_000, 64);
    begin(a, 1, &waiter);
    let mut stall = STALL_WORD0.to_le_bytes().to_vec();
    stall.resize(16, 0);
    begin(b, 2, &stall);
    match b.finish().outcome {
        Outcome::Failed(why) => assert!(
            why.contains("stall: Head handler still running after")
                && why.contains("the handler worker is restarted"),
            "{why}"
        ),
        other => panic!("the overrun fails its message, got {other:?}"),
    }
    let partner = msg(PARTNER, 0, 32);
    begin(b, 3, &partner);
    assert_eq!(b.finish().outcome, own_length(&partner));
    assert_eq!(a.finish().outcome, own_length(&waiter));
}

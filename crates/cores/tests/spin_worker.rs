//! Handler sets run in a handler worker process (the crate's
//! `corefarm-core-worker`): the reference handlers give the whole-message
//! results, and a handler that crashes, loops or overruns its output
//! budget fails only its message; the next one succeeds.

use crate::support::cc;
use cc::set;

use std::path::Path;
use std::process::Command;

use corefarm_cores::spin::{BudgetSpec, HandlerSet, Outcome, Rule};
use corefarm_cores::worker::HandlerWorker;
use corefarm_cores::{LoadError, LoadOptions, WorkerCommand};
use corefarm_toolchain::{require_tool, Tool};
use rand::{Rng, SeedableRng};

/// Every handler set of cores/spin in one shared object.
fn compile(dir: &Path) -> Vec<u8> {
    let sources: Vec<_> = ["sum", "filter", "histogram", "strided", "faulty"]
        .map(cc::reference)
        .to_vec();
    std::fs::read(cc::shared_object(
        &sources,
        "c11",
        &[],
        &dir.join("spin.so"),
    ))
    .unwrap()
}

fn sets() -> Vec<HandlerSet> {
    let b = BudgetSpec {
        scratch: 1 << 20,
        ..BudgetSpec::default()
    };
    vec![
        set("sum", 1, b),
        set("filter", 2, b),
        set("histogram", 3, b),
        set("strided", 4, b),
        set("crash", 5, b),
        set(
            "hang",
            6,
            BudgetSpec {
                per_call_ms: 200,
                ..b
            },
        ),
        set(
            "greedy",
            7,
            BudgetSpec {
                output: 10_000,
                ..b
            },
        ),
    ]
}

fn opts() -> LoadOptions {
    LoadOptions {
        worker: WorkerCommand::Program(env!("CARGO_BIN_EXE_corefarm-core-worker").into()),
        ..LoadOptions::default()
    }
}

fn header(word0: u32, params: [u32; 3]) -> Vec<u8> {
    [word0, params[0], params[1], params[2]]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

fn run(w: &mut HandlerWorker, id: u32, msg: &[u8], chunk: usize) -> Option<Outcome> {
    let ctx = w.select(&msg[..msg.len().min(chunk)])?;
    Some(w.run(ctx, id, msg, chunk).outcome)
}

#[test]
fn reference_handlers_in_the_worker_match_the_whole_message() {
    if !require_tool(Tool::Cxx, "reference_handlers_in_the_worker") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut w = HandlerWorker::start(&compile(dir.path()), sets(), 3, &opts()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for round in 0..12u32 {
        let chunk = 16 * rng.gen_range(1..300usize);
        let data: Vec<u8> = (0..rng.gen_range(1..6000usize) * 16)
            .map(|_| rng.gen())
            .collect();
        let mut msg = header(1, [0; 3]);
        msg.extend_from_slice(&data);
        let want: i64 = data
            .chunks_exact(4)
            .map(|w| i32::from_le_bytes(w.try_into().unwrap()) as i64)
            .sum();
        let got = run(&mut w, round, &msg, chunk);
        assert_eq!(
            got,
            Some(Outcome::Result(want.to_le_bytes().to_vec())),
            "sum {round}"
        );

        let threshold: i32 = rng.gen_range(-1000..1000) * 1_000_000;
        let mut msg = header(2, [threshold as u32, 0, 0]);
        msg.extend_from_slice(&data);
        let want: Vec<u8> = data
            .chunks_exact(16)
            .filter(|r| i32::from_le_bytes(r[4..8].try_into().unwrap()) >= threshold)
            .flatten()
            .copied()
            .collect();
        let expect = if want.is_empty() {
            Outcome::Forward
        } else {
            Outcome::Result(want)
        };
        assert_eq!(
            run(&mut w, round, &msg, chunk),
            Some(expect),
            "filter {round}"
        );

        let mut msg = header(3, [0; 3]);
        msg.extend_from_slice(&data);
        let mut bins = [0u64; 256];
        data.iter().for_each(|&b| bins[b as usize] += 1);
        let want: Vec<u8> = bins.iter().flat_map(|c| c.to_le_bytes()).collect();
        assert_eq!(
            run(&mut w, round, &msg, chunk),
            Some(Outcome::Result(want)),
            "histogram {round}"
        );

        let block = rng.gen_range(1..64u32);
        let stride = block + rng.gen_range(0..64u32);
        let count = rng.gen_range(1..2000u32);
        let packed: Vec<u8> = (0..count * block).map(|_| rng.gen()).collect();
        let mut msg = header(4, [count, block, stride]);
        msg.extend_from_slice(&packed);
        let mut want = vec![0u8; (count * stride) as usize];
        for (i, blk) in packed.chunks(block as usize).enumerate() {
            let at = i * stride as usize;
            want[at..at + block as usize].copy_from_slice(blk);
        }
        assert_eq!(
            run(&mut w, round, &msg, chunk),
            Some(Outcome::Result(want)),
            "strided {round}"
        );
    }
    // No ruleset matches word 0 = 99: the node sends it to the cores.
    assert_eq!(run(&mut w, 99, &header(99, [0; 3]), 4096), None);
    assert_eq!(w.restarts, 0);
}

fn sum_of_seven(w: &mut HandlerWorker, id: u32) {
    let mut ok = header(1, [0; 3]);
    ok.extend_from_slice(&7i32.to_le_bytes());
    assert_eq!(
        run(w, id, &ok, 4096),
        Some(Outcome::Result(7i64.to_le_bytes().to_vec())),
        "the next message succeeds"
    );
}

fn failure(o: Option<Outcome>) -> String {
    match o {
        Some(Outcome::Failed(why)) => why,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn crashing_looping_and_greedy_handlers_fail_only_their_message() {
    if !require_tool(Tool::Cxx, "crashing_looping_and_greedy_handlers") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut w = HandlerWorker::start(&compile(dir.path()), sets(), 2, &opts()).unwrap();
    sum_of_seven(&mut w, 0);

    let mut crash = header(5, [0; 3]);
    crash.extend_from_slice(&[0u8; 10_000]);
    let why = failure(run(&mut w, 1, &crash, 1024));
    assert!(
        why.contains("handler set crash: the payload handler crashed")
            && why.contains("SIGSEGV (an invalid memory access")
            && why.contains("restarts"),
        "{why}"
    );
    assert_eq!(w.restarts, 1);
    sum_of_seven(&mut w, 2);

    let why = failure(run(&mut w, 3, &header(6, [0; 3]), 4096));
    assert!(
        why.contains("handler set hang: Head handler still running")
            && why.contains("budget of 200ms"),
        "{why}"
    );
    assert_eq!(w.restarts, 2);
    sum_of_seven(&mut w, 4);

    let why = failure(run(&mut w, 5, &header(7, [0; 3]), 4096));
    assert!(why.contains("handler set greedy: Payload handler emitted more than the output budget of 10000 bytes"), "{why}");
    assert_eq!(w.restarts, 2, "a budget error needs no restart");
    sum_of_seven(&mut w, 6);

    // Killed from outside between messages: the next message gets a new worker.
    let pid = w.pid().expect("a running worker");
    let st = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    // Waits for the kill to land: until the kernel reports the whole process
    // ended (every thread, so its end of the channel is closed), without
    // reaping it. A zombie leader alone is not enough: its handler threads
    // may still hold the socket open.
    loop {
        // SAFETY: waitid only writes the siginfo_t it is given, which is a
        // plain C struct for which all zeroes is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        let r = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) };
        assert_eq!(r, 0, "waitid: {}", std::io::Error::last_os_error());
        // SAFETY: filled in by waitid (0 while the child has not ended).
        if unsafe { info.si_pid() } == pid as libc::pid_t {
            break;
        }
        std::thread::yield_now();
    }
    sum_of_seven(&mut w, 7);
    assert_eq!(w.restarts, 3);
}

#[test]
fn unknown_handler_sets_are_refused_at_start() {
    if !require_tool(Tool::Cxx, "unknown_handler_sets_are_refused_at_start") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let so = compile(dir.path());
    let err = HandlerWorker::start(
        &so,
        vec![set("nosuch", 1, BudgetSpec::default())],
        1,
        &opts(),
    )
    .err()
    .unwrap();
    match err {
        LoadError::Invalid(why) => assert!(why.contains("defines none of nosuch_head"), "{why}"),
        other => panic!("{other:?}"),
    }
    let err = HandlerWorker::start(
        b"not an ELF",
        vec![set("sum", 1, BudgetSpec::default())],
        1,
        &opts(),
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("cannot be loaded"), "{err}");
    let mut bad = set("sum", 1, BudgetSpec::default());
    bad.ruleset.rules = vec![Rule::FALSE; 5];
    let err = HandlerWorker::start(&so, vec![bad], 1, &opts())
        .err()
        .unwrap();
    assert!(err.to_string().contains("1 to 4 rules"), "{err}");
}

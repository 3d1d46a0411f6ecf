//! Isolated cores (the default): a core that overruns its output, writes
//! through a null pointer, never returns or aborts fails only its own job,
//! with a message naming the core and the cause; its next job runs on a
//! fresh worker and the other cores carry on. The cores are
//! `cores/faulty/faulty.cpp` (fault chosen by the first input byte) and,
//! for RTL, the reference `vadd` and `stuck` Verilog cores.

use crate::support::faulty;

use bytes::Bytes;
use corefarm_cores::image::{self, ArtifactKind};
use corefarm_cores::{load, Core, CoreError, Isolation, LoadOptions, WorkerCommand};
use corefarm_toolchain::{self as toolchain, require_tool, BuildKind, ImageBuilder, Tool};
use faulty::{cache, faulty_image, opts, repo};

fn input(first: u8, salt: u8) -> Vec<u8> {
    let mut v: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(3) ^ salt).collect();
    v[0] = first;
    if first >= 0xF0 {
        v[1..9].fill(0); // the pointer written through by 0xF2 / 0xFF: null
    }
    v
}

fn good(core: &mut Box<dyn Core>, salt: u8) {
    let i = input(salt & 0x7f, salt);
    let mut out = vec![0u8; 64];
    core.process(&i, &mut out).expect("a good job succeeds");
    let want: Vec<u8> = i.iter().map(|b| b ^ 0x5A).collect();
    assert_eq!(out, want);
}

fn fault(core: &mut Box<dyn Core>, first: u8) -> String {
    let mut out = vec![0x11u8; 64];
    let e = core
        .process(&input(first, 9), &mut out)
        .expect_err("a faulty job fails");
    assert!(matches!(e, CoreError::Worker(_)), "{e:?}");
    // Nothing the failed job wrote reaches the caller.
    assert!(out.iter().all(|&b| b == 0x11), "output changed: {out:?}");
    eprintln!("fault {first:#x}: {e}");
    e.to_string()
}

#[test]
fn each_fault_fails_only_its_job() {
    let Some(img) = faulty_image("each_fault_fails_only_its_job", 2, 64, 64) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let mut loaded = load(&cfg, &opts(300)).unwrap();
    assert!(
        loaded.description.contains("isolated"),
        "{}",
        loaded.description
    );
    let faults: [(u8, &str); 6] = [
        (0xF1, "SIGSEGV: an invalid memory access at byte "),
        (0xF2, "SIGSEGV"),
        (0xF3, "no result within 300ms"),
        (0xF4, "SIGABRT"),
        (
            0xFF,
            "SIGSEGV: an invalid memory access at address 0x0 (a null pointer)",
        ),
        (
            0xF5,
            "access at byte 1 of its 64-byte input memory, which is read-only",
        ),
    ];
    for (n, (first, cause)) in faults.iter().enumerate() {
        good(&mut loaded.cores[0], n as u8);
        let msg = fault(&mut loaded.cores[0], *first);
        assert!(msg.starts_with("core 0 (native faulty): "), "{msg}");
        assert!(msg.contains(cause), "fault {first:#x}: {msg}");
        assert!(msg.contains("restarts for the next job"), "{msg}");
        // The same core works again, on a new worker; the other one never stopped.
        good(&mut loaded.cores[0], n as u8 + 100);
        good(&mut loaded.cores[1], n as u8 + 50);
    }
    // The overrun is located: in the guard page after the output.
    let msg = fault(&mut loaded.cores[0], 0xF1);
    assert!(
        msg.contains("of its 64-byte output memory, past its end"),
        "{msg}"
    );
    good(&mut loaded.cores[0], 7);
    let s = loaded.cores[0].stats();
    assert_eq!((s.jobs, s.resets, s.timeouts), (13, 7, 1));
    assert_eq!(loaded.cores[1].stats().resets, 0);
}

#[test]
fn a_small_overrun_into_the_slack_is_caught_by_the_canary() {
    // The core writes 64 bytes; this image says 62, so two bytes land in
    // the slack before the guard page rather than on it. The next job fails
    // the same way: the canary was restored.
    let Some(img) = faulty_image("a_small_overrun_is_caught", 1, 64, 62) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let mut loaded = load(&cfg, &opts(5000)).unwrap();
    let mut out = vec![0x11u8; 62];
    let e = loaded.cores[0]
        .process(&input(1, 1), &mut out)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("wrote past the end of its 62-byte output"),
        "{e}"
    );
    assert!(out.iter().all(|&b| b == 0x11));
    let e = loaded.cores[0].process(&input(2, 2), &mut out).unwrap_err();
    assert!(e.to_string().contains("wrote past the end"), "{e}");
}

#[test]
fn a_program_that_is_no_worker_fails_the_load_with_a_reason() {
    let Some(img) = faulty_image("a_program_that_is_no_worker", 1, 64, 64) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let o = LoadOptions {
        worker: WorkerCommand::Program("true".into()),
        ..opts(1000)
    };
    let e = load(&cfg, &o).err().expect("load fails").to_string();
    assert!(
        e.contains("exited with status 0 before its core was loaded"),
        "{e}"
    );
    let o = LoadOptions {
        worker: WorkerCommand::Program(repo().join("no-such-program")),
        ..opts(1000)
    };
    let e = load(&cfg, &o).err().expect("load fails").to_string();
    assert!(e.contains("cannot start the core worker"), "{e}");
}

/// Builds `cores/<dir>/<dir>.v` (top = dir) into an RTL-only image.
fn rtl_image(dir: &str, cores: u32, i: u32, o: u32) -> Option<Vec<u8>> {
    if !require_tool(
        Tool::Verilator,
        &format!("isolated RTL test of cores/{dir}"),
    ) {
        return None;
    }
    let src = repo().join("cores").join(dir).join(format!("{dir}.v"));
    let kind = BuildKind::Rtl { top: dir.into() };
    let so = toolchain::cached_build(&kind, &[src], "", &cache()).unwrap();
    let table = image::default_core_table(cores, i, o).unwrap();
    let target = image::rtl_target().unwrap();
    Some(
        ImageBuilder::new(dir, i, o, table)
            .artifact(target, ArtifactKind::Rtl, dir, std::fs::read(so).unwrap())
            .build()
            .unwrap(),
    )
}

#[test]
fn isolated_rtl_vadd_computes_and_counts_cycles() {
    let Some(img) = rtl_image("vadd", 2, 2048, 1024) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let mut loaded = load(&cfg, &opts(60_000)).unwrap();
    assert!(
        loaded.description.contains("rtl vadd") && loaded.description.contains("isolated"),
        "{}",
        loaded.description
    );
    for (k, core) in loaded.cores.iter_mut().enumerate() {
        let input: Vec<u8> = (0..2048u32).map(|i| (i * 13 + k as u32) as u8).collect();
        let mut out = vec![0u8; 1024];
        core.process(&input, &mut out).unwrap();
        let want: Vec<u8> = (0..1024)
            .map(|i| input[i].wrapping_add(input[1024 + i]))
            .collect();
        assert_eq!(out, want);
        let s = core.stats();
        assert_eq!(s.jobs, 1);
        assert!(s.last_cycles.unwrap() >= 256 + 128 + 128, "{s:?}");
        // A batch of three in one worker job: every output, every cycle counted.
        let inputs: Vec<u8> = (0..3 * 2048u32).map(|i| (i * 7 + k as u32) as u8).collect();
        let mut outs = vec![0u8; 3 * 1024];
        core.process_batch(&inputs, &mut outs, 3).unwrap();
        for (i, o) in inputs.chunks(2048).zip(outs.chunks(1024)) {
            let want: Vec<u8> = (0..1024).map(|j| i[j].wrapping_add(i[1024 + j])).collect();
            assert_eq!(o, &want[..]);
        }
        let b = core.stats();
        assert_eq!(b.jobs, 4);
        assert!(b.cycles.unwrap() >= 4 * (256 + 128 + 128), "{b:?}");
    }
}

#[test]
fn isolated_rtl_hang_reports_cycles_and_the_core_recovers() {
    let Some(img) = rtl_image("stuck", 1, 16, 16) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let mut loaded = load(&cfg, &opts(100)).unwrap();
    let mut out = [0u8; 16];
    for _ in 0..2 {
        let e = loaded.cores[0].process(&[1; 16], &mut out).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("core 0 (rtl stuck): timed out after 100ms"),
            "{msg}"
        );
        let cycles: u64 = msg
            .split(", ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no cycle count in {msg:?}"));
        assert!(cycles > 1000, "{msg}");
    }
    let s = loaded.cores[0].stats();
    assert_eq!((s.timeouts, s.jobs), (2, 0));
}

/// `count` inputs end to end, good ones (salted by position) except the
/// faults placed at their indices.
fn batch(count: usize, faults: &[(usize, u8)]) -> Vec<u8> {
    (0..count)
        .flat_map(|k| {
            let first = faults
                .iter()
                .find(|(at, _)| *at == k)
                .map_or(k as u8 & 0x7f, |f| f.1);
            input(first, k as u8)
        })
        .collect()
}

fn expected(inputs: &[u8]) -> Vec<u8> {
    inputs.iter().map(|b| b ^ 0x5A).collect()
}

#[test]
fn a_batch_runs_in_one_job_and_matches_in_process() {
    let Some(img) = faulty_image("a_batch_runs_in_one_job", 1, 64, 64) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let mut isolated = load(&cfg, &opts(5000)).unwrap();
    let in_process = LoadOptions {
        isolation: Isolation::InProcess,
        ..opts(5000)
    };
    let mut inproc = load(&cfg, &in_process).unwrap();
    // 5 inputs fit one job; 150 take five (a job holds a lane: half of
    // the 64 slots of 64 bytes), each submitted while the one before runs.
    for count in [1, 5, 150] {
        let inputs = batch(count, &[]);
        let mut out = vec![0u8; 64 * count];
        isolated.cores[0]
            .process_batch(&inputs, &mut out, count)
            .unwrap();
        assert_eq!(out, expected(&inputs), "count {count}");
        let mut out2 = vec![0u8; 64 * count];
        inproc.cores[0]
            .process_batch(&inputs, &mut out2, count)
            .unwrap();
        assert_eq!(out2, out);
    }
    let s = isolated.cores[0].stats();
    assert_eq!((s.jobs, s.resets), (156, 0));
    // Sizes that are not count inputs and outputs are refused, untouched.
    let mut out = vec![0x11u8; 64 * 2];
    let e = isolated.cores[0]
        .process_batch(&batch(3, &[]), &mut out, 2)
        .unwrap_err();
    assert!(e.to_string().contains("for 2 inputs"), "{e}");
    assert!(out.iter().all(|&b| b == 0x11));
}

#[test]
fn a_crash_or_hang_in_a_batch_fails_only_that_batch() {
    let Some(img) = faulty_image("a_crash_in_a_batch", 2, 64, 64) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let mut loaded = load(&cfg, &opts(300)).unwrap();
    let cases: [(usize, u8, &str); 4] = [
        (2, 0xF2, "was killed by SIGSEGV"),
        (3, 0xF3, "no result within 300ms"),
        (0, 0xF4, "SIGABRT"),
        // An input of a job of a full lane (32 slots), the next job waiting.
        (70, 0xF1, "of its 64-byte output memory, past its end"),
    ];
    for (at, first, cause) in cases {
        let count = if at >= 64 { 100 } else { 5 };
        let inputs = batch(count, &[(at, first)]);
        let mut out = vec![0x11u8; 64 * count];
        let e = loaded.cores[0]
            .process_batch(&inputs, &mut out, count)
            .unwrap_err();
        assert_eq!(e.index, at, "{e}");
        let msg = e.error.to_string();
        assert!(msg.starts_with("core 0 (native faulty): "), "{msg}");
        assert!(msg.contains(cause), "{msg}");
        assert!(msg.contains("restarts for the next job"), "{msg}");
        // Nothing of the failed job reaches the caller (inputs of earlier
        // jobs of the same batch did complete).
        let from = at / 32 * 32;
        assert!(out[from * 64..].iter().all(|&b| b == 0x11), "{at}");
        // The next batch runs on a fresh worker; the other core never stopped.
        for core in loaded.cores.iter_mut() {
            let inputs = batch(5, &[]);
            let mut out = vec![0u8; 64 * 5];
            core.process_batch(&inputs, &mut out, 5).unwrap();
            assert_eq!(out, expected(&inputs));
        }
    }
    let s = loaded.cores[0].stats();
    assert_eq!((s.resets, s.timeouts), (4, 1));
    assert_eq!(loaded.cores[1].stats().resets, 0);
}

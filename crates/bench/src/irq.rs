//! Completion by interrupt against polling: the CPU a node spends per job
//! while an FPGA core runs jobs of a fixed length. The board is the fake
//! tree of `corefarm_board::fake` with a thread playing the core behind it
//! (`corefarm_cores::zynq::fake`), loaded through the Zynq backend as a
//! node loads it; the job loop runs on this thread, as on a node's core
//! handler, and its CPU is this thread's (`getrusage(RUSAGE_THREAD)`), so
//! the thread playing the core is not counted. Both modes run side by
//! side, in alternation, on one fake board each.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use corefarm_board::fake::{FakeInterrupt, TempTree};
use corefarm_cores::zynq::fake::FakeCore;
use corefarm_cores::zynq::ZynqOptions;
use corefarm_cores::{load, DriverOptions, LoadOptions};
use corefarm_smp::{Configuration, CoreInfo};
use serde::{Deserialize, Serialize};

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct IrqOptions {
    /// Jobs per mode and round.
    pub jobs: u32,
    /// How long the core takes per job.
    pub job: Duration,
    /// Rounds, each running both modes once.
    pub rounds: u32,
}

/// One mode's figures over one round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModeRun {
    /// `interrupt` or `poll`.
    pub mode: String,
    pub jobs: u32,
    /// User plus system CPU of the job loop's thread per job, microseconds.
    pub cpu_us_per_job: f64,
    /// Voluntary context switches (sleeps) of that thread per job.
    pub wakeups_per_job: f64,
    /// Wall-clock time per job, milliseconds.
    pub wall_ms_per_job: f64,
}

/// The report: every round's two runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IrqReport {
    pub job_ms: f64,
    pub jobs: u32,
    pub runs: Vec<ModeRun>,
}

const REGS: u64 = 0x43c0_0000;
const SIZE: usize = 64;
const CORE: CoreInfo = CoreInfo {
    control: REGS as u32,
    input: REGS as u32 + 0x1000,
    output: REGS as u32 + 0x2000,
};

/// User + system CPU and voluntary context switches of this thread.
fn thread_usage() -> (Duration, i64) {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime) + tv(ru.ru_stime), ru.ru_nvcsw)
}

fn run_mode(opts: &IrqOptions, interrupts: bool) -> Result<ModeRun> {
    let tree = TempTree::new();
    tree.fpga_manager("fpga0", "operating");
    let regs = tree.uio(0, "corefarm-core", &[(REGS, 0x1_0000)]);
    let irq = FakeInterrupt::bind(&tree.root(), 0);
    let core = FakeCore::start(&regs, REGS, CORE, SIZE, opts.job, Some(irq));
    let cfg = Configuration {
        input_size: SIZE as u32,
        output_size: SIZE as u32,
        cores: vec![CORE],
        bitstream: Bytes::from_static(b"bench"),
    };
    let lopts = LoadOptions {
        native: false,
        rtl: false,
        zynq: Some(ZynqOptions {
            root: tree.root(),
            udmabuf: None,
            interrupts,
            ..ZynqOptions::default()
        }),
        // The node's defaults: a 1 ms bound per poll.
        driver: DriverOptions::default(),
        ..LoadOptions::default()
    };
    let mut loaded = load(&cfg, &lopts).context("loading the fake Zynq core")?;
    let c = &mut loaded.cores[0];
    let input = [7u8; SIZE];
    let mut out = [0u8; SIZE];
    // One job first: the mapping's first touches are not the steady state.
    c.process(&input, &mut out)?;
    let (cpu0, sw0, t0) = {
        let (c, s) = thread_usage();
        (c, s, Instant::now())
    };
    for _ in 0..opts.jobs {
        c.process(&input, &mut out)?;
    }
    let wall = t0.elapsed();
    let (cpu1, sw1) = thread_usage();
    anyhow::ensure!(out == [8u8; SIZE], "the fake core's output is wrong");
    drop(loaded);
    core.stop();
    let n = f64::from(opts.jobs);
    Ok(ModeRun {
        mode: if interrupts { "interrupt" } else { "poll" }.into(),
        jobs: opts.jobs,
        cpu_us_per_job: (cpu1 - cpu0).as_secs_f64() * 1e6 / n,
        wakeups_per_job: (sw1 - sw0) as f64 / n,
        wall_ms_per_job: wall.as_secs_f64() * 1e3 / n,
    })
}

/// Runs both modes `rounds` times, alternating.
pub fn run(opts: &IrqOptions) -> Result<IrqReport> {
    anyhow::ensure!(
        opts.jobs > 0 && opts.rounds > 0,
        "--jobs and --rounds must be at least 1"
    );
    let mut runs = Vec::new();
    for _ in 0..opts.rounds {
        runs.push(run_mode(opts, true)?);
        runs.push(run_mode(opts, false)?);
    }
    Ok(IrqReport {
        job_ms: opts.job.as_secs_f64() * 1e3,
        jobs: opts.jobs,
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_modes_run_and_report_per_job_figures() {
        let r = run(&IrqOptions {
            jobs: 5,
            job: Duration::from_micros(200),
            rounds: 1,
        })
        .unwrap();
        let modes: Vec<_> = r.runs.iter().map(|m| m.mode.as_str()).collect();
        assert_eq!(modes, ["interrupt", "poll"]);
        assert!(r
            .runs
            .iter()
            .all(|m| m.jobs == 5 && m.wall_ms_per_job > 0.0));
    }
}

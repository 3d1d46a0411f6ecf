//! `corefarm bench irq`'s arguments: completion by interrupt against
//! polling on a fake Zynq board ([`corefarm_bench::irq`]). One JSON object
//! on stdout.

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use corefarm_bench::irq::{self, IrqOptions};

#[derive(Args)]
pub struct IrqArgs {
    /// Jobs per mode and round.
    #[arg(long, default_value_t = 500)]
    jobs: u32,
    /// Milliseconds the core takes per job.
    #[arg(long, default_value_t = 1.0)]
    job_ms: f64,
    /// Rounds, each running both modes once (interrupt, then polling).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
}

pub fn run(a: IrqArgs) -> Result<()> {
    let job = Duration::try_from_secs_f64(a.job_ms / 1e3)
        .map_err(|_| anyhow::anyhow!("--job-ms must be a duration, not {}", a.job_ms))?;
    let report = irq::run(&IrqOptions {
        jobs: a.jobs,
        job,
        rounds: a.rounds,
    })?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

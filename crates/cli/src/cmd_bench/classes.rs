//! `corefarm bench classes`'s arguments: priority classes against the
//! queueing model ([`corefarm_bench::classes`]). One JSON object on stdout.

use anyhow::Result;
use clap::Args;
use corefarm_bench::classes::{self, ClassesOptions};

#[derive(Args)]
pub struct ClassesBenchArgs {
    /// Offered loads ρ to measure (fractions of the node's capacity).
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.3,0.5,0.7,0.9")]
    loads: Vec<f64>,
    /// Share of messages in the urgent class (class 0); the rest are class 1.
    #[arg(long, default_value_t = 0.3)]
    urgent_share: f64,
    /// The benchmarking core's delay per input, microseconds.
    #[arg(long, default_value_t = 500)]
    delay_us: u32,
    /// Mean inputs per message (geometric, at least 1).
    #[arg(long, default_value_t = 8.0)]
    mean_inputs: f64,
    /// Measured seconds per load (after one second of warm-up); higher
    /// loads need longer runs for a stable mean.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
    /// Seed of the arrival and size draws (same seed, same run).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn run(a: ClassesBenchArgs) -> Result<()> {
    let report = classes::run(&ClassesOptions {
        loads: a.loads,
        urgent_share: a.urgent_share,
        delay_us: a.delay_us,
        mean_inputs: a.mean_inputs,
        duration: a.duration,
        seed: a.seed,
    })?;
    println!("{report}");
    Ok(())
}

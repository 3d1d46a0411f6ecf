//! `corefarm bench sharing`'s arguments: shared nodes, seed 002 §5.5
//! scaled to this machine ([`corefarm_bench::sharing`]).

use anyhow::Result;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use corefarm_bench::sharing::multi::{self, MultiOptions};
use corefarm_bench::sharing::workloads::Workload;
use corefarm_bench::sharing::{self, SharingOptions, Variant};

/// The variants by name, listed in the help as clap lists an enum's.
fn parse_variant() -> impl TypedValueParser<Value = Variant> {
    PossibleValuesParser::new(Variant::ALL.map(Variant::name))
        .map(|s| s.parse::<Variant>().expect("a listed variant"))
}

/// `seed` or a multi-tenant workload's name.
fn parse_workload() -> impl TypedValueParser<Value = String> {
    let names: Vec<&'static str> = std::iter::once("seed")
        .chain(Workload::ALL.map(Workload::name))
        .collect();
    PossibleValuesParser::new(names)
}

#[derive(Args)]
pub struct SharingArgs {
    /// seed: seed 002 §5.5's equal, always-busy applications (--apps,
    /// --functions, --calls); arrivals, bursts or zipf64: multi-tenant
    /// workloads generated from --seed (users arriving and leaving, bursts,
    /// Zipf popularity, heavy-tailed call sizes; docs/sharing.md). The
    /// multi-tenant workloads run exclusive, static, shared or cowork.
    #[arg(long, default_value = "seed", value_parser = parse_workload())]
    workload: String,
    /// Multi-tenant workloads: the server's --user-idle-timeout, in seconds.
    #[arg(long, default_value_t = 20.0)]
    user_idle_timeout_s: f64,
    /// Multi-tenant workloads: a shortened workload (a smoke run, not results).
    #[arg(long)]
    quick: bool,
    /// software, exclusive, static, shared or cowork.
    #[arg(long, default_value = "shared", value_parser = parse_variant())]
    variant: Variant,
    /// Simulated nodes.
    #[arg(long, default_value_t = 8)]
    nodes: usize,
    /// Concurrent applications (user connections).
    #[arg(long, default_value_t = 4)]
    apps: u32,
    /// Distinct functions the applications pick from (1: the seed's
    /// single-function utilisation experiment, §5.5.3).
    #[arg(long, default_value_t = 16)]
    functions: u32,
    /// Each application's share of the work, in calls of mean size
    /// (50.5 ms of node time each); the calls themselves are 1–100 ms.
    #[arg(long, default_value_t = 20)]
    calls: u32,
    /// Messages one call is split into (the seed's n_j).
    #[arg(long, default_value_t = 6)]
    jobs: u32,
    /// Accelerator speedup S: software time per input = S × node time per
    /// input. 0: no software path (software, static with more functions
    /// than nodes, and cowork refuse it; T_SW is then taken at S = 1).
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Monitoring period P in ms; the nodes' programming time is the same
    /// unless --reconfigure-delay-ms says otherwise (seed table 5.3).
    #[arg(long, default_value_t = 10)]
    period_ms: u64,
    /// The simulated nodes' programming time in ms (default: P).
    #[arg(long)]
    reconfigure_delay_ms: Option<u64>,
    /// Seed of the random call sequences (same seed, same workload).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// `cowork`: no backup copies of the local threads' last messages
    /// (docs/cowork.md), for comparison.
    #[arg(long)]
    no_backup: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: SharingArgs) -> Result<()> {
    if let Ok(workload) = a.workload.parse::<Workload>() {
        if !(a.user_idle_timeout_s.is_finite() && a.user_idle_timeout_s > 0.0) {
            anyhow::bail!("--user-idle-timeout-s must be positive");
        }
        let o = MultiOptions {
            workload,
            variant: a.variant,
            nodes: a.nodes,
            jobs: a.jobs,
            speedup: a.speedup,
            period_ms: a.period_ms,
            reconfigure_delay_ms: a.reconfigure_delay_ms.unwrap_or(a.period_ms),
            seed: a.seed,
            user_idle_timeout: std::time::Duration::from_secs_f64(a.user_idle_timeout_s),
            quick: a.quick,
            no_backup: a.no_backup,
        };
        let r = multi::measure(&o)?;
        if a.json {
            println!("{r}");
        } else {
            println!("{}", multi::summary(&r));
        }
        return Ok(());
    }
    let o = SharingOptions {
        variant: a.variant,
        nodes: a.nodes,
        apps: a.apps,
        functions: a.functions,
        calls: a.calls,
        jobs: a.jobs,
        speedup: a.speedup,
        period_ms: a.period_ms,
        reconfigure_delay_ms: a.reconfigure_delay_ms,
        seed: a.seed,
        no_backup: a.no_backup,
    };
    let r = sharing::measure(&o)?;
    if a.json {
        println!("{r}");
    } else {
        println!("{}", sharing::summary(&o, &r));
    }
    Ok(())
}

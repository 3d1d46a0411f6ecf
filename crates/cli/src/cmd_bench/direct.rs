//! `corefarm bench direct`'s arguments: throughput of a group's direct data
//! path ([`corefarm_bench::direct`]). One JSON object on stdout.

use anyhow::Result;
use clap::Args;
use corefarm_bench::cpu::CpuTarget;
use corefarm_bench::direct::{self, DirectOptions};

#[derive(Args)]
pub struct DirectArgs {
    /// The server's user port (its nodes need a peer port).
    #[arg(long)]
    server: String,
    /// Group size.
    #[arg(long, default_value_t = 4)]
    nodes: u32,
    /// Bytes per input (one input per data message, at most 1 MiB).
    #[arg(long, default_value_t = 32768)]
    input_size: u32,
    /// Bytes per output of the benchmarking core (at least 16).
    #[arg(long, default_value_t = 16384)]
    output_size: u32,
    /// Messages in flight per member.
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// Messages per `Direct::map` call.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Priority class of every message, 0 (most urgent) to 7 (default 4:
    /// the default class); sent as chunks of that class where the members
    /// offer chunks on the direct path.
    #[arg(long, default_value_t = corefarm_smp::stream::DEFAULT_CLASS,
          value_parser = clap::value_parser!(u8).range(0..8))]
    priority: u8,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Seconds at the start excluded from the figures.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// LABEL=PID: a process whose CPU time over the window is reported (repeatable).
    #[arg(long = "cpu-pid", value_name = "LABEL=PID")]
    cpu_pids: Vec<CpuTarget>,
    /// A server with TLS on its user port: the group opens over TLS, but
    /// the direct path is plain TCP only and is then refused.
    #[command(flatten)]
    tls: crate::cmd_tls::ClientTlsArgs,
}

pub fn run(a: DirectArgs) -> Result<()> {
    let report = direct::run(&DirectOptions {
        server: a.server,
        nodes: a.nodes,
        input_size: a.input_size,
        output_size: a.output_size,
        window: a.window,
        batch: a.batch,
        priority: a.priority,
        duration: a.duration,
        warmup: a.warmup,
        cpu_pids: a.cpu_pids,
        tls: a.tls.load()?,
    })?;
    println!("{report}");
    Ok(())
}

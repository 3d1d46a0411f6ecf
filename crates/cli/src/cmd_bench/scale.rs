//! `corefarm bench scale`'s arguments: the server at thousands of nodes
//! ([`corefarm_bench::scale`]). One JSON object on stdout; with --out, also
//! scale.json and scale.csv there.

use anyhow::{Context, Result};
use clap::Args;
use corefarm_bench::scale::{self, ScaleOptions};

#[derive(Args)]
pub struct ScaleArgs {
    /// Cluster sizes, comma-separated (one server each).
    #[arg(long, value_delimiter = ',', default_value = "100,300,1000,3000,10000")]
    nodes: Vec<usize>,
    /// Simulated nodes per `corefarm node` process.
    #[arg(long, default_value_t = 2000)]
    per_process: usize,
    /// Seconds of the idle window (server CPU with every node idle).
    #[arg(long, default_value_t = 3.0)]
    idle: f64,
    /// Scheduler microbenchmark: node counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,3000,10000")]
    sched_nodes: Vec<usize>,
    /// Scheduler microbenchmark: function counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    sched_functions: Vec<usize>,
    /// Data messages per scheduler point.
    #[arg(long, default_value_t = 2000)]
    sched_messages: usize,
    /// Algorithm 1 periods per scheduler point.
    #[arg(long, default_value_t = 20)]
    sched_periods: usize,
    /// Seconds per event kind on a small cluster (group open, session,
    /// data via the server and direct); 0 skips them.
    #[arg(long, default_value_t = 2.0)]
    event_seconds: f64,
    /// Samples per cluster size, in one cluster: idle windows, full status
    /// requests and configurations fanned out to every node (their mean,
    /// and their spread beside it).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// The model is calibrated on the sizes up to this many nodes and
    /// validated on the larger ones.
    #[arg(long, default_value_t = 1000)]
    calibrate_max: usize,
    /// Only the scheduler in process: no server, no nodes, no events.
    #[arg(long)]
    sched_only: bool,
    /// Small sizes for a smoke run (a few seconds): 50 and 200 nodes,
    /// the scheduler to 1,000 nodes and 100 functions, 0.5 s per event.
    #[arg(long)]
    quick: bool,
    /// Extra argument for the server (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    server_args: Vec<String>,
    /// Directory for scale.json and scale.csv.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// No progress on stderr.
    #[arg(long)]
    quiet: bool,
}

pub fn run(a: ScaleArgs) -> Result<()> {
    let mut o = ScaleOptions {
        program: std::env::current_exe().context("locating the corefarm binary")?,
        nodes: a.nodes,
        per_process: a.per_process,
        idle: a.idle,
        server_args: a.server_args,
        sched_nodes: a.sched_nodes,
        sched_functions: a.sched_functions,
        sched_messages: a.sched_messages,
        sched_periods: a.sched_periods,
        event_seconds: a.event_seconds,
        repeats: a.repeats,
        calibrate_max: a.calibrate_max,
        progress: !a.quiet,
    };
    if a.quick {
        o.nodes = vec![50, 200];
        // Two samples of a quarter second: the idle time of one of half a
        // second, and the floor fit has its spread.
        o.idle = 0.25;
        o.sched_nodes = vec![100, 1000];
        o.sched_functions = vec![1, 100];
        o.sched_messages = 500;
        o.sched_periods = 5;
        o.event_seconds = 0.5;
        o.repeats = 2;
    }
    if a.sched_only {
        o.nodes.clear();
        o.event_seconds = 0.0;
    }
    crate::interrupt::kill_children_on_signal("bench scale");
    let rep = scale::run(&o)?;
    let json = serde_json::to_string(&rep)?;
    if let Some(dir) = a.out {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("scale.json"), &json)?;
        std::fs::write(dir.join("scale.csv"), rep.csv())?;
    }
    println!("{json}");
    Ok(())
}

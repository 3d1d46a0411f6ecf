//! `corefarm demo`: the seed's test case (seed 000 §4.3: 64×64 signed int32
//! matrix products) end to end on an embedded local cluster, every result
//! checked, side by side with the single-threaded software baseline of §4.5.
//!
//! One concept per file: [`workload`] (matrices and their check), [`image`]
//! (building the core and its image), [`cluster`] and [`stream`] (the timed
//! run), [`baseline`] and [`rtl`] (measurements after it), [`report`].

mod baseline;
mod cluster;
mod image;
mod report;
mod rtl;
mod stream;
mod workload;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Result};
use clap::{Args, ValueEnum};
use corefarm_bench::stats::bits_per_second;
use corefarm_cores::image::Family;
use corefarm_cores::{Core, Isolation, LoadOptions};
use rand::Rng;
use serde::Serialize;

use self::report::Report;
use self::stream::StreamSpec;
use self::workload::{INPUT_SIZE, OUTPUT_SIZE};

/// Above this many bytes of held results, results are checked as they arrive
/// instead of after the timed run.
const HOLD_LIMIT: usize = 256 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// HLS C++ (cores/matmul/matmul.cpp) compiled for this CPU.
    Native,
    /// Verilog (cores/matmul/matmul.v) simulated by Verilator.
    Rtl,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Native => "native",
            Target::Rtl => "rtl",
        }
    }

    /// Loading restricted to this backend and family.
    fn load_options(self, family: Family, isolation: Isolation) -> LoadOptions {
        LoadOptions {
            native: self == Target::Native,
            rtl: self == Target::Rtl,
            families: vec![family],
            isolation,
            ..LoadOptions::default()
        }
    }
}

#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// Which form of the matrix multiplier the nodes run.
    #[arg(long, value_enum, default_value_t = Target::Native)]
    pub target: Target,
    /// Which vendor's style of core: intel (cores/matmul/matmul.cpp and
    /// matmul.v: Avalon agent, memories in the core) or amd
    /// (matmul_vitis.cpp and matmul_axi.v: Vitis ap_ctrl_hs on AXI4-Lite, the
    /// core reading and writing host memory through its AXI4 master).
    #[arg(long, default_value = "intel", value_parser = parse_family)]
    pub family: Family,
    /// Node managers in the embedded cluster.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub nodes: u32,
    /// Hardware cores (core-table entries) per node.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cores: u32,
    /// Matrix pairs to multiply [default: 2000 native, 200 rtl].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub jobs: Option<u64>,
    /// Matrix pairs per data message (the seed's "input count", §4.4.1); a
    /// node runs one message's inputs through one core, one after another.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub count: u32,
    /// Data messages the demo keeps in flight [default: 4 × nodes × cores];
    /// the server's credit may allow fewer.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub window: Option<u32>,
    /// Seed of the random matrices (printed, so a failure can be replayed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds the software baseline runs (at least one product).
    #[arg(long, default_value_t = 1.0)]
    pub baseline_seconds: f64,
    /// Seconds to wait for the next result before giving up.
    #[arg(long, default_value_t = 60.0)]
    pub result_timeout: f64,
    /// Build cache [default: $COREFARM_CACHE, else ~/.cache/corefarm].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Print one JSON object with every figure instead of the human report.
    #[arg(long)]
    pub json: bool,
}

fn parse_family(s: &str) -> Result<Family, corefarm_cores::image::UnknownFamily> {
    s.parse()
}

/// One core of the matrix multiplier in `so`, loaded by corefarm-cores the
/// way a node loads it (one-core image, driver, backend), in this process:
/// the standalone figures time the function and the simulator alone.
fn load_one_core(target: Target, family: Family, so: &Path) -> Result<Box<dyn Core>> {
    let img = image::matmul_image(target, family, so, 1)?;
    let loaded = corefarm_cores::load(
        &img.configuration,
        &target.load_options(family, Isolation::InProcess),
    )
    .map_err(|e| anyhow!("loading {}: {e}", so.display()))?;
    loaded
        .cores
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("the {} image loaded no core", target.name()))
}

pub fn run(args: DemoArgs) -> Result<()> {
    anyhow::ensure!(
        args.baseline_seconds.is_finite() && args.baseline_seconds >= 0.0,
        "--baseline-seconds must be a non-negative number"
    );
    anyhow::ensure!(
        args.result_timeout.is_finite() && args.result_timeout > 0.0,
        "--result-timeout must be a positive number of seconds"
    );
    let quiet = args.json;
    let say = |m: &str| {
        if !quiet {
            eprintln!("{m}");
        }
    };
    image::check_tools(args.target, args.family)?;
    let cache = args
        .cache_dir
        .clone()
        .unwrap_or_else(image::default_cache_dir);
    let built = image::build(args.target, args.family, &cache, &say)?;
    let img = image::matmul_image(
        args.target,
        args.family,
        built.object(args.target),
        args.cores,
    )?;

    let jobs = args.jobs.unwrap_or(match args.target {
        Target::Native => 2000,
        Target::Rtl => 200,
    });
    let instances = args.nodes * args.cores;
    let window = args.window.unwrap_or(4 * instances);
    // 32 random bits: short to type back, exact in any JSON reader.
    let seed = args
        .seed
        .unwrap_or_else(|| rand::thread_rng().gen::<u32>() as u64);
    let streamed = cluster::run(
        &cluster::ClusterSpec {
            target: args.target,
            family: args.family,
            nodes: args.nodes,
            cores: args.cores,
        },
        &img.configuration,
        &StreamSpec {
            jobs,
            count: args.count,
            window,
            seed,
            timeout: Duration::from_secs_f64(args.result_timeout),
            hold: (jobs as usize).saturating_mul(OUTPUT_SIZE) <= HOLD_LIMIT,
            quiet,
        },
        &say,
    )?;

    // Measurements that need the CPU to themselves run after the cluster stopped.
    say("running the software baseline");
    let software = baseline::measure(&built.native_so, args.baseline_seconds, seed)?;
    let rtl = match &built.rtl_so {
        Some(so) => {
            say("timing one RTL instance alone");
            let (secs, elapsed) = (args.baseline_seconds, streamed.elapsed);
            let family = args.family;
            Some(rtl::measure(
                so, family, seed, secs, jobs, elapsed, instances,
            )?)
        }
        None => None,
    };

    let (elapsed, latency) = (streamed.elapsed, streamed.latency);
    let v = streamed.verify(seed);
    let report = Report {
        target: args.target,
        family: args.family,
        isolation: Isolation::Process.name(),
        artifact: img.artifact,
        nodes: args.nodes,
        cores_per_node: args.cores,
        instances,
        jobs,
        count: args.count,
        messages: jobs.div_ceil(args.count as u64),
        window,
        seed,
        image_bytes: img.bytes,
        build_seconds: built.seconds,
        build_reused_cache: built.reused,
        cache_dir: cache.display().to_string(),
        verified: v.verified,
        mismatches: v.mismatches,
        failed: v.failed,
        all_verified: v.verified == jobs && v.failed == 0,
        verification: v.verification,
        first_bad_job: v.first_bad,
        seconds: elapsed,
        matrices_per_s: jobs as f64 / elapsed,
        gbit_per_s_in: bits_per_second(jobs * INPUT_SIZE as u64, elapsed) / 1e9,
        gbit_per_s_out: bits_per_second(jobs * OUTPUT_SIZE as u64, elapsed) / 1e9,
        latency_ms: latency,
        ratio_vs_software: (jobs as f64 / elapsed) / software.matrices_per_s,
        software,
        rtl,
    };
    report.print(args.json)?;
    report.verdict(&built.native_so)
}

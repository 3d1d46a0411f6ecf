//! The demo's result: every figure of a run, printed for people or as one
//! JSON object, and the verdict (wrong or missing results fail the command).

use std::path::Path;

use anyhow::{bail, Result};
use corefarm_bench::stats::{human, LatencySummary};
use serde::Serialize;

use super::baseline::Software;
use super::image::ENTRY;
use super::rtl::RtlFigures;
use super::stream::BadJob;
use super::Target;

#[derive(Debug, Serialize)]
pub struct Report {
    pub target: Target,
    /// `intel` or `amd`: which style of core the nodes ran.
    pub family: corefarm_cores::image::Family,
    /// Where the nodes ran their cores: "process" or "in-process".
    pub isolation: &'static str,
    pub artifact: String,
    pub nodes: u32,
    pub cores_per_node: u32,
    pub instances: u32,
    pub jobs: u64,
    /// Inputs per data message.
    pub count: u32,
    /// Data messages sent (jobs ÷ count, rounded up).
    pub messages: u64,
    /// Data messages the demo kept in flight at most.
    pub window: u32,
    pub seed: u64,
    pub image_bytes: usize,
    pub build_seconds: f64,
    pub build_reused_cache: bool,
    pub cache_dir: String,
    /// Results equal to the software computation.
    pub verified: u64,
    pub mismatches: u64,
    /// Jobs the cluster answered with an error instead of a result.
    pub failed: u64,
    pub all_verified: bool,
    /// "after" (results held, checked once the clock stopped) or "inline".
    pub verification: &'static str,
    pub first_bad_job: Option<BadJob>,
    pub seconds: f64,
    pub matrices_per_s: f64,
    pub gbit_per_s_in: f64,
    pub gbit_per_s_out: f64,
    pub latency_ms: LatencySummary,
    pub software: Software,
    /// corefarm matrices/s ÷ software matrices/s.
    pub ratio_vs_software: f64,
    pub rtl: Option<RtlFigures>,
}

impl Report {
    pub fn print(&self, json: bool) -> Result<()> {
        if json {
            println!("{}", serde_json::to_string(self)?);
        } else {
            print_human(self);
        }
        Ok(())
    }

    /// Fails unless every result was verified and the baseline computes the
    /// right product (`native_so` names the object it ran).
    pub fn verdict(&self, native_so: &Path) -> Result<()> {
        let (jobs, verified, seed) = (self.jobs, self.verified, self.seed);
        if let Some(bad) = &self.first_bad_job {
            bail!(
                "{} of {jobs} results are wrong or missing ({} mismatched, {} failed); first bad job: {} (seed {seed}): {}",
                jobs - verified,
                self.mismatches,
                self.failed,
                bad.job,
                bad.reason
            );
        }
        anyhow::ensure!(
            self.all_verified,
            "only {verified} of {jobs} results were verified"
        );
        anyhow::ensure!(
            self.software.output_verified,
            "the software baseline ({}) computes a wrong product",
            native_so.display()
        );
        Ok(())
    }
}

fn print_human(r: &Report) {
    let l = &r.latency_ms;
    println!(
        "corefarm demo: {} products of 64×64 int32 matrices (seed 000 §4.3) on {} node(s) × {} {} core(s) ({}), {} per message",
        r.jobs,
        r.nodes,
        r.cores_per_node,
        format_args!("{} {}", r.target.name(), r.family),
        r.isolation,
        r.count
    );
    println!(
        "  image      {ENTRY}, {}, {} bytes ({} in {:.1} s, cache {})",
        r.artifact,
        r.image_bytes,
        if r.build_reused_cache {
            "reused from the cache"
        } else {
            "built"
        },
        r.build_seconds,
        r.cache_dir
    );
    println!(
        "  checked    {}/{} results equal the software computation (Rust, naive, wrapping i32; checked {})",
        r.verified,
        r.jobs,
        if r.verification == "after" { "after the timed run" } else { "as they arrived, inside the timed run" }
    );
    println!(
        "  corefarm   {:.1} matrices/s over {:.2} s; in {}, out {}",
        r.matrices_per_s,
        r.seconds,
        human(r.gbit_per_s_in * 1e9, "bit/s"),
        human(r.gbit_per_s_out * 1e9, "bit/s")
    );
    println!(
        "  latency    avg {:.2} ms, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (submit to result; demo window {}, server credit may allow fewer)",
        l.avg_ms, l.p50_ms, l.p99_ms, l.max_ms, r.window
    );
    println!(
        "  software   {:.1} matrices/s ({:.1} MB/s in; seed §4.5 measured 96 MB/s on its machine): {}",
        r.software.matrices_per_s, r.software.mbyte_per_s_in, r.software.implementation
    );
    println!(
        "  ratio      corefarm / software = {:.2}× ({} instances sharing {} CPU(s) with the server, nodes and this client)",
        r.ratio_vs_software,
        r.instances,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if let Some(rtl) = &r.rtl {
        println!(
            "  rtl        {} simulated cycles/job (bus transfers included); one instance alone: {} cycles/s; \
             in the cluster: {} cycles/s per instance (jobs × cycles/job ÷ wall time ÷ {} instances)",
            rtl.cycles_per_job,
            human(rtl.standalone_cycles_per_s, ""),
            human(rtl.cluster_cycles_per_s_per_instance, ""),
            r.instances
        );
    }
}

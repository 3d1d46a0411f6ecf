//! Simulation speed of the RTL core: cycles per job and simulated cycles per
//! second, alone and inside the cluster.

use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use serde::Serialize;

use super::workload::{check, input_for, OUTPUT_SIZE};
use super::Target;

#[derive(Debug, Serialize)]
pub struct RtlFigures {
    /// Simulated cycles of one job, bus transfers included (Core::stats).
    pub cycles_per_job: u64,
    /// One instance alone in this process after the cluster stopped: simulated
    /// cycles ÷ wall time inside its jobs (Core::stats).
    pub standalone_cycles_per_s: f64,
    pub standalone_jobs: u64,
    /// jobs × cycles_per_job ÷ cluster wall time ÷ instances: the average
    /// simulation speed each instance sustained in the cluster, sharing the CPUs.
    pub cluster_cycles_per_s_per_instance: f64,
}

/// Times one RTL instance through corefarm-cores (the nodes' own load path)
/// for at least `seconds` (and two jobs), checking its outputs too, and
/// derives the cluster's figure from its `jobs` in `cluster_seconds` over
/// `instances` instances.
pub fn measure(
    rtl_so: &Path,
    family: corefarm_cores::image::Family,
    seed: u64,
    seconds: f64,
    jobs: u64,
    cluster_seconds: f64,
    instances: u32,
) -> Result<RtlFigures> {
    let mut core = super::load_one_core(Target::Rtl, family, rtl_so)?;
    let mut out = vec![0u8; OUTPUT_SIZE];
    let start = Instant::now();
    let mut n = 0u64;
    while n < 2 || start.elapsed().as_secs_f64() < seconds {
        let input = input_for(seed ^ 0x5717, n);
        core.process(&input, &mut out)?;
        check(&input, &out).map_err(|r| anyhow!("standalone RTL core, job {n}: {r}"))?;
        n += 1;
    }
    let st = core.stats();
    let (Some(total), Some(last)) = (st.cycles, st.last_cycles) else {
        bail!("the RTL core reports no cycle count");
    };
    Ok(RtlFigures {
        cycles_per_job: last,
        standalone_cycles_per_s: total as f64 / st.busy.as_secs_f64().max(1e-9),
        standalone_jobs: st.jobs,
        cluster_cycles_per_s_per_instance: jobs as f64 * last as f64
            / cluster_seconds
            / instances as f64,
    })
}

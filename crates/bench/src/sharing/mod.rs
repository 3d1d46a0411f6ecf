//! Shared nodes (`corefarm bench sharing`): seed 002 §5.5 scaled to this machine. An
//! embedded cluster (simulated nodes programming in `--reconfigure-delay-ms`)
//! serves `--apps` concurrent applications; each calls a random sequence of
//! `--functions` functions (benchmarking configurations with different
//! per-input delays), each call 1–100 ms of node time split into `--jobs`
//! messages. An application's software path is a loop calibrated so that an
//! input costs `--speedup` times its node time (soft.rs).
//!
//! Variants (`--variant`, apps.rs): `software` (every call on the
//! application's CPU), `exclusive` (server `--sharing exclusive`: each
//! application owns nodes / apps nodes and reprograms them when it calls
//! another function), `static` (the nodes divided among the first functions
//! up front and never reprogrammed; other functions run in software),
//! `shared` (server `--sharing shared`, Algorithm 1) and `cowork` (shared,
//! each call through the client's co-working map).
//!
//! Reports the makespan T_o normalised to software-only and the utilisation
//! U = T_e / T_o (seed eqs. 5.7/5.8): T_SW is the software-only makespan on
//! this machine's N_c CPUs, max(longest application, total / N_c), and T_e
//! the makespan if every resource that may work were busy all along,
//! S·W / (N_c + n_s·S) with W the node time of all calls, S the speedup and
//! the N_c term only for variants that compute on the CPU.

mod apps;
pub mod multi;
mod soft;
#[cfg(test)]
mod tests;
pub mod workloads;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use corefarm_server::{ServerOptions, Sharing};

use apps::{Software, StaticPartition};

/// How the applications reach the nodes (or do without them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Software,
    Exclusive,
    Static,
    Shared,
    Cowork,
}

/// A name that is not a [`Variant`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a variant (software, exclusive, static, shared or cowork)")]
pub struct UnknownVariant(pub String);

impl std::str::FromStr for Variant {
    type Err = UnknownVariant;

    fn from_str(s: &str) -> Result<Self, UnknownVariant> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| UnknownVariant(s.to_string()))
    }
}

impl Variant {
    pub const ALL: [Variant; 5] = [
        Variant::Software,
        Variant::Exclusive,
        Variant::Static,
        Variant::Shared,
        Variant::Cowork,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Software => "software",
            Variant::Exclusive => "exclusive",
            Variant::Static => "static",
            Variant::Shared => "shared",
            Variant::Cowork => "cowork",
        }
    }

    fn server(self) -> Option<Sharing> {
        match self {
            Variant::Software => None,
            Variant::Exclusive | Variant::Static => Some(Sharing::Exclusive),
            Variant::Shared | Variant::Cowork => Some(Sharing::Shared),
        }
    }
}

/// One run: the cluster, the workload and the variant.
#[derive(Debug, Clone)]
pub struct SharingOptions {
    /// software, exclusive, static, shared or cowork.
    pub variant: Variant,
    /// Simulated nodes.
    pub nodes: usize,
    /// Concurrent applications (user connections).
    pub apps: u32,
    /// Distinct functions the applications pick from (1: the seed's
    /// single-function utilisation experiment, §5.5.3).
    pub functions: u32,
    /// Each application's share of the work, in calls of mean size
    /// (50.5 ms of node time each); the calls themselves are 1–100 ms.
    pub calls: u32,
    /// Messages one call is split into (the seed's n_j).
    pub jobs: u32,
    /// Accelerator speedup S: software time per input = S × node time per
    /// input. 0: no software path (software, static with more functions
    /// than nodes, and cowork refuse it; T_SW is then taken at S = 1).
    pub speedup: f64,
    /// Monitoring period P in ms; the nodes' programming time is the same
    /// unless --reconfigure-delay-ms says otherwise (seed table 5.3).
    pub period_ms: u64,
    /// The simulated nodes' programming time in ms (default: P).
    pub reconfigure_delay_ms: Option<u64>,
    /// Seed of the random call sequences (same seed, same workload).
    pub seed: u64,
    /// `cowork`: no backup copies of the local threads' last messages
    /// (docs/cowork.md), for comparison.
    pub no_backup: bool,
}

/// xorshift64*: a reproducible workload needs no more.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// One call: function index and number of inputs.
type Call = (u32, u32);

/// Per-input delay of function `f`: 100 µs to 1.6 ms, so calls of 1–100 ms
/// have from one to about a thousand inputs.
fn delay_us(f: u32) -> u32 {
    100 * (f + 1)
}

/// Mean node time of a call drawn from 1–100 ms, in µs.
const MEAN_CALL_US: u64 = 50_500;

/// Every application gets the same share of the work, `--calls` calls of
/// mean size (seed 002 §5.5.2: the experiment's total workload "is divided
/// between applications"), as calls of 1–100 ms of node time drawn until
/// the share is used, the last one cut to what is left (so a share is
/// exact to within one input). Unequal shares
/// would leave the application with the most work running alone at the
/// end, on fewer nodes than its calls could use, which measures the draw
/// rather than the framework.
fn workload(a: &SharingOptions) -> Vec<Vec<Call>> {
    let mut rng = Rng(a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let share_us = u64::from(a.calls) * MEAN_CALL_US;
    (0..a.apps)
        .map(|_| {
            let mut left = share_us;
            let mut calls = Vec::new();
            while left > 0 {
                let f = rng.below(a.functions as u64) as u32;
                let work_us = (1000 + rng.below(99_000)).min(left);
                let inputs = (work_us / u64::from(delay_us(f))).max(1);
                left = left.saturating_sub(inputs * u64::from(delay_us(f)));
                calls.push((f, inputs as u32));
            }
            calls
        })
        .collect()
}

/// Runs one variant and returns its report (also what `--json` prints).
pub fn measure(a: &SharingOptions) -> Result<serde_json::Value> {
    if a.apps == 0 || a.nodes == 0 || a.functions == 0 || a.jobs == 0 || a.calls == 0 {
        bail!("--apps, --nodes, --functions, --calls and --jobs must be at least 1");
    }
    if !(a.speedup.is_finite() && (0.0..=1000.0).contains(&a.speedup)) {
        bail!("--speedup must be between 0 and 1000");
    }
    let calls = workload(a);
    let node_time = |c: &[Call]| -> f64 {
        c.iter()
            .map(|&(f, n)| n as f64 * delay_us(f) as f64 * 1e-6)
            .sum()
    };
    let work: f64 = calls.iter().map(|c| node_time(c)).sum();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let s_base = if a.speedup > 0.0 { a.speedup } else { 1.0 };
    let longest = calls.iter().map(|c| node_time(c)).fold(0.0, f64::max);
    let software = (s_base * longest).max(s_base * work / cpus);
    let placed = (a.functions).min(a.nodes as u32);
    let uses_cpu = a.speedup > 0.0
        && match a.variant {
            Variant::Software | Variant::Cowork => true,
            Variant::Static => placed < a.functions,
            Variant::Exclusive | Variant::Shared => false,
        };
    let nodes = if a.variant == Variant::Software {
        0.0
    } else {
        a.nodes as f64
    };
    let expected = s_base * work / (if uses_cpu { cpus } else { 0.0 } + nodes * s_base);

    let iters_per_us = soft::calibrate();
    let sw = Software {
        iters_per_us,
        speedup: a.speedup,
    };
    let period = Duration::from_millis(a.period_ms.max(1));
    let reconfigure = a.reconfigure_delay_ms.unwrap_or(a.period_ms);
    let cluster = match a.variant.server() {
        None => None,
        Some(sharing) => {
            let opts = ServerOptions {
                nodes_listen: "127.0.0.1:0".into(),
                users_listen: "127.0.0.1:0".into(),
                sharing,
                monitor_period: period,
                ..ServerOptions::default()
            };
            let node = corefarm_node::NodeOptions {
                reconfigure_delay: Duration::from_millis(reconfigure),
                ..corefarm_node::NodeOptions::default()
            };
            let embedded = crate::cluster::EmbeddedCluster::start(a.nodes, opts, node)?;
            apps::wait_nodes(embedded.cluster.users_addr, a.nodes)?;
            Some(embedded)
        }
    };
    let result = run_apps(
        a,
        calls,
        sw,
        cluster.as_ref().map(|c| c.cluster.users_addr),
        placed,
    );
    let st = match &cluster {
        Some(c) => Some(apps::status(c.cluster.users_addr)?),
        None => None,
    };
    // Configurations the nodes loaded, in every mode (a static partition's
    // setup, before the clock, included).
    let reconfigurations: u64 = st
        .as_ref()
        .map_or(0, |st| st.nodes.iter().map(|n| n.reconfigurations).sum());
    // Seconds the nodes had work in flight, all of them: beside the
    // utilisation, it tells nodes left idle from nodes slower than their
    // nominal delay (busy but behind the expected makespan).
    let busy: f64 = st
        .as_ref()
        .map_or(0.0, |st| st.nodes.iter().map(|n| n.busy_seconds).sum());
    drop(cluster);
    let Ran {
        makespan,
        local_inputs,
        backups,
    } = result?;
    let inputs: u64 = workload(a).iter().flatten().map(|&(_, n)| n as u64).sum();
    Ok(serde_json::json!({
        "variant": a.variant.name(),
        "sharing": a.variant.server().map(|s| s.to_string()),
        "nodes": a.nodes, "apps": a.apps, "functions": a.functions, "calls": a.calls,
        "jobs": a.jobs, "speedup": a.speedup, "period_ms": a.period_ms,
        "reconfigure_delay_ms": reconfigure, "cpus": cpus, "iters_per_us": iters_per_us,
        "node_work_s": work, "makespan_s": makespan, "software_s": software,
        "expected_s": expected,
        "normalised_makespan": makespan / software,
        "utilisation": expected / makespan,
        "nodes_busy_share": if nodes > 0.0 { busy / (nodes * makespan) } else { 0.0 },
        "local_share": local_inputs as f64 / inputs.max(1) as f64,
        "reconfigurations": reconfigurations,
        "backup": a.variant == Variant::Cowork && !a.no_backup,
        "backups": backups,
    }))
}

/// Starts the applications together and returns what they did. A static partition is set
/// up (connected and programmed) before the clock starts: it is the
/// up-front placement, not part of the workload.
fn run_apps(
    a: &SharingOptions,
    calls: Vec<Vec<Call>>,
    sw: Software,
    addr: Option<std::net::SocketAddr>,
    placed: u32,
) -> Result<Ran> {
    let partition = match (a.variant, addr) {
        (Variant::Static, Some(addr)) => {
            if placed < a.functions && a.speedup <= 0.0 {
                bail!("static: functions without nodes need a software path (--speedup > 0)");
            }
            Some(StaticPartition::start(addr, a.nodes as u32, placed)?)
        }
        _ => None,
    };
    let share = (a.nodes as u32 / a.apps).max(1);
    let jobs = a.jobs;
    let variant = a.variant;
    let backup = !a.no_backup;
    let backups = &AtomicU64::new(0);
    let start = Instant::now();
    let local = std::thread::scope(|s| -> Result<u64> {
        let threads: Vec<_> = calls
            .iter()
            .map(|c| {
                let partition = partition.as_ref();
                s.spawn(move || match (variant, addr) {
                    (Variant::Software, _) => apps::software(sw, c),
                    (Variant::Static, _) => partition.expect("started").app(sw, c, jobs),
                    (Variant::Exclusive, Some(addr)) => apps::cluster(addr, Some(share), c, jobs),
                    (Variant::Shared, Some(addr)) => apps::cluster(addr, None, c, jobs),
                    (Variant::Cowork, Some(addr)) => {
                        apps::cowork(addr, sw, c, jobs, backup, backups)
                    }
                    (_, None) => bail!("no cluster"),
                })
            })
            .collect();
        let mut local = 0;
        for t in threads {
            local += t
                .join()
                .map_err(|_| anyhow::anyhow!("an application thread panicked"))??;
        }
        Ok(local)
    })?;
    Ok(Ran {
        makespan: start.elapsed().as_secs_f64(),
        local_inputs: local,
        backups: backups.load(Ordering::Relaxed),
    })
}

/// What the applications of one run did.
struct Ran {
    makespan: f64,
    /// Inputs computed on the applications' CPUs.
    local_inputs: u64,
    /// Co-working's backup copies.
    backups: u64,
}

/// One line on a run's report `r` (from [`measure`]) for a reader.
pub fn summary(a: &SharingOptions, r: &serde_json::Value) -> String {
    format!(
        "{} apps, {} nodes, {}, speedup {}: makespan {:.3} s = {:.1} % of software-only, \
             utilisation {:.1} %, {:.1} % of inputs on the CPU, {} reconfigurations{}",
        a.apps,
        a.nodes,
        a.variant.name(),
        a.speedup,
        r["makespan_s"].as_f64().unwrap_or(0.0),
        100.0 * r["normalised_makespan"].as_f64().unwrap_or(0.0),
        100.0 * r["utilisation"].as_f64().unwrap_or(0.0),
        100.0 * r["local_share"].as_f64().unwrap_or(0.0),
        r["reconfigurations"],
        match a.variant {
            Variant::Cowork => format!(", {} backup copies", r["backups"]),
            _ => String::new(),
        },
    )
}

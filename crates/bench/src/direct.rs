//! Throughput of a group's direct data path (client → members' peer ports,
//! the server only on the control plane), with the CPU the watched
//! processes (the server) spent over the window: set beside the
//! benchmarking user's figures through the server, it shows what taking the
//! data off the server saves.

use std::time::{Duration, Instant};

use crate::cpu::{CpuTarget, CpuWatch};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use corefarm_client::group::{Group, GroupOptions};
use corefarm_smp::BenchmarkConfig;

/// What to measure.
#[derive(Debug, Clone)]
pub struct DirectOptions {
    /// The server's user port (its nodes need a peer port).
    pub server: String,
    /// Group size.
    pub nodes: u32,
    /// Bytes per input (one input per data message, at most 1 MiB).
    pub input_size: u32,
    /// Bytes per output of the benchmarking core (at least 16).
    pub output_size: u32,
    /// Messages in flight per member.
    pub window: usize,
    /// Messages per `Direct::map` call.
    pub batch: usize,
    /// Priority class of every message, 0 (most urgent) to 7; sent as
    /// chunks of that class where the members offer chunks on the direct path.
    pub priority: u8,
    /// Measured seconds (after the warm-up).
    pub duration: f64,
    /// Seconds at the start excluded from the figures.
    pub warmup: f64,
    /// Processes whose CPU time over the window is reported.
    pub cpu_pids: Vec<CpuTarget>,
    /// TLS to the server's user port (`--tls-ca`): the group opens, and
    /// the direct path is then refused with the reason (the members' peer
    /// ports speak plain TCP only).
    pub tls: Option<corefarm_smp::tls::ClientTls>,
}

/// Runs the measurement and returns the report (one JSON object).
pub fn run(a: &DirectOptions) -> Result<serde_json::Value> {
    if a.input_size < 16 || a.output_size < 16 || a.input_size as usize > 1 << 20 {
        bail!("--input-size 16 B-1 MiB, --output-size at least 16");
    }
    if a.batch == 0 || a.window == 0 || a.duration.is_nan() || a.duration <= 0.0 {
        bail!("--batch, --window and --duration must be positive");
    }
    let mut opts = GroupOptions::new(a.nodes);
    // A server with an auth file: $COREFARM_SECRET or $COREFARM_SECRET_FILE.
    opts.secret = corefarm_smp::auth::Secret::from_env().map_err(anyhow::Error::msg)?;
    opts.tls = a.tls.clone();
    let mut g = Group::open(&a.server, opts)
        .with_context(|| format!("opening a group of {} nodes", a.nodes))?;
    let cfg = BenchmarkConfig {
        input_size: a.input_size,
        output_size: a.output_size,
        delay_us: 0,
    }
    .to_configuration();
    g.configure(&cfg)?;
    let mut d = g.direct(a.window)?;
    let inputs: Vec<Bytes> = (0..a.batch)
        .map(|i| Bytes::from(vec![i as u8; a.input_size as usize]))
        .collect();
    let start = Instant::now() + Duration::from_secs_f64(a.warmup.max(0.0));
    let end = start + Duration::from_secs_f64(a.duration);
    let watch = CpuWatch::start(&a.cpu_pids, start, end);
    let (mut msgs, mut out_bytes, mut first, mut last) = (0usize, 0usize, None, start);
    while Instant::now() < end {
        let t = Instant::now();
        let outs = d.map_with(&inputs, a.priority)?;
        if t >= start {
            first.get_or_insert(t);
            msgs += outs.len();
            out_bytes += outs.iter().map(|o| o.len()).sum::<usize>();
            last = Instant::now();
        }
    }
    let cpu = watch.finish()?;
    let secs = first.map_or(0.0, |f| (last - f).as_secs_f64());
    if msgs == 0 || secs <= 0.0 {
        bail!("no batch completed inside the window; lengthen --duration");
    }
    let in_bps = (msgs * a.input_size as usize) as f64 * 8.0 / secs;
    let out_bps = out_bytes as f64 * 8.0 / secs;
    let moved = (in_bps + out_bps) / 8.0;
    let cpu_json: Vec<serde_json::Value> = cpu
        .iter()
        .map(|c| {
            serde_json::json!({"label": c.label, "pid": c.pid, "cpu_s": c.cpu_s, "cpus": c.cpus,
                "wall_s": c.wall_s, "cpu_s_per_gb": c.cpus / (moved / 1e9)})
        })
        .collect();
    let report = serde_json::json!({
        "path": "direct", "nodes": a.nodes, "input_size": a.input_size,
        "output_size": a.output_size, "window": a.window, "batch": a.batch,
        "priority": a.priority,
        "seconds": secs, "messages": msgs,
        "throughput": {"input_bps": in_bps, "output_bps": out_bps, "messages_per_s": msgs as f64 / secs},
        "cpu": cpu_json,
    });
    drop(d);
    g.close()?;
    Ok(report)
}

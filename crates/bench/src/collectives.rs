//! OSU-style latency of a group's collectives against message size, group
//! size and tree, with the calibrated model's prediction beside every point
//! (`corefarm bench collectives`). The measuring loop also feeds
//! `corefarm model calibrate`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use corefarm_client::group::{Algorithm, Group, GroupError, GroupOptions};
use corefarm_model::collectives::{Algo, Calibration, Op, Sample, Shape};
use corefarm_smp::{DType, ReduceOp};
use serde::Serialize;

/// What to measure and how long.
#[derive(Clone, Debug)]
pub struct Grid {
    /// A running cluster's user port; default: an embedded cluster on
    /// loopback with as many nodes as the largest group.
    pub server: Option<String>,
    /// Group sizes (node count).
    pub nodes: Vec<u32>,
    /// Bytes per rank; whole int32 elements.
    pub sizes: Vec<u64>,
    /// bcast, reduce, allreduce, allgather, barrier (among the nodes);
    /// scatter, gather (the user's, through the server).
    pub ops: Vec<Op>,
    /// Trees: linear, binomial, star.
    pub algos: Vec<Algo>,
    /// Untimed calls before each point.
    pub warmup: u32,
    /// Fewest timed calls per point.
    pub min_iters: u32,
    /// Most timed calls per point.
    pub iters: u32,
    /// Seconds of timed calls per point, within the two bounds above.
    pub budget: f64,
    /// TLS to `server`'s user port (`--tls-ca`); `None`: plain TCP.
    pub tls: Option<corefarm_smp::tls::ClientTls>,
}

impl Grid {
    fn check(&self) -> Result<()> {
        if self.nodes.is_empty() || self.nodes.contains(&0) {
            bail!("--nodes: group sizes of at least 1");
        }
        if let Some(s) = self.sizes.iter().find(|&&s| s == 0 || s % 4 != 0) {
            bail!("--sizes: {s} is not a positive multiple of 4 (int32 elements)");
        }
        if self.iters == 0
            || self.min_iters > self.iters
            || self.budget.is_nan()
            || self.budget < 0.0
        {
            bail!("--iters must be at least 1 and at least --min-iters; --budget non-negative");
        }
        if self.tls.is_some() && self.server.is_none() {
            bail!("--tls-ca is for --server's cluster: the embedded one speaks plain TCP");
        }
        Ok(())
    }
}

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub op: Op,
    /// `None` for the user's scatter/gather (no tree).
    pub algo: Option<Algo>,
    pub n: u32,
    pub bytes: u64,
    pub iters: usize,
    pub median_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub min_us: f64,
}

impl Point {
    /// The model's view of the point (any tree for scatter/gather: it has none).
    pub fn shape(&self) -> Shape {
        Shape {
            op: self.op,
            algo: self.algo.unwrap_or(Algo::Linear),
            n: self.n,
            bytes: self.bytes,
        }
    }

    pub fn sample(&self) -> Sample {
        Sample {
            shape: self.shape(),
            seconds: self.median_us * 1e-6,
        }
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn algorithm(a: Algo) -> Algorithm {
    match a {
        Algo::Linear => Algorithm::Linear,
        Algo::Binomial => Algorithm::Binomial,
        Algo::Star => Algorithm::Star,
    }
}

/// One call of `op`; only the collective itself is inside the returned time
/// (the destination buffer is freed afterwards, untimed).
fn once(g: &mut Group, op: Op, algo: Algo, bytes: u64, scatter: &[u8]) -> Result<f64> {
    let a = algorithm(algo);
    let t = Instant::now();
    let dst = match op {
        Op::Bcast => g.bcast(0, "s", "d", DType::I32, a).map(|_| true),
        Op::Reduce => g
            .reduce(0, "s", "d", DType::I32, ReduceOp::Sum, a)
            .map(|_| true),
        Op::Allreduce => g
            .allreduce("s", "d", DType::I32, ReduceOp::Sum, a)
            .map(|_| true),
        Op::Allgather => g.allgather("s", "d", a).map(|_| true),
        Op::Barrier => g.barrier(a).map(|_| false),
        Op::Scatter => g
            .scatter_rows("d", DType::I32, scatter, bytes as usize)
            .map(|_| true),
        Op::Gather => g.gather("s").map(|_| false),
    }
    .with_context(|| format!("{} {} of {bytes} bytes", op.name(), algo.name()))?;
    let secs = t.elapsed().as_secs_f64();
    if dst {
        match g.free("d") {
            // A reduce leaves `d` on the root only: the others' "no buffer"
            // fails the free on them alone, and the group carries on.
            Err(GroupError::Failed { .. }) if op == Op::Reduce => {}
            r => r.context("freeing the destination")?,
        }
    }
    Ok(secs)
}

fn point(g: &mut Group, grid: &Grid, op: Op, algo: Option<Algo>, bytes: u64) -> Result<Point> {
    let scatter = if op == Op::Scatter {
        vec![1u8; bytes as usize * g.size() as usize]
    } else {
        Vec::new()
    };
    let a = algo.unwrap_or(Algo::Binomial);
    for _ in 0..grid.warmup {
        once(g, op, a, bytes, &scatter)?;
    }
    let mut t = Vec::new();
    let start = Instant::now();
    while t.len() < grid.min_iters as usize
        || (t.len() < grid.iters as usize && start.elapsed().as_secs_f64() < grid.budget)
    {
        t.push(once(g, op, a, bytes, &scatter)?);
    }
    t.sort_by(f64::total_cmp);
    let us = |s: f64| s * 1e6;
    Ok(Point {
        op,
        algo,
        n: g.size(),
        bytes: if op == Op::Barrier { 0 } else { bytes },
        iters: t.len(),
        median_us: us(quantile(&t, 0.5)),
        p99_us: us(quantile(&t, 0.99)),
        mean_us: us(t.iter().sum::<f64>() / t.len() as f64),
        min_us: us(t[0]),
    })
}

/// A cluster to measure on: the given one, or an embedded one that stops on drop.
pub struct Target {
    pub addr: String,
    pub label: String,
    /// Stops on drop.
    _embedded: Option<crate::cluster::EmbeddedCluster>,
}

impl Target {
    pub fn start(grid: &Grid) -> Result<Target> {
        grid.check()?;
        if let Some(a) = &grid.server {
            return Ok(Target {
                addr: a.clone(),
                label: format!("cluster at {a}"),
                _embedded: None,
            });
        }
        let n = grid.nodes.iter().copied().max().unwrap_or(1) as usize;
        let server = corefarm_server::ServerOptions {
            nodes_listen: "127.0.0.1:0".into(),
            users_listen: "127.0.0.1:0".into(),
            ..corefarm_server::ServerOptions::default()
        };
        let node = corefarm_node::NodeOptions {
            name: "bench".into(),
            reconnect: false,
            peer_listen: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
            ..corefarm_node::NodeOptions::default()
        };
        let embedded = crate::cluster::EmbeddedCluster::start(n, server, node)?;
        let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
        Ok(Target {
            addr: embedded.cluster.users_addr.to_string(),
            label: format!("embedded cluster of {n} nodes in one process, {cpus} CPUs"),
            _embedded: Some(embedded),
        })
    }
}

/// Measures every point of `grid` on `target`, group size by group size;
/// `say` hears one line per point.
pub fn measure(target: &Target, grid: &Grid, say: &mut dyn FnMut(&Point)) -> Result<Vec<Point>> {
    grid.check()?;
    let mut out = Vec::new();
    for &n in &grid.nodes {
        let mut opts = GroupOptions::new(n);
        opts.name = Some("bench collectives".into());
        opts.model = None;
        opts.timeout = Duration::from_secs(60);
        opts.secret = corefarm_smp::auth::Secret::from_env().map_err(anyhow::Error::msg)?;
        opts.tls = grid.tls.clone();
        let mut g = Group::open(&target.addr, opts)
            .with_context(|| format!("opening a group of {n} nodes"))?;
        let mut sizes = grid.sizes.clone();
        if grid.ops.iter().all(|&o| o == Op::Barrier) {
            sizes.truncate(1);
        }
        for (i, &bytes) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..bytes).map(|b| b as u8).collect();
            g.bcast_from_user("s", DType::I32, Bytes::from(data), Algorithm::Binomial)?;
            for &op in &grid.ops {
                if op == Op::Barrier && i > 0 {
                    continue;
                }
                let algos: Vec<Option<Algo>> = if op.has_tree() {
                    grid.algos.iter().copied().map(Some).collect()
                } else {
                    vec![None]
                };
                for algo in algos {
                    let p = point(&mut g, grid, op, algo, bytes)?;
                    say(&p);
                    out.push(p);
                }
            }
            g.free("s")?;
        }
        g.close()?;
    }
    Ok(out)
}

pub fn describe(p: &Point) -> String {
    format!(
        "{:<9} {:<8} n={:<2} {:>8} B: median {:>10.1} µs  p99 {:>10.1} µs ({} calls)",
        p.op.name(),
        p.algo.map_or("server", |a| a.name()),
        p.n,
        p.bytes,
        p.median_us,
        p.p99_us,
        p.iters
    )
}

/// Measures `grid` and returns the report (one JSON object): every point
/// beside the prediction of the calibration in `model` (default: the
/// default calibration file; without one, the model fitted to this run).
/// Unless `quiet`, one line per point on standard error.
pub fn run(grid: &Grid, model: Option<&Path>, quiet: bool) -> Result<serde_json::Value> {
    let target = Target::start(grid)?;
    let points = measure(&target, grid, &mut |p| {
        if !quiet {
            eprintln!("{}", describe(p));
        }
    })?;
    let (model, source) = match model {
        Some(p) => (
            Some(Calibration::load(p)?),
            format!("calibration file {}", p.display()),
        ),
        None => match Calibration::load_default() {
            Some(c) => (Some(c), "the default calibration file".to_string()),
            None => (
                Calibration::from_samples(
                    points.iter().map(Point::sample).collect(),
                    corefarm_client::group::CHUNK,
                    target.label.clone(),
                ),
                "fitted to this run (in-sample)".to_string(),
            ),
        },
    };
    let rows: Vec<serde_json::Value> = points
        .iter()
        .map(|p| {
            let mut v = serde_json::to_value(p).expect("a point serialises");
            if let Some(m) = &model {
                let pred = m.predict(p.shape()) * 1e6;
                v["predicted_us"] = pred.into();
                v["model_error"] = ((pred - p.median_us) / p.median_us).into();
            }
            v
        })
        .collect();
    let report = serde_json::json!({
        "tool": "corefarm bench collectives",
        "cluster": target.label,
        "warmup": grid.warmup, "min_iters": grid.min_iters, "max_iters": grid.iters,
        "budget_s": grid.budget,
        "model": model.as_ref().map(|m| serde_json::json!({
            "source": source, "params": m.params, "chunk": m.chunk,
            "calibration_rms_error": m.rms_error,
        })),
        "points": rows,
    });
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 51.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
    }
}

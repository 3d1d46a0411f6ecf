//! `corefarm model`: calibrate the collectives' latency model on this
//! machine and ask it for predictions (docs/collectives.md, "Model"), and
//! the priority classes' queueing model (`classes`, docs/streams.md).

mod classes;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use corefarm_model::collectives::{default_path, Algo, Calibration, Op, Sample, Shape};

use corefarm_bench::collectives::{describe, measure, Grid, Target};

use crate::cmd_bench::collectives::parse_size;

#[derive(Subcommand)]
pub enum ModelCmd {
    /// Measure collectives on an embedded cluster (about 15 s a pass) and
    /// fit the model's parameters; writes the calibration as JSON.
    Calibrate(CalibrateArgs),
    /// Predicted latency of one collective.
    Predict(PredictArgs),
    /// Priority classes (seed 001 §IV): each class's mean wait and time
    /// from its offered load and service time, and the per-class queue
    /// depths for the server's --class-depths.
    Classes(classes::ClassesArgs),
}

#[derive(Args)]
pub struct CalibrateArgs {
    /// Where to write the calibration (default:
    /// $XDG_CACHE_HOME/corefarm/collectives-model.json, else ~/.cache/…),
    /// which the client's `auto` tree choice reads.
    #[arg(long)]
    out: Option<PathBuf>,
    /// A running cluster's user port instead of an embedded one.
    #[arg(long)]
    server: Option<String>,
    /// Group sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16")]
    nodes: Vec<u32>,
    /// Bytes per rank to measure.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "8,8K,64K,1M")]
    sizes: Vec<u64>,
    /// Untimed calls before each point.
    #[arg(long, default_value_t = 3)]
    warmup: u32,
    /// Fewest timed calls per point.
    #[arg(long, default_value_t = 5)]
    min_iters: u32,
    /// Most timed calls per point.
    #[arg(long, default_value_t = 100)]
    iters: u32,
    /// Seconds of timed calls per point, within the two bounds above.
    #[arg(long, default_value_t = 0.05)]
    budget: f64,
    /// Passes over the grid (each on a fresh embedded cluster, or all on
    /// `--server`'s); a point's sample is the geometric mean of its passes
    /// (a point's median moves by up to ±20 % from one cluster to the next
    /// on a busy machine).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    passes: u32,
    /// Print every measured point on standard error.
    #[arg(long, short)]
    verbose: bool,
    /// TLS to --server's user port.
    #[command(flatten)]
    tls: crate::cmd_tls::ClientTlsArgs,
}

#[derive(Args)]
pub struct PredictArgs {
    /// bcast, reduce, allreduce, allgather, barrier, scatter, gather.
    #[arg(long)]
    op: Op,
    /// linear, binomial or star; default: all three and the one `auto` picks.
    #[arg(long)]
    algo: Option<Algo>,
    /// Bytes per rank (suffixes K, M).
    #[arg(long, value_parser = parse_size)]
    bytes: u64,
    /// Group size.
    #[arg(long, short)]
    n: u32,
    /// Calibration file (default: the one `calibrate` writes by default).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(c: ModelCmd) -> Result<()> {
    match c {
        ModelCmd::Calibrate(a) => calibrate(a),
        ModelCmd::Predict(a) => predict(a),
        ModelCmd::Classes(a) => classes::run(a),
    }
}

fn calibrate(a: CalibrateArgs) -> Result<()> {
    let out = match a.out {
        Some(p) => p,
        None => default_path()
            .context("no XDG_CACHE_HOME or HOME to put the calibration in; pass --out")?,
    };
    let grid = Grid {
        server: a.server,
        nodes: a.nodes,
        sizes: a.sizes,
        ops: Op::ALL.to_vec(),
        algos: Algo::ALL.to_vec(),
        warmup: a.warmup,
        min_iters: a.min_iters,
        iters: a.iters,
        budget: a.budget,
        tls: a.tls.load()?,
    };
    let started = std::time::Instant::now();
    let verbose = a.verbose;
    let mut passes = Vec::new();
    let mut label = String::new();
    for pass in 0..a.passes {
        let target = Target::start(&grid)?;
        if a.passes > 1 {
            eprintln!("pass {} of {} on {}", pass + 1, a.passes, target.label);
        }
        label = target.label.clone();
        passes.push(measure(&target, &grid, &mut |p| {
            if verbose {
                eprintln!("{}", describe(p));
            }
        })?);
    }
    let samples = geometric_means(&passes);
    let cal = Calibration::from_samples(samples, corefarm_client::group::CHUNK, label).context(
        "the measurements do not determine the model (too few group sizes or message sizes?)",
    )?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&out, cal.to_json() + "\n")
        .with_context(|| format!("writing {}", out.display()))?;
    let p = &cal.params;
    println!(
        "calibrated on {}{} in {:.1} s: {} points, fit error rms {:.1} %, max {:.1} %",
        cal.on,
        match a.passes {
            1 => String::new(),
            n => format!(" ({n} passes)"),
        },
        started.elapsed().as_secs_f64(),
        cal.samples.len(),
        100.0 * cal.rms_error,
        100.0 * cal.max_error
    );
    println!(
        "t0 {:.1} µs per command; stage P = hop + bytes/bandwidth: linear {:.1} µs + {:.2} GB/s, \
         binomial {:.1} µs + {:.2} GB/s, star {:.1} µs + {:.2} GB/s; O = {:.2} µs + {:.2} GB/s; \
         {:.1} µs per member; allgather {:.2} GB/s more",
        p.t0 * 1e6,
        p.hop.linear * 1e6,
        gbps(p.byte.linear),
        p.hop.binomial * 1e6,
        gbps(p.byte.binomial),
        p.hop.star * 1e6,
        gbps(p.byte.star),
        p.combine * 1e6,
        gbps(p.combine_byte),
        p.member * 1e6,
        gbps(p.allgather_byte),
    );
    println!("wrote {}", out.display());
    Ok(())
}

/// Bytes per second, in GB/s, of a per-byte cost (∞ shown as "inf").
/// One sample per point of the grid: the geometric mean of its medians
/// over the passes (each pass measures the grid in the same order).
fn geometric_means(passes: &[Vec<corefarm_bench::collectives::Point>]) -> Vec<Sample> {
    let Some(first) = passes.first() else {
        return Vec::new();
    };
    first
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mine: Vec<f64> = passes
                .iter()
                .filter_map(|pass| pass.get(i))
                .filter(|q| q.shape() == p.shape())
                .map(|q| q.sample().seconds)
                .collect();
            let log_mean = mine.iter().map(|t| t.ln()).sum::<f64>() / mine.len() as f64;
            Sample {
                shape: p.shape(),
                seconds: log_mean.exp(),
            }
        })
        .collect()
}

fn gbps(per_byte: f64) -> f64 {
    if per_byte > 0.0 {
        1e-9 / per_byte
    } else {
        f64::INFINITY
    }
}

fn predict(a: PredictArgs) -> Result<()> {
    let path = match a.model {
        Some(p) => p,
        None => default_path().context("no default calibration path; pass --model")?,
    };
    let cal = Calibration::load(&path)
        .map_err(anyhow::Error::msg)
        .context("run `corefarm model calibrate` first, or pass --model")?;
    let algos = match a.algo {
        Some(x) => vec![x],
        None => Algo::ALL.to_vec(),
    };
    let rows: Vec<(Algo, f64)> = algos
        .iter()
        .map(|&algo| {
            let shape = Shape {
                op: a.op,
                algo,
                n: a.n,
                bytes: a.bytes,
            };
            (algo, cal.predict(shape))
        })
        .collect();
    let best = cal.best(a.op, a.n, a.bytes);
    if a.json {
        let v = serde_json::json!({
            "op": a.op, "n": a.n, "bytes": a.bytes, "auto": best,
            "predicted_us": rows.iter().map(|(al, t)| (al.name().to_string(), serde_json::Value::from(t * 1e6)))
                .collect::<serde_json::Map<String, serde_json::Value>>(),
        });
        println!("{v}");
        return Ok(());
    }
    for (algo, t) in rows {
        let mark = if a.op.has_tree() && algo == best {
            "  ← auto"
        } else {
            ""
        };
        println!(
            "{} {} n={} {} B: {:.1} µs{mark}",
            a.op.name(),
            if a.op.has_tree() {
                algo.name()
            } else {
                "via server"
            },
            a.n,
            a.bytes,
            t * 1e6
        );
        if !a.op.has_tree() {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use corefarm_bench::collectives::Point;

    fn point(op: Op, n: u32, median_us: f64) -> Point {
        Point {
            op,
            algo: Some(Algo::Linear),
            n,
            bytes: 8,
            iters: 5,
            median_us,
            p99_us: median_us,
            mean_us: median_us,
            min_us: median_us,
        }
    }

    #[test]
    fn passes_merge_into_the_geometric_mean_of_each_point() {
        let passes = vec![
            vec![point(Op::Bcast, 2, 100.0), point(Op::Reduce, 4, 10.0)],
            vec![point(Op::Bcast, 2, 400.0), point(Op::Reduce, 4, 10.0)],
        ];
        let s = geometric_means(&passes);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].shape, passes[0][0].shape());
        assert!((s[0].seconds - 200e-6).abs() < 1e-12, "{:?}", s[0]);
        assert!((s[1].seconds - 10e-6).abs() < 1e-12, "{:?}", s[1]);
        assert!(geometric_means(&[]).is_empty());
    }
}

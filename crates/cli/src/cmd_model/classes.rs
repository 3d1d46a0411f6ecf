//! `corefarm model classes`: the per-class queueing model of seed 001 §IV
//! (docs/streams.md, "The queueing model") as a calculator. Given each
//! priority class's arrival rate and service time, it predicts each class's
//! mean wait and time from submit to result (Cobham's non-preemptive
//! priority formula, M/G/1) and the per-class queue depth that overflows at
//! most `--overflow` of the time — the values for the server's
//! `--class-depths`. `corefarm bench classes` measures the service moments
//! and the links' cost on a real node and validates the same formula.

use anyhow::{bail, Result};
use clap::Args;
use corefarm_model::queueing::{class_depths_general, priority_classes_general, GeneralClass};
use corefarm_smp::stream::CLASSES;

use crate::flags::FlagError;

#[derive(Args)]
pub struct ClassesArgs {
    /// Arrival rate per class, messages per second: `class=rate` pairs
    /// (class 0 is the most urgent), e.g. `0=30,4=70`.
    #[arg(long, value_delimiter = ',', value_parser = parse_rate, required = true)]
    rates: Vec<(u8, f64)>,
    /// Mean service time per message, ms: one value for every class, or
    /// `class=ms` pairs for each class of --rates.
    #[arg(long, value_delimiter = ',', required = true)]
    service_ms: Vec<String>,
    /// Squared coefficient of variation of the service time, `E[S²]/E[S]² − 1`:
    /// 0 for constant service, 1 for exponential (seed 001's M/M/1).
    /// `corefarm bench classes` prints `E[S]` and `E[S²]` of a real node.
    #[arg(long, default_value_t = 1.0)]
    cs2: f64,
    /// Fixed cost of the links on the path, µs (added to each class's time;
    /// `bench classes` calibrates it as F).
    #[arg(long, default_value_t = 0.0)]
    link_us: f64,
    /// Fraction of time a class's queue may be full: sets the depths.
    #[arg(long, default_value_t = 1e-3)]
    overflow: f64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn parse_rate(s: &str) -> Result<(u8, f64), FlagError> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| FlagError::RatePair(s.to_string()))?;
    let class = parse_class(k)?;
    let rate: f64 = v
        .trim()
        .parse()
        .map_err(|_| FlagError::Rate(v.to_string()))?;
    if !(rate.is_finite() && rate >= 0.0) {
        return Err(FlagError::NegativeRate(v.to_string()));
    }
    Ok((class, rate))
}

fn parse_class(k: &str) -> Result<u8, FlagError> {
    match k.trim().parse::<u8>() {
        Ok(c) if c < CLASSES => Ok(c),
        _ => Err(FlagError::Class(k.to_string())),
    }
}

/// One class's service mean in seconds, from `--service-ms`.
fn service_of(spec: &[String], class: u8) -> Result<f64> {
    let ms = if let [one] = spec {
        if one.contains('=') {
            None
        } else {
            Some(one.trim().to_string())
        }
    } else {
        None
    };
    let ms = match ms {
        Some(v) => v,
        None => spec
            .iter()
            .find_map(|p| {
                let (k, v) = p.split_once('=')?;
                (parse_class(k).ok()? == class).then(|| v.trim().to_string())
            })
            .ok_or_else(|| anyhow::anyhow!("--service-ms gives no time for class {class}"))?,
    };
    let v: f64 = ms
        .parse()
        .map_err(|_| anyhow::anyhow!("{ms:?} is not a time in ms"))?;
    if !(v.is_finite() && v > 0.0) {
        bail!("--service-ms: {ms:?} is not a positive time");
    }
    Ok(v * 1e-3)
}

/// One row of the prediction.
#[derive(Debug, serde::Serialize)]
pub struct Row {
    pub class: u8,
    pub rate: f64,
    pub load: f64,
    pub wait_ms: Option<f64>,
    pub time_ms: Option<f64>,
    pub depth: Option<u32>,
}

/// The prediction for `a`, classes in priority order.
pub fn predict(a: &ClassesArgs) -> Result<Vec<Row>> {
    if !(a.cs2.is_finite() && a.cs2 >= 0.0) {
        bail!("--cs2 must be a finite number ≥ 0");
    }
    if !(a.overflow > 0.0 && a.overflow < 1.0) {
        bail!("--overflow must be between 0 and 1 (exclusive)");
    }
    if !(a.link_us.is_finite() && a.link_us >= 0.0) {
        bail!("--link-us must be a finite number ≥ 0");
    }
    let mut rates = a.rates.clone();
    rates.sort_by_key(|r| r.0);
    if rates.windows(2).any(|w| w[0].0 == w[1].0) {
        bail!("--rates names a class twice");
    }
    let classes = rates
        .iter()
        .map(|&(class, lambda)| {
            let mean = service_of(&a.service_ms, class)?;
            Ok(GeneralClass {
                lambda,
                mean,
                second_moment: (1.0 + a.cs2) * mean * mean,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let figures = priority_classes_general(&classes);
    let depths = class_depths_general(&classes, a.overflow);
    Ok(rates
        .iter()
        .zip(classes.iter().zip(figures.iter().zip(depths)))
        .map(|(&(class, rate), (c, (f, depth)))| Row {
            class,
            rate,
            load: c.lambda * c.mean,
            wait_ms: f.map(|f| f.wait * 1e3),
            time_ms: f.map(|f| f.time_in_system * 1e3 + a.link_us * 1e-3),
            depth,
        })
        .collect())
}

/// The `--class-depths` value for the server; `None` if a class is unstable.
pub fn depths_flag(rows: &[Row]) -> Option<String> {
    rows.iter()
        .map(|r| r.depth.map(|d| format!("{}={d}", r.class)))
        .collect::<Option<Vec<_>>>()
        .map(|v| v.join(","))
}

pub fn run(a: ClassesArgs) -> Result<()> {
    let rows = predict(&a)?;
    let flag = depths_flag(&rows);
    if a.json {
        let v =
            serde_json::json!({ "classes": rows, "class_depths": flag, "overflow": a.overflow });
        println!("{v}");
        return Ok(());
    }
    let total: f64 = rows.iter().map(|r| r.load).sum();
    println!("total load ρ = {total:.3}");
    println!("class  rate/s    load    wait ms   time ms   depth");
    let ms = |v: Option<f64>| v.map_or_else(|| "unstable".to_string(), |v| format!("{v:.3}"));
    for r in &rows {
        println!(
            "{:>5}  {:>7.1}  {:>6.3}  {:>9}  {:>8}  {:>6}",
            r.class,
            r.rate,
            r.load,
            ms(r.wait_ms),
            ms(r.time_ms),
            r.depth.map_or_else(|| "-".to_string(), |d| d.to_string())
        );
    }
    match flag {
        Some(f) => println!("server: --class-depths {f}"),
        None => println!("a class is unstable (cumulative load ≥ 1): no finite depths"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(rates: &[(u8, f64)], service: &[&str], cs2: f64) -> ClassesArgs {
        ClassesArgs {
            rates: rates.to_vec(),
            service_ms: service.iter().map(|s| s.to_string()).collect(),
            cs2,
            link_us: 0.0,
            overflow: 1e-3,
            json: false,
        }
    }

    #[test]
    fn one_exponential_class_is_mm1() {
        // λ = 100/s, E[S] = 5 ms: ρ = 0.5, T = 1/(μ − λ) = 10 ms, W = 5 ms,
        // depth: 0.5ⁿ ≤ 1e-3 → n = 10.
        let rows = predict(&args(&[(4, 100.0)], &["5"], 1.0)).unwrap();
        let r = &rows[0];
        assert!((r.load - 0.5).abs() < 1e-12);
        assert!((r.time_ms.unwrap() - 10.0).abs() < 1e-9);
        assert!((r.wait_ms.unwrap() - 5.0).abs() < 1e-9);
        assert_eq!(r.depth, Some(10));
        assert_eq!(depths_flag(&rows).as_deref(), Some("4=10"));
    }

    #[test]
    fn classes_are_ordered_by_urgency_and_overload_is_reported() {
        let rows = predict(&args(&[(6, 70.0), (0, 30.0)], &["0=2", "6=4"], 0.0)).unwrap();
        assert_eq!(rows.iter().map(|r| r.class).collect::<Vec<_>>(), [0, 6]);
        assert!(rows[0].wait_ms.unwrap() < rows[1].wait_ms.unwrap());
        // 30 × 2 ms + 300 × 4 ms > 1: the bulk class is unstable.
        let rows = predict(&args(&[(0, 30.0), (6, 300.0)], &["0=2", "6=4"], 0.0)).unwrap();
        assert!(rows[0].time_ms.is_some() && rows[1].time_ms.is_none());
        assert_eq!(depths_flag(&rows), None);
    }

    #[test]
    fn bad_arguments_are_refused_with_the_reason() {
        assert!(matches!(parse_rate("9=1"), Err(FlagError::Class(k)) if k == "9"));
        assert!(matches!(parse_rate("1"), Err(FlagError::RatePair(s)) if s == "1"));
        assert!(matches!(parse_rate("1=-3"), Err(FlagError::NegativeRate(v)) if v == "-3"));
        assert!(matches!(parse_rate("1=x"), Err(FlagError::Rate(v)) if v == "x"));
        // What clap prints after "invalid value": the reason.
        let e = parse_rate("9=1").unwrap_err().to_string();
        assert!(e.contains("not a class (0 to 7"), "{e}");
        let e = predict(&args(&[(0, 1.0), (2, 1.0)], &["0=1"], 1.0)).unwrap_err();
        assert!(e.to_string().contains("class 2"), "{e}");
        let e = predict(&args(&[(0, 1.0), (0, 2.0)], &["1"], 1.0)).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }
}

//! `corefarm bench compare OLD.json NEW.json`: matches the points of two
//! suite result files and flags the metrics that got worse by more than the
//! noise seen in the recordings themselves.
//!
//! A suite file (written by `bench/suite.py`) looks like
//! `{"experiment", "machine", "points": [{"key": {...}, "status": "ok",
//! "runs": N, "metrics": {"input_bps": {"runs", "mean", "min", "max",
//! "stdev"}, ...}}]}`. A single `bench user --json` or `bench echo --json`
//! report is accepted too, as one point measured once.

use std::collections::BTreeMap;

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::stats::Spread;

/// Which way a metric should move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Higher,
    Lower,
    /// Not judged (counts, configuration echoes).
    Neutral,
}

/// Throughputs and rates should go up, latencies and times down.
pub fn direction(metric: &str) -> Direction {
    let m = metric.to_ascii_lowercase();
    if m.ends_with("_bps")
        || m.ends_with("_per_s")
        || m.ends_with("_hz")
        || m.contains("throughput")
        || m.contains("speedup")
    {
        Direction::Higher
    } else if m.contains("latency")
        || m.ends_with("_ms")
        || m.ends_with("_us")
        || m.ends_with("_ns")
    {
        Direction::Lower
    } else {
        Direction::Neutral
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Same,
    Better,
    Worse,
    /// Not comparable (neutral metric or zero baseline).
    Info,
}

#[derive(Debug, Clone, Serialize)]
pub struct MetricDelta {
    pub metric: String,
    pub old: Spread,
    pub new: Spread,
    /// new mean / old mean.
    pub ratio: Option<f64>,
    /// Relative change tolerated as noise for this metric.
    pub allowed: f64,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Serialize)]
pub struct PointDelta {
    pub key: String,
    /// "ok", or why the point cannot be compared ("failed in new: …").
    pub status: String,
    pub metrics: Vec<MetricDelta>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub threshold: f64,
    pub points: Vec<PointDelta>,
    pub only_in_old: Vec<String>,
    pub only_in_new: Vec<String>,
    pub regressions: usize,
    pub improvements: usize,
}

impl Comparison {
    /// The comparison for a reader: one line per metric of every point
    /// (or the point's status), the points only one side has (`old` and
    /// `new` name the sides), and the counts.
    pub fn summary(&self, old: &str, new: &str) -> String {
        let mut out = String::new();
        for p in &self.points {
            if p.status != "ok" {
                out += &format!("{}: {}\n", p.key, p.status);
                continue;
            }
            for m in &p.metrics {
                let mark = match m.verdict {
                    Verdict::Worse => "WORSE",
                    Verdict::Better => "better",
                    Verdict::Same => "same",
                    Verdict::Info => "",
                };
                out += &format!(
                    "{:<48} {:<16} {:>12.4e} -> {:>12.4e}  x{:<7} (noise ±{:.0}%) {}\n",
                    p.key,
                    m.metric,
                    m.old.mean,
                    m.new.mean,
                    m.ratio
                        .map(|r| format!("{r:.3}"))
                        .unwrap_or_else(|| "-".into()),
                    m.allowed * 100.0,
                    mark
                );
            }
        }
        for k in &self.only_in_old {
            out += &format!("{k}: only in {old}\n");
        }
        for k in &self.only_in_new {
            out += &format!("{k}: only in {new}\n");
        }
        out += &format!(
            "{} regression(s), {} improvement(s)\n",
            self.regressions, self.improvements
        );
        out
    }
}

/// Why a results document cannot be compared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotResults {
    #[error("not a suite result (no \"points\") nor a benchmark report")]
    UnknownShape,
    #[error("a point has no key")]
    PointWithoutKey,
}

/// Which side of a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Old,
    New,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Old => "old",
            Side::New => "new",
        })
    }
}

/// Why two results could not be compared. The causes are part of each
/// message (what `corefarm bench compare` prints).
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// One side is not results.
    #[error("in the {side} results: {why}")]
    NotResults { side: Side, why: NotResults },
    #[error("reading {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("parsing {}: {error}", path.display())]
    Parse {
        path: PathBuf,
        error: serde_json::Error,
    },
    /// The files were read but their contents cannot be compared.
    #[error("comparing {} (old) with {} (new): {error}", old.display(), new.display())]
    Files {
        old: PathBuf,
        new: PathBuf,
        error: Box<CompareError>,
    },
}

/// Reads two result files and compares them (see [`compare`]).
pub fn compare_files(old: &Path, new: &Path, threshold: f64) -> Result<Comparison, CompareError> {
    let read = |p: &Path| -> Result<Value, CompareError> {
        let text = std::fs::read_to_string(p).map_err(|error| CompareError::Read {
            path: p.to_path_buf(),
            error,
        })?;
        serde_json::from_str(&text).map_err(|error| CompareError::Parse {
            path: p.to_path_buf(),
            error,
        })
    };
    compare(&read(old)?, &read(new)?, threshold).map_err(|e| CompareError::Files {
        old: old.to_path_buf(),
        new: new.to_path_buf(),
        error: Box::new(e),
    })
}

/// One measured point: its status and its metrics.
#[derive(Debug, Clone)]
struct RecordedPoint {
    status: String,
    reason: Option<String>,
    metrics: BTreeMap<String, Spread>,
}

fn spread_of(v: &Value) -> Option<Spread> {
    match v {
        Value::Number(n) => n.as_f64().map(|x| Spread::of(&[x])),
        Value::Object(o) => {
            let f = |k: &str| o.get(k).and_then(Value::as_f64);
            let mean = f("mean")?;
            Some(Spread {
                runs: f("runs").unwrap_or(1.0) as u32,
                mean,
                min: f("min").unwrap_or(mean),
                max: f("max").unwrap_or(mean),
                stdev: f("stdev").unwrap_or(0.0),
            })
        }
        _ => None,
    }
}

/// Canonical text of a point key: its fields in sorted order.
fn key_text(k: &Value) -> String {
    match k {
        Value::Object(o) => {
            let m: BTreeMap<_, _> = o.iter().collect();
            m.iter()
                .map(|(k, v)| match v {
                    Value::String(s) => format!("{k}={s}"),
                    other => format!("{k}={other}"),
                })
                .collect::<Vec<_>>()
                .join(",")
        }
        other => other.to_string(),
    }
}

fn points_of(doc: &Value) -> Result<BTreeMap<String, RecordedPoint>, NotResults> {
    let mut out = BTreeMap::new();
    if let Some(points) = doc.get("points").and_then(Value::as_array) {
        for p in points {
            let key = key_text(p.get("key").ok_or(NotResults::PointWithoutKey)?);
            let status = p
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("ok")
                .to_string();
            let reason = p.get("reason").and_then(Value::as_str).map(str::to_string);
            let mut metrics = BTreeMap::new();
            if let Some(m) = p.get("metrics").and_then(Value::as_object) {
                for (name, v) in m {
                    if let Some(s) = spread_of(v) {
                        metrics.insert(name.clone(), s);
                    }
                }
            }
            out.insert(
                key,
                RecordedPoint {
                    status,
                    reason,
                    metrics,
                },
            );
        }
        return Ok(out);
    }
    // A single benchmark report.
    let (key, fields): (&str, Vec<(&str, &[&str])>) =
        match doc.get("benchmark").and_then(Value::as_str) {
            // `bench node` measures a node with the same user report.
            Some(k @ ("user" | "node")) => (
                k,
                vec![
                    ("input_bps", &["throughput", "input_bps"][..]),
                    ("output_bps", &["throughput", "output_bps"]),
                    ("latency_avg_ms", &["latency", "avg_ms"]),
                    ("latency_p99_ms", &["latency", "p99_ms"]),
                ],
            ),
            Some("echo") => (
                "echo",
                vec![
                    ("throughput_bps", &["throughput_bps"][..]),
                    ("messages_per_s", &["messages_per_s"]),
                ],
            ),
            _ => return Err(NotResults::UnknownShape),
        };
    let mut metrics = BTreeMap::new();
    for (name, path) in fields {
        let v = path.iter().try_fold(doc, |v, k| v.get(k));
        if let Some(x) = v.and_then(Value::as_f64) {
            metrics.insert(name.to_string(), Spread::of(&[x]));
        }
    }
    // `errors`: a count (echo) or the list of them (user, node).
    let errors = doc.get("errors").map_or(0, |e| {
        e.as_u64()
            .or_else(|| e.as_array().map(|a| a.len() as u64))
            .unwrap_or(0)
    });
    let ok = doc.get("ok").and_then(Value::as_bool).unwrap_or(true) && errors == 0;
    out.insert(
        key.to_string(),
        RecordedPoint {
            status: if ok { "ok" } else { "failed" }.into(),
            reason: None,
            metrics,
        },
    );
    Ok(out)
}

/// Judges one metric. A change counts only beyond `allowed`, the larger of
/// the threshold and the relative range of either recording.
pub fn judge(metric: &str, old: Spread, new: Spread, threshold: f64) -> MetricDelta {
    let allowed = threshold
        .max(old.relative_range())
        .max(new.relative_range());
    let dir = direction(metric);
    let ratio = (old.mean != 0.0).then(|| new.mean / old.mean);
    let verdict = match (dir, ratio) {
        (Direction::Neutral, _) | (_, None) => Verdict::Info,
        (d, Some(r)) => {
            let change = r - 1.0;
            let better = if d == Direction::Higher {
                change
            } else {
                -change
            };
            if better < -allowed {
                Verdict::Worse
            } else if better > allowed {
                Verdict::Better
            } else {
                Verdict::Same
            }
        }
    };
    MetricDelta {
        metric: metric.to_string(),
        old,
        new,
        ratio,
        allowed,
        verdict,
    }
}

pub fn compare(old: &Value, new: &Value, threshold: f64) -> Result<Comparison, CompareError> {
    let side = |side| move |why| CompareError::NotResults { side, why };
    let old = points_of(old).map_err(side(Side::Old))?;
    let new = points_of(new).map_err(side(Side::New))?;
    let mut points = Vec::new();
    let (mut regressions, mut improvements) = (0, 0);
    for (key, o) in &old {
        let Some(n) = new.get(key) else { continue };
        let status = match (o.status.as_str(), n.status.as_str()) {
            ("ok", "ok") => "ok".to_string(),
            ("ok", s) => {
                // A point that used to work and no longer does is the worst regression.
                regressions += 1;
                format!(
                    "{s} in new: {}",
                    n.reason.as_deref().unwrap_or("no reason recorded")
                )
            }
            (s, _) => format!("{s} in old"),
        };
        let mut metrics = Vec::new();
        if status == "ok" {
            for (m, os) in &o.metrics {
                if let Some(ns) = n.metrics.get(m) {
                    let d = judge(m, *os, *ns, threshold);
                    match d.verdict {
                        Verdict::Worse => regressions += 1,
                        Verdict::Better => improvements += 1,
                        _ => {}
                    }
                    metrics.push(d);
                }
            }
        }
        points.push(PointDelta {
            key: key.clone(),
            status,
            metrics,
        });
    }
    Ok(Comparison {
        threshold,
        only_in_old: old
            .keys()
            .filter(|k| !new.contains_key(*k))
            .cloned()
            .collect(),
        only_in_new: new
            .keys()
            .filter(|k| !old.contains_key(*k))
            .cloned()
            .collect(),
        points,
        regressions,
        improvements,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn suite(points: Value) -> Value {
        json!({"experiment": "server", "points": points})
    }

    #[test]
    fn directions() {
        assert_eq!(direction("input_bps"), Direction::Higher);
        assert_eq!(direction("messages_per_s"), Direction::Higher);
        assert_eq!(direction("latency_p99_ms"), Direction::Lower);
        assert_eq!(direction("runs"), Direction::Neutral);
    }

    #[test]
    fn noise_band_comes_from_the_recorded_spread() {
        let one = |x: f64| Spread::of(&[x]);
        // 10 % lower throughput, single runs, 5 % threshold: a regression.
        assert_eq!(
            judge("input_bps", one(100.0), one(90.0), 0.05).verdict,
            Verdict::Worse
        );
        // Same change, but the old recording itself ranged over ±15 %: noise.
        let noisy = Spread::of(&[85.0, 100.0, 115.0]);
        let d = judge("input_bps", noisy, one(90.0), 0.05);
        assert!((d.allowed - 0.3).abs() < 1e-12);
        assert_eq!(d.verdict, Verdict::Same);
        // Latency: lower is better.
        assert_eq!(
            judge("latency_avg_ms", one(10.0), one(8.0), 0.05).verdict,
            Verdict::Better
        );
        assert_eq!(
            judge("latency_avg_ms", one(10.0), one(12.0), 0.05).verdict,
            Verdict::Worse
        );
        // Zero baseline and neutral metrics are not judged.
        assert_eq!(
            judge("input_bps", one(0.0), one(5.0), 0.05).verdict,
            Verdict::Info
        );
        assert_eq!(
            judge("runs", one(1.0), one(3.0), 0.05).verdict,
            Verdict::Info
        );
        assert_eq!(
            judge("input_bps", one(100.0), one(97.0), 0.05).ratio,
            Some(0.97)
        );
    }

    #[test]
    fn points_are_matched_by_key_in_any_field_order() {
        let old = suite(json!([
            {"key": {"nodes": 1, "policy": "queue"}, "status": "ok", "runs": 3,
             "metrics": {"input_bps": {"runs": 3, "mean": 100.0, "min": 99.0, "max": 101.0, "stdev": 1.0},
                         "latency_avg_ms": {"runs": 3, "mean": 2.0, "min": 2.0, "max": 2.0, "stdev": 0.0}}},
            {"key": {"nodes": 2, "policy": "queue"}, "status": "ok", "runs": 1,
             "metrics": {"input_bps": 200.0}},
            {"key": {"nodes": 3, "policy": "queue"}, "status": "ok", "runs": 1, "metrics": {}}
        ]));
        let new = suite(json!([
            {"key": {"policy": "queue", "nodes": 1}, "status": "ok", "runs": 1,
             "metrics": {"input_bps": {"runs": 1, "mean": 80.0, "min": 80.0, "max": 80.0, "stdev": 0.0},
                         "latency_avg_ms": {"runs": 1, "mean": 1.0, "min": 1.0, "max": 1.0, "stdev": 0.0}}},
            {"key": {"policy": "queue", "nodes": 2}, "status": "failed", "reason": "server crashed", "metrics": {}},
            {"key": {"policy": "stack", "nodes": 1}, "status": "ok", "metrics": {}}
        ]));
        let c = compare(&old, &new, 0.05).unwrap();
        // Throughput of point 1 and the failure of point 2.
        assert_eq!(c.regressions, 2);
        assert_eq!(c.improvements, 1); // latency halved
        assert_eq!(c.only_in_old, vec!["nodes=3,policy=queue".to_string()]);
        assert_eq!(c.only_in_new, vec!["nodes=1,policy=stack".to_string()]);
        let p2 = c
            .points
            .iter()
            .find(|p| p.key == "nodes=2,policy=queue")
            .unwrap();
        assert!(p2.status.contains("server crashed"));
    }

    #[test]
    fn single_reports_compare_as_one_point() {
        let rep = |bps: f64| {
            json!({"benchmark": "user", "ok": true, "throughput": {"input_bps": bps, "output_bps": bps},
                                     "latency": {"avg_ms": 1.0, "p99_ms": 2.0}})
        };
        let c = compare(&rep(100.0), &rep(120.0), 0.05).unwrap();
        assert_eq!((c.regressions, c.improvements), (0, 2));
        assert!(matches!(
            compare(&json!({"x": 1}), &rep(1.0), 0.05),
            Err(CompareError::NotResults {
                side: Side::Old,
                why: NotResults::UnknownShape
            })
        ));
        assert!(matches!(
            compare(&rep(1.0), &json!({"points": [{}]}), 0.05),
            Err(CompareError::NotResults {
                side: Side::New,
                why: NotResults::PointWithoutKey
            })
        ));
    }

    #[test]
    fn node_reports_compare_too_and_a_list_of_errors_fails_a_point() {
        let rep = |bps: f64, errors: Value| {
            json!({"benchmark": "node", "ok": true, "errors": errors,
                   "throughput": {"input_bps": bps, "output_bps": bps},
                   "latency": {"avg_ms": 1.0, "p99_ms": 2.0}})
        };
        let c = compare(&rep(100.0, json!([])), &rep(80.0, json!([])), 0.05).unwrap();
        assert_eq!((c.regressions, c.improvements), (2, 0));
        let failed = points_of(&rep(100.0, json!(["no node"]))).unwrap();
        assert_eq!(failed["node"].status, "failed");
    }
}

//! Telemetry shared by the corefarm server and node managers: the same
//! HTTP endpoint (`/metrics` in the Prometheus/OpenMetrics text format,
//! `/status` as JSON), a lock-free histogram for the hot path, bounded label
//! slots, and helpers to encode metric families with prometheus-client.
//!
//! Metrics are derived at scrape time from counters their owners keep anyway
//! (atomics written by one task, relaxed, most without a locked instruction:
//! [`OwnedCounter`], [`AtomicHistogram::observe_owned`]): the data path never
//! takes a lock for telemetry, and the status model and the metrics cannot disagree.

pub mod histogram;
pub mod http;
pub mod owned;
pub mod slots;

pub use histogram::{AtomicHistogram, HistogramSnapshot, LATENCY_BOUNDS};
pub use http::{Endpoints, MetricsServer};
pub use owned::OwnedCounter;
pub use prometheus_client;
pub use slots::{bounded, Slots, MAX_NAME_CHARS};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Labels as owned `(name, value)` pairs.
pub type Labels = Vec<(&'static str, String)>;

/// One family being encoded: a name, a help line, a type and its samples.
pub struct Family<'a, 'b> {
    enc: prometheus_client::encoding::MetricEncoder<'a>,
    _b: std::marker::PhantomData<&'b ()>,
}

/// Starts a family. `name` excludes the `_total` suffix of counters (the
/// encoder adds it) and includes the unit (`_seconds`, `_bytes`).
pub fn family<'a, 'b>(
    enc: &'a mut DescriptorEncoder<'b>,
    name: &'a str,
    help: &str,
    ty: MetricType,
) -> Result<Family<'a, 'b>, std::fmt::Error> {
    Ok(Family {
        enc: enc.encode_descriptor(name, help, None, ty)?,
        _b: std::marker::PhantomData,
    })
}

impl Family<'_, '_> {
    pub fn counter(&mut self, labels: &Labels, v: u64) -> Result<&mut Self, std::fmt::Error> {
        self.enc
            .encode_family(labels)?
            .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
        Ok(self)
    }

    pub fn counter_f64(&mut self, labels: &Labels, v: f64) -> Result<&mut Self, std::fmt::Error> {
        self.enc
            .encode_family(labels)?
            .encode_counter::<NoLabelSet, _, f64>(&v, None)?;
        Ok(self)
    }

    pub fn gauge(&mut self, labels: &Labels, v: i64) -> Result<&mut Self, std::fmt::Error> {
        self.enc.encode_family(labels)?.encode_gauge(&v)?;
        Ok(self)
    }

    pub fn histogram(
        &mut self,
        labels: &Labels,
        h: &HistogramSnapshot,
    ) -> Result<&mut Self, std::fmt::Error> {
        self.enc
            .encode_family(labels)?
            .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets(), None)?;
        Ok(self)
    }
}

/// A collector from a closure, so an owner can describe its metrics where
/// its counters live.
pub struct FnCollector<F>(pub F);

impl<F> std::fmt::Debug for FnCollector<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnCollector")
    }
}

impl<F> Collector for FnCollector<F>
where
    F: Fn(&mut DescriptorEncoder) -> Result<(), std::fmt::Error> + Send + Sync + 'static,
{
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        (self.0)(&mut encoder)
    }
}

/// Boxes a closure as a collector (the bound guides closure inference).
pub fn collector<F>(f: F) -> Box<FnCollector<F>>
where
    F: Fn(&mut DescriptorEncoder) -> Result<(), std::fmt::Error> + Send + Sync + 'static,
{
    Box::new(FnCollector(f))
}

/// A registry whose metrics all start with `corefarm_`.
pub fn registry() -> Registry {
    Registry::with_prefix("corefarm")
}

/// The OpenMetrics text exposition of a registry (ends with `# EOF`).
pub fn encode(r: &Registry) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, r).expect("writing to a String");
    s
}

/// The same exposition in the classic Prometheus text format (0.0.4), for
/// scrapers that do not ask for OpenMetrics (curl, `promtool check
/// metrics`): there a counter's family is named with its `_total` suffix,
/// there is no `# UNIT` or `# EOF`, and an empty label set is left out.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 64 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(p);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(&line.replacen("{} ", " ", 1)),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_counters_become_prometheus_text() {
        let om = "# HELP corefarm_x Xs.\n# TYPE corefarm_x counter\ncorefarm_x_total{a=\"b\"} 1\n\
                  # HELP corefarm_y_seconds Ys.\n# TYPE corefarm_y_seconds histogram\n\
                  corefarm_y_seconds_sum{} 0.5\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP corefarm_x_total Xs.\n# TYPE corefarm_x_total counter\n\
             corefarm_x_total{a=\"b\"} 1\n# HELP corefarm_y_seconds Ys.\n\
             # TYPE corefarm_y_seconds histogram\ncorefarm_y_seconds_sum 0.5\n"
        );
    }
}

//! A latency histogram that the hot path can feed without a lock: fixed
//! bucket bounds and one relaxed atomic add per observation (plus one for the
//! sum). prometheus-client's own `Histogram` takes a lock per observation,
//! which the data path of the server must not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds in seconds, from 50 µs (a loopback round trip) to 10 s (a
/// slow FPGA programming); everything above lands in `+Inf`.
pub const LATENCY_BOUNDS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug)]
pub struct AtomicHistogram {
    bounds: &'static [f64],
    bounds_ns: Vec<u64>,
    /// One per bound, plus `+Inf`.
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        Self::new(LATENCY_BOUNDS)
    }
}

impl AtomicHistogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        AtomicHistogram {
            bounds,
            bounds_ns: bounds.iter().map(|b| (b * 1e9) as u64).collect(),
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = self.bounds_ns.partition_point(|&b| b < ns);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// [`AtomicHistogram::observe`] by the histogram's one writer at a time
    /// (see [`crate::owned`]): a load and a store per word, no locked add.
    #[inline]
    pub fn observe_owned(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = self.bounds_ns.partition_point(|&b| b < ns);
        let bump = |a: &AtomicU64, n: u64| {
            a.store(a.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed)
        };
        bump(&self.counts[i], 1);
        bump(&self.sum_ns, ns);
    }

    /// Adds a snapshot taken of a histogram with the same bounds (an ended
    /// session folded into its name's totals). Any number of writers.
    pub fn add(&self, s: &HistogramSnapshot) {
        debug_assert_eq!(self.bounds, s.bounds);
        for (a, &n) in self.counts.iter().zip(&s.counts) {
            if n > 0 {
                a.fetch_add(n, Ordering::Relaxed);
            }
        }
        self.sum_ns
            .fetch_add((s.sum * 1e9).round() as u64, Ordering::Relaxed);
    }

    /// A consistent-enough copy (each bucket read once, relaxed).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        HistogramSnapshot {
            bounds: self.bounds,
            count: counts.iter().sum(),
            counts,
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    pub bounds: &'static [f64],
    /// Per bucket (not cumulative), the last one being `+Inf`.
    pub counts: Vec<u64>,
    pub count: u64,
    /// Seconds.
    pub sum: f64,
}

impl HistogramSnapshot {
    /// Adds another snapshot with the same bounds (aggregating sessions).
    pub fn merge(&mut self, o: &HistogramSnapshot) {
        debug_assert_eq!(self.bounds, o.bounds);
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.count += o.count;
        self.sum += o.sum;
    }

    /// `(upper bound, count)` pairs as prometheus-client's encoder takes them.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().copied())
            .collect()
    }

    /// The `q` quantile in seconds, interpolated inside its bucket as
    /// Prometheus' `histogram_quantile` does; `None` without observations.
    /// Above the last bound the answer is that bound (a lower estimate).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c > 0 && (seen + c) as f64 >= rank {
                let Some(&hi) = self.bounds.get(i) else {
                    return self.bounds.last().copied();
                };
                let lo = if i == 0 { 0.0 } else { self.bounds[i - 1] };
                let within = (rank - seen as f64) / c as f64;
                return Some(lo + (hi - lo) * within);
            }
            seen += c;
        }
        self.bounds.last().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket() {
        let h = AtomicHistogram::new(&[0.001, 0.01]);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1)); // on the bound: le="0.001"
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(1));
        let s = h.snapshot();
        assert_eq!(s.counts, vec![2, 1, 1]);
        assert_eq!(s.count, 4);
        assert!((s.sum - 1.0065).abs() < 1e-9);
        assert_eq!(s.buckets().last(), Some(&(f64::INFINITY, 1)));
    }

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let h = AtomicHistogram::new(&[0.001, 0.002, 0.004]);
        for _ in 0..50 {
            h.observe(Duration::from_micros(500));
        }
        for _ in 0..50 {
            h.observe(Duration::from_micros(3000));
        }
        let s = h.snapshot();
        assert_eq!(s.quantile(0.5), Some(0.001));
        let p99 = s.quantile(0.99).unwrap();
        assert!(p99 > 0.002 && p99 <= 0.004, "{p99}");
        assert_eq!(AtomicHistogram::default().snapshot().quantile(0.5), None);
        let mut merged = s.clone();
        merged.merge(&s);
        assert_eq!(merged.count, 200);
    }

    #[test]
    fn owned_observations_and_added_snapshots_agree_with_observe() {
        let (a, b) = (AtomicHistogram::default(), AtomicHistogram::default());
        for us in [10, 70, 300, 2_000, 40_000] {
            a.observe(Duration::from_micros(us));
            b.observe_owned(Duration::from_micros(us));
        }
        assert_eq!(a.snapshot(), b.snapshot());
        let folded = AtomicHistogram::default();
        folded.add(&b.snapshot());
        folded.add(&b.snapshot());
        let mut twice = a.snapshot();
        twice.merge(&a.snapshot());
        assert_eq!(folded.snapshot().counts, twice.counts);
        assert!((folded.snapshot().sum - twice.sum).abs() < 1e-9);
    }
}

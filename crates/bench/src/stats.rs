//! Arithmetic shared by the benchmarks: latency histograms, throughput,
//! spread over repeated runs, and human-readable units.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latency recorder in nanoseconds. HdrHistogram keeps 3 significant digits
/// over any range, so a run with millions of samples costs a few kilobytes
/// and percentiles stay exact to 0.1 %.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    h: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    pub fn new() -> Self {
        LatencyHistogram {
            h: Histogram::new(3).expect("3 significant digits is a valid precision"),
        }
    }

    /// Records one round trip. Zero is clamped to 1 ns (the histogram's
    /// lowest discernible value); the histogram grows for large values.
    pub fn record(&mut self, ns: u64) {
        self.h
            .record(ns.max(1))
            .expect("auto-resizing histogram accepts any u64");
    }

    pub fn len(&self) -> u64 {
        self.h.len()
    }

    pub fn is_empty(&self) -> bool {
        self.h.is_empty()
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        self.h
            .add(&other.h)
            .expect("auto-resizing histograms always merge");
    }

    pub fn summary(&self) -> LatencySummary {
        if self.h.is_empty() {
            return LatencySummary::default();
        }
        let ms = |ns: u64| ns as f64 / 1e6;
        LatencySummary {
            samples: self.h.len(),
            avg_ms: self.h.mean() / 1e6,
            min_ms: ms(self.h.min()),
            p50_ms: ms(self.h.value_at_quantile(0.50)),
            p90_ms: ms(self.h.value_at_quantile(0.90)),
            p99_ms: ms(self.h.value_at_quantile(0.99)),
            max_ms: ms(self.h.max()),
        }
    }
}

/// Latency statistics in milliseconds (the seed reports milliseconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub samples: u64,
    pub avg_ms: f64,
    pub min_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Bits per second for `bytes` moved in `secs` (0 for an empty window).
pub fn bits_per_second(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    }
}

/// Summary of one metric over repeated runs of the same point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub runs: u32,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// Sample standard deviation (0 for a single run).
    pub stdev: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        let n = values.len();
        if n == 0 {
            return Spread::default();
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let stdev = if n > 1 {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Spread {
            runs: n as u32,
            mean,
            min,
            max,
            stdev,
        }
    }

    /// Range relative to the mean, (max − min) / |mean|: the noise band used
    /// to decide whether a difference between two recordings is real.
    pub fn relative_range(&self) -> f64 {
        if self.mean == 0.0 || self.runs < 2 {
            0.0
        } else {
            (self.max - self.min) / self.mean.abs()
        }
    }
}

/// "9.62 Gbit/s" style formatting with decimal prefixes, as in the seed.
pub fn human_bps(bps: f64) -> String {
    human(bps, "bit/s")
}

/// Decimal-prefixed value with a unit: 1234.0, "B" -> "1.23 kB".
pub fn human(v: f64, unit: &str) -> String {
    let prefixes = [("", 1.0), ("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12)];
    let (p, d) = prefixes
        .iter()
        .rev()
        .find(|(_, d)| v.abs() >= *d)
        .copied()
        .unwrap_or(("", 1.0));
    format!("{:.2} {}{}", v / d, p, unit)
}

/// Binary-prefixed byte size: 131072 -> "128 KiB".
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{} {}", v as u64, UNITS[i])
    } else {
        format!("{:.1} {}", v, UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_percentiles_and_mean() {
        let mut h = LatencyHistogram::new();
        // 1..=100 ms, one sample each.
        for ms in 1..=100u64 {
            h.record(ms * 1_000_000);
        }
        let s = h.summary();
        assert_eq!(s.samples, 100);
        let close = |a: f64, b: f64| (a - b).abs() / b < 0.002;
        assert!(close(s.avg_ms, 50.5), "avg {}", s.avg_ms);
        assert!(close(s.min_ms, 1.0), "min {}", s.min_ms);
        assert!(close(s.p50_ms, 50.0), "p50 {}", s.p50_ms);
        assert!(close(s.p90_ms, 90.0), "p90 {}", s.p90_ms);
        assert!(close(s.p99_ms, 99.0), "p99 {}", s.p99_ms);
        assert!(close(s.max_ms, 100.0), "max {}", s.max_ms);
    }

    #[test]
    fn histogram_empty_zero_and_merge() {
        let mut a = LatencyHistogram::new();
        assert_eq!(a.summary(), LatencySummary::default());
        a.record(0);
        let mut b = LatencyHistogram::new();
        b.record(3_600_000_000_000); // one hour: the histogram must grow
        a.merge(&b);
        let s = a.summary();
        assert_eq!(s.samples, 2);
        assert!(s.min_ms > 0.0 && s.min_ms < 1e-5);
        assert!((s.max_ms - 3.6e6).abs() / 3.6e6 < 0.002);
    }

    #[test]
    fn throughput_math() {
        assert_eq!(bits_per_second(1_000, 1.0), 8_000.0);
        assert_eq!(bits_per_second(125_000_000, 0.5), 2e9);
        assert_eq!(bits_per_second(5, 0.0), 0.0);
    }

    #[test]
    fn spread_statistics() {
        let s = Spread::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(s.runs, 8);
        assert_eq!(s.mean, 5.0);
        assert_eq!((s.min, s.max), (2.0, 9.0));
        assert!((s.stdev - 2.138).abs() < 1e-3);
        assert!((s.relative_range() - 7.0 / 5.0).abs() < 1e-12);
        let one = Spread::of(&[3.0]);
        assert_eq!((one.stdev, one.relative_range()), (0.0, 0.0));
        assert_eq!(Spread::of(&[]).runs, 0);
    }

    #[test]
    fn units() {
        assert_eq!(human_bps(9.62e9), "9.62 Gbit/s");
        assert_eq!(human_bps(393e6), "393.00 Mbit/s");
        assert_eq!(human_bps(12.0), "12.00 bit/s");
        assert_eq!(human_size(131072), "128 KiB");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(16), "16 B");
    }
}

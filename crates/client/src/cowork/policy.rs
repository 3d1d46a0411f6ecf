//! The splitter's decisions and measurements, free of threads and sockets so
//! that they are tested with a fake clock: how much work the cluster and a
//! local thread take next (seed 002 eq. 4.4 and 4.8 applied to the work
//! that remains), and the throughput/latency estimates they are made from.

use std::time::Instant;

use corefarm_model::Partition;

/// Seconds since some origin. The engine reads time only through this, so
/// tests drive the estimators with a fake clock.
pub(crate) trait Clock: Sync {
    fn now(&self) -> f64;
}

/// The real clock.
pub(crate) struct WallClock(Instant);

impl WallClock {
    pub fn new() -> Self {
        WallClock(Instant::now())
    }
}

impl Clock for WallClock {
    fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// The model parameters of seed 002 §4.4 as far as they are known (see
/// [`corefarm_model::partition`] for their meaning). Items are data
/// messages: `x_c` and `x_a` are data messages per second, the rest seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Estimates {
    /// `X_c`: local throughput over all local threads, messages/s.
    pub x_c: Option<f64>,
    /// `X_a`: cluster throughput, messages/s (measured from arriving results,
    /// or reported by the caller — see `Cowork::set_cluster_throughput`).
    pub x_a: Option<f64>,
    /// `D_a`: the shortest round trip of one message through the cluster
    /// (includes that message's processing time, so it errs high).
    pub d_a: Option<f64>,
    /// `O_c`: CPU time to start co-working (`O_0` plus the first submission).
    pub o_c: Option<f64>,
    /// `O_0`: CPU time of a local run with no work (starting and joining
    /// the local threads).
    pub o_0: Option<f64>,
}

impl Estimates {
    /// `self` with every value `newer` knows replaced by `newer`'s.
    pub fn merged(self, newer: Estimates) -> Estimates {
        Estimates {
            x_c: newer.x_c.or(self.x_c),
            x_a: newer.x_a.or(self.x_a),
            d_a: newer.d_a.or(self.d_a),
            o_c: newer.o_c.or(self.o_c),
            o_0: newer.o_0.or(self.o_0),
        }
    }

    /// The model, once both throughputs and the latency are known (unknown
    /// overheads count as 0); `None` while the cluster is being probed.
    pub fn partition(&self) -> Option<Partition> {
        let o_0 = self.o_0.unwrap_or(0.0);
        let p = Partition {
            x_c: self.x_c?,
            x_a: self.x_a?,
            d_a: self.d_a?,
            o_0,
            o_c: self.o_c.unwrap_or(o_0).max(o_0),
        };
        p.check().ok().map(|_| p)
    }
}

/// Fixed knobs of one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Knobs {
    /// Most data messages the cluster has in flight.
    pub window: usize,
    /// Local worker threads.
    pub threads: usize,
    /// `C_COWORK_MAX` of Algorithm 2: most messages a local thread takes
    /// at once, i.e. how often it comes back to rebalance.
    pub local_max: usize,
    /// `n_j` of Algorithm 2: a local thread takes 1/(n_j · threads) of the
    /// local share at a time (guided self-scheduling), so batches shrink as
    /// the work runs out and neither side is left with a long tail.
    pub jobs: usize,
}

/// How many more messages the cluster should take now, with `unassigned`
/// messages not yet taken by anyone and `inflight` already at the cluster.
///
/// The cluster's target is its eq. 4.4 share of the work still to do
/// (`α(R)·R`, `R = unassigned + inflight`), nothing at or below the
/// break-even size `N_L` (eq. 4.8) or when `α ≤ 0`, at most `window`. So
/// as the work runs out the cluster stops refilling early enough to finish
/// together with the local threads. Before the cluster has been measured
/// it is probed as if it were one more local thread (`R / (threads + 1)`).
pub(crate) fn cluster_take(
    est: &Estimates,
    unassigned: usize,
    inflight: usize,
    k: &Knobs,
) -> usize {
    if unassigned == 0 || inflight >= k.window {
        return 0;
    }
    let rem = (unassigned + inflight) as f64;
    let target = match est.partition() {
        Some(p) => {
            let a = p.alpha(rem);
            if rem <= p.break_even() || a <= 0.0 {
                0.0
            } else {
                (a.min(1.0) * rem).round()
            }
        }
        None => (rem / (k.threads + 1) as f64).round(),
    };
    let target = (target as usize).min(k.window);
    target.saturating_sub(inflight).min(unassigned)
}

/// How many messages a local thread takes next. `cluster_on`: the cluster
/// is (or may still be) taking work; its expected share `α(R)` is then left
/// out of the local share. The batch is 1/(n_j · threads) of the local
/// share, at least 1, at most `local_max` (Algorithm 2's `C_COWORK_MAX`).
pub(crate) fn local_take(
    est: &Estimates,
    unassigned: usize,
    inflight: usize,
    cluster_on: bool,
    k: &Knobs,
) -> usize {
    if unassigned == 0 {
        return 0;
    }
    let rem = (unassigned + inflight) as f64;
    let alpha = if !cluster_on {
        0.0
    } else {
        match est.partition() {
            Some(p) if rem > p.break_even() => p.alpha(rem).clamp(0.0, 1.0),
            Some(_) => 0.0,
            None => 1.0 / (k.threads + 1) as f64,
        }
    };
    let share = (1.0 - alpha) * rem / (k.jobs.max(1) * k.threads.max(1)) as f64;
    // The epsilon keeps float noise (60.000000000001) from adding one.
    ((share - 1e-9).ceil() as usize)
        .clamp(1, k.local_max.max(1))
        .min(unassigned)
}

/// Running measurements of one run.
#[derive(Debug, Default, Clone)]
pub(crate) struct Meter {
    threads: usize,
    local_items: u64,
    /// Seconds the local threads spent processing, summed over threads.
    local_busy: f64,
    /// Cluster results counted in closed busy periods, minus one each.
    gaps: u64,
    /// Seconds from first to last result of the closed busy periods.
    span: f64,
    /// The open busy period: (first arrival, last arrival, results).
    open: Option<(f64, f64, u64)>,
    min_latency: Option<f64>,
    pub o_0: Option<f64>,
    pub o_c: Option<f64>,
}

impl Meter {
    pub fn new(threads: usize) -> Meter {
        Meter {
            threads,
            ..Meter::default()
        }
    }

    /// One local thread processed `items` messages in `secs`.
    pub fn local_batch(&mut self, items: usize, secs: f64) {
        self.local_items += items as u64;
        self.local_busy += secs.max(0.0);
    }

    /// A cluster result arrived at `arrived` for a message sent at `sent`.
    pub fn cluster_result(&mut self, sent: f64, arrived: f64) {
        let lat = (arrived - sent).max(0.0);
        self.min_latency = Some(self.min_latency.map_or(lat, |m| m.min(lat)));
        self.open = Some(match self.open {
            None => (arrived, arrived, 1),
            Some((first, _, n)) => (first, arrived, n + 1),
        });
    }

    /// The cluster has nothing in flight: the time until the next
    /// submission is not cluster time.
    pub fn cluster_idle(&mut self) {
        if let Some((first, last, n)) = self.open.take() {
            self.gaps += n - 1;
            self.span += last - first;
        }
    }

    /// What this run has measured so far.
    pub fn estimates(&self) -> Estimates {
        let x_c = (self.local_items > 0 && self.local_busy > 0.0)
            .then(|| self.threads as f64 * self.local_items as f64 / self.local_busy);
        let (mut gaps, mut span) = (self.gaps, self.span);
        if let Some((first, last, n)) = self.open {
            gaps += n - 1;
            span += last - first;
        }
        let x_a = (gaps > 0 && span > 0.0).then(|| gaps as f64 / span);
        Estimates {
            x_c,
            x_a,
            d_a: self.min_latency,
            o_c: self.o_c,
            o_0: self.o_0,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A clock that moves only when told to.
    struct FakeClock(Mutex<f64>);

    impl FakeClock {
        fn advance(&self, s: f64) {
            *self.0.lock().unwrap() += s;
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> f64 {
            *self.0.lock().unwrap()
        }
    }

    const K: Knobs = Knobs {
        window: 32,
        threads: 2,
        local_max: 16,
        jobs: 6,
    };

    /// X_c = 1000/s, X_a = 3000/s, D_a = 10 ms, O_c = 2 ms, O_0 = 1 ms:
    /// N_L = 9.33, α(100) = 0.69 (the model crate's hand-computed case).
    fn known() -> Estimates {
        Estimates {
            x_c: Some(1000.0),
            x_a: Some(3000.0),
            d_a: Some(0.010),
            o_c: Some(0.002),
            o_0: Some(0.001),
        }
    }

    #[test]
    fn meter_measures_throughputs_and_latency_on_a_fake_clock() {
        let clock = FakeClock(Mutex::new(0.0));
        let mut m = Meter::new(2);
        assert_eq!(m.estimates(), Estimates::default());
        // Two threads, each 10 messages in 20 ms: 500/s each, 1000/s together.
        m.local_batch(10, 0.020);
        m.local_batch(10, 0.020);
        // The cluster: sent at t=0, results at 5, 6, 7, 8 ms (1000/s, 5 ms
        // first round trip); then idle; then one result 3 ms after its send.
        let sent = clock.now();
        for _ in 0..4 {
            clock.advance(if m.estimates().d_a.is_none() {
                0.005
            } else {
                0.001
            });
            m.cluster_result(sent, clock.now());
        }
        m.cluster_idle();
        clock.advance(1.0); // idle time must not count
        let s2 = clock.now();
        clock.advance(0.003);
        m.cluster_result(s2, clock.now());
        let e = m.estimates();
        assert!((e.x_c.unwrap() - 1000.0).abs() < 1e-9, "{e:?}");
        assert!((e.x_a.unwrap() - 1000.0).abs() < 1e-6, "{e:?}");
        assert!((e.d_a.unwrap() - 0.003).abs() < 1e-12, "{e:?}");
    }

    #[test]
    fn merged_prefers_newer_values() {
        let old = known();
        let newer = Estimates {
            x_a: Some(5.0),
            ..Estimates::default()
        };
        let m = old.merged(newer);
        assert_eq!(m.x_a, Some(5.0));
        assert_eq!(m.x_c, Some(1000.0));
        assert!(Estimates::default().partition().is_none());
        assert!(known().partition().is_some());
    }

    #[test]
    fn cluster_takes_its_eq_4_4_share_of_what_remains() {
        // R = 100: α = 0.69 → 69, capped by the window (32).
        assert_eq!(cluster_take(&known(), 100, 0, &K), 32);
        let wide = Knobs { window: 1000, ..K };
        assert_eq!(cluster_take(&known(), 100, 0, &wide), 69);
        // With 60 in flight of R = 100 it tops up to 69.
        assert_eq!(cluster_take(&known(), 40, 60, &wide), 9);
        // R = 9 ≤ N_L = 9.33: nothing more goes to the cluster.
        assert_eq!(cluster_take(&known(), 9, 0, &wide), 0);
        // R = 20: α = 0.45 → 9; 10 already in flight → none more.
        assert_eq!(cluster_take(&known(), 10, 10, &wide), 0);
        assert_eq!(cluster_take(&known(), 20, 0, &wide), 9);
        // Nothing left, or the window full.
        assert_eq!(cluster_take(&known(), 0, 5, &wide), 0);
        assert_eq!(cluster_take(&known(), 500, 32, &K), 0);
    }

    #[test]
    fn unmeasured_cluster_is_probed_like_one_more_thread() {
        let e = Estimates {
            x_c: Some(1000.0),
            ..Estimates::default()
        };
        // R = 90, 2 threads: 90 / 3 = 30.
        assert_eq!(cluster_take(&e, 90, 0, &K), 30);
        assert_eq!(cluster_take(&e, 2, 0, &K), 1);
    }

    #[test]
    fn local_batches_shrink_with_the_work_left() {
        // Cluster off: R = 1200 over 6 · 2 → 100, capped at 16.
        assert_eq!(local_take(&known(), 1200, 0, false, &K), 16);
        // Cluster off, R = 60: 60 / 12 = 5.
        assert_eq!(local_take(&known(), 60, 0, false, &K), 5);
        // Cluster on, R = 100: local share 31 / 12 → 3.
        assert_eq!(local_take(&known(), 100, 0, true, &K), 3);
        // Cluster on but R ≤ N_L: all of it is local work → 9 / 12 → 1.
        assert_eq!(local_take(&known(), 9, 0, true, &K), 1);
        // Unmeasured cluster: local share 2/3 of 90 = 60 → 5.
        assert_eq!(local_take(&Estimates::default(), 90, 0, true, &K), 5);
        assert_eq!(local_take(&known(), 0, 10, true, &K), 0);
    }
}

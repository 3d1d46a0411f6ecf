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
    /// `X_a`: cluster throughput, messages/s (measured from results that
    /// arrived while no local thread computed, else from all of them; or
    /// reported by the caller — see `Cowork::set_cluster_throughput`).
    pub x_a: Option<f64>,
    /// Cluster throughput while local threads computed, messages/s. Below
    /// `X_a` where the local work competes with the cluster's path for the
    /// CPUs (nodes, server or client threads on the same machine); the
    /// split then gives the CPU only work that adds more than it costs.
    pub x_a_beside: Option<f64>,
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
            x_a_beside: newer.x_a_beside.or(self.x_a_beside),
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
    /// Backup copies ([`worth_backup`]): when the cluster has nothing left
    /// to take, it also computes messages local threads are still on.
    pub backup: bool,
}

/// Where the cluster path stands, as the local threads see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Not configured yet: may still take work.
    Waiting,
    Active,
    /// Finished or failed: takes no more work and gives none back.
    Done,
}

/// Messages of `rem` still to do that the cluster should do: eq. 4.4 over
/// whole messages ([`Partition::accelerator_items_whole`], which weighs
/// all-local too, as eq. 4.8's break-even size does for divisible work), so
/// that no local thread is left with a last message that outlasts the
/// cluster's whole share. `None` while the model is not known.
fn cluster_share(est: &Estimates, rem: usize, k: &Knobs) -> Option<usize> {
    let p = est.partition()?;
    let beside = est.x_a_beside.unwrap_or(p.x_a);
    Some(p.accelerator_items_whole(rem as u64, k.threads.max(1) as u64, beside) as usize)
}

/// How many more messages the cluster should take now, with `unassigned`
/// messages not yet taken by anyone and `inflight` already at the cluster.
///
/// The cluster's target is its share of the work still to do
/// (`R = unassigned + inflight`, see [`cluster_share`]), at most `window`.
/// So as the work runs out the cluster stops refilling early enough to
/// finish together with the local threads. Before the model is known the
/// cluster keeps its window full, as it would alone, while each local
/// thread probes with one message at a time: assuming the CPU as fast as
/// the cluster (the earlier prior, `R / (threads + 1)`) left nodes idle
/// while the CPU worked through messages it was slower at (co-working
/// 1.17–1.19× all-cluster at P = 1 ms, against 1.11–1.12× this way;
/// docs/cowork.md).
pub(crate) fn cluster_take(
    est: &Estimates,
    unassigned: usize,
    inflight: usize,
    k: &Knobs,
) -> usize {
    if unassigned == 0 || inflight >= k.window {
        return 0;
    }
    let rem = unassigned + inflight;
    let target = cluster_share(est, rem, k).unwrap_or(rem);
    target
        .min(k.window)
        .saturating_sub(inflight)
        .min(unassigned)
}

/// How many messages a local thread takes next: 1/(n_j · threads) of the
/// local share, at least 1, at most `local_max` (Algorithm 2's
/// `C_COWORK_MAX`). The local share is everything once the cluster is
/// `Done`; while it is `Waiting` for its configuration, what eq. 4.4 would
/// leave the CPU (so work goes on locally meanwhile, Algorithm 2 lines
/// 7–12) — unless the configuration is expected (`wait` seconds) before a
/// local message would be done, when the thread takes none and waits; once
/// it is `Active`, what [`cluster_share`] leaves the CPU, which may be
/// nothing: the thread then takes none and waits.
pub(crate) fn local_take(
    est: &Estimates,
    unassigned: usize,
    inflight: usize,
    cluster: Side,
    wait: Option<f64>,
    k: &Knobs,
) -> usize {
    if unassigned == 0 {
        return 0;
    }
    if let (Side::Waiting, Some(wait), Some(x_c)) = (cluster, wait, est.x_c) {
        // One message on one thread (X_c counts all of them).
        if k.threads.max(1) as f64 / x_c > wait {
            return 0;
        }
    }
    let rem = unassigned + inflight;
    let share = match (cluster, est.partition()) {
        (Side::Done, _) => rem as f64,
        (Side::Active, Some(_)) => {
            let cpu = rem - cluster_share(est, rem, k).unwrap_or(rem).min(rem);
            if cpu == 0 {
                return 0;
            }
            // Never more than the share itself, whatever the rounding.
            return batch(cpu as f64, k).min(cpu).min(unassigned);
        }
        (_, Some(p)) if rem as f64 > p.break_even() => {
            (1.0 - p.alpha(rem as f64).clamp(0.0, 1.0)) * rem as f64
        }
        (_, Some(_)) => rem as f64,
        // Unmeasured: one message, the least a probe can take; the next
        // batch is sized by what it and the cluster's first results measure.
        (_, None) => return 1,
    };
    batch(share, k).min(unassigned)
}

/// Whether the cluster, with nothing else left to take, should also
/// compute a message a local thread is on, expected done at `finish`
/// (clock seconds; infinite before `X_c` is known): yes unless the local
/// result is due within one cluster round trip `D_a`, when the copy would
/// come later anyway. An overdue message is a straggler (a longer message,
/// or a thread that lost its CPU) and is copied too. Whichever result comes
/// first is kept; the local thread gives up its copy between two inputs.
/// Eq. 4.4 splits the work so that both sides finish together, but a
/// thread's last message is indivisible: without this the call waits for
/// it while the nodes idle (most of all on a function's first call, before
/// `X_c` is known and the local thread has probed with a whole message).
pub(crate) fn worth_backup(finish: f64, now: f64, d_a: Option<f64>) -> bool {
    let left = finish - now;
    left <= 0.0 || left > d_a.unwrap_or(0.0)
}

/// 1/(n_j · threads) of a local share, at least 1, at most `local_max`.
fn batch(share: f64, k: &Knobs) -> usize {
    let b = share / (k.jobs.max(1) * k.threads.max(1)) as f64;
    // The epsilon keeps float noise (60.000000000001) from adding one.
    ((b - 1e-9).ceil() as usize).clamp(1, k.local_max.max(1))
}

/// Cluster results of closed and open busy periods: the arrivals after
/// the first of each period, and the seconds between them.
#[derive(Debug, Default, Clone, Copy)]
struct Arrivals {
    gaps: u64,
    span: f64,
}

impl Arrivals {
    fn rate(&self) -> Option<f64> {
        (self.gaps > 0 && self.span > 0.0).then(|| self.gaps as f64 / self.span)
    }
}

/// Running measurements of one run.
#[derive(Debug, Default, Clone)]
pub(crate) struct Meter {
    threads: usize,
    /// Messages the local threads computed (a message given up counts the
    /// share of its inputs they had done).
    local_items: f64,
    /// Seconds the local threads spent processing, summed over threads.
    local_busy: f64,
    /// Local threads computing now.
    local_active: usize,
    /// A local thread computed since the last cluster result.
    local_since: bool,
    /// Intervals between cluster results with no local thread computing,
    /// and with one computing at some point.
    alone: Arrivals,
    beside: Arrivals,
    /// Last arrival of the open busy period.
    open: Option<f64>,
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

    /// A local thread starts a batch.
    pub fn local_start(&mut self) {
        self.local_active += 1;
        self.local_since = true;
    }

    /// One local thread processed `items` messages in `secs`.
    pub fn local_batch(&mut self, items: f64, secs: f64) {
        self.local_active = self.local_active.saturating_sub(1);
        self.local_items += items.max(0.0);
        self.local_busy += secs.max(0.0);
    }

    /// A cluster result arrived at `arrived` for a message sent at `sent`.
    pub fn cluster_result(&mut self, sent: f64, arrived: f64) {
        let lat = (arrived - sent).max(0.0);
        self.min_latency = Some(self.min_latency.map_or(lat, |m| m.min(lat)));
        if let Some(last) = self.open {
            let a = if self.local_since {
                &mut self.beside
            } else {
                &mut self.alone
            };
            a.gaps += 1;
            a.span += (arrived - last).max(0.0);
        }
        self.open = Some(arrived);
        self.local_since = self.local_active > 0;
    }

    /// The cluster has nothing in flight: the time until the next
    /// submission is not cluster time.
    pub fn cluster_idle(&mut self) {
        self.open = None;
    }

    /// What this run has measured so far.
    pub fn estimates(&self) -> Estimates {
        let x_c = (self.local_items > 0.0 && self.local_busy > 0.0)
            .then(|| self.threads as f64 * self.local_items / self.local_busy);
        let all = Arrivals {
            gaps: self.alone.gaps + self.beside.gaps,
            span: self.alone.span + self.beside.span,
        };
        Estimates {
            x_c,
            x_a: self.alone.rate().or(all.rate()),
            x_a_beside: self.beside.rate(),
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
        backup: true,
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
            x_a_beside: None,
        }
    }

    #[test]
    fn meter_measures_throughputs_and_latency_on_a_fake_clock() {
        let clock = FakeClock(Mutex::new(0.0));
        let mut m = Meter::new(2);
        assert_eq!(m.estimates(), Estimates::default());
        // Two threads, each 10 messages in 20 ms: 500/s each, 1000/s together.
        m.local_batch(10.0, 0.020);
        m.local_batch(10.0, 0.020);
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
        // A message given up a quarter done in 5 ms counts a quarter:
        // 20.25 messages in 45 ms over 2 threads, 900/s.
        let mut gave_up = m.clone();
        gave_up.local_batch(0.25, 0.005);
        let x_c = gave_up.estimates().x_c.unwrap();
        assert!((x_c - 900.0).abs() < 1e-9, "{x_c}");
        assert!((e.d_a.unwrap() - 0.003).abs() < 1e-12, "{e:?}");
    }

    #[test]
    fn meter_tells_the_cluster_alone_from_the_cluster_beside_local_work() {
        let mut m = Meter::new(1);
        // Alone: results 1 ms apart (1000/s).
        for t in [0.000, 0.001, 0.002] {
            m.cluster_result(0.0, t);
        }
        // A local batch starts: results 2 ms apart (500/s) until it ends.
        m.local_start();
        m.cluster_result(0.0, 0.004);
        m.cluster_result(0.0, 0.006);
        m.local_batch(1.0, 0.005);
        // The interval the batch ended in still counts beside it.
        m.cluster_result(0.0, 0.008);
        // Alone again: 1 ms apart.
        m.cluster_result(0.0, 0.009);
        let e = m.estimates();
        assert!((e.x_a.unwrap() - 1000.0).abs() < 1e-6, "{e:?}");
        assert!((e.x_a_beside.unwrap() - 500.0).abs() < 1e-6, "{e:?}");
        // Only ever beside local work: X_a falls back to all results.
        let mut m = Meter::new(1);
        m.local_start();
        m.cluster_result(0.0, 0.001);
        m.cluster_result(0.0, 0.003);
        assert_eq!(m.estimates().x_a, m.estimates().x_a_beside);
    }

    #[test]
    fn a_local_thread_that_slows_the_cluster_more_than_it_adds_takes_none() {
        let k = Knobs {
            threads: 1,
            window: 1000,
            ..K
        };
        // Undisturbed, the CPU's share of 400 is 10 messages.
        assert_eq!(local_take(&slow_cpu(), 400, 0, Side::Active, None, &k), 2);
        // Beside it the cluster loses 200/s; the CPU adds 100/s: none.
        let slowed = Estimates {
            x_a_beside: Some(3640.0),
            ..slow_cpu()
        };
        assert_eq!(local_take(&slowed, 400, 0, Side::Active, None, &k), 0);
        assert_eq!(cluster_take(&slowed, 400, 0, &k), 400);
        // Still starting, the CPU works meanwhile all the same.
        assert_eq!(local_take(&slowed, 400, 0, Side::Waiting, None, &k), 2);
    }

    #[test]
    fn a_local_thread_waits_for_a_configuration_due_before_its_message() {
        let k = Knobs { threads: 1, ..K };
        // X_c = 100/s: a message takes a local thread 10 ms.
        let e = slow_cpu();
        // Expected in 2 ms: waiting beats starting a 10 ms message.
        assert_eq!(local_take(&e, 24, 0, Side::Waiting, Some(0.002), &k), 0);
        // Expected in 50 ms, or no estimate yet: work meanwhile.
        assert_eq!(local_take(&e, 24, 0, Side::Waiting, Some(0.050), &k), 1);
        let never = Some(f64::INFINITY);
        assert_eq!(local_take(&e, 24, 0, Side::Waiting, never, &k), 1);
        // Nothing on its way (it may never come), or X_c unknown: work.
        assert_eq!(local_take(&e, 24, 0, Side::Waiting, None, &k), 1);
        let none = Estimates::default();
        assert_eq!(local_take(&none, 24, 0, Side::Waiting, Some(0.0), &k), 1);
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
        // R = 100: α = 0.69 leaves the 2 threads 31, as whole pairs 30
        // (T = 33.3 ms; 32 would take 34 ms) → 70, capped by the window (32).
        assert_eq!(cluster_take(&known(), 100, 0, &K), 32);
        let wide = Knobs { window: 1000, ..K };
        assert_eq!(cluster_take(&known(), 100, 0, &wide), 70);
        // With 60 in flight of R = 100 it tops up to 70.
        assert_eq!(cluster_take(&known(), 40, 60, &wide), 10);
        // R = 9 ≤ N_L = 9.33 with one thread: nothing goes to the cluster.
        let one = Knobs { threads: 1, ..wide };
        assert_eq!(cluster_take(&known(), 9, 0, &one), 0);
        // With two threads of whole messages, 4 each and 1 at the cluster
        // (10.3 ms) beat 5 and 4 on the CPU (11 ms).
        assert_eq!(cluster_take(&known(), 9, 0, &wide), 1);
        // R = 20: α = 0.45 leaves 11, as pairs 10 → 10; 10 in flight → none more.
        assert_eq!(cluster_take(&known(), 10, 10, &wide), 0);
        assert_eq!(cluster_take(&known(), 20, 0, &wide), 10);
        // Nothing left, or the window full.
        assert_eq!(cluster_take(&known(), 0, 5, &wide), 0);
        assert_eq!(cluster_take(&known(), 500, 32, &K), 0);
    }

    #[test]
    fn unmeasured_the_cluster_keeps_its_window_full() {
        let e = Estimates {
            x_c: Some(1000.0),
            ..Estimates::default()
        };
        // The window (32) while work is left, then what is left.
        assert_eq!(cluster_take(&e, 90, 0, &K), 32);
        assert_eq!(cluster_take(&e, 90, 30, &K), 2);
        assert_eq!(cluster_take(&e, 2, 0, &K), 2);
    }

    #[test]
    fn a_local_message_is_copied_unless_due_within_a_cluster_round_trip() {
        // Due in 5 ms, D_a = 10 ms: the copy would come later.
        assert!(!worth_backup(1.005, 1.0, Some(0.010)));
        // Due in 50 ms: the cluster is sooner.
        assert!(worth_backup(1.050, 1.0, Some(0.010)));
        // Unknown local speed, or unknown round trip: copied.
        assert!(worth_backup(f64::INFINITY, 1.0, Some(0.010)));
        assert!(worth_backup(1.005, 1.0, None));
        // Overdue: a straggler, copied.
        assert!(worth_backup(0.990, 1.0, Some(0.010)));
    }

    #[test]
    fn local_batches_shrink_with_the_work_left() {
        // Cluster done: R = 1200 over 6 · 2 → 100, capped at 16.
        assert_eq!(local_take(&known(), 1200, 0, Side::Done, None, &K), 16);
        // Cluster done, R = 60: 60 / 12 = 5.
        assert_eq!(local_take(&known(), 60, 0, Side::Done, None, &K), 5);
        // Cluster starting, R = 100: local share 31 / 12 → 3.
        assert_eq!(local_take(&known(), 100, 0, Side::Waiting, None, &K), 3);
        // Cluster starting but R ≤ N_L: all of it is local work → 9 / 12 → 1.
        assert_eq!(local_take(&known(), 9, 0, Side::Waiting, None, &K), 1);
        // Unmeasured: one message, a probe.
        let none = Estimates::default();
        assert_eq!(local_take(&none, 90, 0, Side::Waiting, None, &K), 1);
        assert_eq!(local_take(&none, 90, 0, Side::Active, None, &K), 1);
        assert_eq!(local_take(&known(), 0, 10, Side::Waiting, None, &K), 0);
    }

    /// X_c = 100/s (10 ms a message), X_a = 3840/s, D_a = 2.5 ms: a call of
    /// 24 messages is done by the cluster in 8.75 ms, by the cluster and one
    /// local message in 10 ms.
    fn slow_cpu() -> Estimates {
        Estimates {
            x_c: Some(100.0),
            x_a: Some(3840.0),
            d_a: Some(0.0025),
            o_c: Some(0.0),
            o_0: Some(0.0),
            x_a_beside: None,
        }
    }

    #[test]
    fn an_active_cluster_leaves_the_cpu_only_messages_it_finishes_in_time() {
        let k = Knobs {
            threads: 1,
            window: 64,
            ..K
        };
        // Eq. 4.4 rounded would give the CPU one message (0.85 of 24).
        let p = slow_cpu().partition().unwrap();
        assert_eq!(24 - p.accelerator_items(24), 1);
        assert_eq!(local_take(&slow_cpu(), 24, 0, Side::Active, None, &k), 0);
        assert_eq!(cluster_take(&slow_cpu(), 24, 0, &k), 24);
        // Still starting: the CPU works meanwhile (Algorithm 2 lines 7–12).
        assert_eq!(local_take(&slow_cpu(), 24, 0, Side::Waiting, None, &k), 1);
        // A large call: the CPU's whole share, in batches of 1/n_j.
        assert_eq!(cluster_take(&slow_cpu(), 400, 0, &k), 64);
        assert_eq!(local_take(&slow_cpu(), 400, 0, Side::Active, None, &k), 2);
        // The cluster's share is what the CPU does not take, whole.
        let wide = Knobs { window: 1000, ..k };
        assert_eq!(cluster_take(&slow_cpu(), 400, 0, &wide), 390);
        assert_eq!(
            local_take(&slow_cpu(), 10, 390, Side::Active, None, &wide),
            2
        );
        // Nothing left to the CPU: the cluster tops up to everything.
        assert_eq!(cluster_take(&slow_cpu(), 10, 390, &wide), 0);
    }
}

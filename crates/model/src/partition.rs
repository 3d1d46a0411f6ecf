//! Partitioning a workload between the CPU and an accelerator — seed 002
//! §4.4 ("Partitioning model") and its use in chapter 5 (Algorithm 2).
//!
//! Two resources perform the same function on disjoint parts of a workload
//! of `N` items. The accelerator (for corefarm: the cluster) gets the
//! fraction `α`, the CPU the rest; the task is done when the slower side is
//! done, so the best `α` makes both finish together (`T_a = T_c`).
//!
//! | symbol | field | meaning | unit |
//! |---|---|---|---|
//! | `X_c` | [`Partition::x_c`] | CPU throughput | items/s |
//! | `X_a` | [`Partition::x_a`] | accelerator throughput | items/s |
//! | `O_c` | [`Partition::o_c`] | CPU overhead of co-working: CPU time spent initiating the accelerator and collecting its results, which the CPU cannot spend on items | s |
//! | `O_0` | [`Partition::o_0`] | the part of `O_c` that calling the function in software costs anyway, with `N = 0` | s |
//! | `D_a` | [`Partition::d_a`] | accelerator latency: initiation plus return of the result, during which the accelerator processes nothing | s |
//!
//! The functions do not validate their inputs; [`Partition::check`] does
//! (throughputs finite and positive, times finite and non-negative).

use crate::ModelError;

/// Measured parameters of one CPU/accelerator pair (see the module table).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Partition {
    /// `X_c`: CPU throughput, items/s.
    pub x_c: f64,
    /// `X_a`: accelerator throughput, items/s.
    pub x_a: f64,
    /// `O_c`: CPU overhead of initiating the accelerator and collecting its results, s.
    pub o_c: f64,
    /// `O_0`: the share of `O_c` a purely local call costs too (`N = 0`), s.
    pub o_0: f64,
    /// `D_a`: accelerator initiation plus result-return latency, s.
    pub d_a: f64,
}

/// Eq. 4.2: `α* = X_a / (X_a + X_c)`, the accelerator's share of a large
/// workload, where overheads and latencies are negligible: work is split in
/// proportion to throughput.
pub fn alpha_star(x_a: f64, x_c: f64) -> f64 {
    x_a / (x_a + x_c)
}

impl Partition {
    /// Why the parameters cannot be used, if they cannot.
    pub fn check(&self) -> Result<(), ModelError> {
        for (name, value) in [("X_c", self.x_c), ("X_a", self.x_a)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ModelError::Throughput { name, value });
            }
        }
        for (name, value) in [("O_c", self.o_c), ("O_0", self.o_0), ("D_a", self.d_a)] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(ModelError::Time { name, value });
            }
        }
        Ok(())
    }

    /// Eq. 4.2 for these throughputs.
    pub fn alpha_star(&self) -> f64 {
        alpha_star(self.x_a, self.x_c)
    }

    /// Eq. 4.4: `α = α* [1 − X_c (D_a − O_c) / N]`, the accelerator's share
    /// of `n` items that makes eq. 4.3a and 4.3b equal. Not clamped: a
    /// value ≤ 0 means the accelerator's latency exceeds what the CPU needs
    /// for the whole workload (Algorithm 2 then keeps it all on the CPU).
    pub fn alpha(&self, n: f64) -> f64 {
        self.alpha_star() * (1.0 - self.x_c * (self.d_a - self.o_c) / n)
    }

    /// Eq. 4.3a: `T'_a = α N / X_a + D_a`, the accelerator's completion time.
    pub fn accelerator_time(&self, alpha: f64, n: f64) -> f64 {
        alpha * n / self.x_a + self.d_a
    }

    /// Eq. 4.3b: `T'_c = (1 − α) N / X_c + O_c`, the CPU's completion time
    /// when it co-works.
    pub fn cpu_time(&self, alpha: f64, n: f64) -> f64 {
        (1.0 - alpha) * n / self.x_c + self.o_c
    }

    /// Left-hand side of eq. 4.5 and 4.6: `N / X_c + O_0`, the time of the
    /// whole workload on the CPU alone.
    pub fn cpu_only_time(&self, n: f64) -> f64 {
        n / self.x_c + self.o_0
    }

    /// Eq. 4.8: `N_L = X_c [X_c (O_c − O_0) / X_a + D_a − O_0]`, the smallest
    /// workload for which co-working is no slower than the CPU alone
    /// (both inequalities 4.5 and 4.6 hold). Below it, everything stays on
    /// the CPU (Algorithm 2, lines 1–4).
    pub fn break_even(&self) -> f64 {
        self.x_c * (self.x_c * (self.o_c - self.o_0) / self.x_a + self.d_a - self.o_0)
    }

    /// How many of `n` items go to the accelerator: 0 at or below
    /// [`break_even`](Self::break_even) or when eq. 4.4 gives `α ≤ 0`,
    /// else `α n` rounded, at most `n`.
    pub fn accelerator_items(&self, n: u64) -> u64 {
        let nf = n as f64;
        if n == 0 || nf <= self.break_even() {
            return 0;
        }
        let a = self.alpha(nf);
        if a <= 0.0 {
            return 0;
        }
        ((a * nf).round() as u64).min(n)
    }

    /// Eq. 4.3a for `items` whole items (0 when it gets none), where the
    /// accelerator runs at `beside` items/s while the CPU computes (for
    /// `cpu_busy` seconds) and at `X_a` after: on a machine whose CPUs also
    /// drive the accelerator the CPU's own work slows it, which eq. 4.3a
    /// does not model (`beside = X_a` gives eq. 4.3a).
    fn accelerator_items_time(&self, items: u64, beside: f64, cpu_busy: f64) -> f64 {
        if items == 0 {
            return 0.0;
        }
        let m = items as f64;
        let during = beside * cpu_busy;
        let busy = if m <= during {
            m / beside
        } else {
            cpu_busy + (m - during) / self.x_a
        };
        busy + self.d_a
    }

    /// Eq. 4.3b's compute time for `items` on `threads` CPU threads: a
    /// thread runs whole items, so the CPU lasts as long as its busiest one.
    fn cpu_items_busy(&self, items: u64, threads: u64) -> f64 {
        let t = threads.max(1);
        (items.div_ceil(t) * t) as f64 / self.x_c
    }

    /// Eq. 4.4 over whole items: how many of `n` items go to the
    /// accelerator so that the later of the two sides (eq. 4.3a, 4.3b)
    /// finishes first. Eq. 4.4 makes both sides finish together for a
    /// divisible workload; rounding its share can leave the CPU a last item
    /// that outlasts the accelerator's whole share, which matters when a
    /// call has few items and the CPU is much slower per item. `beside`:
    /// the accelerator's throughput while the CPU computes (see
    /// `accelerator_items_time`; `X_a` when they do not compete), so the
    /// CPU gets no work where it would cost the accelerator more than it
    /// adds. The CPU's side pays `O_c`, or `O_0` when it does everything;
    /// ties go to the accelerator.
    pub fn accelerator_items_whole(&self, n: u64, threads: u64, beside: f64) -> u64 {
        if n == 0 {
            return 0;
        }
        let t = threads.max(1);
        let beside = if beside.is_finite() && beside > 0.0 {
            beside
        } else {
            self.x_a
        };
        let cost = |cpu: u64| {
            if cpu == 0 {
                return self.accelerator_items_time(n, self.x_a, 0.0);
            }
            let busy = self.cpu_items_busy(cpu, t);
            let overhead = if cpu == n { self.o_0 } else { self.o_c };
            let a = self.accelerator_items_time(n - cpu, beside, busy);
            a.max(busy + overhead)
        };
        // Every whole multiple of `threads` for a call-sized workload; for
        // a large one, those around eq. 4.4's share at either throughput.
        let steps = n.div_ceil(t);
        let candidates: Vec<u64> = if steps <= 4096 {
            (0..=steps).map(|k| (k * t).min(n)).collect()
        } else {
            let mut c = vec![0, n];
            for x_a in [self.x_a, beside] {
                let p = Partition { x_a, ..*self };
                let nf = n as f64;
                let cpu = ((1.0 - p.alpha(nf)) * nf).clamp(0.0, nf);
                let below = (cpu / t as f64).floor() as u64 * t;
                c.extend([below.min(n), (below + t).min(n)]);
            }
            c
        };
        candidates
            .into_iter()
            .map(|cpu| (cost(cpu), cpu))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map_or(n, |(_, cpu)| n - cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    /// X_c = 1000/s, X_a = 3000/s, O_c = 2 ms, O_0 = 1 ms, D_a = 10 ms.
    fn p() -> Partition {
        Partition {
            x_c: 1000.0,
            x_a: 3000.0,
            o_c: 0.002,
            o_0: 0.001,
            d_a: 0.010,
        }
    }

    #[test]
    fn eq_4_2_splits_in_proportion_to_throughput() {
        // 3000 / (3000 + 1000)
        assert!(close(alpha_star(3000.0, 1000.0), 0.75));
        assert!(close(p().alpha_star(), 0.75));
        assert!(close(alpha_star(1.0, 1.0), 0.5));
        // Eq. 4.1a = 4.1b at α*: 0.75·N/3000 = 0.25·N/1000.
        let n = 1234.0;
        assert!(close(0.75 * n / 3000.0, 0.25 * n / 1000.0));
    }

    #[test]
    fn eq_4_4_corrects_for_latency_and_overhead() {
        // α = 0.75 · [1 − 1000 · (0.010 − 0.002) / 100] = 0.75 · 0.92 = 0.69
        let a = p().alpha(100.0);
        assert!(close(a, 0.69), "{a}");
        // Both sides finish together (eq. 4.3a = 4.3b):
        // T'_a = 0.69·100/3000 + 0.010 = 0.033; T'_c = 0.31·100/1000 + 0.002 = 0.033.
        assert!(close(p().accelerator_time(a, 100.0), 0.033));
        assert!(close(p().cpu_time(a, 100.0), 0.033));
        // Large N tends to α*; N = X_c (D_a − O_c) = 8 gives α = 0.
        assert!(close(p().alpha(8.0e9), 0.75 * (1.0 - 1e-9)));
        assert!(close(p().alpha(8.0), 0.0));
        assert!(p().alpha(4.0) < 0.0);
    }

    #[test]
    fn eq_4_8_break_even() {
        // N_L = 1000 · [1000 · (0.002 − 0.001) / 3000 + 0.010 − 0.001]
        //     = 1000 · [0.000333… + 0.009] = 9.333…
        let nl = p().break_even();
        assert!(close(nl, 9.0 + 1.0 / 3.0), "{nl}");
        // At N_L both inequalities hold, 4.6 with equality given α N_L = X_c (O_c − O_0) (eq. 4.7).
        let alpha = 1000.0 * (0.002 - 0.001) / nl;
        assert!(p().cpu_only_time(nl) + 1e-12 >= p().cpu_time(alpha, nl));
        assert!(close(
            p().cpu_only_time(nl),
            p().accelerator_time(alpha, nl)
        ));
        // No overhead and no latency: co-working always pays.
        let free = Partition {
            o_c: 0.0,
            o_0: 0.0,
            d_a: 0.0,
            ..p()
        };
        assert_eq!(free.break_even(), 0.0);
    }

    #[test]
    fn accelerator_items_follow_algorithm_2() {
        let p = p();
        assert_eq!(p.accelerator_items(0), 0);
        assert_eq!(
            p.accelerator_items(9),
            0,
            "below N_L = 9.33 all stays local"
        );
        // N = 20: α = 0.75 · (1 − 8/20) = 0.45 → 9 items.
        assert_eq!(p.accelerator_items(20), 9);
        // N = 100: 69 items (α = 0.69).
        assert_eq!(p.accelerator_items(100), 69);
        // A slow, far accelerator never gets work below its latency horizon.
        let far = Partition { d_a: 1.0, ..p };
        assert_eq!(far.accelerator_items(500), 0);
    }

    #[test]
    fn whole_items_never_leave_the_cpu_a_longer_tail_than_the_accelerator() {
        let p = p();
        // Divisible workloads agree with eq. 4.4: N = 100 → 69 (T = 33 ms).
        assert_eq!(p.accelerator_items_whole(100, 1, 3000.0), 69);
        // Below N_L everything stays on the CPU, as in Algorithm 2.
        assert_eq!(p.accelerator_items_whole(9, 1, 3000.0), 0);
        assert_eq!(p.accelerator_items_whole(0, 1, 3000.0), 0);
        // Few items, a CPU 38× slower per item, a short latency: eq. 4.4
        // gives the CPU 0.85 of 24 items, rounded to 1, which takes it
        // longer (10 ms) than the accelerator all 24 (8.75 ms).
        let few = Partition {
            x_c: 100.0,
            x_a: 3840.0,
            o_c: 0.0,
            o_0: 0.0,
            d_a: 0.0025,
        };
        assert!(few.accelerator_items(24) < 24);
        assert_eq!(few.accelerator_items_whole(24, 1, 3840.0), 24);
        // Many items: eq. 4.4's share, whole (10.0 of 400).
        let k = few.accelerator_items_whole(400, 1, 3840.0);
        assert!((389..=390).contains(&k), "{k}");
        // Two threads run whole items each: the CPU's share is even.
        let two = Partition { x_c: 480.0, ..few };
        assert_eq!((400 - two.accelerator_items_whole(400, 2, 3840.0)) % 2, 0);
        // One item: whichever side finishes it first.
        assert_eq!(few.accelerator_items_whole(1, 1, 3840.0), 1);
        let far = Partition { d_a: 0.010, ..few };
        assert_eq!(far.accelerator_items_whole(1, 1, 3840.0), 0);
    }

    #[test]
    fn a_cpu_that_slows_the_accelerator_more_than_it_adds_gets_no_work() {
        // X_c = 300/s; the accelerator: 3000/s alone, 2500/s beside the CPU.
        let p = Partition {
            x_c: 300.0,
            x_a: 3000.0,
            o_c: 0.0,
            o_0: 0.0,
            d_a: 0.001,
        };
        // Undisturbed, the CPU takes about eq. 4.4's share (10 % less D_a).
        let free = p.accelerator_items_whole(1000, 1, 3000.0);
        assert!((908..=910).contains(&free), "{free}");
        // Costing the accelerator 500/s while adding 300/s: all to it.
        assert_eq!(p.accelerator_items_whole(1000, 1, 2500.0), 1000);
        // Costing it 200/s while adding 300/s still pays; the two finish
        // together with a little more on the CPU, the accelerator being
        // slower while they share.
        let some = p.accelerator_items_whole(1000, 1, 2800.0);
        assert!((900..free).contains(&some), "{some}");
        // Large workloads take the candidates around eq. 4.4's share.
        let big = p.accelerator_items_whole(1_000_000, 1, 3000.0);
        assert!((909_000..=909_100).contains(&big), "{big}");
        assert_eq!(p.accelerator_items_whole(1_000_000, 1, 2500.0), 1_000_000);
    }

    #[test]
    fn check_refuses_unusable_parameters() {
        assert!(p().check().is_ok());
        let bad = [
            Partition { x_c: 0.0, ..p() },
            Partition {
                x_a: f64::NAN,
                ..p()
            },
            Partition { d_a: -1.0, ..p() },
            Partition {
                o_0: f64::INFINITY,
                ..p()
            },
        ];
        for (b, name) in bad.into_iter().zip(["X_c", "X_a", "D_a", "O_0"]) {
            match b.check() {
                Err(ModelError::Throughput { name: n, .. } | ModelError::Time { name: n, .. }) => {
                    assert_eq!(n, name, "{b:?}")
                }
                other => panic!("{b:?}: {other:?}"),
            }
        }
    }
}

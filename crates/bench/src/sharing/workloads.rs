//! Multi-tenant workloads generated from a seed, for `corefarm bench sharing
//! --workload NAME`: users that arrive and leave, work in bursts, favour a
//! few popular functions, and make calls of heavy-tailed sizes. Seed 002
//! §5.5's workload (every application an equal, always-busy share) is the
//! `seed` workload of mod.rs and does not change.
//!
//! - `arrivals`: users arrive as a Poisson process over a window, each
//!   makes a geometric number of calls with exponential think times between
//!   them, then leaves; Zipf popularity over 32 functions.
//! - `bursts`: a fixed set of users present from the start, each alternating
//!   bursts of back-to-back calls with exponential off periods, keeping its
//!   connection (and, in exclusive mode, its nodes) while off; 16 functions.
//! - `zipf64`: `arrivals` over 64 functions with a flatter popularity and
//!   users that change function more often: many rare functions, so
//!   programming time weighs most.
//!
//! Call sizes (node time) follow a bounded Pareto distribution; a user's
//! next call keeps its function with probability `stay`, else draws one
//! from the Zipf popularity. Every quantity is an integer number of
//! microseconds or inputs, so bench/sharing_bound.py (the overhead-free
//! model) regenerates the same workload from the same seed; tests on both
//! sides pin the same values.

use super::Rng;

/// A multi-tenant workload by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Arrivals,
    Bursts,
    Zipf64,
}

/// A name that is not a [`Workload`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a workload (seed, arrivals, bursts or zipf64)")]
pub struct UnknownWorkload(pub String);

impl std::str::FromStr for Workload {
    type Err = UnknownWorkload;

    fn from_str(s: &str) -> Result<Self, UnknownWorkload> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| UnknownWorkload(s.to_string()))
    }
}

/// How users come.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    /// Poisson arrivals at `per_s` users a second during `window_us`; each
    /// makes a geometric number of calls of mean `mean_calls`, separated by
    /// exponential think times of mean `think_us`.
    Poisson {
        per_s: f64,
        window_us: u64,
        mean_calls: f64,
        think_us: f64,
    },
    /// `users` present from the start, each making `bursts` bursts of a
    /// geometric number of back-to-back calls (mean `mean_calls`), the
    /// bursts separated by exponential off periods of mean `off_us`.
    OnOff {
        users: u32,
        bursts: u32,
        mean_calls: f64,
        off_us: f64,
    },
}

/// A workload's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub arrival: Arrival,
    /// Distinct functions; function `f`'s popularity rank is `f`.
    pub functions: u32,
    /// Zipf exponent of the functions' popularity.
    pub zipf_s: f64,
    /// Probability that a user's next call keeps its current function.
    pub stay: f64,
    /// Bounded Pareto call sizes (node time): shape and bounds in µs.
    pub alpha: f64,
    pub min_call_us: u64,
    pub max_call_us: u64,
    /// Nodes an exclusive-mode user asks for (hello `nodes`), out of
    /// `nodes`: one where users outnumber the nodes, an equal share where a
    /// fixed set of users divides them.
    pub exclusive_divisor: u32,
}

impl Workload {
    pub const ALL: [Workload; 3] = [Workload::Arrivals, Workload::Bursts, Workload::Zipf64];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Arrivals => "arrivals",
            Workload::Bursts => "bursts",
            Workload::Zipf64 => "zipf64",
        }
    }

    /// The workload's parameters; `quick` shortens it (fewer users or
    /// bursts) for a smoke run, never for results.
    pub fn shape(self, quick: bool) -> Shape {
        let window_us = if quick { 1_000_000 } else { 5_000_000 };
        match self {
            Workload::Arrivals => Shape {
                arrival: Arrival::Poisson {
                    per_s: 10.0,
                    window_us,
                    mean_calls: 8.0,
                    think_us: 100_000.0,
                },
                functions: 32,
                zipf_s: 1.1,
                stay: 0.8,
                alpha: 1.2,
                min_call_us: 5_000,
                max_call_us: 1_000_000,
                exclusive_divisor: 8,
            },
            Workload::Bursts => Shape {
                arrival: Arrival::OnOff {
                    users: 4,
                    bursts: if quick { 2 } else { 6 },
                    mean_calls: 4.0,
                    off_us: 500_000.0,
                },
                functions: 16,
                zipf_s: 1.1,
                stay: 0.8,
                alpha: 1.2,
                min_call_us: 10_000,
                max_call_us: 1_000_000,
                exclusive_divisor: 4,
            },
            Workload::Zipf64 => Shape {
                arrival: Arrival::Poisson {
                    per_s: 10.0,
                    window_us,
                    mean_calls: 8.0,
                    think_us: 100_000.0,
                },
                functions: 64,
                zipf_s: 0.8,
                stay: 0.5,
                alpha: 1.2,
                min_call_us: 5_000,
                max_call_us: 1_000_000,
                exclusive_divisor: 8,
            },
        }
    }
}

/// One call of a user: how long the user is idle before issuing it (think
/// time or off period, after the previous call's results), its function
/// and its number of inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub wait_us: u64,
    pub function: u32,
    pub inputs: u32,
}

/// One user: when it connects (µs after the start) and its calls in order;
/// it leaves after the last one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub arrive_us: u64,
    pub calls: Vec<Call>,
}

/// Per-input delay of function `f`, in µs: 100 µs to 1.6 ms as the seed
/// workload's, repeating every 16 functions.
pub fn delay_us(f: u32) -> u32 {
    super::delay_us(f % 16)
}

impl Rng {
    /// Uniform on [0, 1), 53 bits.
    fn unit(&mut self) -> f64 {
        self.below(1 << 53) as f64 / (1u64 << 53) as f64
    }

    /// Exponential of mean `mean`, rounded to an integer.
    fn exp(&mut self, mean: f64) -> u64 {
        (-mean * (1.0 - self.unit()).ln()).round() as u64
    }

    /// Geometric on 1, 2, … of mean `mean` (≥ 1).
    fn geometric(&mut self, mean: f64) -> u32 {
        let p = 1.0 / mean.max(1.0);
        if p >= 1.0 {
            self.unit();
            return 1;
        }
        1 + ((1.0 - self.unit()).ln() / (1.0 - p).ln()).floor() as u32
    }

    /// Bounded Pareto on [lo, hi] of shape `alpha`, rounded.
    fn pareto(&mut self, alpha: f64, lo: u64, hi: u64) -> u64 {
        let (l, h) = (lo as f64, hi as f64);
        let u = self.unit();
        let x = l / (1.0 - u * (1.0 - (l / h).powf(alpha))).powf(1.0 / alpha);
        (x.round() as u64).clamp(lo, hi)
    }
}

/// Cumulative Zipf weights of ranks 1..=n with exponent `s`.
fn zipf_table(n: u32, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    (1..=n)
        .map(|k| {
            acc += (k as f64).powf(-s);
            acc
        })
        .collect()
}

fn zipf(rng: &mut Rng, table: &[f64]) -> u32 {
    let u = rng.unit() * table[table.len() - 1];
    table.iter().position(|&c| u < c).unwrap_or(table.len() - 1) as u32
}

/// The users of workload `shape` from `seed`: the same seed, the same users.
pub fn generate(shape: &Shape, seed: u64) -> Vec<User> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let table = zipf_table(shape.functions, shape.zipf_s);
    let arrivals: Vec<(u64, Vec<u32>)> = match shape.arrival {
        Arrival::Poisson {
            per_s,
            window_us,
            mean_calls,
            ..
        } => {
            let mut t = 0;
            let mut out = Vec::new();
            loop {
                t += rng.exp(1e6 / per_s);
                if t > window_us {
                    break;
                }
                out.push((t, vec![rng.geometric(mean_calls)]));
            }
            out
        }
        Arrival::OnOff {
            users,
            bursts,
            mean_calls,
            ..
        } => (0..users)
            .map(|_| (0, (0..bursts).map(|_| rng.geometric(mean_calls)).collect()))
            .collect(),
    };
    arrivals
        .into_iter()
        .map(|(arrive_us, bursts)| {
            let mut calls = Vec::new();
            let mut current = None;
            for (b, n) in bursts.into_iter().enumerate() {
                for i in 0..n {
                    let wait_us = match (shape.arrival, b, i) {
                        (_, 0, 0) => 0,
                        (Arrival::Poisson { think_us, .. }, _, _) => rng.exp(think_us),
                        (Arrival::OnOff { off_us, .. }, _, 0) => rng.exp(off_us),
                        (Arrival::OnOff { .. }, _, _) => 0,
                    };
                    let function = match current {
                        Some(f) if rng.unit() < shape.stay => f,
                        _ => zipf(&mut rng, &table),
                    };
                    current = Some(function);
                    let size = rng.pareto(shape.alpha, shape.min_call_us, shape.max_call_us);
                    let inputs = (size / u64::from(delay_us(function))).max(1) as u32;
                    calls.push(Call {
                        wait_us,
                        function,
                        inputs,
                    });
                }
            }
            User { arrive_us, calls }
        })
        .collect()
}

/// Node time of a call, in µs.
pub fn node_us(c: &Call) -> u64 {
    u64::from(c.inputs) * u64::from(delay_us(c.function))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_calls(users: &[User]) -> impl Iterator<Item = &Call> {
        users.iter().flat_map(|u| u.calls.iter())
    }

    #[test]
    fn names_parse_back() {
        for w in Workload::ALL {
            assert_eq!(w.name().parse::<Workload>(), Ok(w));
        }
        assert_eq!(
            "seed".parse::<Workload>(),
            Err(UnknownWorkload("seed".into()))
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_users_and_another_seed_others() {
        for w in Workload::ALL {
            let s = w.shape(false);
            assert_eq!(generate(&s, 3), generate(&s, 3));
            assert_ne!(generate(&s, 3), generate(&s, 4));
        }
    }

    /// The same values are pinned in bench/tests/test_sharing_bound.py:
    /// the overhead-free model regenerates the workload the bench runs.
    #[test]
    fn the_workloads_are_pinned() {
        let u = generate(&Workload::Arrivals.shape(false), 1);
        assert_eq!(u.len(), 44);
        assert_eq!(u[0].arrive_us, 12_297);
        assert_eq!(
            u[0].calls[..2],
            [
                Call {
                    wait_us: 0,
                    function: 13,
                    inputs: 22
                },
                Call {
                    wait_us: 295_197,
                    function: 13,
                    inputs: 4
                }
            ]
        );
        let total: u64 = all_calls(&u).map(node_us).sum();
        assert_eq!(total, 5_611_900);
        let b = generate(&Workload::Bursts.shape(false), 1);
        assert_eq!(b.len(), 4);
        assert_eq!(
            b.iter().map(|u| u.calls.len()).collect::<Vec<_>>(),
            [13, 15, 11, 37]
        );
    }

    #[test]
    fn poisson_arrivals_come_at_the_rate_within_the_window() {
        let s = Workload::Arrivals.shape(false);
        let Arrival::Poisson {
            per_s, window_us, ..
        } = s.arrival
        else {
            unreachable!()
        };
        let mut n = 0usize;
        let seeds = 200;
        for seed in 1..=seeds {
            let u = generate(&s, seed);
            assert!(u.windows(2).all(|w| w[0].arrive_us <= w[1].arrive_us));
            assert!(u.iter().all(|u| u.arrive_us <= window_us));
            n += u.len();
        }
        let expected = per_s * window_us as f64 * 1e-6 * seeds as f64;
        // A Poisson count of mean 10 000 has a standard deviation of 100.
        assert!((n as f64 - expected).abs() < 4.0 * expected.sqrt(), "{n}");
        // The first arrival is one exponential gap (later gaps are biased
        // short by the window's end): its standard deviation is its mean.
        let first: Vec<f64> = (1..=4000)
            .map(|seed| generate(&s, seed)[0].arrive_us as f64)
            .collect();
        let mean = first.iter().sum::<f64>() / first.len() as f64;
        let sd =
            (first.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / first.len() as f64).sqrt();
        assert!((mean - 1e6 / per_s).abs() < 0.05 * 1e6 / per_s, "{mean}");
        assert!((sd / mean - 1.0).abs() < 0.1, "{sd} {mean}");
    }

    #[test]
    fn sessions_are_geometric_with_their_mean() {
        let s = Workload::Arrivals.shape(false);
        let lens: Vec<f64> = (1..=200)
            .flat_map(|seed| generate(&s, seed))
            .map(|u| u.calls.len() as f64)
            .collect();
        let mean = lens.iter().sum::<f64>() / lens.len() as f64;
        assert!((mean - 8.0).abs() < 0.3, "{mean}");
        assert!(lens.iter().all(|&l| l >= 1.0));
        // Geometric: P(length = 1) = 1 / mean.
        let ones = lens.iter().filter(|&&l| l == 1.0).count() as f64 / lens.len() as f64;
        assert!((ones - 0.125).abs() < 0.02, "{ones}");
    }

    #[test]
    fn popularity_is_zipf() {
        for w in [Workload::Arrivals, Workload::Zipf64] {
            let s = w.shape(false);
            let mut count = vec![0f64; s.functions as usize];
            for seed in 1..=300 {
                for u in generate(&s, seed) {
                    // A user's first call is a fresh draw from the popularity.
                    count[u.calls[0].function as usize] += 1.0;
                }
            }
            // Rank 1 over rank 2 and rank 1 over rank 4: 2^s and 4^s.
            let r2 = count[0] / count[1];
            let r4 = count[0] / count[3];
            assert!((r2 / 2f64.powf(s.zipf_s) - 1.0).abs() < 0.15, "{w:?} {r2}");
            assert!((r4 / 4f64.powf(s.zipf_s) - 1.0).abs() < 0.2, "{w:?} {r4}");
            assert!(count.iter().all(|&c| c > 0.0) || w == Workload::Zipf64);
        }
    }

    #[test]
    fn call_sizes_are_heavy_tailed_within_their_bounds() {
        let s = Workload::Arrivals.shape(false);
        let sizes: Vec<u64> = (1..=100)
            .flat_map(|seed| generate(&s, seed))
            .flat_map(|u| u.calls)
            .map(|c| node_us(&c))
            .collect();
        // Whole inputs: at most one input's delay under the bound.
        assert!(sizes
            .iter()
            .all(|&x| x + 1600 > s.min_call_us && x <= s.max_call_us));
        let mut sorted = sizes.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2] as f64;
        let mean = sizes.iter().sum::<u64>() as f64 / sizes.len() as f64;
        // Pareto(1.2) from 5 ms: median 5 ms × 2^(1/1.2) ≈ 9 ms, the mean
        // pulled far above it by the tail; the largest 1 % of calls carry
        // over a fifth of the node time.
        assert!((7_500.0..11_000.0).contains(&median), "{median}");
        assert!(mean > 1.8 * median, "{mean} {median}");
        let top: u64 = sorted[sorted.len() * 99 / 100..].iter().sum();
        assert!(top as f64 > 0.2 * sizes.iter().sum::<u64>() as f64);
    }

    #[test]
    fn bursts_alternate_back_to_back_calls_with_off_periods() {
        let s = Workload::Bursts.shape(false);
        let Arrival::OnOff { users, bursts, .. } = s.arrival else {
            unreachable!()
        };
        for seed in 1..=20 {
            let u = generate(&s, seed);
            assert_eq!(u.len(), users as usize);
            for user in &u {
                assert_eq!(user.arrive_us, 0);
                assert_eq!(user.calls[0].wait_us, 0);
                let offs = user.calls.iter().filter(|c| c.wait_us > 0).count();
                // One off period before every burst but the first (an
                // exponential draw rounds to 0 µs with negligible odds).
                assert!(offs < bursts as usize && offs + 2 >= bursts as usize);
            }
        }
    }

    #[test]
    fn users_keep_their_function_with_probability_stay() {
        for w in Workload::ALL {
            let s = w.shape(false);
            let (mut same, mut pairs) = (0f64, 0f64);
            for seed in 1..=100 {
                for u in generate(&s, seed) {
                    for p in u.calls.windows(2) {
                        pairs += 1.0;
                        same += f64::from(p[0].function == p[1].function);
                    }
                }
            }
            // Staying, or drawing the same function again from the popularity.
            let r = same / pairs;
            assert!(r >= s.stay - 0.03 && r < s.stay + 0.15, "{w:?} {r}");
        }
    }
}

//! Performance models of the fabric and its collectives, as the seeds give
//! them, so measured runs can be compared with predictions. Plain functions
//! of plain numbers: they can move to a model crate unchanged.
//!
//! - Seed 003 §5.4.2, equations 5.3 and 5.4: latency of broadcast and reduce
//!   in units of P, the time to move the payload over one stage, plus O, the
//!   per-combination overhead of a reduce; equation 5.5: the bandwidth of a
//!   tree is the link rate divided by its number of stages.
//! - Seed 001 §IV, equations 1–7: the time of a packet over a path of k links
//!   with an M/M/1 queue per hub.
//!
//! These are the seeds' equations as printed, in units of P and O. The
//! calibrated form that predicts seconds (chunk pipelining, per-hop
//! bandwidth, parameters fitted on the machine by `corefarm model
//! calibrate`) is `corefarm_model::collectives`, which `auto` uses.

use corefarm_smp::Algo;

fn log2_ceil(n: u32) -> f64 {
    f64::from(n.max(1).next_power_of_two().trailing_zeros())
}

/// Stages of payload movement in seed 003's time charts: 2 + (n − 1) for the
/// linear and star trees, 2 + log2 n for the binomial tree (⌈log2 n⌉ when
/// n is not a power of two).
pub fn stages(algo: Algo, n: u32) -> f64 {
    match algo {
        Algo::Linear | Algo::Star => 2.0 + f64::from(n.saturating_sub(1)),
        Algo::Binomial => 2.0 + log2_ceil(n),
    }
}

/// Combining steps on the critical path of a reduce: n − 1 (linear, star), log2 n (binomial).
pub fn combines(algo: Algo, n: u32) -> f64 {
    match algo {
        Algo::Linear | Algo::Star => f64::from(n.saturating_sub(1)),
        Algo::Binomial => log2_ceil(n),
    }
}

/// Equation 5.3: T_broadcast = stages × P.
pub fn t_broadcast(algo: Algo, n: u32, p: f64) -> f64 {
    stages(algo, n) * p
}

/// Equation 5.4: T_reduce = stages × P + combines × O.
pub fn t_reduce(algo: Algo, n: u32, p: f64, o: f64) -> f64 {
    stages(algo, n) * p + combines(algo, n) * o
}

/// Allreduce as corefarm runs it: a reduce then a broadcast.
pub fn t_allreduce(algo: Algo, n: u32, p: f64, o: f64) -> f64 {
    t_reduce(algo, n, p, o) + t_broadcast(algo, n, p)
}

/// Equation 5.5: B = link rate / N_stage.
pub fn max_bandwidth(link_rate: f64, algo: Algo, n: u32) -> f64 {
    link_rate / stages(algo, n)
}

/// One measured collective, for [`calibrate`].
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub algo: Algo,
    pub n: u32,
    /// True for a reduce (then O counts), false for a broadcast.
    pub reduce: bool,
    pub seconds: f64,
}

/// P and O fitted to measurements by least squares on equations 5.3/5.4
/// (T = a·P + b·O with a = stages, b = combines or 0). Only P is fitted when
/// no sample is a reduce. `None` without samples or with a degenerate system.
pub fn calibrate(samples: &[Sample]) -> Option<(f64, f64)> {
    let rows: Vec<(f64, f64, f64)> = samples
        .iter()
        .map(|s| {
            let b = if s.reduce { combines(s.algo, s.n) } else { 0.0 };
            (stages(s.algo, s.n), b, s.seconds)
        })
        .collect();
    let (mut aa, mut ab, mut bb, mut at, mut bt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(a, b, t) in &rows {
        aa += a * a;
        ab += a * b;
        bb += b * b;
        at += a * t;
        bt += b * t;
    }
    if aa == 0.0 {
        return None;
    }
    if bb == 0.0 {
        return Some((at / aa, 0.0));
    }
    let det = aa * bb - ab * ab;
    if det.abs() < 1e-12 * aa * bb {
        return None;
    }
    Some(((at * bb - bt * ab) / det, (aa * bt - ab * at) / det))
}

/// Seed 001 table I: platform parameters (seconds, bits, bits per second).
#[derive(Debug, Clone, Copy)]
pub struct LinkParams {
    /// T_l: link transmission latency.
    pub t_link: f64,
    /// T_r: routing latency at each hub.
    pub t_route: f64,
    /// T_a: application to routing logic latency (each end).
    pub t_app: f64,
    /// B_l: link bandwidth.
    pub bandwidth: f64,
    /// Outgoing links per node (4 in the seed's 2-D torus).
    pub links: f64,
}

impl LinkParams {
    /// T_pkt = p / B_l.
    pub fn t_packet(&self, bits: f64) -> f64 {
        bits / self.bandwidth
    }

    /// Equation 1: T = (k − 1)(T_l + T_r + T_pkt) + 2 T_a, without queueing.
    pub fn t_path(&self, k: f64, bits: f64) -> f64 {
        (k - 1.0) * (self.t_link + self.t_route + self.t_packet(bits)) + 2.0 * self.t_app
    }

    /// Equations 2–5: utilisation ρ, expected queue length q̃ and waiting
    /// time T_q of one hub's M/M/1 queue at `rate` packets per second
    /// generated per node. `None` when the queue is unstable (ρ ≥ 1).
    pub fn queue(&self, rate: f64, bits: f64) -> Option<(f64, f64, f64)> {
        let eq = rate / self.links;
        let dq = 1.0 / self.t_packet(bits);
        let rho = eq / dq;
        (rho < 1.0).then(|| (rho, rho * rho / (1.0 - rho), rho / (dq - eq)))
    }

    /// Equations 6–7: T̃ = (k̃ − 1)(T_l + T_r + T_p) with T_p = T_s + T_q + T_pkt
    /// (scheduling delay T_s ≈ 0 for round robin), plus 2 T_a.
    pub fn t_average(&self, k: f64, bits: f64, rate: f64) -> Option<f64> {
        let (_, _, tq) = self.queue(rate, bits)?;
        let tp = tq + self.t_packet(bits);
        Some((k - 1.0) * (self.t_link + self.t_route + tp) + 2.0 * self.t_app)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_003_equations() {
        // n = 16: binomial 2 + 4 stages, linear and star 2 + 15.
        assert_eq!(t_broadcast(Algo::Binomial, 16, 1.0), 6.0);
        assert_eq!(t_broadcast(Algo::Linear, 16, 2.0), 34.0);
        assert_eq!(t_reduce(Algo::Star, 4, 1.0, 0.5), 5.0 + 1.5);
        assert_eq!(t_reduce(Algo::Binomial, 5, 1.0, 1.0), 5.0 + 3.0);
        assert_eq!(max_bandwidth(3.2, Algo::Binomial, 4), 0.8);
    }

    #[test]
    fn calibration_recovers_p_and_o() {
        let (p, o) = (3e-6, 0.7e-6);
        let mut s = Vec::new();
        for algo in [Algo::Linear, Algo::Binomial, Algo::Star] {
            for n in [4, 8, 16] {
                s.push(Sample {
                    algo,
                    n,
                    reduce: false,
                    seconds: t_broadcast(algo, n, p),
                });
                s.push(Sample {
                    algo,
                    n,
                    reduce: true,
                    seconds: t_reduce(algo, n, p, o),
                });
            }
        }
        let (fp, fo) = calibrate(&s).unwrap();
        assert!(
            (fp - p).abs() < 1e-12 && (fo - o).abs() < 1e-12,
            "{fp} {fo}"
        );
        let only_bcast: Vec<Sample> = s.iter().copied().filter(|x| !x.reduce).collect();
        assert!((calibrate(&only_bcast).unwrap().0 - p).abs() < 1e-12);
        assert!(calibrate(&[]).is_none());
    }

    #[test]
    fn seed_001_model_with_table_i_values() {
        let l = LinkParams {
            t_link: 0.0,
            t_route: 0.57e-6,
            t_app: 0.13e-6,
            bandwidth: 1600e6,
            links: 4.0,
        };
        // A zero-byte packet between neighbours: 2 T_a = 0.26 µs; each hop adds T_r (§VI: 0.57 µs).
        assert!((l.t_path(1.0, 0.0) - 0.26e-6).abs() < 1e-15);
        assert!((l.t_path(3.0, 0.0) - l.t_path(2.0, 0.0) - 0.57e-6).abs() < 1e-15);
        let (rho, _, _) = l.queue(1e6, 528.0).unwrap();
        assert!((rho - 1e6 / 4.0 * 528.0 / 1600e6).abs() < 1e-12);
        assert!(l.queue(1e8, 528.0).is_none());
        assert!(l.t_average(2.0, 528.0, 1e6).unwrap() > l.t_path(2.0, 528.0));
    }
}

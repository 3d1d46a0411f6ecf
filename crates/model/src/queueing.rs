//! Queueing models for links and priority classes (seed 001 §IV).
//!
//! Seed 001 models each hop of a packet as an M/M/1 queue in front of a
//! server of rate μ; corefarm applies the same to every queue on a message's
//! path (server ingress, per-node dispatch, node input, result path). With
//! priority classes served non-preemptively (a message in service finishes
//! even if a more urgent one arrives, which is what a framed link does), the
//! mean wait of class k (1 = most urgent) is Cobham's formula
//!
//! `W_k = W0 / ((1 − σ_{k−1})(1 − σ_k))`,   `W0 = Σ_i λ_i E[S_i²] / 2`,
//!
//! with σ_k = Σ_{i≤k} ρ_i and ρ_i = λ_i / μ_i; the time in system adds the
//! service time 1/μ_k. For exponential service `E[S²] = 2/μ²`, so
//! W0 = Σ ρ_i / μ_i. Buffer depths follow from the queue-length
//! distribution: geometric for M/M/1, and approximated as geometric with the
//! class's mean occupancy (Little: L_k = λ_k T_k) for the priority classes.
//!
//! Units: rates in messages per second, times in seconds.

/// One M/M/1 queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mm1 {
    /// Arrival rate λ.
    pub lambda: f64,
    /// Service rate μ.
    pub mu: f64,
}

impl Mm1 {
    /// Utilisation ρ = λ/μ.
    pub fn rho(&self) -> f64 {
        self.lambda / self.mu
    }

    fn stable(&self) -> bool {
        self.mu > 0.0 && self.lambda >= 0.0 && self.rho() < 1.0
    }

    /// Mean time in system 1/(μ − λ); `None` when the queue is unstable.
    pub fn time_in_system(&self) -> Option<f64> {
        self.stable().then(|| 1.0 / (self.mu - self.lambda))
    }

    /// Mean wait before service ρ/(μ − λ).
    pub fn wait(&self) -> Option<f64> {
        self.stable().then(|| self.rho() / (self.mu - self.lambda))
    }

    /// Mean number in system ρ/(1 − ρ).
    pub fn mean_in_system(&self) -> Option<f64> {
        self.stable().then(|| self.rho() / (1.0 - self.rho()))
    }

    /// Smallest depth n with P(N ≥ n) = ρⁿ ≤ `overflow`: a buffer of n
    /// messages overflows at most that often.
    pub fn depth_for(&self, overflow: f64) -> Option<u32> {
        depth_geometric(self.stable().then(|| self.rho())?, overflow)
    }
}

/// Smallest n with qⁿ ≤ ε for a geometric tail of ratio q (at least 1).
fn depth_geometric(q: f64, overflow: f64) -> Option<u32> {
    if !((0.0..1.0).contains(&q) && overflow > 0.0 && overflow < 1.0) {
        return None;
    }
    if q == 0.0 {
        return Some(1);
    }
    Some(((overflow.ln() / q.ln()).ceil() as u32).max(1))
}

/// One priority class: its arrival rate and its own service rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Class {
    pub lambda: f64,
    pub mu: f64,
}

/// Per-class figures of a non-preemptive priority queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassFigures {
    /// Mean wait before service.
    pub wait: f64,
    /// Mean time in system (wait + service).
    pub time_in_system: f64,
    /// Mean number waiting (Little: λ·W).
    pub mean_waiting: f64,
    /// Mean number in the queue including the one in service (λ·T).
    pub mean_in_system: f64,
}

/// Cobham's formula for classes in priority order (index 0 = most urgent),
/// exponential service per class. `None` for a class whose cumulative load
/// σ_k reaches 1 (it and every lower class are unstable).
pub fn priority_classes(classes: &[Class]) -> Vec<Option<ClassFigures>> {
    let general: Vec<GeneralClass> = classes.iter().map(|&c| c.into()).collect();
    priority_classes_general(&general)
}

/// One priority class with any service-time distribution (M/G/1): its
/// arrival rate and the first two moments of its service time, as a
/// measurement gives them (a link's service is closer to constant than to
/// exponential, and W0 depends on `E[S²]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeneralClass {
    pub lambda: f64,
    /// `E[S]`, seconds.
    pub mean: f64,
    /// `E[S²]`, seconds².
    pub second_moment: f64,
}

impl From<Class> for GeneralClass {
    /// Exponential service of rate μ: `E[S] = 1/μ`, `E[S²] = 2/μ²`.
    fn from(c: Class) -> GeneralClass {
        let (mean, second_moment) = if c.mu > 0.0 {
            (1.0 / c.mu, 2.0 / (c.mu * c.mu))
        } else {
            (f64::INFINITY, f64::INFINITY)
        };
        GeneralClass {
            lambda: c.lambda,
            mean,
            second_moment,
        }
    }
}

/// Cobham's formula with `W0 = Σ λ_i E[S_i²] / 2` (M/G/1 non-preemptive
/// priority); [`priority_classes`] is the exponential case.
pub fn priority_classes_general(classes: &[GeneralClass]) -> Vec<Option<ClassFigures>> {
    let valid = |c: &GeneralClass| {
        c.lambda >= 0.0 && c.mean > 0.0 && c.mean.is_finite() && c.second_moment.is_finite()
    };
    let w0: f64 = classes
        .iter()
        .filter(|c| valid(c))
        .map(|c| c.lambda * c.second_moment / 2.0)
        .sum();
    let mut sigma_prev = 0.0;
    classes
        .iter()
        .map(|c| {
            if !valid(c) {
                return None;
            }
            let sigma = sigma_prev + c.lambda * c.mean;
            let out = (sigma < 1.0).then(|| {
                let wait = w0 / ((1.0 - sigma_prev) * (1.0 - sigma));
                ClassFigures {
                    wait,
                    time_in_system: wait + c.mean,
                    mean_waiting: c.lambda * wait,
                    mean_in_system: c.lambda * (wait + c.mean),
                }
            });
            sigma_prev = sigma;
            out
        })
        .collect()
}

/// Buffer depth per class (the message in service included) so that each
/// overflows at most `overflow` of the time, approximating each class's
/// occupancy as geometric with the class's mean (exact for a single
/// class, which is M/M/1: mean ρ/(1−ρ), ratio ρ).
pub fn class_depths(classes: &[Class], overflow: f64) -> Vec<Option<u32>> {
    let general: Vec<GeneralClass> = classes.iter().map(|&c| c.into()).collect();
    class_depths_general(&general, overflow)
}

/// [`class_depths`] for any service-time distribution (the moments a
/// measurement gives, as in [`priority_classes_general`]).
pub fn class_depths_general(classes: &[GeneralClass], overflow: f64) -> Vec<Option<u32>> {
    priority_classes_general(classes)
        .into_iter()
        .map(|f| {
            let l = f?.mean_in_system;
            depth_geometric(l / (1.0 + l), overflow)
        })
        .collect()
}

/// Seed 001's per-path latency with a queue per hop: `hops` identical
/// M/M/1 hops, each adding its time in system, plus a fixed propagation
/// and processing cost per hop.
pub fn path_latency(hops: u32, hop: Mm1, fixed_per_hop: f64) -> Option<f64> {
    Some(f64::from(hops) * (hop.time_in_system()? + fixed_per_hop))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn general_depths_match_the_exponential_ones_for_exponential_moments() {
        let classes = [
            Class {
                lambda: 30.0,
                mu: 250.0,
            },
            Class {
                lambda: 70.0,
                mu: 250.0,
            },
        ];
        let general: Vec<GeneralClass> = classes.iter().map(|&c| c.into()).collect();
        let d = class_depths(&classes, 1e-3);
        assert_eq!(d, class_depths_general(&general, 1e-3));
        // The urgent class needs the shallower buffer.
        assert!(d[0].unwrap() < d[1].unwrap(), "{d:?}");
        // Constant service (E[S²] = E[S]²) waits less, so needs no more.
        let constant: Vec<GeneralClass> = general
            .iter()
            .map(|g| GeneralClass {
                second_moment: g.mean * g.mean,
                ..*g
            })
            .collect();
        let c = class_depths_general(&constant, 1e-3);
        assert!(c[1].unwrap() <= d[1].unwrap(), "{c:?} {d:?}");
    }

    #[test]
    fn mm1_textbook_values() {
        let q = Mm1 {
            lambda: 8.0,
            mu: 10.0,
        };
        assert!(close(q.rho(), 0.8));
        assert!(close(q.time_in_system().unwrap(), 0.5));
        assert!(close(q.wait().unwrap(), 0.4));
        assert!(close(q.mean_in_system().unwrap(), 4.0));
        // P(N >= n) = 0.8^n <= 1e-3 first at n = 31.
        assert_eq!(q.depth_for(1e-3), Some(31));
        assert_eq!(
            Mm1 {
                lambda: 10.0,
                mu: 10.0
            }
            .time_in_system(),
            None
        );
        assert_eq!(q.depth_for(0.0), None);
    }

    #[test]
    fn one_priority_class_is_mm1() {
        let f = priority_classes(&[Class {
            lambda: 8.0,
            mu: 10.0,
        }])[0]
            .unwrap();
        assert!(close(f.wait, 0.4));
        assert!(close(f.time_in_system, 0.5));
        assert_eq!(
            class_depths(
                &[Class {
                    lambda: 8.0,
                    mu: 10.0
                }],
                1e-3
            ),
            vec![Some(31)]
        );
    }

    #[test]
    fn cobham_two_classes() {
        // ρ1 = 0.3, ρ2 = 0.5, μ = 10 both: W0 = (0.3 + 0.5)/10 = 0.08.
        let c = [
            Class {
                lambda: 3.0,
                mu: 10.0,
            },
            Class {
                lambda: 5.0,
                mu: 10.0,
            },
        ];
        let f = priority_classes(&c);
        let (hi, lo) = (f[0].unwrap(), f[1].unwrap());
        assert!(close(hi.wait, 0.08 / 0.7));
        assert!(close(lo.wait, 0.08 / (0.7 * 0.2)));
        // Conservation: the load-weighted mean wait equals FCFS M/M/1's
        // (same μ for both classes).
        let mean = (3.0 * hi.wait + 5.0 * lo.wait) / 8.0;
        let fcfs = Mm1 {
            lambda: 8.0,
            mu: 10.0,
        }
        .wait()
        .unwrap();
        assert!(close(mean, fcfs), "{mean} vs {fcfs}");
        // Urgent traffic waits less, and needs a shallower buffer.
        let d = class_depths(&c, 1e-3);
        assert!(d[0].unwrap() < d[1].unwrap());
    }

    #[test]
    fn overload_makes_the_lower_classes_unstable() {
        let c = [
            Class {
                lambda: 6.0,
                mu: 10.0,
            },
            Class {
                lambda: 5.0,
                mu: 10.0,
            },
        ];
        let f = priority_classes(&c);
        assert!(f[0].is_some() && f[1].is_none());
        assert_eq!(class_depths(&c, 1e-3)[1], None);
    }

    #[test]
    fn path_adds_hops() {
        let hop = Mm1 {
            lambda: 0.0,
            mu: 1000.0,
        };
        assert!(close(
            path_latency(3, hop, 1e-4).unwrap(),
            3.0 * (1e-3 + 1e-4)
        ));
    }

    #[test]
    fn general_classes_reduce_to_the_exponential_and_to_pollaczek_khinchine() {
        let exp = [
            Class {
                lambda: 2.0,
                mu: 10.0,
            },
            Class {
                lambda: 5.0,
                mu: 10.0,
            },
        ];
        let general: Vec<GeneralClass> = exp.iter().map(|&c| c.into()).collect();
        for (a, b) in priority_classes(&exp)
            .iter()
            .zip(priority_classes_general(&general))
        {
            assert!(close(a.unwrap().wait, b.unwrap().wait));
        }
        // One class of constant service (M/D/1): W = ρ S / (2 (1 − ρ)).
        let (lambda, s) = (6.0, 0.1);
        let md1 = priority_classes_general(&[GeneralClass {
            lambda,
            mean: s,
            second_moment: s * s,
        }]);
        let rho = lambda * s;
        assert!(close(md1[0].unwrap().wait, rho * s / (2.0 * (1.0 - rho))));
    }
}

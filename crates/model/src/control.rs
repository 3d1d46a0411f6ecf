//! The server as a control plane: what it holds and spends per node, per
//! user and per event, and so how large a cluster one server can run.
//!
//! With the direct data path a server moves no data: its load is the
//! connections it holds (memory, and a little CPU while they are idle) and
//! the events it handles — a node connecting, a configuration fanned out to
//! a user's nodes, a user's session, a group opening, a status request or a
//! scrape, and the data messages that still go through it. Each event has a
//! measured cost (`corefarm bench scale`); the load of a cluster is their
//! sum at the rates the cluster sees them:
//!
//! - memory: `base + per_node·N + per_user·U`;
//! - CPU (CPUs kept busy): `idle_per_node·N + Σ rate_e · cost_e`, where a
//!   configuration costs `per_config + k·(per_config_node + per_config_node_log·ln(k/k₀))`
//!   for `k` nodes and a status or scrape `per_status_node·N`;
//! - a configuration's fan-out time: `fanout_fixed + fanout_per_node·k`
//!   (the server sends to and hears from each node in turn; the nodes
//!   configure in parallel).
//!
//! One server saturates when the CPU it needs reaches the CPUs it has, or
//! its memory the memory it has; [`ControlCosts::max_nodes`] solves for N.

use serde::{Deserialize, Serialize};

/// Measured costs of each event and each connection (seconds of CPU, bytes
/// of resident memory, seconds of wall time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlCosts {
    /// Resident bytes of a server without peers.
    pub mem_base: f64,
    /// Resident bytes per idle connected node.
    pub mem_per_node: f64,
    /// Resident bytes per connected user session.
    pub mem_per_user: f64,
    /// CPU seconds per node connection (accept, hello, registration).
    pub cpu_connect: f64,
    /// CPU seconds per second of a server with no work (its timers).
    #[serde(default)]
    pub cpu_idle_base: f64,
    /// CPU seconds per second per idle node (timers, keep-alives: the
    /// nodes send no heartbeat; a node's only reports are its answers).
    pub cpu_idle_node: f64,
    /// CPU seconds per configuration, fixed part.
    pub cpu_config: f64,
    /// CPU seconds per node a configuration is fanned out to.
    pub cpu_config_node: f64,
    /// CPU seconds per user session (connect, hello, close).
    pub cpu_session: f64,
    /// CPU seconds per group opened and closed.
    pub cpu_group_open: f64,
    /// CPU seconds per data message through the server.
    pub cpu_message_server: f64,
    /// Server CPU seconds per data message on the direct path.
    pub cpu_message_direct: f64,
    /// CPU seconds per status request or scrape listing every node, fixed part.
    #[serde(default)]
    pub cpu_status: f64,
    /// CPU seconds per node per status request or scrape listing every node.
    pub cpu_status_node: f64,
    /// Wall seconds of a configuration's fan-out, fixed part.
    pub fanout_fixed: f64,
    /// Wall seconds of a configuration's fan-out per node.
    pub fanout_per_node: f64,
}

/// What a cluster asks of its server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlLoad {
    /// Connected nodes.
    pub nodes: f64,
    /// Connected user sessions.
    pub users: f64,
    /// Nodes connecting per second (churn: restarts, reconnections).
    pub connects_per_s: f64,
    /// Configurations per second, and the nodes each reaches.
    pub configs_per_s: f64,
    pub nodes_per_config: f64,
    /// User sessions opened per second.
    pub sessions_per_s: f64,
    /// Groups opened per second.
    pub group_opens_per_s: f64,
    /// Data messages per second through the server, and on the direct path.
    pub messages_server_per_s: f64,
    pub messages_direct_per_s: f64,
    /// Status requests or scrapes listing every node, per second.
    pub full_status_per_s: f64,
}

/// The server's predicted load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlPrediction {
    /// Resident bytes.
    pub memory_bytes: f64,
    /// CPUs kept busy on average (CPU seconds per second).
    pub cpus: f64,
    /// Wall seconds of one configuration's fan-out to `nodes_per_config` nodes.
    pub fanout_s: f64,
}

impl ControlCosts {
    /// The server's memory and CPU under `l`.
    pub fn predict(&self, l: &ControlLoad) -> ControlPrediction {
        let memory_bytes =
            self.mem_base + self.mem_per_node * l.nodes + self.mem_per_user * l.users;
        let cpus = self.cpu_idle_base
            + self.cpu_idle_node * l.nodes
            + l.connects_per_s * self.cpu_connect
            + l.configs_per_s * (self.cpu_config + self.cpu_config_node * l.nodes_per_config)
            + l.sessions_per_s * self.cpu_session
            + l.group_opens_per_s * self.cpu_group_open
            + l.messages_server_per_s * self.cpu_message_server
            + l.messages_direct_per_s * self.cpu_message_direct
            + l.full_status_per_s * self.status_cpu_s(l.nodes);
        ControlPrediction {
            memory_bytes,
            cpus,
            fanout_s: self.fanout_s(l.nodes_per_config),
        }
    }

    /// Wall seconds for a configuration to reach `nodes` nodes and be answered.
    pub fn fanout_s(&self, nodes: f64) -> f64 {
        self.fanout_fixed + self.fanout_per_node * nodes
    }

    /// CPU seconds of one status request or scrape listing `nodes` nodes.
    pub fn status_cpu_s(&self, nodes: f64) -> f64 {
        self.cpu_status + self.cpu_status_node * nodes
    }

    /// CPU seconds of one configuration fanned out to `nodes` nodes.
    pub fn config_cpu_s(&self, nodes: f64) -> f64 {
        self.cpu_config + nodes * self.cpu_config_node
    }

    /// The most nodes one server holds with `cpus` CPUs and `memory`
    /// bytes, when the load per node is `per_node` (the rates of
    /// [`ControlLoad`] per connected node; its `nodes` and `users` are
    /// ignored) and users are `users_per_node` per node: the smaller of the
    /// CPU bound and the memory bound (`f64::INFINITY` when neither grows
    /// with the nodes).
    pub fn max_nodes(
        &self,
        per_node: &ControlLoad,
        users_per_node: f64,
        cpus: f64,
        memory: f64,
    ) -> f64 {
        let one = ControlLoad {
            nodes: 1.0,
            users: users_per_node,
            ..*per_node
        };
        // What does not grow with the nodes: the idle server, and each
        // status request's fixed part (its rate does grow).
        let fixed = ControlCosts {
            cpu_idle_base: 0.0,
            cpu_status: 0.0,
            ..*self
        };
        let per_request = per_node.full_status_per_s * self.cpu_status;
        let cpus = (cpus - self.cpu_idle_base).max(0.0);
        // Both are linear in N with these rates: cost(N) = N · cost(1),
        // except the full-status term, which is N² (every node per request,
        // requests in proportion to the nodes).
        let p = fixed.predict(&one);
        let cpu_bound = match p.cpus + per_request {
            c if c > 0.0 && per_node.full_status_per_s > 0.0 => {
                // a·N + b·N² = cpus, with b the full-status part.
                let b = per_node.full_status_per_s * self.cpu_status_node;
                let a = c - b;
                (-a + (a * a + 4.0 * b * cpus).sqrt()) / (2.0 * b)
            }
            c if c > 0.0 => cpus / c,
            _ => f64::INFINITY,
        };
        let grow = self.mem_per_node + self.mem_per_user * users_per_node;
        let mem_bound = match grow {
            g if g > 0.0 => ((memory - self.mem_base) / g).max(0.0),
            _ => f64::INFINITY,
        };
        cpu_bound.min(mem_bound)
    }
}

/// `ln x` for `x ≥ 1`, else 0: the growing part of a per-node cost that
/// rises with the log of the node count (none below one node).
pub fn ln1(x: f64) -> f64 {
    if x > 1.0 {
        x.ln()
    } else {
        0.0
    }
}

/// The median, mean and spread of repeated measurements of one figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub samples: usize,
    /// What the model is fitted to and judged by: a sample's window can
    /// also hold work that is not the event's (a burst of the simulated
    /// nodes that share the machine, another process), which moves one
    /// sample by several times and the mean with it, not the median.
    #[serde(default)]
    pub median: f64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// Sample standard deviation (0 for a single sample).
    pub stdev: f64,
}

impl Spread {
    /// `None` for no samples.
    pub fn of(xs: &[f64]) -> Option<Spread> {
        if xs.is_empty() {
            return None;
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = if xs.len() > 1 {
            xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
        } else {
            0.0
        };
        let mut sorted = xs.to_vec();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        let median = match sorted.len() % 2 {
            1 => sorted[mid],
            _ => (sorted[mid - 1] + sorted[mid]) / 2.0,
        };
        Some(Spread {
            samples: xs.len(),
            median,
            mean,
            min: xs.iter().copied().fold(f64::INFINITY, f64::min),
            max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            stdev: var.sqrt(),
        })
    }
}

/// A cost `y = Σ βⱼ·fⱼ(x)` with every `βⱼ ≥ 0` (a cost has no negative
/// part) fitted by least squares on the relative error over every sample
/// (each row weighted `1/|y|`, so a small cluster's samples count as much
/// as a large one's: the model is judged by its relative error). Several
/// samples per size carry their spread into the fit. `None` without rows
/// or when the features cannot be fitted.
pub fn fit_costs(samples: &[(f64, f64)], features: &[&dyn Fn(f64) -> f64]) -> Option<Vec<f64>> {
    let rows: Vec<Vec<f64>> = samples
        .iter()
        .map(|&(x, _)| features.iter().map(|f| f(x)).collect())
        .collect();
    let y: Vec<f64> = samples.iter().map(|s| s.1).collect();
    let w: Vec<f64> = y
        .iter()
        .map(|v| if *v != 0.0 { 1.0 / v.abs() } else { 1.0 })
        .collect();
    crate::lsq::nnls(&rows, &y, &w)
}

/// A figure at the floor of what its measurement resolves, such as the CPU
/// of a server whose nodes are idle (its timers and the observer's
/// session: a few ms per second at every size, moving between windows by
/// about as much as any per-node part could add).
///
/// The line `a + b·x` is fitted by ordinary least squares over every
/// sample; its slope is kept only when it exceeds twice its standard error
/// (the samples resolve it); otherwise the figure is the mean of the
/// samples and `b = 0`, and `slope_resolution` (twice the slope's standard
/// error) bounds what a per-node part can be. A slope from the noise
/// between sizes would otherwise predict, ten times further out, ten
/// times the noise. `resolution` is twice the residuals' standard
/// deviation: how far one mean of this measurement moves by itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FloorFit {
    pub base: f64,
    pub slope: f64,
    pub slope_resolution: f64,
    pub resolution: f64,
}

/// See [`FloorFit`]; `None` with fewer than three samples or a single `x`.
pub fn fit_floor(samples: &[(f64, f64)]) -> Option<FloorFit> {
    if samples.len() < 3 {
        return None;
    }
    let (a, b) = fit_free(samples)?;
    let n = samples.len() as f64;
    let mx = samples.iter().map(|p| p.0).sum::<f64>() / n;
    let sxx: f64 = samples.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let rss: f64 = samples.iter().map(|p| (p.1 - a - b * p.0).powi(2)).sum();
    let sigma = (rss / (n - 2.0)).sqrt();
    let slope_resolution = 2.0 * sigma / sxx.sqrt();
    let resolution = 2.0 * sigma;
    if b > slope_resolution && a >= 0.0 {
        return Some(FloorFit {
            base: a,
            slope: b,
            slope_resolution,
            resolution,
        });
    }
    let mean = samples.iter().map(|p| p.1).sum::<f64>() / n;
    Some(FloorFit {
        base: mean,
        slope: 0.0,
        slope_resolution,
        resolution,
    })
}

/// The error a validation point is judged by: the part of
/// `|predicted − measured|` beyond what the measurement resolves, relative
/// to the measurement, `max(0, |p − m| − resolution) / |m|`. With no
/// resolution stated (0) it is the relative error. An error inside the
/// resolution is not evidence against the model, only that the figure is
/// at the floor of its measurement: a 1 ms/s server timer measured as
/// 2 ms/s in one window and 1 ms/s in the next is 100 % off with either
/// as the truth. So a figure near its floor passes when its prediction is
/// within its resolution, and a large figure is judged relatively as
/// every other is; none is dropped.
pub fn judged_error(predicted: f64, measured: f64, resolution: f64) -> f64 {
    let beyond = ((predicted - measured).abs() - resolution.max(0.0)).max(0.0);
    if beyond == 0.0 {
        return 0.0;
    }
    relative_error(measured + beyond, measured)
}

/// A straight line `y = a + b·x` through measured points by least squares
/// (at least two distinct `x`); `None` otherwise. A cost has no negative
/// fixed part: where the free fit's `a` comes out below zero (noise in a
/// small point), the line goes through the origin instead.
pub fn fit_line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let (a, b) = fit_free(points)?;
    if a >= 0.0 {
        return Some((a, b));
    }
    let sxx: f64 = points.iter().map(|p| p.0 * p.0).sum();
    let sxy: f64 = points.iter().map(|p| p.0 * p.1).sum();
    Some((0.0, sxy / sxx))
}

fn fit_free(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let b = sxy / sxx;
    Some((my - b * mx, b))
}

/// |predicted − measured| / measured.
pub fn relative_error(predicted: f64, measured: f64) -> f64 {
    if measured == 0.0 {
        return if predicted == 0.0 { 0.0 } else { f64::INFINITY };
    }
    ((predicted - measured) / measured).abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fitted_cost_has_no_negative_fixed_part() {
        let (a, b) = fit_line(&[(100.0, 3.0), (1000.0, 21.0)]).unwrap();
        assert!((a - 1.0).abs() < 1e-9 && (b - 0.02).abs() < 1e-12);
        // The free fit would be -3.9 + 0.069 x.
        let (a, b) = fit_line(&[(100.0, 3.0), (1000.0, 65.0)]).unwrap();
        assert_eq!(a, 0.0);
        assert!((b - 65_300.0 / 1_010_000.0).abs() < 1e-12);
    }

    #[test]
    fn a_spread_is_the_median_mean_min_max_and_sample_stdev() {
        let s = Spread::of(&[6.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.samples, s.mean, s.min, s.max), (4, 3.0, 1.0, 6.0));
        assert_eq!(s.median, 2.5);
        // One sample far out moves the mean, not the median.
        assert_eq!(Spread::of(&[1.0, 9.0, 1.2, 1.1, 1.3]).unwrap().median, 1.2);
        assert!((s.stdev - (14.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(Spread::of(&[5.0]).unwrap().stdev, 0.0);
        assert!(Spread::of(&[]).is_none());
    }

    /// y = 2 + 3x + 0.5 x ln x exactly at 100/300/1000, three samples per
    /// size, noise ±1 % around the truth: the fit over every sample finds
    /// each coefficient and predicts 10,000 within 1 %.
    #[test]
    fn costs_fitted_over_every_sample_find_a_log_growing_per_node_part() {
        let truth = |x: f64| 2.0 + 3.0 * x + 0.5 * x * ln1(x);
        let mut samples = Vec::new();
        for x in [100.0, 300.0, 1000.0] {
            for e in [-0.01, 0.0, 0.01] {
                samples.push((x, truth(x) * (1.0 + e)));
            }
        }
        let f: [&dyn Fn(f64) -> f64; 3] = [&|_| 1.0, &|x| x, &|x| x * ln1(x)];
        let b = fit_costs(&samples, &f).unwrap();
        assert!(relative_error(b[1], 3.0) < 0.05, "{b:?}");
        assert!(relative_error(b[2], 0.5) < 0.05, "{b:?}");
        let at = |x: f64| b[0] + b[1] * x + b[2] * x * ln1(x);
        assert!(relative_error(at(10_000.0), truth(10_000.0)) < 0.01);
        // A falling line is no cost: the slope stays at zero.
        let b = fit_costs(&[(1.0, 5.0), (2.0, 4.0), (3.0, 3.0)], &f[..2]).unwrap();
        assert_eq!(b[1], 0.0);
        // The constant minimising the relative errors: Σ(1/y) / Σ(1/y²).
        let want = (1.0 / 5.0 + 1.0 / 4.0 + 1.0 / 3.0) / (1.0 / 25.0 + 1.0 / 16.0 + 1.0 / 9.0);
        assert!(relative_error(b[0], want) < 1e-6, "{b:?}");
        assert!(fit_costs(&[], &f).is_none());
    }

    /// An idle server's CPU: the same at every size within its noise. A
    /// line through two single samples would extrapolate the noise; the
    /// floor fit keeps no slope the samples do not resolve.
    #[test]
    fn a_figure_at_its_floor_keeps_no_slope_it_cannot_resolve() {
        let noisy = [
            (100.0, 1.7e-3),
            (100.0, 2.0e-3),
            (100.0, 1.8e-3),
            (300.0, 1.9e-3),
            (300.0, 1.7e-3),
            (300.0, 2.0e-3),
            (1000.0, 2.0e-3),
            (1000.0, 1.8e-3),
            (1000.0, 2.1e-3),
        ];
        let f = fit_floor(&noisy).unwrap();
        assert_eq!(f.slope, 0.0, "{f:?}");
        let mean = noisy.iter().map(|p| p.1).sum::<f64>() / 9.0;
        assert!((f.base - mean).abs() < 1e-15);
        assert!(f.resolution > 1e-4 && f.resolution < 5e-4, "{f:?}");
        // The free line's slope, extrapolated to 10,000 nodes.
        let (a, b) = fit_free(&noisy).unwrap();
        assert!(b > 0.0 && a + b * 1e4 > 3e-3);
        // A real per-node cost well above the noise is kept.
        let real: Vec<(f64, f64)> = noisy.iter().map(|&(x, y)| (x, y + 1e-6 * x)).collect();
        let f = fit_floor(&real).unwrap();
        assert!(relative_error(f.slope, 1e-6) < 0.2, "{f:?}");
        assert!(fit_floor(&noisy[..2]).is_none());
    }

    #[test]
    fn an_error_inside_the_resolution_is_not_counted() {
        // Without a resolution: the relative error.
        assert!((judged_error(1.2, 1.0, 0.0) - 0.2).abs() < 1e-12);
        assert!((judged_error(0.7, 1.0, 0.0) - 0.3).abs() < 1e-12);
        // 1.9 ms/s predicted, 1.0 measured, resolution 1 ms/s: 90 % off,
        // but inside what the measurement resolves.
        assert_eq!(judged_error(1.9e-3, 1.0e-3, 1.0e-3), 0.0);
        // Beyond it only the excess counts: 3 vs 1 with a resolution of 1.
        assert!((judged_error(3.0, 1.0, 1.0) - 1.0).abs() < 1e-12);
        assert!((judged_error(-1.0, 1.0, 1.0) - 1.0).abs() < 1e-12);
        // A large figure with a small resolution is judged relatively.
        assert!((judged_error(130.0, 100.0, 1.0) - 0.29).abs() < 1e-12);
    }

    fn costs() -> ControlCosts {
        ControlCosts {
            mem_base: 16e6,
            mem_per_node: 8e3,
            mem_per_user: 100e3,
            cpu_connect: 50e-6,
            cpu_idle_base: 0.0,
            cpu_idle_node: 0.0,
            cpu_config: 1e-3,
            cpu_config_node: 20e-6,
            cpu_session: 200e-6,
            cpu_group_open: 1e-3,
            cpu_message_server: 10e-6,
            cpu_message_direct: 0.0,
            cpu_status: 0.0,
            cpu_status_node: 2e-6,
            fanout_fixed: 5e-3,
            fanout_per_node: 40e-6,
        }
    }

    #[test]
    fn load_is_the_sum_of_connections_and_events_at_their_rates() {
        let c = costs();
        let l = ControlLoad {
            nodes: 10_000.0,
            users: 10.0,
            configs_per_s: 1.0,
            nodes_per_config: 1000.0,
            messages_server_per_s: 10_000.0,
            full_status_per_s: 0.5,
            ..Default::default()
        };
        let p = c.predict(&l);
        assert!((p.memory_bytes - (16e6 + 80e6 + 1e6)).abs() < 1.0);
        // 1 ms + 20 ms configuring, 100 ms of messages, 10 ms of status.
        assert!(
            (p.cpus - (0.001 + 0.020 + 0.100 + 0.010)).abs() < 1e-9,
            "{}",
            p.cpus
        );
        assert!((p.fanout_s - 0.045).abs() < 1e-12);
        assert!((c.config_cpu_s(1000.0) - 0.021).abs() < 1e-12);
    }

    #[test]
    fn one_server_saturates_at_its_cpus_or_its_memory() {
        let c = costs();
        // Each node reconfigured once a minute, alone: 1/60 configurations
        // per node and second of 1 node each.
        let per_node = ControlLoad {
            configs_per_s: 1.0 / 60.0,
            nodes_per_config: 1.0,
            ..Default::default()
        };
        let cpu_only = c.max_nodes(&per_node, 0.0, 1.0, f64::INFINITY);
        let per = (1e-3 + 20e-6) / 60.0;
        assert!(relative_error(cpu_only, 1.0 / per) < 1e-9);
        // 300 MB of memory binds first at 8 kB a node (35,500 < 58,824).
        let mem = c.max_nodes(&per_node, 0.0, 1.0, 0.3e9);
        assert!(relative_error(mem, (0.3e9 - 16e6) / 8e3) < 1e-9);
        // Full-status requests in proportion to the nodes grow as N²:
        // the bound solves the quadratic exactly.
        let status = ControlLoad {
            full_status_per_s: 1e-3,
            ..per_node
        };
        let n = c.max_nodes(&status, 0.0, 1.0, f64::INFINITY);
        let at = |n: f64| per * n + 1e-3 * 2e-6 * n * n;
        assert!(relative_error(at(n), 1.0) < 1e-9, "{n}");
        assert!(n < cpu_only);
    }

    #[test]
    fn the_idle_server_and_a_status_requests_fixed_part_do_not_grow_with_the_nodes() {
        let c = ControlCosts {
            cpu_idle_base: 0.01,
            cpu_status: 1e-3,
            ..costs()
        };
        let l = ControlLoad {
            nodes: 1000.0,
            full_status_per_s: 2.0,
            ..Default::default()
        };
        // 10 ms idle, 2 × (1 ms + 1,000 × 2 µs).
        assert!((c.predict(&l).cpus - (0.01 + 2.0 * 3e-3)).abs() < 1e-12);
        let per_node = ControlLoad {
            full_status_per_s: 1e-3,
            ..Default::default()
        };
        let n = c.max_nodes(&per_node, 0.0, 1.0, f64::INFINITY);
        let at = |n: f64| {
            c.predict(&ControlLoad {
                nodes: n,
                full_status_per_s: 1e-3 * n,
                ..Default::default()
            })
            .cpus
        };
        assert!(relative_error(at(n), 1.0) < 1e-9, "{n}");
    }

    #[test]
    fn a_line_through_measurements_predicts_between_and_beyond_them() {
        let pts = [(100.0, 16.8e6), (1000.0, 24e6), (3000.0, 40e6)];
        let (a, b) = fit_line(&pts).unwrap();
        assert!(relative_error(b, 8e3) < 1e-9 && relative_error(a, 16e6) < 1e-9);
        assert!(fit_line(&pts[..1]).is_none());
        assert!(fit_line(&[(5.0, 1.0), (5.0, 2.0)]).is_none());
        assert_eq!(relative_error(0.0, 0.0), 0.0);
        assert!((relative_error(1.2, 1.0) - 0.2).abs() < 1e-12);
    }

    /// The measurements of `corefarm bench scale` (one server, 2 shared
    /// CPUs): resident memory and fan-out time fitted on 100 and 1,000
    /// nodes predict 3,000 and 10,000 nodes within 20 %.
    #[test]
    fn fitted_on_small_clusters_it_predicts_ten_thousand_nodes() {
        // (nodes, resident KiB when idle, fan-out seconds)
        let measured = [
            (100.0, 19_512.0, 0.0189),
            (1000.0, 29_784.0, 0.353),
            (3000.0, 54_104.0, 1.039),
            (10_000.0, 115_816.0, 4.267),
        ];
        let mem: Vec<(f64, f64)> = measured[..2].iter().map(|m| (m.0, m.1 * 1024.0)).collect();
        let fan: Vec<(f64, f64)> = measured[..2].iter().map(|m| (m.0, m.2)).collect();
        let ((mem_base, mem_per_node), (fanout_fixed, fanout_per_node)) =
            (fit_line(&mem).unwrap(), fit_line(&fan).unwrap());
        let c = ControlCosts {
            mem_base,
            mem_per_node,
            fanout_fixed,
            fanout_per_node,
            ..Default::default()
        };
        for &(n, kib, fanout) in &measured[2..] {
            let p = c.predict(&ControlLoad {
                nodes: n,
                nodes_per_config: n,
                ..Default::default()
            });
            assert!(
                relative_error(p.memory_bytes, kib * 1024.0) < 0.2,
                "{n}: {p:?}"
            );
            assert!(relative_error(p.fanout_s, fanout) < 0.2, "{n}: {p:?}");
        }
    }
}

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
//!   configuration costs `per_config + per_config_node·k` for `k` nodes and
//!   a status or scrape `per_status_node·N`;
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
        self.cpu_config + self.cpu_config_node * nodes
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

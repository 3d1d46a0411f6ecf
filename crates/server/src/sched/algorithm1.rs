//! Periodic reconfiguration (seed 002 Algorithm 1), with the cost of
//! reprogramming weighed in.
//!
//! Once per monitoring period P, demand per function is closed (work
//! processed in the period plus work still waiting, in node-seconds, from
//! measured service times) and turned into a load per replica,
//! ρ = demand / (replicas × P): the fraction of the period each replica
//! would need to be busy.
//!
//! 1. **Functions without a replica first** (unlike the seed, which tries
//!    replication first: its applications fall back to the CPU, ours wait).
//!    A requested function with waiting users or queued work takes, in this
//!    order: an idle node with ρ < C_RECONFIG; a node of a function that has
//!    more than one replica (drained first: no new work, in-flight work
//!    finishes); after `max_wait` (at least ten reprogramming times, so
//!    programming stays under a tenth of the time), the sole replica of a busy
//!    function — time slicing when there are more functions than nodes.
//! 2. **Replication.** Each idle node whose own function has ρ < C_RECONFIG
//!    may replicate the function with the highest ρ if that is above
//!    C_REPLICATE — but only if the expected gain over the horizon H exceeds
//!    the cost. With R the node's measured reconfiguration time:
//!    gain = min(1, rate − replicas) × (H − R), where rate = demand / P is
//!    how many nodes the function could keep busy;
//!    cost = R, plus, when the node is the only replica of a function
//!    someone still uses, R again (to load it back) and ρ_own × H (its
//!    work waiting meanwhile). Two functions alternating on a board whose
//!    programming is slow therefore keep their replicas instead of trading
//!    them every period.

use std::time::Duration;

use super::{FnId, Sched, SlotState};

impl Sched {
    /// One monitoring period ended.
    pub(super) fn monitor(&mut self, now: Duration) {
        let prior = self.p.service_prior;
        let period = self.p.period.as_secs_f64().max(1e-9);
        let mut in_flight: std::collections::HashMap<FnId, u64> = Default::default();
        for s in self.nodes.values() {
            if let Some(f) = s.function {
                *in_flight.entry(f).or_default() +=
                    s.in_flight.values().map(|j| j.count as u64).sum::<u64>();
            }
        }
        for f in self.fns.values_mut() {
            f.close_period(in_flight.get(&f.id).copied().unwrap_or(0), prior);
        }
        self.serve_requests(now, period);
        self.replicate(now, period);
    }

    /// Load per replica: the fraction of the period each replica would be busy.
    fn rho(&self, f: FnId, period: f64) -> f64 {
        let demand = self.fns.get(&f).map_or(0.0, |f| f.demand);
        demand / (self.replicas_or_loading(f).max(1) as f64 * period)
    }

    /// The node's own load: its function's ρ, 0 when it holds none.
    fn own_rho(&self, node: u64, period: f64) -> f64 {
        self.nodes[&node]
            .function
            .map_or(0.0, |f| self.rho(f, period))
    }

    pub(super) fn reconfig_time(&self, node: u64) -> Duration {
        self.nodes[&node].reconfig.unwrap_or(self.p.period)
    }

    /// Step 1: functions that have no replica and are needed.
    fn serve_requests(&mut self, now: Duration, period: f64) {
        let mut wanting: Vec<(Duration, FnId)> = self
            .fns
            .values()
            .filter(|f| !f.waiting.is_empty() || !f.queue.is_empty())
            .filter(|f| f.lost_loads < super::route::MAX_LOST_LOADS)
            .filter_map(|f| f.requested.map(|t| (t, f.id)))
            .filter(|&(_, id)| self.replicas_or_loading(id) == 0)
            .collect();
        wanting.sort();
        for (since, f) in wanting {
            let usable = |s: &super::Slot| !s.refused.contains(&f);
            let by_rho = |mut v: Vec<u64>, me: &Sched| {
                v.sort_by(|a, b| me.own_rho(*a, period).total_cmp(&me.own_rho(*b, period)));
                v.first().copied()
            };
            let idle: Vec<u64> = self
                .nodes
                .iter()
                .filter(|(&id, s)| {
                    s.idle() && usable(s) && self.own_rho(id, period) < self.p.c_reconfig
                })
                .map(|(&id, _)| id)
                .collect();
            if let Some(node) = by_rho(idle, self) {
                self.reconfigure(node, f, now);
                continue;
            }
            let ready = |s: &super::Slot| s.state == SlotState::Ready && usable(s);
            let spare: Vec<u64> = self
                .nodes
                .iter()
                .filter(|(_, s)| ready(s) && s.function.is_some_and(|g| self.replicas(g) > 1))
                .map(|(&id, _)| id)
                .collect();
            let victim = by_rho(spare, self).or_else(|| {
                let r = self
                    .nodes
                    .keys()
                    .map(|&n| self.reconfig_time(n))
                    .max()
                    .unwrap_or_default();
                let limit = self.p.max_wait.max(r * 10);
                if now.saturating_sub(since) < limit {
                    return None;
                }
                let any: Vec<u64> = self
                    .nodes
                    .iter()
                    .filter(|(_, s)| ready(s))
                    .map(|(&id, _)| id)
                    .collect();
                by_rho(any, self)
            });
            if let Some(node) = victim {
                tracing::debug!(node, function = %f, "draining a node for a function without a replica");
                self.nodes.get_mut(&node).expect("listed").state =
                    SlotState::Draining { target: f };
            }
        }
    }

    /// Step 2: replicate the most loaded function onto idle, lightly used nodes.
    fn replicate(&mut self, now: Duration, period: f64) {
        let mut idle: Vec<u64> = self
            .nodes
            .iter()
            .filter(|(_, s)| s.idle())
            .map(|(&id, _)| id)
            .collect();
        idle.sort_by(|a, b| {
            self.own_rho(*a, period)
                .total_cmp(&self.own_rho(*b, period))
        });
        for node in idle {
            let own = self.nodes[&node].function;
            let own_rho = self.own_rho(node, period);
            if own_rho >= self.p.c_reconfig {
                continue;
            }
            let best = self
                .fns
                .keys()
                .filter(|&&f| Some(f) != own && !self.nodes[&node].refused.contains(&f))
                .filter(|&&f| self.replicas_or_loading(f) > 0)
                .map(|&f| (self.rho(f, period), f))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            let Some((rho_h, h)) = best else { continue };
            if rho_h <= self.p.c_replicate {
                continue;
            }
            let r = self.reconfig_time(node).as_secs_f64();
            let horizon = self.p.horizon.as_secs_f64();
            let n_h = self.replicas_or_loading(h) as f64;
            let rate = self.fns[&h].demand / period;
            let gain = (rate - n_h).clamp(0.0, 1.0) * (horizon - r).max(0.0);
            let sole =
                own.is_some_and(|g| self.replicas_or_loading(g) == 1 && self.fns[&g].wanted());
            // The only replica of a function someone uses is lent only once
            // it has been idle for a whole period: a user between two calls,
            // or whose function was just loaded, would otherwise lose it at
            // once and take a node back from another function.
            if sole && now.saturating_sub(self.nodes[&node].busy_until) < self.p.period {
                continue;
            }
            let cost = r + if sole { r + own_rho * horizon } else { 0.0 };
            if gain > cost {
                tracing::debug!(node, function = %h, gain, cost, "replicating");
                self.reconfigure(node, h, now);
            } else {
                tracing::trace!(node, function = %h, gain, cost, "replication not worth its reprogramming");
            }
        }
    }
}

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
//!
//! **Weights.** Where a node goes to one function rather than another —
//! which hot function an idle node replicates, which node is drained for a
//! function without a replica — functions are ranked by ρ × the mean
//! weight of their active users' sessions (`Held::weight`): of two functions
//! equally loaded, a weight-3 user's gets a node before a weight-1 user's,
//! so under contention it ends with about three times the replicas. The
//! thresholds (C_RECONFIG, C_REPLICATE) and the gain and cost stay in
//! plain load and time: a weight orders claims, it does not make work.

use std::collections::HashMap;
use std::time::Duration;

use super::ranked::Ranked;
use super::{FnId, Sched, Slot, SlotState};

/// Replicas per function, counted once per period and kept up to date as
/// the period's decisions move nodes: without it every ρ would count a
/// function's replicas over all nodes, and a period over N nodes would cost
/// N² (seconds at ten thousand nodes, for a period of milliseconds).
#[derive(Default)]
struct Held {
    /// Nodes serving, loading or drained for each function.
    promised: HashMap<FnId, usize>,
    /// Nodes serving it now (Ready).
    ready: HashMap<FnId, usize>,
    /// Each function's active users' mean weight (1 for none), counted
    /// once per period: see [`Held::weight`].
    weight: HashMap<FnId, f64>,
}

/// What a slot counts for: (promised to, ready for).
type Counted = (Option<FnId>, Option<FnId>);

fn counted(s: &Slot) -> Counted {
    let ready = match s.state {
        SlotState::Ready => s.function,
        _ => None,
    };
    (s.promised_to(), ready)
}

impl Held {
    fn of(s: &Sched) -> Held {
        let mut h = Held::default();
        for slot in s.nodes.values() {
            h.count(counted(slot), 1);
        }
        let unit = super::queue::WEIGHT_UNIT as f64;
        for f in s.fns.values() {
            let (w, n) = s.active_weight(f);
            if n > 0 {
                h.weight.insert(f.id, w as f64 / (unit * n as f64));
            }
        }
        h
    }

    /// `f`'s active users' mean weight, per session (a user's weight is split
    /// among its sessions, whose demand adds up): what its ρ is multiplied
    /// by where functions compete for a node.
    fn weight(&self, f: FnId) -> f64 {
        self.weight.get(&f).copied().unwrap_or(1.0)
    }

    fn count(&mut self, (promised, ready): Counted, add: isize) {
        for (map, f) in [(&mut self.promised, promised), (&mut self.ready, ready)] {
            if let Some(f) = f {
                let n = map.entry(f).or_default();
                *n = n.saturating_add_signed(add);
            }
        }
    }

    /// A node's slot changed from `before` to `after`.
    fn moved(&mut self, before: Counted, after: Counted) {
        self.count(before, -1);
        self.count(after, 1);
    }

    fn promised(&self, f: FnId) -> usize {
        self.promised.get(&f).copied().unwrap_or(0)
    }

    fn ready(&self, f: FnId) -> usize {
        self.ready.get(&f).copied().unwrap_or(0)
    }
}

/// Step 1's candidates for functions without a replica, by the function
/// their nodes hold, ranked by its claim ([`Sched::claim`]).
#[derive(Default)]
struct Candidates {
    /// Idle nodes whose function's load is below C_RECONFIG.
    idle: Ranked,
    /// Ready nodes of functions with more than one ready replica.
    shared: Ranked,
    /// Every ready node: taken from once a function has waited long enough.
    ready: Ranked,
}

impl Sched {
    /// One monitoring period ended. Linear in the nodes and functions,
    /// plus a sort of the idle nodes: O(n log n) per period.
    pub(super) fn monitor(&mut self, now: Duration) {
        let prior = self.p.service_prior;
        let period = self.p.period.as_secs_f64().max(1e-9);
        let mut in_flight: HashMap<FnId, u64> = Default::default();
        for s in self.nodes.values() {
            if let Some(f) = s.function {
                *in_flight.entry(f).or_default() +=
                    s.in_flight.values().map(|j| j.count as u64).sum::<u64>();
            }
        }
        for f in self.fns.values_mut() {
            f.close_period(in_flight.get(&f.id).copied().unwrap_or(0), prior);
        }
        let mut held = Held::of(self);
        self.serve_requests(now, period, &mut held);
        self.replicate(now, period, &mut held);
    }

    /// Load per replica: the fraction of the period each replica would be busy.
    fn rho(&self, f: FnId, period: f64, held: &Held) -> f64 {
        let demand = self.fns.get(&f).map_or(0.0, |f| f.demand);
        demand / (held.promised(f).max(1) as f64 * period)
    }

    /// The node's own load: its function's ρ, 0 when it holds none.
    fn own_rho(&self, node: u64, period: f64, held: &Held) -> f64 {
        self.nodes[&node]
            .function
            .map_or(0.0, |f| self.rho(f, period, held))
    }

    /// ρ × its users' weight: the rank of `f`'s claim on a node.
    fn claim(&self, f: FnId, period: f64, held: &Held) -> f64 {
        self.rho(f, period, held) * held.weight(f)
    }

    /// The node's own function's claim, 0 when it holds none.
    fn own_claim(&self, node: u64, period: f64, held: &Held) -> f64 {
        self.nodes[&node]
            .function
            .map_or(0.0, |f| self.claim(f, period, held))
    }

    pub(super) fn reconfig_time(&self, node: u64) -> Duration {
        self.nodes[&node].reconfig.unwrap_or(self.p.period)
    }

    /// [`Sched::reconfigure`], keeping `held` counted.
    fn reconfigure_held(&mut self, node: u64, f: FnId, now: Duration, held: &mut Held) {
        let before = counted(&self.nodes[&node]);
        self.reconfigure(node, f, now);
        if let Some(s) = self.nodes.get(&node) {
            held.moved(before, counted(s));
        }
    }

    /// The node passing `keep` whose function has the weakest claim
    /// ([`Sched::own_claim`]; the first such in id order among equals): a
    /// scan of every node, what [`Sched::serve_requests`] decided per
    /// function before its candidates were ranked; the tests compare the two.
    #[cfg(test)]
    fn lowest_rho(
        &self,
        period: f64,
        held: &Held,
        keep: impl Fn(u64, &Slot) -> bool,
    ) -> Option<u64> {
        self.nodes
            .iter()
            .filter(|(&id, s)| keep(id, s))
            .map(|(&id, _)| (self.own_claim(id, period, held), id))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, id)| id)
    }

    /// Step 1: functions that have no replica and are needed, oldest
    /// request first. Each takes the node a scan would pick (the lowest
    /// claim, then the lowest id) — an idle node of a lightly loaded
    /// function, else a replica of a function with several, else (after
    /// the wait) any ready node — from [`Candidates`] ranked once per
    /// period: O((F + N) log N) instead of a scan of every node per function.
    fn serve_requests(&mut self, now: Duration, period: f64, held: &mut Held) {
        #[cfg(test)]
        if self.ix.scan_serve {
            return self.serve_requests_scan(now, period, held);
        }
        let wanting = self.wanting(held);
        if wanting.is_empty() {
            return;
        }
        let limit = self.p.max_wait.max(self.slowest_reconfig() * 10);
        let mut c = self.candidates(period, held);
        for (since, f) in wanting {
            let waited = now.saturating_sub(since) >= limit;
            // Candidates only leave (a function without a replica holds no
            // node), and those waiting later have waited less: no function
            // after this one can take a node either.
            if c.idle.is_empty() && c.shared.is_empty() && (!waited || c.ready.is_empty()) {
                break;
            }
            let nodes = &self.nodes;
            let usable = |n: u64| !nodes[&n].refused.contains(&f);
            if let Some((g, node)) = c.idle.lowest(usable) {
                self.reconfigure_held(node, f, now, held);
                self.candidate_moved(&mut c, node, g, f, period, held);
                continue;
            }
            let victim = c
                .shared
                .lowest(usable)
                .or_else(|| waited.then(|| c.ready.lowest(usable)).flatten());
            if let Some((g, node)) = victim {
                self.drain_held(node, f, held);
                self.candidate_moved(&mut c, node, g, f, period, held);
            }
        }
    }

    /// The functions step 1 serves: requested, with waiting users or
    /// queued work, not given up, without a node promised; oldest first.
    fn wanting(&self, held: &Held) -> Vec<(Duration, FnId)> {
        let mut wanting: Vec<(Duration, FnId)> = self
            .fns
            .values()
            .filter(|f| !f.waiting.is_empty() || !f.queue.is_empty())
            .filter(|f| f.lost_loads < super::route::MAX_LOST_LOADS)
            .filter_map(|f| f.requested.map(|t| (t, f.id)))
            .filter(|&(_, id)| held.promised(id) == 0)
            .collect();
        wanting.sort();
        wanting
    }

    /// The slowest node's reprogramming bounds how long a function
    /// without a replica waits before it may take a busy one's.
    fn slowest_reconfig(&self) -> Duration {
        self.nodes
            .keys()
            .map(|&n| self.reconfig_time(n))
            .max()
            .unwrap_or_default()
    }

    /// `node` takes no new work and loads `f` once idle, `held` kept counted.
    fn drain_held(&mut self, node: u64, f: FnId, held: &mut Held) {
        tracing::debug!(node, function = %f, "draining a node for a function without a replica");
        let slot = self.nodes.get_mut(&node).expect("listed");
        let before = counted(slot);
        slot.state = SlotState::Draining { target: f };
        held.moved(before, counted(slot));
        self.reindex(node);
    }

    /// Step 1's candidates, every node in its group and every group ranked.
    fn candidates(&self, period: f64, held: &Held) -> Candidates {
        let mut c = Candidates::default();
        for (&id, s) in &self.nodes {
            if s.idle() {
                c.idle.add(s.function, id);
            }
            if s.state == SlotState::Ready {
                c.shared.add(s.function, id);
                c.ready.add(s.function, id);
            }
        }
        let mut groups = c.idle.groups();
        groups.extend(c.ready.groups());
        for g in groups {
            self.rank_candidates(&mut c, g, period, held);
        }
        c
    }

    /// Ranks the group of nodes holding `g` by its claim, in each list it
    /// qualifies for.
    fn rank_candidates(&self, c: &mut Candidates, g: Option<FnId>, period: f64, held: &Held) {
        let claim = g.map_or(0.0, |f| self.claim(f, period, held));
        let rho = g.map_or(0.0, |f| self.rho(f, period, held));
        c.idle.rank(g, (rho < self.p.c_reconfig).then_some(claim));
        c.shared
            .rank(g, g.filter(|&f| held.ready(f) > 1).map(|_| claim));
        c.ready.rank(g, Some(claim));
    }

    /// `node`, of the group holding `g`, was given to `f`: it is no
    /// candidate any more, and the claims of `g` and `f` changed with
    /// their replica counts (no other function's did).
    fn candidate_moved(
        &self,
        c: &mut Candidates,
        node: u64,
        g: Option<FnId>,
        f: FnId,
        period: f64,
        held: &Held,
    ) {
        for list in [&mut c.idle, &mut c.shared, &mut c.ready] {
            list.remove(g, node);
        }
        for h in [g, Some(f)] {
            self.rank_candidates(c, h, period, held);
        }
    }

    /// Step 1 as a scan of every node per function (what it was): the
    /// reference the ranked candidates are tested against.
    #[cfg(test)]
    fn serve_requests_scan(&mut self, now: Duration, period: f64, held: &mut Held) {
        let wanting = self.wanting(held);
        if wanting.is_empty() {
            return;
        }
        let slowest = self.slowest_reconfig();
        for (since, f) in wanting {
            let usable = |s: &Slot| !s.refused.contains(&f);
            let c_reconfig = self.p.c_reconfig;
            let idle = self.lowest_rho(period, held, |id, s| {
                s.idle() && usable(s) && self.own_rho(id, period, held) < c_reconfig
            });
            if let Some(node) = idle {
                self.reconfigure_held(node, f, now, held);
                continue;
            }
            let ready = |s: &Slot| s.state == SlotState::Ready && usable(s);
            let victim = self
                .lowest_rho(period, held, |_, s| {
                    ready(s) && s.function.is_some_and(|g| held.ready(g) > 1)
                })
                .or_else(|| {
                    let limit = self.p.max_wait.max(slowest * 10);
                    if now.saturating_sub(since) < limit {
                        return None;
                    }
                    self.lowest_rho(period, held, |_, s| ready(s))
                });
            if let Some(node) = victim {
                self.drain_held(node, f, held);
            }
        }
    }

    /// Step 2: replicate the most loaded function onto idle, lightly used
    /// nodes. The functions worth a replica (ρ above C_REPLICATE) are kept
    /// in order of ρ, so each idle node looks at the first it may load
    /// instead of at every function.
    fn replicate(&mut self, now: Duration, period: f64, held: &mut Held) {
        let mut idle: Vec<(f64, u64)> = self
            .nodes
            .iter()
            .filter(|(_, s)| s.idle())
            .map(|(&id, _)| (self.own_claim(id, period, held), id))
            .collect();
        idle.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c_replicate = self.p.c_replicate;
        // Worth a replica by its load; ranked by its claim.
        let hot_entry = |me: &Sched, held: &Held, f: FnId| {
            let rho = me.rho(f, period, held);
            let claim = me.claim(f, period, held);
            (held.promised(f) > 0 && rho > c_replicate).then_some((claim, f))
        };
        let mut hot: Vec<(f64, FnId)> = self
            .fns
            .keys()
            .filter_map(|&f| hot_entry(self, held, f))
            .collect();
        let by_rho = |hot: &mut Vec<(f64, FnId)>| hot.sort_by(|a, b| b.0.total_cmp(&a.0));
        by_rho(&mut hot);
        for (_, node) in idle {
            if hot.is_empty() {
                break;
            }
            let own = self.nodes[&node].function;
            let own_rho = self.own_rho(node, period, held);
            if own_rho >= self.p.c_reconfig {
                continue;
            }
            let refused = &self.nodes[&node].refused;
            let best = hot
                .iter()
                .find(|(_, f)| Some(*f) != own && !refused.contains(f))
                .copied();
            let Some((_, h)) = best else { continue };
            let r = self.reconfig_time(node).as_secs_f64();
            let horizon = self.p.horizon.as_secs_f64();
            let n_h = held.promised(h) as f64;
            let rate = self.fns[&h].demand / period;
            let gain = (rate - n_h).clamp(0.0, 1.0) * (horizon - r).max(0.0);
            let sole = own.is_some_and(|g| held.promised(g) == 1 && self.fns[&g].wanted());
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
                self.reconfigure_held(node, h, now, held);
                // The two functions whose replicas changed move in the order.
                for f in [Some(h), own].into_iter().flatten() {
                    hot.retain(|&(_, g)| g != f);
                    if self.fns.contains_key(&f) {
                        hot.extend(hot_entry(self, held, f));
                    }
                }
                by_rho(&mut hot);
            } else {
                tracing::trace!(node, function = %h, gain, cost, "replication not worth its reprogramming");
            }
        }
    }
}

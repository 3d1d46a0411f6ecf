//! Data demultiplexer policies (seed 000 §3.3.1.3 plus corefarm's credit policy).

use std::collections::VecDeque;
use std::time::Duration;

/// How the user handler picks a node for the next data message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Seed: round robin over nodes whose previous send has completed.
    Queue,
    /// Seed: always the top-most node whose previous send has completed.
    Stack,
    /// corefarm: at most a window of messages in flight per node (adaptive,
    /// see [`Window`]), least-loaded first. Bounds the data parked in socket
    /// buffers, hence latency.
    Credit,
}

/// A name that no choice of an option has (`--policy`, `--sharing`); its
/// message is what the command line prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?} (expected {expected})")]
pub struct UnknownName {
    pub what: &'static str,
    pub given: String,
    pub expected: &'static str,
}

impl std::str::FromStr for Policy {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "queue" => Ok(Policy::Queue),
            "stack" => Ok(Policy::Stack),
            "credit" => Ok(Policy::Credit),
            other => Err(UnknownName {
                what: "policy",
                given: other.into(),
                expected: "queue, stack or credit",
            }),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Queue => "queue",
            Policy::Stack => "stack",
            Policy::Credit => "credit",
        })
    }
}

/// Load of one node as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Messages written to the node's socket buffer or still being written.
    pub unwritten: u64,
    /// Messages sent and not yet answered.
    pub in_flight: usize,
    /// Credit policy: messages the node's window admits in flight.
    pub window: u32,
}

/// Node order kept by the policies: rotation for queue, fixed order for stack.
#[derive(Debug, Default)]
pub struct Order {
    ids: VecDeque<u64>,
}

impl Order {
    pub fn add(&mut self, id: u64) {
        self.ids.push_back(id);
    }

    pub fn remove(&mut self, id: u64) {
        self.ids.retain(|&x| x != id);
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The node the policy would pick now, without committing to it.
    /// `load` returns `None` for nodes that are not ready (e.g. configuring).
    pub fn peek(&self, policy: Policy, load: impl Fn(u64) -> Option<Load>) -> Option<(usize, u64)> {
        let idle = |id: u64| load(id).is_some_and(|l| l.unwritten == 0);
        match policy {
            Policy::Stack | Policy::Queue => self
                .ids
                .iter()
                .copied()
                .enumerate()
                .find(|&(_, id)| idle(id)),
            Policy::Credit => {
                let mut best: Option<(usize, u64, usize)> = None;
                for (pos, &id) in self.ids.iter().enumerate() {
                    if let Some(l) = load(id) {
                        if l.in_flight < l.window.max(1) as usize
                            && best.is_none_or(|(_, _, b)| l.in_flight < b)
                        {
                            best = Some((pos, id, l.in_flight));
                        }
                    }
                }
                best.map(|(pos, id, _)| (pos, id))
            }
        }
    }

    /// Picks a node among the ready ones, or `None` if every node is busy.
    /// Queue and credit rotate the chosen node to the back; the stack keeps
    /// its order, so the top node stays preferred (seed §3.3.1.3).
    pub fn pick(&mut self, policy: Policy, load: impl Fn(u64) -> Option<Load>) -> Option<u64> {
        let (pos, id) = self.peek(policy, load)?;
        if policy != Policy::Stack {
            self.ids.remove(pos);
            self.ids.push_back(id);
        }
        Some(id)
    }
}

/// Largest adaptive window, in messages, whatever their size: bounds the
/// in-flight table of small messages.
pub const MAX_WINDOW: u32 = 256;

/// Smallest adaptive window: one message in service plus the next one
/// ready, so that a node never waits for the server's round trip to learn
/// it needs more (a smaller window only saves latency the node would lose
/// in throughput).
pub const MIN_WINDOW: u32 = 2;

/// Credit policy: one node's window, adapted so that the node never waits
/// for the server's round trip, yet no more data waits in front of it than
/// that needs.
///
/// - **Grow** when the window starved the node: a result arrives with
///   nothing else in flight (the node has had nothing to do since it sent
///   it) although the window was full meanwhile, so the user's pace was not
///   the limit. Only when it happens in two epochs in a row (an epoch is a
///   window's worth of results), or twice in one: a single starvation is
///   more often a scheduling hiccup of a loaded machine than a window too
///   small, and growing for it costs latency.
/// - **Shrink** when messages only wait: each message's round trip
///   (dispatch to result) against the shortest one seen recently estimates
///   how many messages were queued ahead of it at the node
///   (`rtt / base - 1`, as TCP Vegas does). If every result over a window's
///   worth had more than [`QUEUED_MAX`] ahead of it, one message fewer would
///   still keep the node busy.
///
/// When the node is the bottleneck this settles at one message in service
/// plus the next one ready (latency about twice the service time); when the
/// round trip through the user is, at as many as cover it.
#[derive(Debug, Clone)]
pub struct Window {
    cur: u32,
    /// Fixed windows never adapt (`--credit-window fixed`).
    adaptive: bool,
    /// The node had `cur` messages in flight since the last decision.
    full: bool,
    /// Fewest messages estimated queued ahead of a result, this epoch (×1000).
    min_queued: u64,
    /// Results seen this epoch.
    seen: u32,
    /// Results this epoch that found the node starved.
    starved: u32,
    /// The previous epoch had a starved result.
    starved_before: bool,
    /// Shortest round trip since the window last grew. A message sent to an
    /// idle node measures it: at the start, and after every growth (which
    /// follows idleness). A stale base (the node became slower) makes the
    /// window shrink until the node starves, grow, and measure it again.
    base: Duration,
}

/// Messages queued at the node, beyond the one in service, that the window
/// tolerates before shrinking (one "next ready" plus noise).
pub const QUEUED_MAX: f64 = 1.5;

impl Window {
    pub fn new(initial: u32, adaptive: bool) -> Self {
        Window {
            cur: initial.clamp(1, MAX_WINDOW),
            adaptive,
            full: false,
            min_queued: u64::MAX,
            seen: 0,
            starved: 0,
            starved_before: false,
            base: Duration::MAX,
        }
    }

    /// Messages the node may have in flight.
    pub fn get(&self) -> u32 {
        self.cur
    }

    /// A message went to the node; `in_flight` counts it.
    pub fn on_dispatch(&mut self, in_flight: usize) {
        if in_flight >= self.cur as usize {
            self.full = true;
        }
    }

    /// A result came back after `rtt` with `left` messages still in flight.
    /// `user_blocked`: the user has no credit left, so it waits for the
    /// windows even if this node never looked full (its next message is on
    /// its way through the user). `cap` bounds the window (the byte budget
    /// over the message size).
    pub fn on_result(&mut self, left: usize, rtt: Duration, user_blocked: bool, cap: u32) {
        if !self.adaptive {
            return;
        }
        self.base = self.base.min(rtt);
        let base = self.base.max(Duration::from_nanos(1));
        let queued = (rtt.as_secs_f64() / base.as_secs_f64() - 1.0).max(0.0);
        let cap = cap.clamp(1, MAX_WINDOW);
        let floor = MIN_WINDOW.min(cap);
        self.seen += 1;
        if left == 0 && (self.full || user_blocked) {
            self.starved += 1;
        } else {
            self.min_queued = self.min_queued.min((queued * 1000.0) as u64);
        }
        if self.starved >= 2 || (self.starved == 1 && self.starved_before) {
            self.cur = (self.cur + 1).min(cap);
            self.base = Duration::MAX;
            self.starved_before = false;
            self.next_epoch();
        } else if self.seen > self.cur {
            if self.starved == 0 && self.min_queued as f64 > QUEUED_MAX * 1000.0 {
                self.cur -= 1;
            }
            self.starved_before = self.starved > 0;
            self.next_epoch();
        }
        self.cur = self.cur.clamp(floor, cap);
    }

    fn next_epoch(&mut self) {
        self.full = false;
        self.min_queued = u64::MAX;
        self.seen = 0;
        self.starved = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn order(n: u64) -> Order {
        let mut o = Order::default();
        (0..n).for_each(|i| o.add(i));
        o
    }

    #[test]
    fn queue_rotates_over_idle_nodes() {
        let mut o = order(3);
        let idle = |_| {
            Some(Load {
                unwritten: 0,
                in_flight: 0,
                window: 0,
            })
        };
        let picks: Vec<_> = (0..6)
            .map(|_| o.pick(Policy::Queue, idle).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn stack_prefers_top_until_it_blocks() {
        let mut o = order(3);
        let busy: HashMap<u64, u64> = [(0, 1)].into();
        let load = |id| {
            Some(Load {
                unwritten: *busy.get(&id).unwrap_or(&0),
                in_flight: 0,
                window: 0,
            })
        };
        assert_eq!(o.pick(Policy::Stack, load), Some(1));
        assert_eq!(
            o.pick(Policy::Stack, |_| Some(Load {
                unwritten: 0,
                in_flight: 9,
                window: 0,
            })),
            Some(0)
        );
    }

    #[test]
    fn credit_picks_least_loaded_and_respects_limit() {
        let mut o = order(3);
        let inflight: HashMap<u64, usize> = [(0, 2), (1, 1), (2, 2)].into();
        let inflight = &inflight;
        let load = |window| {
            move |id| {
                Some(Load {
                    unwritten: 0,
                    in_flight: inflight[&id],
                    window,
                })
            }
        };
        assert_eq!(o.pick(Policy::Credit, load(2)), Some(1));
        assert_eq!(o.pick(Policy::Credit, load(1)), None);
    }

    #[test]
    fn nodes_not_ready_are_skipped() {
        let mut o = order(2);
        let load = |id| {
            if id == 0 {
                None
            } else {
                Some(Load {
                    unwritten: 0,
                    in_flight: 0,
                    window: 4,
                })
            }
        };
        for p in [Policy::Queue, Policy::Stack, Policy::Credit] {
            assert_eq!(o.pick(p, load), Some(1));
        }
    }

    /// Drives a window against a node that serves one message per step,
    /// with the next message reaching the node `lag` steps after a result
    /// left it (the round trip through the user); returns the settled window.
    fn settle(lag: usize, cap: u32) -> u32 {
        let ms = |step: usize| Duration::from_millis(step as u64);
        let mut w = Window::new(1, true);
        // Messages at the node: (dispatched, done) steps.
        let mut flight: VecDeque<(usize, usize)> = VecDeque::new();
        let mut arrivals: VecDeque<usize> = VecDeque::new();
        let mut node_free_at = 0;
        for step in 0..4000 {
            while arrivals.front().is_some_and(|&a| a <= step) {
                arrivals.pop_front();
                let done = node_free_at.max(step) + 1;
                node_free_at = done;
                flight.push_back((step, done));
                w.on_dispatch(flight.len());
            }
            while flight.front().is_some_and(|&(_, d)| d <= step) {
                let (sent, done) = flight.pop_front().expect("non-empty");
                w.on_result(flight.len(), ms(done - sent), true, cap);
            }
            // The user refills the window.
            while flight.len() + arrivals.len() < w.get() as usize {
                arrivals.push_back(step + lag);
            }
        }
        w.get()
    }

    #[test]
    fn window_settles_at_service_plus_one_when_the_node_is_the_bottleneck() {
        // Round trip within a service time: one in service, one ready.
        assert_eq!(settle(0, MAX_WINDOW), 2);
        assert_eq!(settle(1, MAX_WINDOW), 2);
    }

    #[test]
    fn window_grows_to_cover_a_long_round_trip_and_respects_its_cap() {
        let w = settle(5, MAX_WINDOW);
        assert!((6..=7).contains(&w), "window {w} for a 5-step round trip");
        assert_eq!(settle(5, 3), 3);
    }

    #[test]
    fn window_shrinks_when_messages_only_wait() {
        let ms = Duration::from_millis;
        let mut w = Window::new(8, true);
        w.on_result(7, ms(1), true, MAX_WINDOW);
        // Every result then waited behind about four others.
        for _ in 0..2000 {
            w.on_result(5, ms(5), true, MAX_WINDOW);
        }
        assert_eq!(w.get(), MIN_WINDOW);
        // A node the user does not keep busy gives no reason to grow.
        let mut w = Window::new(2, true);
        for _ in 0..50 {
            w.on_dispatch(1);
            w.on_result(0, ms(1), false, MAX_WINDOW);
        }
        assert_eq!(w.get(), 2);
        // A fixed window stays what it was told.
        let mut w = Window::new(4, false);
        w.on_dispatch(4);
        w.on_result(0, ms(1), true, MAX_WINDOW);
        assert_eq!(w.get(), 4);
    }
}

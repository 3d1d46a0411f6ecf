//! Data demultiplexer policies (seed 000 §3.3.1.3 plus corefarm's credit policy).

use std::collections::VecDeque;

pub mod progress;
mod window;
pub use window::{Answer, Window, MAX_WINDOW, MIN_WINDOW};

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
}

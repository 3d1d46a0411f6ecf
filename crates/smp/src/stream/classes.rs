//! The order in which a link sends what waits for it: strict priority by
//! class (0 first), FIFO within a class, and an anti-starvation guard — a
//! waiting class that has been passed over `guard` times in a row by more
//! urgent ones is served once. With the guard, class k's worst-case wait is
//! bounded even under a saturating stream of class 0 traffic; without it
//! (guard 0), service is strictly by priority, as in seed 001.

use std::collections::VecDeque;

use super::chunk::CLASSES;

/// The guard of queues whose items are whole messages (the server's
/// function queues, the node's queue to its cores): a bulk message waits
/// at most this many urgent ones. Links, whose items are chunks, use a
/// longer one ([`super::outbox::STARVATION_GUARD`]).
pub const MESSAGE_GUARD: u32 = 16;

/// The policy alone, for queues that keep their classes in a structure of
/// their own (the server's deficit round-robin queues): which class goes
/// next, given which classes have something waiting.
#[derive(Debug, Clone)]
pub struct ClassPicker {
    passed: [u32; CLASSES as usize],
    guard: u32,
}

impl ClassPicker {
    /// `guard` 0: strict priority, no anti-starvation.
    pub fn new(guard: u32) -> Self {
        ClassPicker {
            passed: [0; CLASSES as usize],
            guard,
        }
    }

    /// The class to serve next among those for which `waiting` holds,
    /// counted as served; `None` when nothing waits.
    pub fn pick(&mut self, waiting: impl Fn(usize) -> bool) -> Option<usize> {
        let top = (0..CLASSES as usize).find(|&c| waiting(c))?;
        // The most urgent class passed over `guard` times goes first.
        let starved = (self.guard > 0)
            .then(|| {
                (top + 1..CLASSES as usize).find(|&c| waiting(c) && self.passed[c] >= self.guard)
            })
            .flatten();
        let c = starved.unwrap_or(top);
        for k in c + 1..CLASSES as usize {
            if waiting(k) {
                self.passed[k] += 1;
            }
        }
        self.passed[c] = 0;
        Some(c)
    }
}

#[derive(Debug)]
pub struct ClassQueues<T> {
    queues: Vec<VecDeque<T>>,
    picker: ClassPicker,
    len: usize,
}

impl<T> ClassQueues<T> {
    /// `guard` 0: strict priority, no anti-starvation.
    pub fn new(guard: u32) -> Self {
        ClassQueues {
            queues: (0..CLASSES).map(|_| VecDeque::new()).collect(),
            picker: ClassPicker::new(guard),
            len: 0,
        }
    }

    /// Queues `item` in `class` (clamped to the last class).
    pub fn push(&mut self, class: u8, item: T) {
        let c = class.min(CLASSES - 1) as usize;
        self.queues[c].push_back(item);
        self.len += 1;
    }

    /// Puts `item` back at the head of `class`: the rest of a message whose
    /// chunk was just sent stays first in line within its class.
    pub fn push_front(&mut self, class: u8, item: T) {
        let c = class.min(CLASSES - 1) as usize;
        self.queues[c].push_front(item);
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Items waiting in `class`.
    pub fn depth(&self, class: u8) -> usize {
        self.queues.get(class as usize).map_or(0, VecDeque::len)
    }

    /// The next item to send, with its class.
    pub fn pop(&mut self) -> Option<(u8, T)> {
        let queues = &self.queues;
        let c = self.picker.pick(|c| !queues[c].is_empty())?;
        self.len -= 1;
        self.queues[c].pop_front().map(|t| (c as u8, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_priority_fifo_within_a_class() {
        let mut q = ClassQueues::new(0);
        for (c, v) in [(3, 'a'), (0, 'b'), (3, 'c'), (1, 'd'), (0, 'e'), (9, 'z')] {
            q.push(c, v);
        }
        assert_eq!(q.depth(7), 1, "classes above 7 go to 7");
        let order: Vec<char> = std::iter::from_fn(|| q.pop()).map(|(_, v)| v).collect();
        assert_eq!(order, ['b', 'e', 'd', 'a', 'c', 'z']);
        assert!(q.is_empty());
    }

    #[test]
    fn the_guard_serves_a_passed_over_class_once_every_guard_turns() {
        let mut q = ClassQueues::new(3);
        q.push(5, "bulk");
        q.push(5, "bulk2");
        let mut served = Vec::new();
        for i in 0..8 {
            q.push(0, "urgent");
            served.push(q.pop().unwrap().0);
            if i == 7 {
                break;
            }
        }
        // Three urgent ones, then the bulk message that waited, and so on.
        assert_eq!(served, [0, 0, 0, 5, 0, 0, 0, 5]);
        assert_eq!(q.depth(0), 2);
        assert_eq!(q.depth(5), 0);
    }
}

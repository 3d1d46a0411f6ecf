//! One function's job queue: a sub-queue per user, served by deficit
//! round-robin by bytes (Shreedhar & Varghese), so that one user's burst
//! cannot starve another user's single message, and a user sending large
//! messages gets no more bytes per round than one sending small ones.
//! A user's quantum is its weight times the base quantum, so backlogged
//! users are served bytes in the ratio of their weights. Weights are in
//! [`WEIGHT_UNIT`]s: a tenant's weight split among its sessions stays
//! whole.

use std::collections::{HashMap, VecDeque};

/// A weight of 1 (a tenant of weight `w` with `n` sessions gives each
/// `w × WEIGHT_UNIT / n`): divisible by every count of sessions up to 16.
pub const WEIGHT_UNIT: u64 = 720_720;

/// Something that can wait in a queue: its owner and its size in bytes.
pub trait Queued {
    fn user(&self) -> u64;
    fn bytes(&self) -> u64;
    /// Priority class, 0 most urgent ([`super::classq`]).
    fn class(&self) -> u8 {
        corefarm_smp::stream::DEFAULT_CLASS
    }
    /// Its user's share against the other users of the queue, in
    /// [`WEIGHT_UNIT`]s (at least 1).
    fn weight(&self) -> u64 {
        WEIGHT_UNIT
    }
}

#[derive(Debug)]
pub struct DrrQueue<J> {
    /// Bytes a user may send per round; the function's input size, so a
    /// round serves about one input per user.
    quantum: u64,
    /// Users with queued jobs, in round order; the front one is being served.
    active: VecDeque<u64>,
    per_user: HashMap<u64, VecDeque<J>>,
    deficit: HashMap<u64, u64>,
    /// Each active user's weight, from its latest job, in [`WEIGHT_UNIT`]s.
    weight: HashMap<u64, u64>,
    len: usize,
}

impl<J: Queued> DrrQueue<J> {
    pub fn new(quantum: u64) -> Self {
        DrrQueue {
            quantum: quantum.max(1),
            active: VecDeque::new(),
            per_user: HashMap::new(),
            deficit: HashMap::new(),
            weight: HashMap::new(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Jobs queued for one user.
    pub fn len_of(&self, user: u64) -> usize {
        self.per_user.get(&user).map_or(0, VecDeque::len)
    }

    /// A user's bytes per round.
    fn quantum_of(&self, user: u64) -> u64 {
        let w = self.weight.get(&user).copied().unwrap_or(WEIGHT_UNIT);
        let q = u128::from(self.quantum) * u128::from(w) / u128::from(WEIGHT_UNIT);
        u64::try_from(q).unwrap_or(u64::MAX).max(1)
    }

    /// A new job at the back of its user's sub-queue.
    pub fn push(&mut self, j: J) {
        let u = j.user();
        self.weight.insert(u, j.weight().max(1));
        let q = self.per_user.entry(u).or_default();
        if q.is_empty() {
            self.active.push_back(u);
        }
        q.push_back(j);
        self.len += 1;
    }

    /// A job that was already dispatched once (its replica died): first in
    /// its user's sub-queue, so re-dispatch keeps the user's order.
    pub fn push_front(&mut self, j: J) {
        let u = j.user();
        self.weight.insert(u, j.weight().max(1));
        let q = self.per_user.entry(u).or_default();
        if q.is_empty() {
            self.active.push_back(u);
        }
        q.push_front(j);
        self.len += 1;
    }

    /// Iterates over every queued job (no particular order).
    pub fn iter(&self) -> impl Iterator<Item = &J> {
        self.per_user.values().flatten()
    }

    /// Removes every job of a user (it left); returns them.
    pub fn remove_user(&mut self, user: u64) -> Vec<J> {
        self.active.retain(|&u| u != user);
        self.deficit.remove(&user);
        self.weight.remove(&user);
        let gone: Vec<J> = self.per_user.remove(&user).unwrap_or_default().into();
        self.len -= gone.len();
        gone
    }

    /// Whether a user not in `except` has a job queued.
    pub fn has_other_than(&self, except: &[u64]) -> bool {
        self.active.iter().any(|u| !except.contains(u))
    }

    /// [`DrrQueue::pop`] among the users not in `except` (held off for
    /// now: `max_nodes`). Those keep their place and deficit: they are
    /// first in the round again when they may be served.
    pub fn pop_except(&mut self, except: &[u64]) -> Option<J> {
        if except.is_empty() {
            return self.pop();
        }
        let mut held = Vec::new();
        self.active.retain(|u| match except.contains(u) {
            true => {
                held.push(*u);
                false
            }
            false => true,
        });
        let j = self.pop();
        for u in held.into_iter().rev() {
            self.active.push_front(u);
        }
        j
    }

    /// The next job by deficit round-robin.
    pub fn pop(&mut self) -> Option<J> {
        let mut visited = 0;
        loop {
            let &u = self.active.front()?;
            let head = self.per_user[&u]
                .front()
                .expect("active users have jobs")
                .bytes();
            let d = self.deficit.entry(u).or_insert(0);
            if *d >= head {
                *d -= head;
                let q = self.per_user.get_mut(&u).expect("active");
                let j = q.pop_front().expect("non-empty");
                if q.is_empty() {
                    // An empty sub-queue keeps no credit (DRR): idling is not saved up.
                    self.per_user.remove(&u);
                    self.deficit.remove(&u);
                    self.weight.remove(&u);
                    self.active.pop_front();
                }
                self.len -= 1;
                return Some(j);
            }
            // The front user has had its turn: the next one gets a quantum.
            self.active.rotate_left(1);
            let next = *self.active.front().expect("non-empty");
            let q = self.quantum_of(next);
            *self.deficit.entry(next).or_insert(0) += q;
            visited += 1;
            if visited > self.active.len() {
                // A whole round served nobody (messages much larger than the
                // quantum): grant the rounds the closest user still needs at
                // once instead of looping through them.
                let rounds = self
                    .active
                    .iter()
                    .map(|u| {
                        let need = self.per_user[u].front().expect("active").bytes();
                        need.saturating_sub(self.deficit.get(u).copied().unwrap_or(0))
                            .div_ceil(self.quantum_of(*u))
                    })
                    .min()
                    .unwrap_or(0);
                if rounds > 1 {
                    for &u in &self.active {
                        let q = self.quantum_of(u);
                        *self.deficit.entry(u).or_insert(0) += (rounds - 1) * q;
                    }
                }
                visited = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct J(u64, u64, u32);
    impl Queued for J {
        fn user(&self) -> u64 {
            self.0
        }
        fn bytes(&self) -> u64 {
            self.1
        }
    }

    #[test]
    fn a_burst_does_not_starve_a_single_message() {
        let mut q = DrrQueue::new(16);
        for i in 0..50 {
            q.push(J(1, 16, i));
        }
        q.push(J(2, 16, 0));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|j| j.0).collect();
        let b = order.iter().position(|&u| u == 2).unwrap();
        assert!(b <= 1, "user 2 served at position {b}: {order:?}");
        assert_eq!(order.len(), 51);
        assert!(q.is_empty());
    }

    #[test]
    fn fairness_is_by_bytes_not_messages() {
        // User 1 sends 4-input messages, user 2 one-input ones: per round
        // user 2 gets about four messages for each of user 1's.
        let mut q = DrrQueue::new(10);
        for i in 0..10 {
            q.push(J(1, 40, i));
            for k in 0..4 {
                q.push(J(2, 10, i * 4 + k));
            }
        }
        let first: Vec<u64> = (0..20).map(|_| q.pop().unwrap().0).collect();
        let ones = first.iter().filter(|&&u| u == 1).count();
        assert!((3..=5).contains(&ones), "{first:?}");
        // Per-user order is kept.
        let mut q2 = DrrQueue::new(10);
        (0..5).for_each(|i| q2.push(J(1, 10, i)));
        q2.push_front(J(1, 10, 99));
        let ids: Vec<u32> = std::iter::from_fn(|| q2.pop()).map(|j| j.2).collect();
        assert_eq!(ids, [99, 0, 1, 2, 3, 4]);
    }

    #[derive(Debug)]
    struct W(u64, u64);
    impl Queued for W {
        fn user(&self) -> u64 {
            self.0
        }
        fn bytes(&self) -> u64 {
            10
        }
        fn weight(&self) -> u64 {
            self.1 * WEIGHT_UNIT
        }
    }

    #[test]
    fn backlogged_users_are_served_in_the_ratio_of_their_weights() {
        let mut q = DrrQueue::new(10);
        for _ in 0..100 {
            q.push(W(1, 1));
            q.push(W(2, 3));
        }
        let first: Vec<u64> = (0..40).map(|_| q.pop().unwrap().0).collect();
        let ones = first.iter().filter(|&&u| u == 1).count();
        assert_eq!(ones, 10, "{first:?}");
    }

    #[test]
    fn users_held_off_keep_their_jobs_and_their_turn() {
        let mut q = DrrQueue::new(10);
        for i in 0..3 {
            q.push(J(1, 10, i));
            q.push(J(2, 10, i));
        }
        assert!(q.has_other_than(&[1]) && !q.has_other_than(&[1, 2]));
        assert_eq!(q.pop_except(&[1, 2]).map(|j| j.0), None);
        let held: Vec<u64> = (0..3).map(|_| q.pop_except(&[1]).unwrap().0).collect();
        assert_eq!(held, [2, 2, 2]);
        let rest: Vec<u32> = std::iter::from_fn(|| q.pop()).map(|j| j.2).collect();
        assert_eq!((rest, q.len()), (vec![0, 1, 2], 0));
    }

    #[test]
    fn huge_messages_do_not_spin_and_users_leave_cleanly() {
        let mut q = DrrQueue::new(1);
        q.push(J(1, 1 << 40, 0));
        q.push(J(2, 1 << 40, 0));
        assert!(q.pop().is_some());
        assert_eq!(q.remove_user(2).len() + q.len(), 1);
        while q.pop().is_some() {}
        assert!(q.is_empty() && q.len_of(1) == 0 && q.len_of(2) == 0);
    }
}

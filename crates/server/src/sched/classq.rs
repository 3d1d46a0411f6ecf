//! A function's queue with priority classes: one deficit
//! round-robin queue per class, served by strict priority (class 0 first)
//! with the anti-starvation policy of `smp::stream::ClassPicker` (shared
//! with the links and the node's queue to its cores) — a class passed over
//! [`GUARD`] times in a row by more urgent ones is served once.
//! Fairness between users holds within each class.

use corefarm_smp::stream::{ClassPicker, CLASSES, MESSAGE_GUARD};

use super::queue::{DrrQueue, Queued};

/// Pops of more urgent classes after which a waiting class is served once.
pub const GUARD: u32 = MESSAGE_GUARD;

#[derive(Debug)]
pub struct ClassDrr<J> {
    classes: Vec<DrrQueue<J>>,
    picker: ClassPicker,
    len: usize,
}

fn slot(class: u8) -> usize {
    class.min(CLASSES - 1) as usize
}

impl<J: Queued> ClassDrr<J> {
    pub fn new(quantum: u64) -> Self {
        ClassDrr {
            classes: (0..CLASSES).map(|_| DrrQueue::new(quantum)).collect(),
            picker: ClassPicker::new(GUARD),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Jobs queued for one user, all classes.
    pub fn len_of(&self, user: u64) -> usize {
        self.classes.iter().map(|q| q.len_of(user)).sum()
    }

    /// Jobs queued in one class.
    pub fn depth(&self, class: u8) -> usize {
        self.classes[slot(class)].len()
    }

    pub fn push(&mut self, j: J) {
        self.len += 1;
        self.classes[slot(j.class())].push(j);
    }

    /// A job dispatched before (its replica died): first of its user in its class.
    pub fn push_front(&mut self, j: J) {
        self.len += 1;
        self.classes[slot(j.class())].push_front(j);
    }

    pub fn iter(&self) -> impl Iterator<Item = &J> {
        self.classes.iter().flat_map(|q| q.iter())
    }

    pub fn remove_user(&mut self, user: u64) -> Vec<J> {
        let gone: Vec<J> = self
            .classes
            .iter_mut()
            .flat_map(|q| q.remove_user(user))
            .collect();
        self.len -= gone.len();
        gone
    }

    /// [`ClassDrr::pop`] among the users not in `except`
    /// ([`DrrQueue::pop_except`]).
    pub fn pop_except(&mut self, except: &[u64]) -> Option<J> {
        if except.is_empty() {
            return self.pop();
        }
        let classes = &self.classes;
        let c = self.picker.pick(|c| classes[c].has_other_than(except))?;
        let j = self.classes[c].pop_except(except)?;
        self.len -= 1;
        Some(j)
    }

    pub fn pop(&mut self) -> Option<J> {
        let classes = &self.classes;
        let c = self.picker.pick(|c| !classes[c].is_empty())?;
        let j = self.classes[c].pop()?;
        self.len -= 1;
        Some(j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct J(u64, u8, u32);
    impl Queued for J {
        fn user(&self) -> u64 {
            self.0
        }
        fn bytes(&self) -> u64 {
            16
        }
        fn class(&self) -> u8 {
            self.1
        }
    }

    #[test]
    fn urgent_classes_first_fair_within_a_class_and_bulk_not_starved() {
        let mut q = ClassDrr::new(16);
        for i in 0..4 {
            q.push(J(1, 7, i));
        }
        q.push(J(1, 0, 100));
        q.push(J(2, 0, 200));
        q.push(J(1, 0, 101));
        assert_eq!((q.len(), q.len_of(1), q.depth(0)), (7, 6, 3));
        let first: Vec<u32> = (0..3).map(|_| q.pop().unwrap().2).collect();
        // Class 0 first; users alternate within it.
        assert_eq!(first, [200, 100, 101]);
        assert_eq!(q.pop().unwrap().2, 0);
        // Under a steady stream of class 0, class 7 still gets one in GUARD + 1.
        let mut bulk = 0;
        for i in 0..(GUARD as usize + 1) * 3 {
            q.push(J(3, 0, 1000 + i as u32));
            if q.pop().unwrap().1 == 7 {
                bulk += 1;
            }
        }
        assert_eq!(bulk, 3);
        let left = q.len();
        let gone = q.remove_user(3).len();
        assert_eq!((gone, q.len(), q.len_of(3)), (3, left - 3, 0));
        while q.pop().is_some() {}
        assert!(q.is_empty() && q.iter().next().is_none());
    }
}

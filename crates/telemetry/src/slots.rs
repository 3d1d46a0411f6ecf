//! Bounded label cardinality: per-name metric slots (users by the name they
//! give in their hello) up to a cap, then one shared `other` slot. A slot is
//! looked up once per session, never per message; the hot path then works on
//! the returned `Arc` alone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The label value every name beyond the cap shares.
pub const OTHER: &str = "other";

#[derive(Debug)]
pub struct Slots<T> {
    cap: usize,
    map: Mutex<BTreeMap<String, Arc<T>>>,
}

impl<T: Default> Slots<T> {
    /// `cap` distinct names get their own slot; the rest share `other`.
    pub fn new(cap: usize) -> Self {
        Slots {
            cap,
            map: Mutex::new(BTreeMap::new()),
        }
    }

    /// The slot for `name`, created if the cap allows. Names are cut to 64
    /// characters, so a peer cannot make a label value arbitrarily long.
    pub fn get(&self, name: &str) -> Arc<T> {
        let name: String = name.chars().take(64).collect();
        let mut m = self.map.lock().expect("slots lock");
        if let Some(s) = m.get(&name) {
            return s.clone();
        }
        let key = if m.len() < self.cap || name == OTHER {
            name
        } else {
            OTHER.to_string()
        };
        m.entry(key).or_default().clone()
    }

    /// Every slot with its label value, sorted by name.
    pub fn all(&self) -> Vec<(String, Arc<T>)> {
        let m = self.map.lock().expect("slots lock");
        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn names_beyond_the_cap_share_other() {
        let s: Slots<AtomicU64> = Slots::new(2);
        s.get("a").fetch_add(1, Ordering::Relaxed);
        s.get("a").fetch_add(1, Ordering::Relaxed);
        s.get("b").fetch_add(1, Ordering::Relaxed);
        s.get("c").fetch_add(1, Ordering::Relaxed);
        s.get("d").fetch_add(1, Ordering::Relaxed);
        let all: Vec<(String, u64)> = s
            .all()
            .into_iter()
            .map(|(k, v)| (k, v.load(Ordering::Relaxed)))
            .collect();
        assert_eq!(
            all,
            vec![("a".into(), 2), ("b".into(), 1), ("other".into(), 2)]
        );
        assert_eq!(s.get(&"x".repeat(100)).load(Ordering::Relaxed), 2);
    }
}

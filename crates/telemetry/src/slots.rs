//! Bounded label cardinality: per-name metric slots (users by the name they
//! give in their hello) up to a cap, then one shared `other` slot. A slot is
//! looked up once per session, never per message; the hot path then works on
//! the returned `Arc` alone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The label value every name beyond the cap shares.
pub const OTHER: &str = "other";

/// Longest name (in characters) a peer can make the server show: a metric
/// label, a status field or a log line carries at most this much of a
/// name a peer chose (a user's, a node's, a node's targets), so a scrape
/// or a status stays about as long as the cluster is large, whatever the
/// peers send.
pub const MAX_NAME_CHARS: usize = 64;

/// `name` cut to [`MAX_NAME_CHARS`] characters (borrowed when it fits):
/// the one bound every peer-supplied name goes through.
pub fn bounded(name: &str) -> std::borrow::Cow<'_, str> {
    match name.char_indices().nth(MAX_NAME_CHARS) {
        Some((at, _)) => std::borrow::Cow::Owned(name[..at].to_string()),
        None => std::borrow::Cow::Borrowed(name),
    }
}

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

    /// The slot for `name`, created if the cap allows. Names are cut to
    /// [`MAX_NAME_CHARS`] ([`bounded`]), so a peer cannot make a label value
    /// arbitrarily long.
    pub fn get(&self, name: &str) -> Arc<T> {
        let name = bounded(name).into_owned();
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

    #[test]
    fn names_are_bounded_in_characters() {
        assert_eq!(bounded("n0"), "n0");
        let long = "é".repeat(MAX_NAME_CHARS + 1);
        assert_eq!(bounded(&long), "é".repeat(MAX_NAME_CHARS));
        assert!(matches!(bounded(&long[2..]), std::borrow::Cow::Borrowed(_)));
    }
}

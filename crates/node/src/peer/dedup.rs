//! Duplicate rejection (seed 001 §III-A: "the network layer automatically
//! rejects any duplicate packets targeted to its local node"). One bounded
//! window per source: the highest sequence number seen and a bitmap of the
//! `WINDOW` numbers below it. Anything older than the window is rejected
//! too — with in-order routes it can only be a replay.

/// Sequence numbers remembered below the highest one seen (512 bytes a
/// source): wide enough that a link may let 64 messages pass a waiting one
/// on routes of up to 64 hops (see `outq::max_passed`).
pub const WINDOW: u64 = 4096;
const WORDS: usize = (WINDOW / 64) as usize;

#[derive(Debug, Clone)]
pub struct DedupWindow {
    /// Highest sequence number accepted + 1 (0: none yet).
    top: u64,
    /// Bit i of the ring = sequence number (top − 1 − i) was seen … kept as
    /// absolute positions `seq % WINDOW` for O(1) updates.
    seen: [u64; WORDS],
}

impl Default for DedupWindow {
    fn default() -> Self {
        DedupWindow {
            top: 0,
            seen: [0; WORDS],
        }
    }
}

impl DedupWindow {
    fn bit(seq: u64) -> (usize, u64) {
        let p = seq % WINDOW;
        ((p / 64) as usize, 1u64 << (p % 64))
    }

    /// True the first time `seq` is offered, false for a duplicate (or a
    /// number too old to tell).
    pub fn accept(&mut self, seq: u64) -> bool {
        // `top` is one past the highest number seen: the last number there
        // is cannot be tracked, and no sender counts that far.
        if seq == u64::MAX {
            return false;
        }
        if seq >= self.top {
            // Clear the positions of numbers that slide out of the window.
            let from = self.top.max(seq.saturating_sub(WINDOW - 1));
            if seq - from >= WINDOW {
                self.seen = [0; WORDS];
            } else {
                for s in from..seq {
                    let (w, b) = Self::bit(s);
                    self.seen[w] &= !b;
                }
            }
            let (w, b) = Self::bit(seq);
            self.seen[w] |= b;
            self.top = seq + 1;
            return true;
        }
        if self.top - seq > WINDOW {
            return false;
        }
        let (w, b) = Self::bit(seq);
        let fresh = self.seen[w] & b == 0;
        self.seen[w] |= b;
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_rejected_gaps_and_reordering_within_the_window_accepted() {
        let mut d = DedupWindow::default();
        assert!(d.accept(1));
        assert!(d.accept(5));
        assert!(!d.accept(5));
        assert!(d.accept(3), "late but new");
        assert!(!d.accept(3));
        assert!(!d.accept(1));
        assert!(d.accept(5 + WINDOW - 1));
        assert!(!d.accept(5), "slid out of the window: rejected");
        assert!(d.accept(10 * WINDOW));
        assert!(d.accept(10 * WINDOW - 1));
        assert!(!d.accept(10 * WINDOW));
        // The largest number is refused, not an overflow.
        assert!(!d.accept(u64::MAX));
        assert!(d.accept(u64::MAX - 1));
        assert!(!d.accept(u64::MAX - 1));
    }

    #[test]
    fn matches_a_set_model_on_random_sequences() {
        use std::collections::HashSet;
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut d = DedupWindow::default();
        let mut seen = HashSet::new();
        let mut top = 0u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let seq = top.saturating_sub(WINDOW) + x % (WINDOW + 40);
            let expect = if seq + WINDOW < top {
                false
            } else {
                seen.insert(seq)
            };
            assert_eq!(d.accept(seq), expect, "seq {seq} top {top}");
            top = top.max(seq + 1);
        }
    }
}

//! Progress, not connection state: the rule both placements use to notice a
//! hung node in milliseconds rather than at `--node-timeout`.
//!
//! A node's progress clock is when it last returned anything (a result or
//! an error for an input), or when work was sent to it while it had none.
//! An input in flight on it is *late* once it was sent longer ago than its
//! bound, `max(factor × expected service, floor)`, less two expected
//! services (see [`Hedge::late_after`]), so that its copy's answer lands
//! within the bound — and the node has also been silent for half that
//! ([`Hedge::late_at`]). Counting from the send, an input queued on the
//! node before it stopped pays the bound, not the bound plus its wait in
//! that queue; asking for the node's silence too, an input queued behind
//! others on a busy node is not late while the node keeps answering, and
//! every input of a node that stopped answering is.
//! (A hung job on one core of an otherwise answering node is the node's
//! worker watchdog's to fail, not this rule's.) A late input is sent again
//! to another node that holds the function — speculative re-dispatch: the
//! first answer per input wins, the other copy's is dropped and counted
//! when it comes. A node with work and no progress for [`Hedge::stall_after`]
//! is *stalled*: it takes no new work until it returns something, then
//! rejoins with the window it had. Its connection stays open: closing it is
//! still `--node-timeout`'s job.
//!
//! Bounds: an input has at most one extra copy, and the copies in flight
//! at a time are at most one node's window ([`budget`]), so a cluster that
//! is slow but alive does at most one node's worth of work twice, never
//! all of it. A function not measured yet (no result so far) is not
//! hedged: there is nothing to compare with.
//!
//! Not hedged, because re-running it is not safe or not possible: work of
//! a configuration with streaming handler sets (their context memory
//! persists across messages, so a second run would count twice; see
//! [`hedgeable`]), and group work (collectives on resident buffers), which
//! never passes through a placement's dispatch: the group code relays it
//! and a member's hang ends the group when the member is timed out.
//!
//! Time is a `Duration` since an origin the placement picks, so the
//! shared-mode scheduler stays a pure function of its events.

use std::time::Duration;

/// A stalled node is not declared before this, whatever the hedge bound:
/// well over a scheduling hiccup, well under any `--node-timeout`.
pub const STALL_FLOOR: Duration = Duration::from_millis(200);

/// The hedge rule's parameters (`--hedge-factor`, `--hedge-floor-ms`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hedge {
    /// Work is late after this many times its expected service time...
    pub factor: f64,
    /// ...and never before this.
    pub floor: Duration,
}

impl Hedge {
    /// `None` (the rule off) when either parameter is zero.
    pub fn new(factor: f64, floor: Duration) -> Option<Hedge> {
        (factor > 0.0 && !floor.is_zero()).then_some(Hedge { factor, floor })
    }

    /// The most a hung node may add to the latency of work expected to
    /// take `expect`: `factor × expect`, at least `floor`.
    pub fn bound(&self, expect: Duration) -> Duration {
        expect.mul_f64(self.factor).max(self.floor)
    }

    /// How long work expected to take `expect` may go without progress:
    /// its [`bound`](Self::bound) less what its copy will take — its own
    /// service and about one job ahead of it on the replica that takes it
    /// (a credit window keeps about one queued) — so that the copy's result
    /// lands within the bound, not a copy's latency after it; never less
    /// than half the bound.
    pub fn late_after(&self, expect: Duration) -> Duration {
        let bound = self.bound(expect);
        bound.saturating_sub(expect * 2).max(bound / 2)
    }

    /// The soonest any work can be late (half the floor, see
    /// [`late_after`](Self::late_after)): when to look first after a send.
    pub fn earliest(&self) -> Duration {
        self.floor / 2
    }

    /// How long a node with work may go without any progress before it is
    /// stalled: twice the bound of its longest work, at least
    /// [`STALL_FLOOR`], so its inputs are hedged before it is set aside.
    pub fn stall_after(&self, expect: Duration) -> Duration {
        (self.bound(expect) * 2).max(STALL_FLOOR)
    }

    /// When an input sent at `sent`, expected to take `expect`, on a node
    /// whose last progress was at `last`, becomes late: once it has waited
    /// [`late_after`](Self::late_after) since its send and the node has
    /// been silent for half that (far longer than a working node's gap
    /// between answers, at four service times or more).
    pub fn late_at(&self, sent: Duration, last: Duration, expect: Duration) -> Duration {
        let after = self.late_after(expect);
        (sent + after).max(last + after / 2)
    }
}

/// Expected service time of a job of `inputs` inputs at `per_input`
/// seconds each; `None` before the function was measured.
pub fn expect(per_input: Option<f64>, inputs: u32) -> Option<Duration> {
    let s = per_input? * f64::from(inputs.max(1));
    Some(Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX))
}

/// Hedge copies that may be in flight at once: one node's window, the
/// largest among those that could take a copy (at least one).
pub fn budget(windows: impl Iterator<Item = u32>) -> usize {
    windows.max().unwrap_or(1).max(1) as usize
}

/// Weight of a new service-time sample in the moving average.
pub const EWMA: f64 = 0.25;

/// A function's measured service time, seconds per input: a moving
/// average of `took / inputs`, where `took` counts from when the node
/// could start the job (its send, or the node's previous answer).
pub fn record_service(prev: Option<f64>, took: Duration, inputs: u32) -> f64 {
    let per = took.as_secs_f64() / f64::from(inputs.max(1));
    match prev {
        Some(s) => s + EWMA * (per - s),
        None => per,
    }
}

/// The expected pace of a node: the slower of its own measured service
/// time and its function's. A node slower than its peers by design keeps
/// its own pace; a node that stops is still judged by the function's, so a
/// fast history does not make it late sooner than its peers would be.
pub fn slower(node: Option<f64>, function: Option<f64>) -> Option<f64> {
    match (node, function) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Whether the work of a configuration may be hedged: not when its image
/// carries streaming handler sets (docs/images.md `handler_sets`), whose
/// per-context memory lives on the node across messages and whose
/// notifications would reach the user twice. The server cannot tell which
/// message a node's rulesets will match, so such a configuration is not
/// hedged at all. Read once per configuration.
pub fn hedgeable(bitstream: &[u8]) -> bool {
    const MAGIC: &[u8] = b"CFIMAGE\0";
    const HEADER: usize = 16;
    #[derive(serde::Deserialize)]
    struct Manifest {
        #[serde(default)]
        handler_sets: Vec<serde::de::IgnoredAny>,
    }
    if !bitstream.starts_with(MAGIC) || bitstream.len() < HEADER {
        return true;
    }
    let len = u32::from_le_bytes(bitstream[12..HEADER].try_into().expect("4 bytes")) as usize;
    let Some(manifest) = HEADER
        .checked_add(len)
        .and_then(|end| bitstream.get(HEADER..end))
    else {
        // The node refuses an image it cannot read; nothing runs to hedge.
        return false;
    };
    match serde_json::from_slice::<Manifest>(manifest) {
        Ok(m) => m.handler_sets.is_empty(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_bound_is_a_multiple_of_the_service_time_with_a_floor() {
        let h = Hedge::new(4.0, ms(50)).unwrap();
        assert_eq!(h.bound(ms(1)), ms(50));
        assert_eq!(h.bound(ms(20)), ms(80));
        // The copy's own service and one job ahead of it fit in the bound.
        assert_eq!(h.late_after(ms(1)), ms(48));
        assert_eq!(h.late_after(ms(20)), ms(40));
        assert_eq!(h.late_after(ms(40)), ms(80));
        assert_eq!(h.late_after(Duration::ZERO), ms(50));
        assert_eq!(h.stall_after(ms(1)), ms(200));
        assert_eq!(h.stall_after(ms(40)), ms(320));
        // Counted from the later of the send and the node's last progress.
        // From the send, once the node has been silent for half of it...
        assert_eq!(h.late_at(ms(10), ms(30), ms(1)), ms(58));
        assert_eq!(h.late_at(ms(30), ms(10), ms(1)), ms(78));
        // ...so an input queued behind others on a node that keeps
        // answering (last progress just now) is not late yet.
        assert_eq!(h.late_at(ms(10), ms(100), ms(1)), ms(124));
        assert_eq!(Hedge::new(0.0, ms(50)), None);
        assert_eq!(Hedge::new(4.0, Duration::ZERO), None);
        assert_eq!(expect(None, 3), None);
        assert_eq!(expect(Some(0.002), 3), Some(ms(6)));
    }

    fn image(manifest: &str) -> Vec<u8> {
        let mut v = b"CFIMAGE\0".to_vec();
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&(manifest.len() as u32).to_le_bytes());
        v.extend_from_slice(manifest.as_bytes());
        v
    }

    #[test]
    fn images_with_handler_sets_are_not_hedged() {
        assert!(hedgeable(b"raw bitstream"));
        assert!(hedgeable(&image(r#"{"name":"vadd"}"#)));
        assert!(hedgeable(&image(r#"{"name":"vadd","handler_sets":[]}"#)));
        assert!(!hedgeable(&image(
            r#"{"name":"f","handler_sets":[{"name":"s"}]}"#
        )));
        assert!(!hedgeable(&image("not json")));
    }
}

//! One server-wide bound on the memory peers can make the server hold
//! before what they send is complete (`--memory-budget`): frames being
//! received (a configuration trickled in, a data message on its way), and
//! chunked messages begun and not finished. Per-connection bounds alone
//! let many connections together hold far more than the host has.
//!
//! Each connection holds a [`Charge`] against the [`Budget`]; a charge
//! grows as bytes arrive and shrinks when they are handed on, and gives
//! back what it holds when dropped, so a connection that ends for any
//! reason leaks nothing and nothing is released twice. A growth the
//! budget cannot take fails only that connection ([`OverBudget`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use corefarm_smp::{ErrorCode, ErrorMsg, ProtocolError};

use crate::metrics::ErrorKind;

/// Charges move in steps of this many bytes (rounded up, given back a step
/// late), so a stream of small frames does not touch the shared counter
/// on every frame; it is a decoder's smallest read buffer, so a connection
/// between frames is charged about what it holds anyway.
const STEP: u64 = 16 << 10;

/// The memory peers may make the server hold, and how much of it they do.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    used: AtomicU64,
}

/// A charge the budget could not take.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the server's memory for unfinished messages is spent ({used} of {limit} bytes held, \
     --memory-budget): {want} more bytes refused; send large messages one at a time, or \
     try again when the server is less busy"
)]
pub(crate) struct OverBudget {
    pub want: u64,
    pub used: u64,
    pub limit: u64,
}

impl From<OverBudget> for ProtocolError {
    fn from(e: OverBudget) -> Self {
        ProtocolError::OverBudget(e.to_string())
    }
}

/// Why a peer is ended for what it made the server hold.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Held {
    /// A growth the budget could not take ([`OverBudget`]'s reason).
    #[error("{0}")]
    OverBudget(String),
    /// A chunked message left unfinished past `--message-timeout`.
    #[error(
        "message {id} was not finished within {after:?} of the server waiting for its \
         chunks (--message-timeout): the connection is closed and what the message held \
         is released"
    )]
    Unfinished { id: u32, after: Duration },
}

impl Held {
    /// The id and code the peer is told.
    pub(crate) fn told(&self) -> (u32, ErrorCode) {
        match self {
            Held::OverBudget(_) => (ErrorMsg::NO_ID, ErrorCode::TooLarge),
            Held::Unfinished { id, .. } => (*id, ErrorCode::Timeout),
        }
    }

    /// How `errors_total` counts it.
    pub(crate) fn kind(&self) -> ErrorKind {
        match self {
            Held::OverBudget(_) => ErrorKind::OverBudget,
            Held::Unfinished { .. } => ErrorKind::Unfinished,
        }
    }
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// Bytes held against the budget now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// A new connection's charge, holding nothing yet.
    pub(crate) fn charge(self: &Arc<Self>) -> Charge {
        Charge {
            budget: self.clone(),
            held: 0,
        }
    }

    fn take(&self, more: u64) -> Result<(), OverBudget> {
        let limit = self.limit;
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_add(more).filter(|&n| n <= limit)
            })
            .map(|_| ())
            .map_err(|used| OverBudget {
                want: more,
                used,
                limit,
            })
    }

    fn give(&self, less: u64) {
        self.used.fetch_sub(less, Ordering::Relaxed);
    }
}

/// A fixed amount held against the budget until dropped: an item queued
/// for a peer (a notification waiting for its user's session).
#[derive(Debug)]
pub(crate) struct Fixed {
    budget: Arc<Budget>,
    held: u64,
}

impl Budget {
    /// Holds exactly `bytes` until the returned guard is dropped.
    pub(crate) fn hold(self: &Arc<Self>, bytes: u64) -> Result<Fixed, OverBudget> {
        self.take(bytes)?;
        Ok(Fixed {
            budget: self.clone(),
            held: bytes,
        })
    }
}

impl Drop for Fixed {
    fn drop(&mut self) {
        self.budget.give(self.held);
    }
}

/// What one connection holds against the budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Arc<Budget>,
    held: u64,
}

impl Charge {
    /// The connection now holds `bytes`: the charge follows (in steps of
    /// [`STEP`]). A growth over the budget is refused and the charge left
    /// as it was.
    pub(crate) fn set(&mut self, bytes: u64) -> Result<(), OverBudget> {
        let want = bytes.div_ceil(STEP).saturating_mul(STEP);
        if want > self.held {
            self.budget.take(want - self.held)?;
            self.held = want;
        } else if want + STEP < self.held {
            self.budget.give(self.held - want);
            self.held = want;
        }
        Ok(())
    }

    /// Bytes this charge holds against the budget.
    #[cfg(test)]
    pub(crate) fn held(&self) -> u64 {
        self.held
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give(self.held);
    }
}

/// A reader of an untrusted peer reports its unfinished frames here.
impl corefarm_smp::codec::Meter for Charge {
    fn hold(&mut self, bytes: usize) -> Result<(), ProtocolError> {
        Ok(self.set(bytes as u64)?)
    }

    /// An idle link keeps no step in hand: thousands of idle nodes would
    /// otherwise hold a step each of the budget.
    fn idle(&mut self) {
        self.budget.give(std::mem::take(&mut self.held));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_follow_what_is_held_and_give_it_back_once() {
        let b = Budget::new(10 * STEP);
        let mut one = b.charge();
        let mut two = b.charge();
        one.set(3 * STEP + 1).unwrap();
        assert_eq!((one.held(), b.used()), (4 * STEP, 4 * STEP));
        two.set(6 * STEP).unwrap();
        // Over the budget: refused, and nothing changes.
        let e = two.set(7 * STEP).unwrap_err();
        assert_eq!((e.want, e.used, e.limit), (STEP, 10 * STEP, 10 * STEP));
        assert_eq!((two.held(), b.used()), (6 * STEP, 10 * STEP));
        // Small changes stay within a step; a real drop gives back.
        one.set(3 * STEP).unwrap();
        assert_eq!(one.held(), 4 * STEP);
        one.set(0).unwrap();
        assert_eq!((one.held(), b.used()), (0, 6 * STEP));
        drop(two);
        assert_eq!(b.used(), 0);
        drop(one);
        assert_eq!(b.used(), 0, "nothing given back twice");
    }
}

#[cfg(test)]
mod wire_tests;

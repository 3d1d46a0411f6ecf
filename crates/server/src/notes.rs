//! Handler notifications (type 0x1C) relayed from a node to the user that
//! owns the data message, with the user's id for it (docs/protocol.md).
//! A user that did not agree `spin-notify` never sees one: they are
//! counted, and the first is logged. At most [`PER_MESSAGE`] of one data
//! message are relayed, whatever a node sends.

use std::sync::Arc;

use corefarm_smp::Notification;

use crate::budget::{Budget, Fixed, OverBudget};

/// What a queued notification is charged beyond its data: its header and
/// the queue's bookkeeping.
const OVERHEAD: u64 = 64;

/// A notification waiting in a user's queue (shared mode, where the
/// scheduler queues for sessions without waiting for them), charged to the
/// memory budget until the session takes it: a user that stops reading
/// while a node notifies cannot make the server queue without end.
#[derive(Debug)]
pub struct Queued {
    note: Notification,
    _held: Fixed,
}

impl Queued {
    /// The notification, its charge released.
    pub fn into_note(self) -> Notification {
        self.note
    }
}

/// `note` charged to `budget` while it waits; refused (and so dropped, the
/// message itself unaffected) when the budget cannot take it.
pub(crate) fn queue(budget: &Arc<Budget>, note: Notification) -> Result<Queued, OverBudget> {
    let held = budget.hold(note.data.len() as u64 + OVERHEAD)?;
    Ok(Queued { note, _held: held })
}

/// Notifications a user's session dropped because the user did not agree them.
#[derive(Debug, Default)]
pub struct Dropped(u64);

impl Dropped {
    /// Counts one; logs the first (a notifying handler sends many).
    pub fn count(&mut self, user: &dyn std::fmt::Display, n: &Notification) {
        if self.0 == 0 {
            tracing::info!(
                %user,
                "handler notification for data id {} dropped (and every later one): the user \
                 did not agree spin-notify",
                n.id
            );
        }
        self.0 += 1;
    }
}

/// Notifications of one data message relayed at most: the bound a node
/// keeps (docs/protocol.md, "Bounds"), enforced by the server too, so a
/// node that ignores it cannot make the server queue and send without end.
pub const PER_MESSAGE: u32 = corefarm_smp::notify::MAX_PER_MESSAGE as u32;

/// Counts one more notification of data message `id` (of the user's
/// numbering), `relayed` being how many came before: whether it is
/// relayed. The rest are dropped, the message itself unaffected; the first
/// one dropped is logged, once per message, naming the `node`.
pub fn within(relayed: &mut u32, id: u32, node: impl FnOnce() -> String) -> bool {
    *relayed = relayed.saturating_add(1);
    if *relayed == PER_MESSAGE + 1 {
        tracing::warn!(
            node = %node(),
            "data id {id}: more than {PER_MESSAGE} handler notifications; the rest are dropped"
        );
    }
    *relayed <= PER_MESSAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queued notification holds its size against the budget until its
    /// session takes it; one the budget cannot take is refused. Before,
    /// a scheduler queued notifications for a user that did not read
    /// without any bound but the per-message count.
    #[test]
    fn queued_notifications_are_charged_until_taken() {
        let budget = Budget::new(3 * (1000 + OVERHEAD));
        let note = |i: u32| Notification {
            id: i,
            set: 0,
            data: bytes::Bytes::from(vec![0u8; 1000]),
        };
        let q: Vec<Queued> = (0..3).map(|i| queue(&budget, note(i)).unwrap()).collect();
        assert_eq!(budget.used(), 3 * (1000 + OVERHEAD));
        let e = queue(&budget, note(3)).unwrap_err();
        assert_eq!(e.want, 1000 + OVERHEAD);
        let mut q = q.into_iter();
        assert_eq!(q.next().unwrap().into_note().id, 0);
        assert_eq!(budget.used(), 2 * (1000 + OVERHEAD));
        drop(q);
        assert_eq!(budget.used(), 0);
    }
}

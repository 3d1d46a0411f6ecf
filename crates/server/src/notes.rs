//! Handler notifications (type 0x1C) relayed from a node to the user that
//! owns the data message, with the user's id for it (docs/protocol.md).
//! A user that did not agree `spin-notify` never sees one: they are
//! counted, and the first is logged.

use corefarm_smp::Notification;

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

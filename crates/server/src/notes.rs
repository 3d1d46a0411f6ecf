//! Handler notifications (type 0x1C) relayed from a node to the user that
//! owns the data message, with the user's id for it (docs/protocol.md).
//! A user that did not agree `spin-notify` never sees one: they are
//! counted, and the first is logged. At most [`PER_MESSAGE`] of one data
//! message are relayed, whatever a node sends.

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

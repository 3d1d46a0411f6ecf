//! Exclusive mode: a node's handler notification to the user, with the id
//! the user gave the message (the node knows the server's internal id,
//! mapped back the way its result is).

use corefarm_smp::{hello::features, Frame, Notification};

use super::{End, Handler};

impl Handler {
    /// `Err` only when the user link is gone; a notification for an id not
    /// in flight on that node loses the node, like a result for one.
    pub(super) async fn on_node_notification(&mut self, id: u64, f: Frame) -> Result<(), End> {
        let Some(n) = self.nodes.get(&id) else {
            return Ok(());
        };
        let note = match Notification::parse(f.payload) {
            Ok(note) => note,
            Err(e) => return self.lose_node(id, &format!("bad notification: {e}")).await,
        };
        let Some(p) = n.in_flight.get(&note.id) else {
            let reason = format!("notification for unknown id {}", note.id);
            return self.lose_node(id, &reason).await;
        };
        let note = note.with_id(p.user_id);
        if !self.conn.agreed(features::SPIN_NOTIFY) {
            self.notes_dropped.count(&self.conn.peer, &note);
            self.shared.metrics.notification(false);
            return Ok(());
        }
        // Checked when parsed: it fits.
        match note.to_frame() {
            Ok(frame) => {
                self.shared.metrics.notification(true);
                self.send_user(frame).await
            }
            Err(e) => self.lose_node(id, &format!("bad notification: {e}")).await,
        }
    }
}

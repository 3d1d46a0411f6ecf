//! Shared mode: a node's handler notification goes to the user whose job
//! it concerns, with that user's id for it (mapped from the node-side id
//! the way [`Sched::on_result`] maps a result's), as an action executed in
//! order with the results, so it stays ahead of the job's own result.

use corefarm_smp::Notification;

use super::{Action, NodeBreach, Sched};

impl Sched {
    /// `Err`: the node named a job it does not hold, and must be closed
    /// (as for a result for an unknown id).
    pub fn on_notification(&mut self, node: u64, note: Notification) -> Result<(), NodeBreach> {
        let Some(slot) = self.nodes.get_mut(&node) else {
            return Ok(());
        };
        let Some(job) = slot.in_flight.get_mut(&note.id) else {
            if slot.late.contains_key(&note.id) {
                // Of a copy whose twin answered first: its user heard the twin's.
                return Ok(());
            }
            return Err(NodeBreach::UnknownNotification(note.id));
        };
        let (user, id) = (job.user, job.id);
        if !crate::notes::within(&mut job.notes, id, || format!("node {node}")) {
            return Ok(());
        }
        if self.users.contains_key(&user) {
            self.out.push(Action::Notify {
                user,
                note: note.with_id(id),
            });
        }
        Ok(())
    }
}

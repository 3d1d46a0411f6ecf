//! Handler notifications on their way to the server (docs/streams.md,
//! "Notifications"). The handler lane queues a message's notifications
//! ([`Outgoing::Notes`](crate::handlers::Outgoing::Notes)) on the sending
//! task's queue just before that message's result or error, and the
//! sending task turns them into `Notification` frames (type 0x1C) in the
//! message's class, so they leave before its result. A server that did
//! not agree `spin-notify` never sees one: they are counted and dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use corefarm_smp::{Notification, OutFrame};

use crate::metrics::NodeStats;

/// What the link agreed on notifications, shared by the receiving task
/// (which learns it from the server's hello) and the sending task.
#[derive(Debug, Default)]
pub struct NoteLink {
    agreed: AtomicBool,
    dropped: AtomicU64,
    stats: Option<Arc<NodeStats>>,
}

impl NoteLink {
    /// Counting sent and dropped notifications in the node's metrics too.
    pub fn with_stats(stats: Option<Arc<NodeStats>>) -> Self {
        NoteLink {
            stats,
            ..NoteLink::default()
        }
    }

    pub fn set_agreed(&self, yes: bool) {
        self.agreed.store(yes, Ordering::Relaxed);
    }

    pub fn agreed(&self) -> bool {
        self.agreed.load(Ordering::Relaxed)
    }

    /// Notifications not sent: the server did not agree them, or they were
    /// over a message's limit ([`corefarm_cores::worker::MAX_NOTIFICATIONS`]).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn count(&self, sent: u64, dropped: u64) {
        self.dropped.fetch_add(dropped, Ordering::Relaxed);
        if let Some(s) = &self.stats {
            s.notifications(sent, dropped);
        }
    }

    /// The frames for the notifications of message `id` from handler set
    /// `set` (`over`: how many more the node did not keep); none (the
    /// notifications counted as dropped) without the feature.
    pub fn frames(&self, id: u32, set: u8, notes: Vec<Vec<u8>>, over: u64) -> Vec<OutFrame> {
        if !self.agreed() {
            self.count(0, notes.len() as u64 + over);
            tracing::debug!(
                id,
                "{} handler notification(s) dropped: the server did not agree spin-notify",
                notes.len()
            );
            return Vec::new();
        }
        self.count(notes.len() as u64, over);
        notes
            .into_iter()
            .filter_map(|n| {
                let n = Notification {
                    id,
                    set,
                    data: Bytes::from(n),
                };
                // The worker keeps only notifications within the 4 KiB bound.
                n.to_frame()
                    .map_err(|e| tracing::warn!(id, "handler notification not sent: {e}"))
                    .ok()
            })
            .collect()
    }
}

//! Handler notifications on their way to the server (docs/streams.md,
//! "Notifications"). The handler lane queues a message's notifications
//! ([`Outgoing::Notes`](crate::handlers::Outgoing::Notes)) on the sending
//! task's queue just before that message's result or error, and the
//! sending task turns them into `Notification` frames (type 0x1C) in the
//! message's class, so they leave before its result. A server that did
//! not agree `spin-notify` never sees one: they are counted and dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use corefarm_smp::{Notification, OutFrame};

/// What the link agreed on notifications, shared by the receiving task
/// (which learns it from the server's hello) and the sending task.
#[derive(Debug, Default)]
pub struct NoteLink {
    agreed: AtomicBool,
    dropped: AtomicU64,
}

impl NoteLink {
    pub fn set_agreed(&self, yes: bool) {
        self.agreed.store(yes, Ordering::Relaxed);
    }

    pub fn agreed(&self) -> bool {
        self.agreed.load(Ordering::Relaxed)
    }

    /// Notifications not sent because the server did not agree them.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The frames for the notifications of message `id` from handler set
    /// `set`; none (the notifications counted as dropped) without the feature.
    pub fn frames(&self, id: u32, set: u8, notes: Vec<Vec<u8>>) -> Vec<OutFrame> {
        if !self.agreed() {
            self.dropped
                .fetch_add(notes.len() as u64, Ordering::Relaxed);
            tracing::debug!(
                id,
                "{} handler notification(s) dropped: the server did not agree spin-notify",
                notes.len()
            );
            return Vec::new();
        }
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

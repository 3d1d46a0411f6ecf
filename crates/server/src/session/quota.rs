//! A user's `max_queued_bytes`, enforced where its data enters: the bytes
//! of its inputs accepted and not yet answered (queued or in flight), all
//! its sessions together, never exceed the limit.
//!
//! - an input larger than the limit could never be taken: it is refused
//!   by id with the limit named (`too-large`), and the session goes on;
//! - an input that fits once some of the user's earlier inputs are
//!   answered is held by its session, which stops reading from the user
//!   (what the user sends meanwhile waits in its socket: back-pressure,
//!   nothing dropped) until an answer to any of the user's sessions
//!   makes room ([`crate::accounts::Account::room`]); then it is placed
//!   like any other, in the order the user sent it.
//!
//! Users without the limit pay nothing here: no map, no atomic.

use std::collections::HashMap;
use std::sync::Arc;

use crate::accounts::Account;

use super::Input;

/// What one session has taken of its user's queued bytes.
#[derive(Default)]
pub(super) struct Quota {
    /// The account charged, once something was taken.
    account: Option<Arc<Account>>,
    /// Bytes taken by each id not yet answered, and how many messages of
    /// that id (the protocol forbids reusing an id in flight; a user that
    /// does only confuses its own count, which the session's end settles).
    by_id: HashMap<u32, (u64, u32)>,
    /// The sum of `by_id`: given back when the session ends.
    total: u64,
    /// An input read and waiting for room: nothing more is read meanwhile.
    pub(super) held: Option<Input>,
}

impl Quota {
    /// Takes `len` bytes of `account`'s queue for the input `id`, if they
    /// fit within `max` with what the user's sessions have queued.
    pub(super) fn take(&mut self, account: &Arc<Account>, id: u32, len: u64, max: u64) -> bool {
        if !account.try_queue(len, max) {
            return false;
        }
        self.account.get_or_insert_with(|| account.clone());
        let e = self.by_id.entry(id).or_default();
        e.0 += len;
        e.1 += 1;
        self.total += len;
        true
    }

    /// The input `id` was answered, or given back to the user unplaced.
    pub(super) fn answered(&mut self, id: u32) {
        let (Some(a), Some(e)) = (&self.account, self.by_id.get_mut(&id)) else {
            return;
        };
        let part = e.0 / u64::from(e.1);
        e.0 -= part;
        e.1 -= 1;
        if e.1 == 0 {
            self.by_id.remove(&id);
        }
        self.total -= part;
        a.unqueue(part);
    }

    /// The account whose room a held input waits for.
    pub(super) fn waiting_on(
        &self,
        account: impl FnOnce() -> Arc<Account>,
    ) -> Option<Arc<Account>> {
        self.held.as_ref().map(|_| account())
    }
}

impl Drop for Quota {
    fn drop(&mut self) {
        if let Some(a) = &self.account {
            a.unqueue(self.total);
        }
    }
}

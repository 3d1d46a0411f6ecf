//! Unassigned nodes, and the users that would take more of them.

use std::collections::HashSet;
use std::sync::Mutex;

use tokio::sync::mpsc;

use crate::nodeconn::NodeConn;

/// Messages from the outside world to a user handler.
pub enum Control {
    NodeJoined(NodeConn),
}

/// A user handler that accepts nodes joining mid-session.
pub struct Waiter {
    pub user: u64,
    pub tx: mpsc::UnboundedSender<Control>,
    /// `None`: every node it can get.
    pub want: Option<u32>,
    pub have: u32,
    /// Nodes that refused this user's configuration: never offered again.
    pub refused: HashSet<u64>,
}

#[derive(Default)]
struct Inner {
    free: Vec<NodeConn>,
    waiters: Vec<Waiter>,
}

#[derive(Default)]
pub struct Pool {
    inner: Mutex<Inner>,
}

impl Pool {
    /// A node became free: give it to the neediest user that wants one,
    /// otherwise keep it.
    pub fn add(&self, mut conn: NodeConn) {
        let mut g = self.inner.lock().expect("pool lock");
        loop {
            let best = g
                .waiters
                .iter()
                .enumerate()
                .filter(|(_, w)| w.want.is_none_or(|n| w.have < n) && !w.refused.contains(&conn.id))
                .min_by_key(|(_, w)| w.have)
                .map(|(i, _)| i);
            let Some(i) = best else { break };
            conn.entry.assign(Some(g.waiters[i].user));
            match g.waiters[i].tx.send(Control::NodeJoined(conn)) {
                Ok(()) => {
                    g.waiters[i].have += 1;
                    return;
                }
                Err(mpsc::error::SendError(Control::NodeJoined(c))) => {
                    conn = c;
                    g.waiters.remove(i);
                }
            }
        }
        conn.entry.assign(None);
        // One that closed on its way here would hold its socket until the
        // next take: the hook below has already run for it.
        if !conn.is_closed() {
            g.free.push(conn);
        }
    }

    /// A node's connection ended: if it was free, let it go now. A free
    /// node is otherwise only pruned when nodes are next taken, and its
    /// socket stays open until then: 10,000 nodes that restarted held
    /// 10,000 descriptors, and their second join stopped at the file limit.
    pub fn forget(&self, id: u64) {
        let gone = {
            let mut g = self.inner.lock().expect("pool lock");
            g.free
                .iter()
                .position(|c| c.id == id)
                .map(|i| g.free.remove(i))
        };
        // Dropped outside the lock.
        drop(gone);
    }

    /// Free nodes held, closed ones included (tests).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.inner.lock().expect("pool lock").free.len()
    }

    /// Takes up to `want` free nodes for a registered user and counts them
    /// as its own in one step, so a node joining meanwhile is not offered to
    /// it beyond what it asked for. Also forgets the nodes that refused the
    /// user's previous configuration: the next one may suit them.
    pub fn take_for(&self, user: u64, want: Option<u32>) -> Vec<NodeConn> {
        let mut g = self.inner.lock().expect("pool lock");
        let inner = &mut *g;
        inner.free.retain(|c| !c.is_closed());
        let Some(w) = inner.waiters.iter_mut().find(|w| w.user == user) else {
            return Vec::new();
        };
        w.refused.clear();
        w.want = want;
        let free = inner.free.len();
        let n = match want {
            Some(n) => (n.saturating_sub(w.have) as usize).min(free),
            None => free,
        };
        w.have += n as u32;
        // Oldest first, so a long-idle node is not starved.
        let taken: Vec<NodeConn> = inner.free.drain(..n).collect();
        for c in &taken {
            c.entry.assign(Some(user));
        }
        taken
    }

    /// Gang allocation (groups): takes `n` free nodes that pass
    /// `fit`, all or none, for `owner` alone until [`Pool::release`]. Waiting
    /// users are not counted: a group holds its nodes for its lifetime.
    pub fn claim_exclusive(
        &self,
        owner: u64,
        n: usize,
        fit: impl Fn(&NodeConn) -> bool,
    ) -> Option<Vec<NodeConn>> {
        let mut g = self.inner.lock().expect("pool lock");
        g.free.retain(|c| !c.is_closed());
        let picked: Vec<usize> = (0..g.free.len())
            .filter(|&i| fit(&g.free[i]))
            .take(n)
            .collect();
        if picked.len() < n {
            return None;
        }
        // Oldest first; removing from the back keeps the earlier indices valid.
        let mut taken: Vec<NodeConn> = picked.iter().rev().map(|&i| g.free.remove(i)).collect();
        taken.reverse();
        for c in &taken {
            c.entry.assign(Some(owner));
        }
        Some(taken)
    }

    /// Gives claimed nodes back (each goes to a waiting user or the free list).
    pub fn release(&self, nodes: Vec<NodeConn>) {
        for c in nodes {
            self.add(c);
        }
    }

    pub fn free_count(&self) -> usize {
        let mut g = self.inner.lock().expect("pool lock");
        g.free.retain(|c| !c.is_closed());
        g.free.len()
    }

    /// Whether a user other than `except` is waiting with no node at all:
    /// the contention that makes an idle user give its nodes back.
    pub fn someone_starved(&self, except: u64) -> bool {
        self.inner
            .lock()
            .expect("pool lock")
            .waiters
            .iter()
            .any(|w| w.user != except && w.have == 0 && !w.tx.is_closed())
    }

    pub fn register(&self, w: Waiter) {
        self.inner.lock().expect("pool lock").waiters.push(w);
    }

    pub fn unregister(&self, user: u64) {
        self.inner
            .lock()
            .expect("pool lock")
            .waiters
            .retain(|w| w.user != user);
    }

    /// Updates a registered user's bookkeeping.
    pub fn update(&self, user: u64, f: impl FnOnce(&mut Waiter)) {
        if let Some(w) = self
            .inner
            .lock()
            .expect("pool lock")
            .waiters
            .iter_mut()
            .find(|w| w.user == user)
        {
            f(w);
        }
    }

    pub fn close_all(&self) {
        for c in self.inner.lock().expect("pool lock").free.drain(..) {
            c.close();
        }
    }
}

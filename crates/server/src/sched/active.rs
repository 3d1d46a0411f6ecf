//! Which users count in the fair shares: those with work (queued, in
//! flight, or a configuration awaited), and for a short window after their
//! last work. Slurm's fair share divides the nodes among the jobs that
//! want them; a configured user idle between bursts wants none, and
//! counting it would keep a bursting user at the share it would have if
//! every user were busy, with the idle users' nodes held for nobody.
//!
//! The window keeps a user that pauses briefly — between two calls, or
//! while it reads a result — from losing its share only to take it back
//! a moment later: moving a node away and back costs two programmings.
//! It lasts one programming time (the nodes' measured average), at least
//! one monitoring period: holding a share for as long as moving it would
//! cost, then letting go, is the rent-or-buy rule, which never pays more
//! than twice what the best choice in hindsight would.
//!
//! A user's weight therefore changes in two places only:
//! [`Sched::note_busy`] (it becomes active) and [`Sched::expire_active`]
//! (its window ended without work), besides joining, configuring,
//! leaving and its tenant's settings.

use std::time::Duration;

use super::function::Function;
use super::Sched;

impl Sched {
    /// How long a user stays in the fair shares after its last work: the
    /// nodes' programming time (the period until one is measured), at
    /// least one monitoring period.
    pub(super) fn active_window(&self) -> Duration {
        self.p.period.max(self.programming.unwrap_or(self.p.period))
    }

    /// A node was programmed in `took`: the window follows the nodes'
    /// programming time (a moving average with weight 1/4, as a node's own).
    pub(super) fn note_programming(&mut self, took: Duration) {
        self.programming = Some(match self.programming {
            Some(r) => (r * 3 + took) / 4,
            None => took,
        });
    }

    /// `user` has work at `now` (it submitted or configured): it counts in
    /// its function's fair share until its window ends without work.
    pub(super) fn note_busy(&mut self, user: u64, now: Duration) {
        let window = self.active_window();
        let Some(rec) = self.users.get_mut(&user) else {
            return;
        };
        rec.last_busy = rec.last_busy.max(now);
        if rec.active_until.is_none() {
            let at = now + window;
            rec.active_until = Some(at);
            self.expiry.insert((at, user));
            // Its function's weight in the fair shares grew.
            self.placement_changed();
        }
    }

    /// Work of `user` queued, in flight, or its configuration awaited.
    fn has_work(&self, user: u64) -> bool {
        let Some(rec) = self.users.get(&user) else {
            return false;
        };
        let of = |f: &Function| f.queue.len_of(user) > 0 || f.waiting.contains(&user);
        rec.in_flight > 0 || rec.function.and_then(|f| self.fns.get(&f)).is_some_and(of)
    }

    /// Users whose window ended are looked at: one with work is looked at
    /// again a window later, one without leaves the fair shares. O(log n)
    /// per user looked at; an active user is looked at once per window.
    pub(super) fn expire_active(&mut self, now: Duration) {
        let window = self.active_window();
        while let Some(&(at, user)) = self.expiry.first() {
            if at > now {
                break;
            }
            self.expiry.pop_first();
            let busy = self.has_work(user);
            let Some(rec) = self.users.get_mut(&user) else {
                continue;
            };
            if busy {
                rec.last_busy = now;
            }
            let next = rec.last_busy + window;
            if next > now {
                rec.active_until = Some(next);
                self.expiry.insert((next, user));
            } else {
                tracing::trace!(user, "no work lately: out of the fair shares");
                rec.active_until = None;
                self.placement_changed();
            }
        }
    }

    /// `f`'s active users' weights summed, in [`super::queue::WEIGHT_UNIT`]s,
    /// and how many they are.
    pub(super) fn active_weight(&self, f: &Function) -> (u128, usize) {
        let one = super::queue::WEIGHT_UNIT;
        f.users
            .iter()
            .filter_map(|u| match self.users.get(u) {
                Some(r) => r.active_until.map(|_| self.units(r)),
                None => Some(one),
            })
            .fold((0, 0), |(w, n), u| (w + u128::from(u), n + 1))
    }
}

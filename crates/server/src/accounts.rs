//! Per-user accounting: what each user (tenant, [`crate::auth::Tenant`])
//! used since the server started, all its sessions together.
//!
//! - node-seconds: a node's busy time (at least one message in flight,
//!   [`crate::metrics::NodeMetrics`]) cut at each of its answers, each
//!   stretch charged to the user whose message was answered at its end
//!   ([`crate::metrics::NodeMetrics::answered`] returns it). A node
//!   answers in the order it works, so the stretch before an answer is
//!   the node time that message took, and the accounts sum to the nodes'
//!   busy time (less the stretch after a node's last answer when it is
//!   lost or given back with work in flight: nobody was answered);
//! - inputs: of the results delivered to the user;
//! - bytes: read from and written to its sessions' links (live sessions'
//!   counters, plus those of ended sessions folded in by the registry as
//!   they leave, under the lock a snapshot takes);
//! - reconfigurations: node programmings for its work. In exclusive mode
//!   its own nodes; in shared mode one programming is shared equally by the
//!   users of the function loaded.
//!
//! - queued bytes: of its inputs accepted and not yet answered (queued or
//!   in flight), all its sessions together, held within its
//!   `max_queued_bytes` ([`Account::try_queue`]); a session waiting for
//!   room waits on [`Account::room`].
//!
//! Charges are relaxed atomic adds on the account, one per answer; a
//! snapshot reads them when someone asks (`status`, `/metrics`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use corefarm_smp::auth::ANONYMOUS;
use corefarm_smp::AccountStatus;
use corefarm_telemetry::prometheus_client::encoding::DescriptorEncoder;
use corefarm_telemetry::prometheus_client::metrics::MetricType::Counter;
use corefarm_telemetry::{family, Labels};

use crate::auth::Tenant;

/// Accounts kept at most. Named users of an auth file always have theirs;
/// without an auth file a hello's `user` names any account, so past this
/// many, users of new names are charged to the anonymous account.
pub const MAX_ACCOUNTS: usize = 1024;

/// Reconfigurations are kept in thousandths: a programming shared by
/// several users is split among them.
const MILLI: u64 = 1000;

/// One user's account.
#[derive(Debug)]
pub struct Account {
    pub tenant: Arc<Tenant>,
    /// Its `/metrics` label: its name for the first
    /// [`crate::metrics::USER_SLOTS`] accounts, `other` for later ones
    /// (fixed when made, so a label's counters never step back).
    label: String,
    node_ns: AtomicU64,
    inputs: AtomicU64,
    reconfig_milli: AtomicU64,
    /// (in, out) bytes of its ended sessions.
    ended_bytes: Mutex<(u64, u64)>,
    sessions: AtomicU64,
    active: AtomicU64,
    /// Bytes of its inputs accepted and not yet answered, all its sessions
    /// together (`max_queued_bytes`).
    queued_bytes: AtomicU64,
    /// Woken when `queued_bytes` falls: its sessions waiting for room.
    room: Notify,
}

impl Account {
    fn new(tenant: Arc<Tenant>, label: String) -> Self {
        Account {
            tenant,
            label,
            node_ns: AtomicU64::new(0),
            inputs: AtomicU64::new(0),
            reconfig_milli: AtomicU64::new(0),
            ended_bytes: Mutex::new((0, 0)),
            sessions: AtomicU64::new(0),
            active: AtomicU64::new(0),
            queued_bytes: AtomicU64::new(0),
            room: Notify::new(),
        }
    }

    pub fn name(&self) -> &str {
        self.tenant.account()
    }

    /// Node time one of its messages took.
    pub fn node_time(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.node_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// A result of `count` inputs was delivered.
    pub fn inputs(&self, count: u32) {
        self.inputs.fetch_add(u64::from(count), Ordering::Relaxed);
    }

    /// `1/shares` of a node programming made for its work.
    pub fn reconfigured(&self, shares: usize) {
        let part = MILLI / shares.max(1) as u64;
        self.reconfig_milli.fetch_add(part, Ordering::Relaxed);
    }

    /// Its `max_queued_bytes`.
    pub fn queue_limit(&self) -> Option<u64> {
        self.tenant.limits.max_queued_bytes
    }

    /// Takes `len` bytes of its queue if they fit within `max` with what
    /// its sessions have queued; `false` leaves the queue as it was.
    pub fn try_queue(&self, len: u64, max: u64) -> bool {
        self.queued_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                q.checked_add(len).filter(|&n| n <= max)
            })
            .is_ok()
    }

    /// `len` bytes taken by [`Account::try_queue`] were answered (or their
    /// session ended): its waiting sessions may find room now.
    pub fn unqueue(&self, len: u64) {
        if len == 0 {
            return;
        }
        self.queued_bytes.fetch_sub(len, Ordering::AcqRel);
        self.room.notify_waiters();
    }

    /// Resolves at the next [`Account::unqueue`] after this call, polled
    /// or not: made before a session checks for room, it misses none.
    pub fn room(&self) -> Notified<'_> {
        self.room.notified()
    }

    /// A session of this user began.
    pub fn session_began(&self) {
        self.sessions.fetch_add(1, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::Relaxed);
    }

    /// A session ended with these (in, out) link bytes. Called by the
    /// registry under its users' lock, once per session begun.
    pub fn session_ended(&self, bytes: (u64, u64)) {
        let mut b = self.ended_bytes.lock().expect("account lock");
        b.0 += bytes.0;
        b.1 += bytes.1;
        self.active.fetch_sub(1, Ordering::Relaxed);
    }

    /// Its status, with `live` the (in, out) bytes of its open sessions.
    pub fn status(&self, live: (u64, u64)) -> AccountStatus {
        let ended = *self.ended_bytes.lock().expect("account lock");
        let l = &self.tenant.limits;
        AccountStatus {
            user: self.name().to_string(),
            weight: l.weight,
            max_nodes: l.max_nodes,
            max_queued_bytes: l.max_queued_bytes,
            sessions: self.sessions.load(Ordering::Relaxed),
            active: self.active.load(Ordering::Relaxed),
            node_seconds: self.node_ns.load(Ordering::Relaxed) as f64 / 1e9,
            inputs: self.inputs.load(Ordering::Relaxed),
            bytes_in: ended.0 + live.0,
            bytes_out: ended.1 + live.1,
            reconfigurations: self.reconfig_milli.load(Ordering::Relaxed) as f64 / MILLI as f64,
            queued_bytes: self.queued_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Every account, by user name.
#[derive(Debug)]
pub struct Accounts {
    map: Mutex<BTreeMap<String, Arc<Account>>>,
    anonymous: Arc<Account>,
}

impl Default for Accounts {
    fn default() -> Self {
        let anonymous = Arc::new(Account::new(
            Arc::new(Tenant::anonymous()),
            ANONYMOUS.to_string(),
        ));
        let map = BTreeMap::from([(ANONYMOUS.to_string(), anonymous.clone())]);
        Accounts {
            map: Mutex::new(map),
            anonymous,
        }
    }
}

impl Accounts {
    /// The accounts of an auth file's named users exist from the start,
    /// so an operator sees every user, those that never came too.
    pub fn new<'a>(tenants: impl Iterator<Item = &'a Arc<Tenant>>) -> Self {
        let a = Accounts::default();
        for t in tenants {
            a.of(t);
        }
        a
    }

    /// The account of users that name none.
    pub fn anonymous(&self) -> &Arc<Account> {
        &self.anonymous
    }

    /// The account of `tenant`, made on first use (see [`MAX_ACCOUNTS`]).
    pub fn of(&self, tenant: &Arc<Tenant>) -> Arc<Account> {
        let Some(name) = &tenant.name else {
            return self.anonymous.clone();
        };
        let mut map = self.map.lock().expect("accounts lock");
        if let Some(a) = map.get(name) {
            return a.clone();
        }
        if map.len() >= MAX_ACCOUNTS {
            return self.anonymous.clone();
        }
        let label = if map.len() < crate::metrics::USER_SLOTS {
            name.clone()
        } else {
            "other".to_string()
        };
        let a = Arc::new(Account::new(tenant.clone(), label));
        map.insert(name.clone(), a.clone());
        a
    }

    /// Every account's status, by name; `live` gives the (in, out) bytes
    /// of an account's open sessions (the registry sums them).
    pub fn snapshot(&self, live: impl Fn(&Arc<Account>) -> (u64, u64)) -> Vec<AccountStatus> {
        let map = self.map.lock().expect("accounts lock");
        map.values().map(|a| a.status(live(a))).collect()
    }

    /// The `/metrics` label of each account in `s` (by name), in its order.
    fn labels(&self, s: &[AccountStatus]) -> Vec<String> {
        let map = self.map.lock().expect("accounts lock");
        s.iter()
            .map(|a| map.get(&a.user).map_or("other", |x| &x.label).to_string())
            .collect()
    }
}

/// The account families of `/metrics`, labelled by user name; accounts
/// past the label cap share `other`, their values summed.
pub fn encode(
    enc: &mut DescriptorEncoder,
    accounts: &Accounts,
    s: &[AccountStatus],
) -> Result<(), std::fmt::Error> {
    let mut by: BTreeMap<String, AccountStatus> = BTreeMap::new();
    for (label, a) in accounts.labels(s).into_iter().zip(s) {
        let t = by.entry(label).or_default();
        t.node_seconds += a.node_seconds;
        t.inputs += a.inputs;
        t.bytes_in += a.bytes_in;
        t.bytes_out += a.bytes_out;
        t.reconfigurations += a.reconfigurations;
    }
    let user = |name: &str| -> Labels { vec![("user", name.to_string())] };
    let mut f = family(
        enc,
        "account_node_seconds",
        "Node time taken by each user's messages since the server started.",
        Counter,
    )?;
    for (name, a) in &by {
        f.counter_f64(&user(name), a.node_seconds)?;
    }
    let mut f = family(
        enc,
        "account_inputs",
        "Inputs of the results delivered to each user.",
        Counter,
    )?;
    for (name, a) in &by {
        f.counter(&user(name), a.inputs)?;
    }
    let mut f = family(
        enc,
        "account_bytes",
        "Bytes on each user's links, by direction.",
        Counter,
    )?;
    for (name, a) in &by {
        for (dir, v) in [("in", a.bytes_in), ("out", a.bytes_out)] {
            let mut l = user(name);
            l.push(("direction", dir.into()));
            f.counter(&l, v)?;
        }
    }
    let mut f = family(
        enc,
        "account_reconfigurations",
        "Node programmings made for each user's work (shared ones split among their users).",
        Counter,
    )?;
    for (name, a) in &by {
        f.counter_f64(&user(name), a.reconfigurations)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_keep_charges_across_sessions_and_cap_labels() {
        let a = Accounts::default();
        let alice = Arc::new(Tenant::named("alice"));
        let acc = a.of(&alice);
        acc.session_began();
        acc.node_time(Duration::from_millis(1500));
        acc.inputs(3);
        acc.reconfigured(2);
        acc.session_ended((10, 20));
        // A second session finds the same account.
        let again = a.of(&Arc::new(Tenant::named("alice")));
        assert!(Arc::ptr_eq(&acc, &again));
        again.session_began();
        again.reconfigured(2);
        let s = a.snapshot(|x| if x.name() == "alice" { (1, 2) } else { (0, 0) });
        let s = s.iter().find(|s| s.user == "alice").unwrap();
        assert_eq!((s.sessions, s.active, s.inputs), (2, 1, 3));
        assert_eq!((s.bytes_in, s.bytes_out), (11, 22));
        assert!((s.node_seconds - 1.5).abs() < 1e-9);
        assert!((s.reconfigurations - 1.0).abs() < 1e-9);
        // Anonymous users share one account.
        assert!(Arc::ptr_eq(
            &a.of(&Arc::new(Tenant::anonymous())),
            a.anonymous()
        ));
        // Labels past the cap are `other`, and stay what they were.
        for i in 0..crate::metrics::USER_SLOTS + 3 {
            a.of(&Arc::new(Tenant::named(&format!("u{i:03}"))));
        }
        let s = a.snapshot(|_| (0, 0));
        let labels = a.labels(&s);
        let own = labels.iter().filter(|l| *l != "other").count();
        assert_eq!(own, crate::metrics::USER_SLOTS);
        assert_eq!(
            labels[s.iter().position(|x| x.user == "alice").unwrap()],
            "alice"
        );
    }

    #[test]
    fn accounts_are_bounded() {
        let a = Accounts::default();
        for i in 0..MAX_ACCOUNTS + 5 {
            a.of(&Arc::new(Tenant::named(&format!("n{i}"))));
        }
        assert_eq!(a.snapshot(|_| (0, 0)).len(), MAX_ACCOUNTS);
        let late = a.of(&Arc::new(Tenant::named("late")));
        assert!(Arc::ptr_eq(&late, a.anonymous()));
    }

    #[test]
    fn metrics_label_accounts_by_user_and_sum_those_past_the_cap() {
        let a = Arc::new(Accounts::default());
        let alice = a.of(&Arc::new(Tenant::named("alice")));
        alice.node_time(Duration::from_millis(2500));
        alice.inputs(7);
        alice.reconfigured(2);
        // Past the label cap: these two share `other`.
        for i in 0..crate::metrics::USER_SLOTS {
            a.of(&Arc::new(Tenant::named(&format!("u{i:03}"))));
        }
        for late in ["zz1", "zz2"] {
            a.of(&Arc::new(Tenant::named(late))).inputs(1);
        }
        let s = a.snapshot(|_| (0, 0));
        let mut reg = corefarm_telemetry::registry();
        let a2 = a.clone();
        reg.register_collector(corefarm_telemetry::collector(move |enc| {
            encode(enc, &a2, &s)
        }));
        let text = corefarm_telemetry::to_prometheus_text(&corefarm_telemetry::encode(&reg));
        for line in [
            r#"corefarm_account_node_seconds_total{user="alice"} 2.5"#,
            r#"corefarm_account_inputs_total{user="alice"} 7"#,
            r#"corefarm_account_inputs_total{user="other"} 2"#,
            r#"corefarm_account_reconfigurations_total{user="alice"} 0.5"#,
            r#"corefarm_account_bytes_total{user="alice",direction="in"} 0"#,
        ] {
            assert!(text.contains(line), "no {line} in\n{text}");
        }
        assert!(!text.contains("zz1"), "{text}");
    }
}

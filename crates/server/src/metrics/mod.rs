//! Server metrics: counters the data path feeds with relaxed atomics (no
//! lock per message), turned into Prometheus families and into the status
//! model only when someone asks (`/metrics`, `/status`, the status request).
//!
//! What a data message touches is owned by one task, the session's handler
//! or the node connection's reader, and counted without a locked
//! instruction ([`OwnedCounter`], `observe_owned`); totals across sessions
//! and nodes (bytes per link, results and latency by user name) are summed
//! when someone asks, from the live entries plus what ended connections
//! left (folded in by the registry when they go, under the lock the sum
//! takes, so no count is seen twice or missed).
//!
//! - [`Metrics`]: server-wide counters (errors by kind, re-dispatches) and
//!   per-user-name slots, capped so a stream of distinct names cannot grow
//!   the label set;
//! - [`NodeMetrics`]: a node's bytes, busy time, results, failures and
//!   reconfigurations, kept in its registry entry;
//! - [`UserMetrics`]: a session's bytes, results, failures and latency;
//! - `families`: the Prometheus families, encoded at scrape time.

mod families;

pub use families::encode;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use corefarm_smp::{ClusterStatus, Configuration, NodeState, NodeStatus, UserStatus};
use corefarm_telemetry::{AtomicHistogram, HistogramSnapshot, OwnedCounter, Slots};

/// Distinct user names with their own label; the rest share `other`.
pub const USER_SLOTS: usize = 32;

/// Configuration round trips: from 1 ms (a native core) to 10 s and more
/// (programming an FPGA).
const CONFIG_BOUNDS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0];

#[derive(Debug, Clone, Copy)]
pub enum ErrorKind {
    /// A node connection lost or dropped while it belonged to a user.
    NodeLost,
    /// A core failed on an input.
    CoreFailure,
    /// A node refused (or did not answer) a configuration.
    ConfigurationFailed,
    /// A user session ended by a protocol or limit error.
    UserError,
    /// A connection refused at --max-users / --max-nodes (or beyond the
    /// connections a port may have on their way in).
    Refused,
    /// A connection refused by `--auth-file`'s gate: no or a wrong answer
    /// to the challenge, no `auth` feature, a seed-format peer.
    AuthFailed,
    /// A TLS port's handshake failed or did not come.
    TlsFailed,
    /// A hello refused: one that does not decode or is too large, or one
    /// with the wrong role for its port.
    BadHello,
    /// A user connection closed for holding a place and nothing else: no
    /// first message within `--read-timeout`, or nothing for
    /// `--user-idle-timeout` while unconfigured.
    Idle,
    /// An unconfigured user connection (or one on its way in) that gave
    /// its place to a new one at a full user port.
    Evicted,
    /// A peer refused for asking more of `--memory-budget` than is left.
    OverBudget,
    /// A user ended for a chunked message unfinished past `--message-timeout`.
    Unfinished,
}

const ERROR_KINDS: [(&str, ErrorKind); 12] = [
    ("node_lost", ErrorKind::NodeLost),
    ("core_failure", ErrorKind::CoreFailure),
    ("configuration_failed", ErrorKind::ConfigurationFailed),
    ("user_error", ErrorKind::UserError),
    ("refused", ErrorKind::Refused),
    ("auth_failed", ErrorKind::AuthFailed),
    ("tls_failed", ErrorKind::TlsFailed),
    ("bad_hello", ErrorKind::BadHello),
    ("idle", ErrorKind::Idle),
    ("evicted", ErrorKind::Evicted),
    ("over_budget", ErrorKind::OverBudget),
    ("unfinished_message", ErrorKind::Unfinished),
];

/// A counter alone on its cache line: the server-wide totals are written
/// from every connection's task, and must not share lines with each other.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Padded(AtomicU64);

/// Per user name, across sessions (so counters only grow): results and
/// latency of the name's ended sessions (the live ones' are added when
/// someone asks, see [`Metrics::by_name`]), failures of all.
#[derive(Debug, Default)]
pub struct UserSlot {
    results: AtomicU64,
    failures: AtomicU64,
    latency: AtomicHistogram,
}

/// A user name's totals as `/metrics` shows them.
#[derive(Debug, Clone)]
pub struct NameTotals {
    pub name: String,
    pub results: u64,
    pub failures: u64,
    pub latency: HistogramSnapshot,
}

/// Built with the `metrics-off` feature: the per-message hooks do nothing.
/// Only for measuring what they cost against the same code with them
/// (bench/metrics_overhead.sh); such a server's metrics and status counters
/// stay at zero.
const OFF: bool = cfg!(feature = "metrics-off");

#[derive(Debug)]
pub struct Metrics {
    started: Instant,
    redispatched: Padded,
    errors: [AtomicU64; ERROR_KINDS.len()],
    users: Slots<UserSlot>,
    /// Handler notifications from nodes: relayed to their user, or dropped
    /// because the user did not agree `spin-notify`.
    notifications: [Padded; 2],
    /// Late messages sent again to another node ([`crate::dispatch::progress`]).
    hedged: Padded,
    /// Answers of a message's second copy, dropped (the first one won).
    hedge_duplicates: Padded,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            redispatched: Padded::default(),
            errors: Default::default(),
            users: Slots::new(USER_SLOTS),
            notifications: Default::default(),
            hedged: Padded::default(),
            hedge_duplicates: Padded::default(),
        }
    }
}

impl Metrics {
    /// A node's handler notification, relayed to its user or dropped.
    pub fn notification(&self, relayed: bool) {
        if OFF {
            return;
        }
        self.notifications[usize::from(!relayed)]
            .0
            .fetch_add(1, Ordering::Relaxed);
    }

    /// (relayed, dropped) notifications so far.
    pub fn notifications(&self) -> (u64, u64) {
        let [r, d] = &self.notifications;
        (r.0.load(Ordering::Relaxed), d.0.load(Ordering::Relaxed))
    }

    /// A late message was sent again to another node.
    pub fn hedged(&self) {
        self.hedged.0.fetch_add(1, Ordering::Relaxed);
    }

    /// The answer of a message's second copy came and was dropped.
    pub fn hedge_duplicate(&self) {
        self.hedge_duplicates.0.fetch_add(1, Ordering::Relaxed);
    }

    /// (hedged, duplicates dropped) so far.
    pub fn hedges(&self) -> (u64, u64) {
        (
            self.hedged.0.load(Ordering::Relaxed),
            self.hedge_duplicates.0.load(Ordering::Relaxed),
        )
    }

    pub fn error(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A node was lost with `moved` messages in flight, which go to others.
    pub fn node_lost(&self, moved: usize) {
        self.error(ErrorKind::NodeLost);
        self.redispatched
            .0
            .fetch_add(moved as u64, Ordering::Relaxed);
    }

    /// Per user name: the slot's (ended sessions, failures of all) plus the
    /// `live` sessions'. The caller holds the lock under which sessions
    /// are folded into their slot when they end ([`UserMetrics::fold`]).
    pub fn by_name<'a>(&self, live: impl Iterator<Item = &'a UserMetrics>) -> Vec<NameTotals> {
        let slots = self.users.all();
        let mut out: Vec<NameTotals> = slots
            .iter()
            .map(|(name, slot)| NameTotals {
                name: name.clone(),
                results: slot.results.load(Ordering::Relaxed),
                failures: slot.failures.load(Ordering::Relaxed),
                latency: slot.latency.snapshot(),
            })
            .collect();
        for u in live {
            let Some(mine) = u.slot.get() else { continue };
            if let Some(i) = slots.iter().position(|(_, s)| Arc::ptr_eq(s, mine)) {
                out[i].results += u.results.get();
                out[i].latency.merge(&u.latency.snapshot());
            }
        }
        out
    }

    /// Server-wide fields of the status model (bytes per link come from
    /// the registry, which sums its entries').
    pub fn fill(&self, s: &mut ClusterStatus) {
        s.uptime_seconds = self.started.elapsed().as_secs_f64();
        s.redispatched = self.redispatched.0.load(Ordering::Relaxed);
        (s.hedged, s.hedge_duplicates) = self.hedges();
        s.errors = ERROR_KINDS
            .iter()
            .map(|(name, k)| {
                (
                    name.to_string(),
                    self.errors[*k as usize].load(Ordering::Relaxed),
                )
            })
            .collect();
    }
}

/// The label of a configuration's function as status, `top` and metrics
/// show it: `bench` for a benchmarking configuration, else the image's
/// name with the digest of the bitstream beside it (`vadd
/// (sha256:5b05cb74bb3d)`, the start of what `corefarm image inspect` and
/// `sha256sum` print for the image file), or the digest alone for a raw
/// bitstream. Users tell their function by the name; the digest tells two
/// builds of one name apart.
pub fn function_label(cfg: &Configuration) -> String {
    if cfg.benchmark().is_some() {
        return "bench".into();
    }
    let digest = bitstream_digest(&cfg.bitstream);
    let digest = &digest[..12];
    match image_name(&cfg.bitstream) {
        Some(name) => format!("{name} (sha256:{digest})"),
        None => format!("sha256:{digest}"),
    }
}

/// Lower-case hex SHA-256 of a configuration's bitstream (a whole image
/// file): what `corefarm image inspect` prints, whose first 12 digits
/// [`function_label`] shows.
pub fn bitstream_digest(bitstream: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bitstream))
}

/// The name in a corefarm image's manifest (docs/images.md: magic,
/// version, manifest length, JSON manifest), bounded as every name a peer
/// chooses is ([`corefarm_telemetry::bounded`]); `None` for anything else
/// (a raw bitstream, a manifest that does not parse, an empty name).
/// Read once per configuration, never per message.
fn image_name(bitstream: &[u8]) -> Option<String> {
    const MAGIC: &[u8] = b"CFIMAGE\0";
    const HEADER: usize = 16;
    #[derive(serde::Deserialize)]
    struct Named {
        name: String,
    }
    if !bitstream.starts_with(MAGIC) || bitstream.len() < HEADER {
        return None;
    }
    let len = u32::from_le_bytes(bitstream[12..HEADER].try_into().expect("4 bytes")) as usize;
    let manifest = bitstream.get(HEADER..HEADER.checked_add(len)?)?;
    let Named { name } = serde_json::from_slice(manifest).ok()?;
    // Control characters would break a status line or a label; the rest
    // of a name is the user's choice.
    let name: String = corefarm_telemetry::bounded(name.trim())
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    (!name.is_empty()).then_some(name)
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds from the process epoch to `at`, never 0 (0 means "not
/// running"). The data path passes the `Instant` it already read, so the
/// hooks add no clock read of their own.
fn stamp_at(at: Instant) -> u64 {
    (at.saturating_duration_since(epoch()).as_nanos() as u64).max(1)
}

fn stamp() -> u64 {
    stamp_at(Instant::now())
}

/// The bytes of one connection each way, frames with their headers: read
/// by one task, queued by one owner at a time.
#[derive(Debug, Default)]
pub struct LinkCounters {
    bytes_in: OwnedCounter,
    bytes_out: OwnedCounter,
}

impl LinkCounters {
    /// A frame of `n` bytes came in (called by the connection's reader).
    pub fn received(&self, n: usize) {
        if !OFF {
            self.bytes_in.add(n as u64);
        }
    }

    /// A frame of `n` bytes was queued (called by the connection's owner).
    pub fn sent(&self, n: usize) {
        if !OFF {
            self.bytes_out.add(n as u64);
        }
    }

    /// (in, out) so far.
    pub fn bytes(&self) -> (u64, u64) {
        (self.bytes_in.get(), self.bytes_out.get())
    }
}

/// Written by the task that owns the node (one writer; the connection's
/// reader for `bytes_in`); read by status.
#[derive(Debug)]
pub struct NodeMetrics {
    function: Mutex<Option<String>>,
    cores: AtomicU32,
    busy_ns: AtomicU64,
    /// When the node last went from idle to busy; 0 while idle.
    busy_since: AtomicU64,
    /// Its busy time's last cut: the busy start or the last answer; 0
    /// while idle (see [`NodeMetrics::answered`]).
    mark: AtomicU64,
    /// Bytes read by the connection's reader, queued by the node's owner.
    pub link: LinkCounters,
    results: OwnedCounter,
    failures: AtomicU64,
    reconfigurations: AtomicU64,
    config_since: AtomicU64,
    config_time: AtomicHistogram,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        // Fix the epoch before any time is stamped against it.
        epoch();
        NodeMetrics {
            function: Mutex::new(None),
            cores: AtomicU32::new(0),
            busy_ns: AtomicU64::new(0),
            busy_since: AtomicU64::new(0),
            mark: AtomicU64::new(0),
            link: LinkCounters::default(),
            results: OwnedCounter::default(),
            failures: AtomicU64::new(0),
            reconfigurations: AtomicU64::new(0),
            config_since: AtomicU64::new(0),
            config_time: AtomicHistogram::new(CONFIG_BOUNDS),
        }
    }
}

impl NodeMetrics {
    /// A message went to the node at `now`; `first` if nothing else was in flight.
    pub fn dispatched(&self, first: bool, now: Instant) {
        if OFF {
            return;
        }
        if first {
            let t = stamp_at(now);
            self.busy_since.store(t, Ordering::Relaxed);
            self.mark.store(t, Ordering::Relaxed);
        }
    }

    /// A result (or, with `failed`, an error for an input) came back at
    /// `now`; `idle` if nothing is in flight any more. Returns the busy
    /// time since the last cut (the busy start or the previous answer):
    /// the node time this answer's message took, which its user's account
    /// is charged ([`crate::accounts`]). Those stretches add up to the
    /// busy time.
    pub fn answered(&self, idle: bool, failed: bool, now: Instant) -> Duration {
        if OFF {
            return Duration::ZERO;
        }
        if failed {
            self.failures.fetch_add(1, Ordering::Relaxed);
        } else {
            self.results.add(1);
        }
        let t = stamp_at(now);
        let last = self.mark.swap(if idle { 0 } else { t }, Ordering::Relaxed);
        if idle {
            self.stop_busy(now);
        }
        if last == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(t.saturating_sub(last))
    }

    fn stop_busy(&self, now: Instant) {
        let since = self.busy_since.swap(0, Ordering::Relaxed);
        if since != 0 {
            let d = stamp_at(now).saturating_sub(since);
            self.busy_ns.fetch_add(d, Ordering::Relaxed);
        }
    }

    /// A configuration is sent to the node.
    pub fn configuring(&self, function: String, cores: usize) {
        *self.function.lock().expect("function lock") = Some(function);
        self.cores.store(cores as u32, Ordering::Relaxed);
        self.config_since.store(stamp(), Ordering::Relaxed);
    }

    /// Called on every state change of the node (see `NodeEntry::set_state`).
    pub fn on_state(&self, s: NodeState) {
        if s != NodeState::Configuring {
            let since = self.config_since.swap(0, Ordering::Relaxed);
            if since != 0 && s == NodeState::Ready {
                let d = stamp().saturating_sub(since);
                self.config_time.observe(Duration::from_nanos(d));
                self.reconfigurations.fetch_add(1, Ordering::Relaxed);
            }
        }
        if matches!(s, NodeState::Free | NodeState::Assigned) {
            // A new owner: whatever was in flight is gone with the old one.
            self.mark.store(0, Ordering::Relaxed);
            self.stop_busy(Instant::now());
            *self.function.lock().expect("function lock") = None;
            self.cores.store(0, Ordering::Relaxed);
        }
    }

    pub fn busy_seconds(&self) -> f64 {
        let mut ns = self.busy_ns.load(Ordering::Relaxed);
        let since = self.busy_since.load(Ordering::Relaxed);
        if since != 0 {
            ns += stamp().saturating_sub(since);
        }
        ns as f64 / 1e9
    }

    /// What the node is configured for, if anything.
    pub fn function(&self) -> Option<String> {
        self.function.lock().expect("function lock").clone()
    }

    pub fn fill(&self, s: &mut NodeStatus) {
        s.function = self.function.lock().expect("function lock").clone();
        s.cores = self.cores.load(Ordering::Relaxed);
        s.busy_seconds = self.busy_seconds();
        s.results_total = self.results.get();
        s.failures = self.failures.load(Ordering::Relaxed);
        s.reconfigurations = self.reconfigurations.load(Ordering::Relaxed);
    }
}

/// Written by the user's handler task (one writer); read by status.
#[derive(Debug, Default)]
pub struct UserMetrics {
    slot: OnceLock<Arc<UserSlot>>,
    failures: AtomicU64,
    results: OwnedCounter,
    latency: AtomicHistogram,
    /// Bytes read and queued by the session's handler.
    pub link: LinkCounters,
}

impl UserMetrics {
    /// The name's slot, looked up once per session (on the first answer,
    /// when the hello's name is known).
    fn slot(&self, m: &Metrics, name: impl FnOnce() -> String) -> &UserSlot {
        self.slot.get_or_init(|| m.users.get(&name()))
    }

    /// A result came back `latency` after its message went to a node.
    pub fn result(&self, m: &Metrics, name: impl FnOnce() -> String, latency: Duration) {
        if OFF {
            return;
        }
        self.latency.observe_owned(latency);
        self.results.add(1);
        // Names the slot this session's counts go to when it ends.
        self.slot(m, name);
    }

    /// The session ended: its results and latency go to its name's slot.
    /// Called once, by the registry, under the lock [`Metrics::by_name`]
    /// is called under.
    pub fn fold(&self) {
        if let Some(slot) = self.slot.get() {
            slot.results
                .fetch_add(self.results.get(), Ordering::Relaxed);
            slot.latency.add(&self.latency.snapshot());
        }
    }

    /// A core failed on one of the user's inputs.
    pub fn failure(&self, m: &Metrics, name: impl FnOnce() -> String) {
        m.error(ErrorKind::CoreFailure);
        self.failures.fetch_add(1, Ordering::Relaxed);
        let slot = self.slot(m, name);
        slot.failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn fill(&self, s: &mut UserStatus) {
        s.failures = self.failures.load(Ordering::Relaxed);
        let h = self.latency.snapshot();
        s.latency_p50 = h.quantile(0.5);
        s.latency_p99 = h.quantile(0.99);
    }
}

/// The label value of a user: its hello name, `anonymous`, or `seed`.
pub fn user_label(name: Option<&str>, hello: bool) -> String {
    match (name, hello) {
        (Some(n), _) if !n.is_empty() => n.to_string(),
        (_, true) => "anonymous".into(),
        (_, false) => "seed".into(),
    }
}

impl NodeMetrics {
    pub fn config_times(&self) -> corefarm_telemetry::HistogramSnapshot {
        self.config_time.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corefarm_smp::UserPhase;

    #[test]
    fn reconfigurations_count_only_accepted_configurations() {
        let n = NodeMetrics::default();
        n.configuring("bench".into(), 2);
        n.on_state(NodeState::Configuring);
        n.on_state(NodeState::Ready);
        // Refused: back to the pool without reaching Ready.
        n.configuring("sha256:abc".into(), 1);
        n.on_state(NodeState::Configuring);
        n.on_state(NodeState::Free);
        let mut s = NodeStatus::default();
        n.fill(&mut s);
        assert_eq!((s.reconfigurations, s.function, s.cores), (1, None, 0));
        assert_eq!(n.config_times().count, 1);
    }

    #[test]
    fn busy_time_runs_from_first_dispatch_to_last_answer() {
        let n = NodeMetrics::default();
        let t0 = Instant::now();
        n.dispatched(true, t0);
        n.dispatched(false, t0 + Duration::from_millis(1));
        assert_ne!(n.busy_since.load(Ordering::Relaxed), 0);
        n.answered(false, false, t0 + Duration::from_millis(2));
        n.answered(true, true, t0 + Duration::from_millis(5));
        assert_eq!(n.busy_since.load(Ordering::Relaxed), 0, "idle again");
        assert!(
            (n.busy_seconds() - 0.005).abs() < 1e-9,
            "{}",
            n.busy_seconds()
        );
        // Idle time does not count.
        n.dispatched(true, t0 + Duration::from_millis(9));
        n.answered(true, false, t0 + Duration::from_millis(10));
        assert!(
            (n.busy_seconds() - 0.006).abs() < 1e-9,
            "{}",
            n.busy_seconds()
        );
        let mut s = NodeStatus::default();
        n.fill(&mut s);
        assert_eq!((s.results_total, s.failures), (2, 1));
    }

    #[test]
    fn families_follow_the_status_and_cap_user_names() {
        let m = Metrics::default();
        m.node_lost(3);
        // Sessions of 37 names: the names past the cap share `other`; the
        // even ones ended (folded into their slot), the odd ones are live.
        let mut live = vec![];
        for i in 0..USER_SLOTS + 5 {
            let u = UserMetrics::default();
            u.result(&m, || format!("u{i}"), Duration::from_millis(2));
            if i % 2 == 0 {
                u.fold();
            } else {
                live.push(u);
            }
        }
        let names = m.by_name(live.iter());
        let mut s = ClusterStatus {
            nodes: vec![NodeStatus {
                id: 1,
                name: Some("n0".into()),
                addr: "127.0.0.1:5".into(),
                state: NodeState::Ready,
                function: Some("bench".into()),
                results_total: 7,
                ..Default::default()
            }],
            users: vec![UserStatus {
                id: 2,
                phase: UserPhase::Routing,
                queued: 4,
                ..Default::default()
            }],
            bytes: corefarm_smp::LinkBytes {
                user_in: 100,
                ..Default::default()
            },
            ..Default::default()
        };
        m.fill(&mut s);
        assert_eq!((s.redispatched, s.errors["node_lost"]), (3, 1));
        m.hedged();
        m.hedged();
        m.hedge_duplicate();
        m.fill(&mut s);
        assert_eq!((s.hedged, s.hedge_duplicates), (2, 1));
        let times = vec![(1, AtomicHistogram::new(CONFIG_BOUNDS).snapshot())];
        let mut reg = corefarm_telemetry::registry();
        let st = s.clone();
        let m = Arc::new(m);
        let m2 = m.clone();
        reg.register_collector(corefarm_telemetry::collector(move |enc| {
            encode(enc, &m2, &st, &names, &times, (0, 0))
        }));
        let text = corefarm_telemetry::to_prometheus_text(&corefarm_telemetry::encode(&reg));
        for line in [
            r#"corefarm_node_results_total{node="n0@127.0.0.1:5"} 7"#,
            r#"corefarm_node_function{node="n0@127.0.0.1:5",function="bench"} 1"#,
            r#"corefarm_nodes_connected{state="ready"} 1"#,
            r#"corefarm_errors_total{kind="node_lost"} 1"#,
            r#"corefarm_redispatched_total 3"#,
            r#"corefarm_hedged_total 2"#,
            r#"corefarm_hedge_duplicates_total 1"#,
            r#"corefarm_queued_messages 4"#,
            r#"corefarm_user_results_total{user="other"} 5"#,
            r#"corefarm_user_results_total{user="u0"} 1"#,
            r#"corefarm_user_results_total{user="u1"} 1"#,
            r#"corefarm_user_latency_seconds_count{user="other"} 5"#,
            r#"corefarm_link_bytes_total{link="user",direction="in"} 100"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in:\n{text}");
        }
        let users = text
            .lines()
            .filter(|l| l.starts_with("corefarm_user_results_total{"))
            .count();
        assert_eq!(users, USER_SLOTS + 1, "32 names and other");
    }

    fn image(manifest: &str) -> Vec<u8> {
        let mut b = b"CFIMAGE\0".to_vec();
        b.extend(1u32.to_le_bytes());
        b.extend((manifest.len() as u32).to_le_bytes());
        b.extend(manifest.as_bytes());
        b.extend(b"artifact bytes");
        b
    }

    fn cfg(bitstream: Vec<u8>) -> Configuration {
        Configuration {
            input_size: 4,
            output_size: 4,
            cores: vec![corefarm_smp::CoreInfo {
                control: 0,
                input: 4,
                output: 8,
            }],
            bitstream: bitstream.into(),
        }
    }

    #[test]
    fn functions_are_labelled_by_image_name_and_digest() {
        use sha2::Digest;
        let short = |b: &[u8]| hex::encode(&sha2::Sha256::digest(b)[..6]);
        let img = image(r#"{"name":"crc32","input_size":4,"output_size":4,"cores":[]}"#);
        let want = format!("crc32 (sha256:{})", short(&img));
        assert_eq!(function_label(&cfg(img)), want);
        // A raw bitstream, a broken manifest, a length past the end: the digest alone.
        for raw in [
            b"not an image".to_vec(),
            image("{not json"),
            image(r#"{"name":""}"#),
            b"CFIMAGE\0\x01\0\0\0\xff\xff\xff\xff{}".to_vec(),
        ] {
            assert_eq!(
                function_label(&cfg(raw.clone())),
                format!("sha256:{}", short(&raw))
            );
        }
        // A peer's name is bounded and cannot carry a line break.
        let long = format!(r#"{{"name":"a\nb{}"}}"#, "x".repeat(500));
        let label = function_label(&cfg(image(&long)));
        let name = label.split(" (sha256:").next().unwrap();
        assert_eq!(name.chars().count(), corefarm_telemetry::MAX_NAME_CHARS);
        assert!(name.starts_with("a?bxx"), "{label}");
    }

    #[test]
    fn user_labels() {
        assert_eq!(user_label(Some("prog"), true), "prog");
        assert_eq!(user_label(None, true), "anonymous");
        assert_eq!(user_label(Some(""), true), "anonymous");
        assert_eq!(user_label(None, false), "seed");
    }
}

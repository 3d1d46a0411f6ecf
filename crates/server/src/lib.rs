//! The corefarm server (seed 000 §3.3).
//!
//! - [`nodeconn`]: one node connection = a reader task and a writer task that
//!   outlive any single owner, so a node can move between the free pool and
//!   user handlers without its byte stream being interrupted.
//! - [`pool`]: the unassigned nodes and the users that still want nodes.
//! - `session`: the user session, one task and one state machine per user
//!   (Initial → Nodes Configuration → Data Routing) over a placement: the
//!   nodes it owns (exclusive mode, no lock on the data path) or the scheduler.
//! - [`dispatch`]: the data demultiplexer policies (queue, stack, credit).
//! - `group`: users that drive a gang-allocated group of nodes.
//! - `registry`: nodes and users as the status extension shows them
//!   (atomics written by their owners, locked only on connect/disconnect).
//! - `limits`: refusing connections beyond `--max-users` / `--max-nodes`,
//!   after taking back a place an idle, unconfigured user holds.
//! - [`auth`]: `--auth-file`, the challenge every connection answers first,
//!   and the users (tenants) it names.
//! - [`accounts`]: what each user used since the server started.
//! - [`sched`]: shared mode (`--sharing shared`): functions, per-function
//!   queues, Algorithm 1; one driver task owns every node.
//! - [`tls`]: optional TLS on either port (`--tls-cert`, `--tls-key`).
//! - [`defaults`]: every default of [`ServerOptions`], shared with the CLI.

pub mod accounts;
mod anylen;
pub mod auth;
mod budget;
mod chunked;
pub mod defaults;
pub mod dispatch;
mod events;
mod greeting;
mod group;
#[cfg(test)]
mod hedge_tests;
#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod idle_tests;
mod intake;
mod limits;
pub mod metrics;
pub mod nodeconn;
mod notes;
pub mod pool;
mod registry;
pub mod sched;
mod session;
mod sink;
pub mod tls;
pub(crate) mod userconn;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use corefarm_smp::ClusterStatus;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use dispatch::Policy;
pub use sched::Sharing;

#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub nodes_listen: String,
    pub users_listen: String,
    pub policy: Policy,
    /// Credit policy: data messages in flight per node; the starting point
    /// of the adaptive window, or the window itself when it is fixed.
    pub credit: u32,
    /// Credit policy: adapt the window (one for all of a session's nodes)
    /// to keep them busy with the least data waiting (see [`dispatch::Window`]).
    pub credit_adaptive: bool,
    /// Credit policy: bytes of data messages an adaptive window may hold
    /// in flight per node (at least one message).
    pub credit_max_bytes: u64,
    /// Credit toward users (hello users with the credit feature): messages a
    /// user may have outstanding. Default: the sum of its nodes' windows.
    pub user_window: Option<u32>,
    pub max_message: u32,
    /// How long a node may take to answer a configuration.
    pub config_timeout: Duration,
    /// How long a node with work in flight may go without returning a result.
    pub node_timeout: Duration,
    /// Hung nodes: work late by this rule is sent again to another node,
    /// and a node without progress takes no new work
    /// ([`dispatch::progress`]); `None`: off.
    pub hedge: Option<dispatch::progress::Hedge>,
    /// How long one write to a peer may make no progress.
    pub io_timeout: Duration,
    /// How long a new user waits for nodes when none (or fewer than it asked for) are free.
    pub node_wait: Duration,
    /// How long a user may stay silent before its session ends: always when
    /// it is not configured; with nothing outstanding, while another user
    /// waits for nodes, when it is (its nodes return to the pool).
    pub user_idle_timeout: Duration,
    /// A frame whose header has begun must complete its header within this,
    /// and its payload must make progress at least this often (users and
    /// nodes); a new user connection must begin its first frame within it.
    pub read_timeout: Duration,
    /// A new node joins the pool when its hello has been answered, or after
    /// this long without one (a seed-format node never says hello).
    pub node_hello_grace: Duration,
    /// Concurrent user connections; a new one beyond takes the place of the
    /// idlest unconfigured one, or is refused with a reason if there is none.
    pub max_users: usize,
    /// Concurrent node connections; more are refused with a reason.
    pub max_nodes: usize,
    /// Secrets every hello peer must prove it holds (`--auth-file`); `None`
    /// admits everyone, and then the ports must be on loopback unless
    /// `insecure_open` says otherwise.
    pub auth: Option<Arc<auth::AuthConfig>>,
    /// With `auth`: admit seed-format peers (no hello, so no authentication).
    pub allow_legacy: bool,
    /// Without `auth`: allow listening on addresses other hosts can reach.
    pub insecure_open: bool,
    /// Who owns the nodes: a user (exclusive) or the scheduler (shared).
    pub sharing: Sharing,
    /// Shared mode: Algorithm 1's monitoring period.
    pub monitor_period: Duration,
    /// Shared mode: data messages one function's queue holds.
    pub queue_limit: usize,
    /// Shared mode: per priority class (index), the most data messages of
    /// that class one function's queue holds (`corefarm model classes`
    /// derives them from offered loads); `None` or absent: only
    /// `queue_limit` bounds the class.
    pub class_depths: Vec<Option<u32>>,
    /// TLS on the ports it names (`--tls-cert`, `--tls-key`, `--tls-ports`).
    pub tls: Option<tls::ServerTls>,
    /// Largest chunk the server sends to and takes from a node that
    /// negotiated chunks; 0: no chunks on the node link.
    pub node_chunk_size: u32,
    /// Bytes all peers together may make the server hold of what they have
    /// begun and not finished; `None`: [`defaults::memory_budget`].
    pub memory_budget: Option<u64>,
    /// How long a user's chunked message may stay unfinished, counting only
    /// time the server waits for its chunks.
    pub message_timeout: Duration,
    /// Connected nodes up to which `/metrics` has a series per node; past
    /// it only totals and counts by state (the label set stays bounded).
    pub metrics_nodes: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        use defaults::*;
        ServerOptions {
            nodes_listen: NODES_LISTEN.into(),
            users_listen: USERS_LISTEN.into(),
            policy: POLICY,
            credit: CREDIT,
            credit_adaptive: CREDIT_ADAPTIVE,
            credit_max_bytes: CREDIT_MAX_BYTES,
            user_window: None,
            max_message: MAX_MESSAGE,
            config_timeout: CONFIG_TIMEOUT,
            node_timeout: NODE_TIMEOUT,
            hedge: dispatch::progress::Hedge::new(HEDGE_FACTOR, HEDGE_FLOOR),
            io_timeout: IO_TIMEOUT,
            node_wait: NODE_WAIT,
            user_idle_timeout: USER_IDLE_TIMEOUT,
            read_timeout: READ_TIMEOUT,
            node_hello_grace: NODE_HELLO_GRACE,
            max_users: MAX_USERS,
            max_nodes: MAX_NODES,
            auth: None,
            allow_legacy: false,
            insecure_open: false,
            sharing: SHARING,
            monitor_period: MONITOR_PERIOD,
            queue_limit: QUEUE_LIMIT,
            class_depths: Vec::new(),
            tls: None,
            node_chunk_size: NODE_CHUNK_SIZE,
            memory_budget: None,
            message_timeout: MESSAGE_TIMEOUT,
            metrics_nodes: METRICS_NODES,
        }
    }
}

/// What every task of a running server reads: its options, the free
/// pool, the registry, the metrics and (shared mode) the scheduler.
pub(crate) struct ServerState {
    pub opts: ServerOptions,
    pub pool: pool::Pool,
    pub registry: registry::Registry,
    /// Shared mode: the scheduler's part of the status, published by it.
    pub view: std::sync::Mutex<sched::view::View>,
    pub metrics: Arc<metrics::Metrics>,
    /// Shared mode: the scheduler, which lends nodes to groups.
    pub sched: std::sync::OnceLock<sched::driver::Handle>,
    /// Recent authentication failures by address (`--auth-file`).
    pub auth_throttle: auth::Throttle,
    /// What peers hold of unfinished messages (`--memory-budget`).
    pub budget: Arc<budget::Budget>,
    /// What each user used since the server started.
    pub accounts: accounts::Accounts,
    next_id: AtomicU64,
}

impl ServerState {
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The status extension's answer; `you` is the asking user, if any.
    pub fn status(&self, you: Option<u64>) -> ClusterStatus {
        self.status_query(you, &corefarm_smp::StatusQuery::all())
    }

    /// [`ServerState::status`] with the node rows `q` asks for.
    pub fn status_query(&self, you: Option<u64>, q: &corefarm_smp::StatusQuery) -> ClusterStatus {
        let mut s = ClusterStatus {
            you,
            policy: self.opts.policy.to_string(),
            max_message: self.opts.max_message,
            sharing: self.opts.sharing.to_string(),
            ..self.registry.snapshot_page(q.nodes.as_ref())
        };
        if self.opts.sharing == Sharing::Shared {
            self.view.lock().expect("view lock").merge(&mut s);
        }
        self.metrics.fill(&mut s);
        s.accounts = self.registry.accounts(&self.accounts);
        s
    }
}

/// What the server is doing, readable from outside the server task (tests,
/// an embedding program). Obtain it with [`Server::status_handle`] before
/// [`Server::run`] consumes the server.
#[derive(Clone)]
pub struct StatusHandle(Arc<ServerState>);

impl StatusHandle {
    pub fn get(&self) -> ClusterStatus {
        self.0.status(None)
    }
}

/// `/metrics` and `/status` of `--metrics-listen`: both from the same status
/// snapshot, so they cannot disagree.
impl corefarm_telemetry::Endpoints for StatusHandle {
    fn metrics(&self) -> String {
        let shared = self.0.clone();
        let mut reg = corefarm_telemetry::registry();
        reg.register_collector(corefarm_telemetry::collector(move |enc| {
            // Per-node series only up to --metrics-nodes: past it the rows
            // are not even built (the counts by state still are).
            let per_node = shared.registry.node_count() <= shared.opts.metrics_nodes;
            let q = match per_node {
                true => corefarm_smp::StatusQuery::all(),
                false => corefarm_smp::StatusQuery::summary(),
            };
            let s = shared.status_query(None, &q);
            let names = shared.registry.by_name(&shared.metrics);
            let times = match per_node {
                true => shared.registry.config_times(),
                false => Vec::new(),
            };
            let held = (shared.budget.used(), shared.budget.limit());
            metrics::encode(enc, &shared.metrics, &s, &names, &times, held)?;
            accounts::encode(enc, &shared.accounts, &s.accounts)
        }));
        corefarm_telemetry::encode(&reg)
    }

    fn status(&self) -> Vec<u8> {
        self.get().encode()
    }
}

/// A bound server, ready to run.
pub struct Server {
    shared: Arc<ServerState>,
    nodes: TcpListener,
    users: TcpListener,
}

impl Server {
    pub async fn bind(opts: ServerOptions) -> std::io::Result<Server> {
        let nodes = TcpListener::bind(&opts.nodes_listen).await.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot listen for nodes on {}: {e}", opts.nodes_listen),
            )
        })?;
        let users = TcpListener::bind(&opts.users_listen).await.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot listen for users on {}: {e}", opts.users_listen),
            )
        })?;
        let bound: Vec<SocketAddr> = [&nodes, &users]
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        check_exposure(&opts, &bound)?;
        let budget = opts
            .memory_budget
            .unwrap_or_else(|| defaults::memory_budget(opts.max_message));
        let tenants = opts.auth.iter().flat_map(|a| a.tenants());
        let accounts = accounts::Accounts::new(tenants);
        let shared = Arc::new(ServerState {
            accounts,
            budget: budget::Budget::new(budget),
            opts,
            pool: pool::Pool::default(),
            registry: registry::Registry::default(),
            view: Default::default(),
            metrics: Default::default(),
            sched: std::sync::OnceLock::new(),
            auth_throttle: Default::default(),
            next_id: AtomicU64::new(1),
        });
        Ok(Server {
            shared,
            nodes,
            users,
        })
    }

    pub fn nodes_addr(&self) -> SocketAddr {
        self.nodes.local_addr().expect("bound listener")
    }

    pub fn users_addr(&self) -> SocketAddr {
        self.users.local_addr().expect("bound listener")
    }

    /// Number of free (unassigned) nodes right now.
    pub fn free_nodes(&self) -> usize {
        self.shared.pool.free_count()
    }

    /// The cluster's status now (nodes, users, counters).
    pub fn status(&self) -> ClusterStatus {
        self.shared.status(None)
    }

    /// A handle that keeps answering [`StatusHandle::get`] while the server runs.
    pub fn status_handle(&self) -> StatusHandle {
        StatusHandle(self.shared.clone())
    }

    /// Accepts nodes and users until `stop` is cancelled.
    pub async fn run(self, stop: CancellationToken) {
        let Server {
            shared,
            nodes,
            users,
        } = self;
        let node_slots = Arc::new(Semaphore::new(shared.opts.max_nodes));
        // Of those, what peers still in their TLS handshake or
        // authentication may hold: peers without a secret cannot take
        // every slot, only this share of them.
        let node_opening = Arc::new(Semaphore::new(opening_cap(shared.opts.max_nodes)));
        let user_places = limits::Places::new(
            shared.opts.max_users,
            opening_cap(shared.opts.max_users),
            shared.opts.read_timeout,
        );
        let refusals = limits::Refusals::new(&shared);
        let sched = (shared.opts.sharing == Sharing::Shared)
            .then(|| sched::driver::start(shared.clone(), stop.child_token()));
        if let Some(h) = &sched {
            let _ = shared.sched.set(h.clone());
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                r = nodes.accept() => match r {
                    Ok((s, addr)) => {
                        tune(&s);
                        let Ok(permit) = node_slots.clone().try_acquire_owned() else {
                            shared.metrics.error(metrics::ErrorKind::Refused);
                            refuse(&refusals, &shared, limits::Port::Nodes, s, addr);
                            continue;
                        };
                        let (shared, kill) = (shared.clone(), stop.child_token());
                        let tls = shared.opts.tls.clone().filter(|t| t.covers(limits::Port::Nodes));
                        match (shared.opts.auth.clone(), tls) {
                            (None, None) => start_node(&shared, tls::Stream::Plain(s), addr, permit, kill, &[]),
                            (auth, tls) => {
                                let Ok(opening) = node_opening.clone().try_acquire_owned() else {
                                    let cap = opening_cap(shared.opts.max_nodes);
                                    refuse_opening(&refusals, &shared, limits::Port::Nodes, s, addr, cap);
                                    continue;
                                };
                                tokio::spawn(async move {
                                    let opened = open(&shared, s, addr, limits::Port::Nodes,
                                        tls.as_ref(), auth.as_deref()).await;
                                    drop(opening);
                                    let Some((s, admitted)) = opened else { return };
                                    start_node(&shared, s, addr, permit, kill, &admitted.prefix);
                                });
                            }
                        }
                    }
                    Err(e) => accept_error(e).await,
                },
                r = users.accept() => match r {
                    Ok((s, addr)) => {
                        tune(&s);
                        let tls = shared.opts.tls.clone().filter(|t| t.covers(limits::Port::Users));
                        let auth = shared.opts.auth.clone();
                        let place = match user_places.admit(tls.is_some() || auth.is_some()) {
                            Ok(p) => p,
                            Err(limits::Full::Places) => {
                                shared.metrics.error(metrics::ErrorKind::Refused);
                                refuse(&refusals, &shared, limits::Port::Users, s, addr);
                                continue;
                            }
                            Err(limits::Full::Opening(cap)) => {
                                refuse_opening(&refusals, &shared, limits::Port::Users, s, addr, cap);
                                continue;
                            }
                        };
                        let shared = shared.clone();
                        let stop = stop.child_token();
                        let sched = sched.clone();
                        tokio::spawn(async move {
                            let way_in = open(&shared, s, addr, limits::Port::Users,
                                tls.as_ref(), auth.as_deref());
                            let Some((s, admitted)) = evictable(&shared, &place, addr, way_in).await.flatten() else {
                                return;
                            };
                            let prefix = admitted.prefix;
                            place.opened();
                            tracing::info!(user = %addr, "user connected");
                            // Listed from now on, whatever it sends first.
                            let id = shared.next_id();
                            let entry = Arc::new(registry::UserEntry::new(id, addr));
                            if let Some(t) = &admitted.tenant {
                                entry.set_account(shared.accounts.of(t));
                            }
                            shared.registry.add_user(entry.clone());
                            let me = (id, entry);
                            let conn = session::Conn { stream: s, peer: addr, place };
                            match sched {
                                Some(h) => {
                                    let mut conn = conn;
                                    let t = shared.opts.read_timeout;
                                    let first = sched::first::wants_group(&mut conn.stream, prefix, t);
                                    let Some(first) = evictable(&shared, &conn.place, addr, first).await else {
                                        return;
                                    };
                                    match first {
                                        (prefix, true) => {
                                            let owned = session::owned::Owned::new(shared.clone(), id, addr, me.1.clone());
                                            session::run(shared, owned, conn, stop, &prefix, me).await
                                        }
                                        (prefix, false) => {
                                            let scheduled = session::scheduled::Scheduled::new(shared.clone(), h, me.1.clone());
                                            session::run(shared, scheduled, conn, stop, &prefix, me).await
                                        }
                                    }
                                }
                                None => {
                                    let owned = session::owned::Owned::new(shared.clone(), id, addr, me.1.clone());
                                    session::run(shared, owned, conn, stop, &prefix, me).await
                                }
                            }
                        });
                    }
                    Err(e) => accept_error(e).await,
                },
            }
        }
        shared.pool.close_all();
    }
}

/// `step` (the way in, or reading the first message), unless a new
/// connection takes the place first: then `None`, logged and counted. A
/// user connection that has not yet spoken cannot be told why.
async fn evictable<T>(
    shared: &ServerState,
    place: &limits::Place,
    addr: SocketAddr,
    step: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        _ = place.evicted().cancelled() => {
            shared.metrics.error(metrics::ErrorKind::Evicted);
            tracing::warn!(peer = %addr, "closed: a new connection took its place at --max-users {} \
                before its session began", shared.opts.max_users);
            None
        }
        r = step => Some(r),
    }
}

/// Connections of a port that may be in their TLS handshake or
/// authentication at once: a quarter of its slots, at most 64.
fn opening_cap(max: usize) -> usize {
    (max / 4).clamp(1, 64)
}

/// A connection's way in: the TLS handshake on a TLS port, then the
/// authentication challenge with `--auth-file`, all within one
/// `--read-timeout`. `None` if either failed or the time ran out (the
/// reason is logged, the connection closed).
async fn open(
    shared: &ServerState,
    s: TcpStream,
    addr: SocketAddr,
    port: limits::Port,
    tls: Option<&tls::ServerTls>,
    auth: Option<&auth::AuthConfig>,
) -> Option<(tls::Stream, auth::Admitted)> {
    let timeout = shared.opts.read_timeout;
    let way_in = async {
        let s = match tls {
            Some(t) => match tls::accept(t, s, addr, port, timeout).await {
                Some(s) => s,
                None => {
                    shared.metrics.error(metrics::ErrorKind::TlsFailed);
                    return None;
                }
            },
            None => tls::Stream::Plain(s),
        };
        let Some(a) = auth else {
            let none = auth::Admitted {
                prefix: Vec::new(),
                tenant: None,
            };
            return Some((s, none));
        };
        let gate = (a, &shared.auth_throttle, &*shared.metrics);
        auth::admit(s, addr, port, gate, shared.opts.allow_legacy, timeout)
            .await
            .ok()
    };
    match tokio::time::timeout(timeout, way_in).await {
        Ok(opened) => opened,
        Err(_) => {
            tracing::warn!(peer = %addr, "closed: no way in (TLS, authentication) within {timeout:?}");
            None
        }
    }
}

/// Beyond the connections a port may have on their way in at once (as
/// [`refuse`] for a TLS port: just the close).
fn refuse_opening(
    refusals: &limits::Refusals,
    shared: &ServerState,
    port: limits::Port,
    s: TcpStream,
    addr: SocketAddr,
    cap: usize,
) {
    shared.metrics.error(metrics::ErrorKind::Refused);
    match &shared.opts.tls {
        Some(t) if t.covers(port) => {
            tracing::warn!(peer = %addr, "connection refused (TLS port): {cap} still on their way in")
        }
        _ => refusals.refuse_opening(port, s, addr, cap),
    }
}

/// Beyond `--max-users`/`--max-nodes`. A TLS port's refusal is just the
/// close (answering would need a handshake, which is what the limit saves).
fn refuse(
    refusals: &limits::Refusals,
    shared: &ServerState,
    port: limits::Port,
    s: TcpStream,
    addr: SocketAddr,
) {
    match &shared.opts.tls {
        Some(t) if t.covers(port) => {
            tracing::warn!(peer = %addr, "connection refused (TLS port): at the connection limit")
        }
        _ => refusals.refuse(port, s, addr),
    }
}

fn start_node(
    shared: &Arc<ServerState>,
    s: tls::Stream,
    addr: SocketAddr,
    permit: tokio::sync::OwnedSemaphorePermit,
    kill: CancellationToken,
    prefix: &[u8],
) {
    let (conn, introduced) = nodeconn::NodeConn::start(s, addr, shared, permit, kill, prefix);
    // Until the node has said hello and been answered, nothing may be sent
    // to it: a configuration that overtook the answer would reach a node
    // that does not yet know which features (error messages, chunks) it has.
    // So the node joins the pool (and the status) only then, or after the
    // grace period for a seed-format node, which never says hello.
    let shared = shared.clone();
    tokio::spawn(async move {
        let _ = tokio::time::timeout(shared.opts.node_hello_grace, introduced).await;
        if !shared
            .registry
            .add_node_if_open(conn.entry.clone(), || conn.is_closed())
        {
            return;
        }
        tracing::info!(node = %conn.label(), "node connected");
        shared.pool.add(conn);
    });
}

/// Without an auth file anyone who reaches a port runs code on the nodes,
/// so both ports stay on loopback unless `--insecure-open` says otherwise.
fn check_exposure(opts: &ServerOptions, bound: &[SocketAddr]) -> std::io::Result<()> {
    let open: Vec<SocketAddr> = bound
        .iter()
        .copied()
        .filter(|a| !a.ip().is_loopback())
        .collect();
    match (&opts.auth, open.is_empty()) {
        (Some(_), _) => tracing::info!("authentication on (--auth-file){}", if opts.allow_legacy {
            "; seed-format peers admitted without it (--allow-legacy)"
        } else {
            ""
        }),
        (None, true) => tracing::info!(
            "no --auth-file: listening on loopback only; give an auth file to accept other hosts"
        ),
        (None, false) if opts.insecure_open => tracing::warn!(
            "no --auth-file and --insecure-open: anyone who reaches {open:?} can run code on every node"
        ),
        (None, false) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "refusing to listen on {open:?} without authentication: anyone who reaches it \
                     could run code on every node. Give --auth-file (see docs/operations.md), \
                     listen on 127.0.0.1, or pass --insecure-open"
                ),
            ))
        }
    }
    Ok(())
}

fn tune(s: &TcpStream) {
    let _ = s.set_nodelay(true);
    // Keep-alive makes a half-open peer (host gone, no FIN) fail its reads
    // eventually instead of holding a handler forever.
    let sock = socket2::SockRef::from(s);
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10))
        .with_retries(3);
    let _ = sock.set_tcp_keepalive(&ka);
}

async fn accept_error(e: std::io::Error) {
    // Typically EMFILE: back off instead of spinning.
    tracing::warn!("accept failed: {e}");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_ports_need_an_auth_file_or_insecure_open() {
        let lo: SocketAddr = "127.0.0.1:8888".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:9999".parse().unwrap();
        let mut o = ServerOptions::default();
        assert!(check_exposure(&o, &[lo, lo]).is_ok());
        let e = check_exposure(&o, &[lo, any]).unwrap_err().to_string();
        assert!(
            e.contains("0.0.0.0:9999") && e.contains("--auth-file"),
            "{e}"
        );
        assert!(
            !e.contains("  "),
            "a source line's indentation in the message: {e}"
        );
        o.insecure_open = true;
        assert!(check_exposure(&o, &[lo, any]).is_ok());
        o.insecure_open = false;
        let users = corefarm_smp::auth::Secret::new("user-secret-0123456789").unwrap();
        let nodes = corefarm_smp::auth::Secret::new("node-secret-0123456789").unwrap();
        o.auth = Some(Arc::new(auth::AuthConfig::new(users, nodes).unwrap()));
        assert!(check_exposure(&o, &[any, any]).is_ok());
    }
}

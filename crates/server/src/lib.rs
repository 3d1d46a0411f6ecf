//! The corefarm server (seed 000 §3.3).
//!
//! - [`nodeconn`]: one node connection = a reader task and a writer task that
//!   outlive any single owner, so a node can move between the free pool and
//!   user handlers without its byte stream being interrupted.
//! - [`pool`]: the unassigned nodes and the users that still want nodes.
//! - [`user`]: the per-user handler, a single-task state machine
//!   (Initial → Nodes Configuration → Data Routing) that owns all routing state,
//!   so the hot path needs no locks.
//! - [`dispatch`]: the data demultiplexer policies (queue, stack, credit).
//! - `registry`: nodes and users as the status extension shows them
//!   (atomics written by their owners, locked only on connect/disconnect).
//! - `limits`: refusing connections beyond `--max-users` / `--max-nodes`.
//! - [`defaults`]: every default of [`ServerOptions`], shared with the CLI.

pub mod defaults;
pub mod dispatch;
mod limits;
pub mod metrics;
pub mod nodeconn;
pub mod pool;
mod registry;
pub mod user;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use corefarm_smp::ClusterStatus;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use dispatch::Policy;

#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub nodes_listen: String,
    pub users_listen: String,
    pub policy: Policy,
    /// Credit policy: data messages in flight per node; the starting point
    /// of the adaptive window, or the window itself when it is fixed.
    pub credit: u32,
    /// Credit policy: adapt each node's window to keep it busy with the
    /// least data waiting (see [`dispatch::Window`]).
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
    /// How long one write to a peer may make no progress.
    pub io_timeout: Duration,
    /// How long a new user waits for nodes when none (or fewer than it asked for) are free.
    pub node_wait: Duration,
    /// How long a user with nothing outstanding may stay silent before its
    /// session ends and its nodes return to the pool.
    pub user_idle_timeout: Duration,
    /// A frame whose header has begun must complete its header within this,
    /// and its payload must make progress at least this often (users and nodes).
    pub read_timeout: Duration,
    /// Concurrent user connections; more are refused with a reason.
    pub max_users: usize,
    /// Concurrent node connections; more are refused with a reason.
    pub max_nodes: usize,
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
            io_timeout: IO_TIMEOUT,
            node_wait: NODE_WAIT,
            user_idle_timeout: USER_IDLE_TIMEOUT,
            read_timeout: READ_TIMEOUT,
            max_users: MAX_USERS,
            max_nodes: MAX_NODES,
        }
    }
}

pub(crate) struct Shared {
    pub opts: ServerOptions,
    pub pool: pool::Pool,
    pub registry: registry::Registry,
    pub metrics: metrics::Metrics,
    next_id: AtomicU64,
}

impl Shared {
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The status extension's answer; `you` is the asking user, if any.
    pub fn status(&self, you: Option<u64>) -> ClusterStatus {
        let mut s = ClusterStatus {
            you,
            policy: self.opts.policy.to_string(),
            max_message: self.opts.max_message,
            ..self.registry.snapshot()
        };
        self.metrics.fill(&mut s);
        s
    }
}

/// What the server is doing, readable from outside the server task (tests,
/// an embedding program). Obtain it with [`Server::status_handle`] before
/// [`Server::run`] consumes the server.
#[derive(Clone)]
pub struct StatusHandle(Arc<Shared>);

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
            let s = shared.status(None);
            let times = shared.registry.config_times();
            metrics::encode(enc, &shared.metrics, &s, &times)
        }));
        corefarm_telemetry::encode(&reg)
    }

    fn status(&self) -> Vec<u8> {
        self.get().encode()
    }
}

/// A bound server, ready to run.
pub struct Server {
    shared: Arc<Shared>,
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
        let shared = Arc::new(Shared {
            opts,
            pool: pool::Pool::default(),
            registry: registry::Registry::default(),
            metrics: metrics::Metrics::default(),
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
        let user_slots = Arc::new(Semaphore::new(shared.opts.max_users));
        let refusals = limits::Refusals::new(&shared);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                r = nodes.accept() => match r {
                    Ok((s, addr)) => {
                        tune(&s);
                        let Ok(permit) = node_slots.clone().try_acquire_owned() else {
                            shared.metrics.error(metrics::ErrorKind::Refused);
                            refusals.refuse(limits::Port::Nodes, s, addr);
                            continue;
                        };
                        let conn = nodeconn::NodeConn::start(s, addr, &shared, permit, stop.child_token());
                        tracing::info!(node = %conn.label(), "node connected");
                        shared.pool.add(conn);
                    }
                    Err(e) => accept_error(e).await,
                },
                r = users.accept() => match r {
                    Ok((s, addr)) => {
                        tune(&s);
                        let Ok(permit) = user_slots.clone().try_acquire_owned() else {
                            shared.metrics.error(metrics::ErrorKind::Refused);
                            refusals.refuse(limits::Port::Users, s, addr);
                            continue;
                        };
                        tracing::info!(user = %addr, "user connected");
                        let shared = shared.clone();
                        let stop = stop.child_token();
                        tokio::spawn(async move {
                            user::run(shared, s, addr, stop).await;
                            drop(permit);
                        });
                    }
                    Err(e) => accept_error(e).await,
                },
            }
        }
        shared.pool.close_all();
    }
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

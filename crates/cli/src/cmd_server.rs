//! `corefarm server`, and what the node and local commands share with it
//! (argument parsers, the runtime, the metrics endpoint, Ctrl-C).

use std::time::Duration;

use clap::Args;
use corefarm_server::{defaults, Policy, Server, ServerOptions, Sharing};
use tokio_util::sync::CancellationToken;

use crate::flags::{FlagError, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, MIN_MAX_MESSAGE};

#[derive(Args, Clone)]
pub struct ServerArgs {
    /// Address the node port listens on (nodes connect here). Default:
    /// 127.0.0.1:8888, or 0.0.0.0:8888 with --auth-file.
    #[arg(long)]
    pub nodes_listen: Option<String>,
    /// Address the user port listens on (user programs connect here).
    /// Default: 127.0.0.1:9999, or 0.0.0.0:9999 with --auth-file.
    #[arg(long)]
    pub users_listen: Option<String>,
    /// TOML file with a `[users]` and a `[nodes]` secret (mode 600): every
    /// hello peer must prove it holds its role's secret (docs/operations.md).
    #[arg(long, help_heading = "Authentication")]
    pub auth_file: Option<std::path::PathBuf>,
    /// With --auth-file: also admit seed-format peers (no hello), which
    /// cannot authenticate.
    #[arg(long, requires = "auth_file", help_heading = "Authentication")]
    pub allow_legacy: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics and the status as JSON at /status.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    #[command(flatten)]
    pub tls: crate::cmd_tls::ServerTlsArgs,
    #[command(flatten)]
    pub tuning: ServerTuning,
}

/// Seconds from the command line, zero allowed: finite and in range, since
/// `Duration::from_secs_f64` panics otherwise.
pub(crate) fn parse_seconds(s: &str) -> Result<f64, FlagError> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..1e9).contains(&v) => Ok(v),
        _ => Err(FlagError::Seconds(s.to_string())),
    }
}

/// `--trust`: a public key in hex, or a file holding one.
pub(crate) fn parse_trust(s: &str) -> Result<corefarm_cores::signature::PublicKey, FlagError> {
    use corefarm_cores::signature::PublicKey;
    if s.trim().parse::<PublicKey>().is_ok() {
        return Ok(s.trim().parse().expect("checked above"));
    }
    let path = std::path::Path::new(s);
    if !path.is_file() {
        return Err(FlagError::NotAPublicKey {
            given: s.to_string(),
            exists: path.exists(),
        });
    }
    // A secret key is 64 hex digits too: read as a public key it would make
    // the node trust a key nobody signs with (and the secret would be on
    // the node). `image keygen` writes the public half beside it as KEY.pub.
    let public = std::path::PathBuf::from(format!("{s}.pub"));
    if public.is_file() {
        return Err(FlagError::SecretKey {
            given: s.to_string(),
            public,
        });
    }
    PublicKey::parse_or_read(s).map_err(|e| FlagError::PublicKeyFile(e.to_string()))
}

/// Seconds for a timeout: zero would fire at once, so it must be positive.
pub(crate) fn parse_timeout(s: &str) -> Result<f64, FlagError> {
    match parse_seconds(s)? {
        v if v > 0.0 => Ok(v),
        _ => Err(FlagError::ZeroTimeout(s.to_string())),
    }
}

/// `--hedge-factor`, `--hedge-floor-ms` that are neither a number in range nor `off`.
#[derive(Debug, thiserror::Error)]
#[error("{given:?} is not {what} (a number from 0 to {max}, or off)")]
pub(crate) struct HedgeFlagError {
    given: String,
    what: &'static str,
    max: f64,
}

/// A hedge parameter: 0 for `off` (the rule off).
fn parse_hedge(s: &str, what: &'static str, max: f64) -> Result<f64, HedgeFlagError> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(0.0);
    }
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=max).contains(&v) => Ok(v),
        _ => Err(HedgeFlagError {
            given: s.to_string(),
            what,
            max,
        }),
    }
}

fn parse_hedge_factor(s: &str) -> Result<f64, HedgeFlagError> {
    parse_hedge(s, "a multiple of the service time", 1e6)
}

/// Milliseconds, at most a day.
fn parse_hedge_floor(s: &str) -> Result<f64, HedgeFlagError> {
    parse_hedge(s, "milliseconds", 86_400_000.0)
}

/// Server tuning; every default comes from `corefarm_server::defaults`.
#[derive(Args, Clone)]
pub struct ServerTuning {
    /// Data demultiplexer: queue and stack as in the seed (a node takes the next
    /// message once its previous send completed), or credit (a window of
    /// messages in flight per node, adaptive by default, least-loaded first:
    /// low latency).
    #[arg(long, default_value_t = defaults::POLICY)]
    pub policy: Policy,
    /// Credit policy: data messages in flight per node (where an adaptive
    /// window starts; the window itself with --credit-window fixed).
    #[arg(long, default_value_t = defaults::CREDIT)]
    pub credit: u32,
    /// Credit policy: `adaptive` moves each node's window to where a larger
    /// one would add little throughput (it tries a neighbour now and then
    /// and keeps it if it delivers more, or as much with less latency);
    /// `fixed` keeps --credit.
    #[arg(long, default_value = if defaults::CREDIT_ADAPTIVE { "adaptive" } else { "fixed" },
          value_parser = ["adaptive", "fixed"])]
    pub credit_window: String,
    /// Credit policy: bytes an adaptive window may keep in flight per node
    /// (at least one message).
    #[arg(long, default_value_t = defaults::CREDIT_MAX_BYTES)]
    pub credit_max_bytes: u64,
    /// Messages a credit-aware user may have outstanding (default: the sum of its nodes' windows).
    #[arg(long)]
    pub user_window: Option<u32>,
    /// Largest accepted message payload, in bytes. A configuration whose input
    /// or output (plus the 4-byte id) would not fit is refused with a reason.
    #[arg(long, default_value_t = defaults::MAX_MESSAGE, value_parser = parse_max_message)]
    pub max_message: u32,
    /// Seconds a node may take to answer a configuration.
    #[arg(long, default_value_t = defaults::CONFIG_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub config_timeout: f64,
    /// Seconds a node with work in flight may go without returning a result.
    #[arg(long, default_value_t = defaults::NODE_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub node_timeout: f64,
    /// The most a node that answers nothing may add to a message's latency,
    /// in times the function's measured service time (and at least
    /// --hedge-floor-ms): two service times before that bound, the message
    /// is sent again to another node holding the function, so the copy's
    /// answer lands within it; the first answer wins, the late one is
    /// dropped. A node silent for twice the bound (at least 200 ms) gets no
    /// new work until it answers. 0 or off: neither.
    #[arg(long, default_value_t = defaults::HEDGE_FACTOR, value_parser = parse_hedge_factor, help_heading = "Hung nodes")]
    pub hedge_factor: f64,
    /// The least bound, in milliseconds, on what a silent node may add to a
    /// message's latency (see --hedge-factor). 0 or off: no hedging.
    #[arg(long, default_value_t = defaults::HEDGE_FLOOR.as_secs_f64() * 1e3, value_parser = parse_hedge_floor, help_heading = "Hung nodes")]
    pub hedge_floor_ms: f64,
    /// Seconds a write to a peer may make no progress before the peer is dropped.
    #[arg(long, default_value_t = defaults::IO_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub io_timeout: f64,
    /// Seconds a new user waits for free nodes when none (or fewer than it asked for) are free.
    #[arg(long, default_value_t = defaults::NODE_WAIT.as_secs_f64(), value_parser = parse_seconds)]
    pub node_wait: f64,
    /// Seconds a user may stay silent before its session ends (hello users
    /// get a timeout error): always for one that is not configured (it holds
    /// a place and nothing else); for a configured one with nothing
    /// outstanding only while another user waits for nodes, which its nodes
    /// then go to.
    #[arg(long, default_value_t = defaults::USER_IDLE_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub user_idle_timeout: f64,
    /// Seconds within which a begun message header must be complete, and
    /// longest pause inside a message, for users and nodes alike (a peer
    /// trickling bytes is cut off); also how long a new user connection may
    /// take to begin its first message. Waiting between later messages is
    /// not bounded by it.
    #[arg(long, default_value_t = defaults::READ_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub read_timeout: f64,
    /// Seconds a new node connection may take to say hello before it is
    /// taken for a seed-format node and joins the pool (corefarm nodes say
    /// hello at once and join as soon as it is answered).
    #[arg(long, default_value_t = defaults::NODE_HELLO_GRACE.as_secs_f64(), value_parser = parse_seconds)]
    pub node_hello_grace: f64,
    /// Concurrent user connections; more are refused with a reason.
    #[arg(long, default_value_t = defaults::MAX_USERS, value_parser = parse_connections)]
    pub max_users: usize,
    /// Concurrent node connections; more are refused with a reason.
    #[arg(long, default_value_t = defaults::MAX_NODES, value_parser = parse_connections)]
    pub max_nodes: usize,
    /// Without an auth file, listen on addresses other hosts can reach
    /// anyway: anyone who reaches a port can then run code on every node.
    #[arg(long, help_heading = "Authentication")]
    pub insecure_open: bool,
    /// Who owns the nodes: `exclusive` (a user owns the nodes it configured
    /// until it leaves, as in the seed) or `shared` (nodes hold functions;
    /// users configuring the same thing share its replicas; the server
    /// reconfigures idle nodes on demand, Algorithm 1). docs/sharing.md.
    #[arg(long, default_value_t = defaults::SHARING, help_heading = "Shared nodes")]
    pub sharing: Sharing,
    /// Shared mode: milliseconds between two runs of the reconfiguration
    /// algorithm (its monitoring period P).
    #[arg(long, default_value_t = defaults::MONITOR_PERIOD.as_secs_f64() * 1e3,
          value_parser = parse_period_ms, help_heading = "Shared nodes")]
    pub monitor_period: f64,
    /// Shared mode: data messages one function's queue holds; beyond it
    /// the server stops reading from its users (or answers queue-full to a
    /// user that asked for it in its hello).
    #[arg(long, default_value_t = defaults::QUEUE_LIMIT, help_heading = "Shared nodes")]
    pub queue_limit: usize,
    /// Shared mode: per-class bounds within a function's queue, as
    /// `class=messages` pairs (class 0 most urgent), e.g. `0=12,6=40`;
    /// `corefarm model classes` computes them from the classes' loads. A
    /// message of a full class waits like one of a full queue (or gets
    /// queue-full). Classes not named are bounded by --queue-limit only.
    #[arg(long, value_delimiter = ',', value_parser = parse_class_depth,
          help_heading = "Shared nodes")]
    pub class_depths: Vec<(u8, u32)>,
    /// Bytes per chunk on the node link, so that a large message does not
    /// hold up urgent ones: a data message or result
    /// larger than this travels as chunks interleaved by priority class, with
    /// nodes that negotiate chunks (the smaller size of the two wins). 0: off;
    /// otherwise 512 to 1048576.
    #[arg(long, default_value_t = defaults::NODE_CHUNK_SIZE, value_parser = parse_chunk_size)]
    pub node_chunk_size: u32,
    /// Bytes all peers together may make the server hold of messages they
    /// have begun and not finished (frames being received, unfinished
    /// chunked messages); a peer that would go over is refused with a
    /// too-large error and closed. Default: four times --max-message, at
    /// least 1 GiB.
    #[arg(long, value_parser = parse_memory_budget)]
    pub memory_budget: Option<u64>,
    /// Seconds a user's chunked message may stay unfinished, counting only
    /// time the server waits for its chunks; then the user gets a timeout
    /// error and is closed, and what the message held is released.
    #[arg(long, default_value_t = defaults::MESSAGE_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub message_timeout: f64,
    /// Connected nodes up to which /metrics has a series per node (nine
    /// families each); with more, only totals and nodes by state, so a
    /// large cluster's scrape stays small and its label set bounded.
    #[arg(long, default_value_t = defaults::METRICS_NODES)]
    pub metrics_nodes: usize,
}

/// `--memory-budget`: bytes, at least one message of the smallest
/// `--max-message`.
pub(crate) fn parse_memory_budget(s: &str) -> Result<u64, FlagError> {
    match s.trim().parse::<u64>() {
        Ok(v) if v >= u64::from(MIN_MAX_MESSAGE) => Ok(v),
        Ok(v) => Err(FlagError::MaxMessageTooSmall(
            v.min(u64::from(u32::MAX)) as u32
        )),
        Err(error) => Err(FlagError::Bytes {
            given: s.to_string(),
            error,
        }),
    }
}

/// `--max-message`, `--node-max-message`: bytes, at least [`MIN_MAX_MESSAGE`].
pub(crate) fn parse_max_message(s: &str) -> Result<u32, FlagError> {
    match s.trim().parse::<u32>() {
        Ok(v) if v >= MIN_MAX_MESSAGE => Ok(v),
        Ok(v) => Err(FlagError::MaxMessageTooSmall(v)),
        Err(error) => Err(FlagError::Bytes {
            given: s.to_string(),
            error,
        }),
    }
}

/// The chunk sizes a link can use: 0 (off) or [`MIN_CHUNK_SIZE`] to
/// `corefarm_smp::stream::MAX_CHUNK_SIZE`.
pub(crate) fn parse_chunk_size(s: &str) -> Result<u32, FlagError> {
    match s.trim().parse::<u32>() {
        Ok(v) if v == 0 || (MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&v) => Ok(v),
        Ok(v) => Err(FlagError::ChunkSize(v)),
        Err(error) => Err(FlagError::Bytes {
            given: s.to_string(),
            error,
        }),
    }
}

/// `--max-users`, `--max-nodes`: 0 would refuse every connection.
fn parse_connections(s: &str) -> Result<usize, FlagError> {
    match s.trim().parse::<usize>() {
        Ok(v) if v >= 1 => Ok(v),
        Ok(_) => Err(FlagError::NoConnections),
        Err(error) => Err(FlagError::Connections {
            given: s.to_string(),
            error,
        }),
    }
}

/// `--monitor-period`: milliseconds, at least 0.1 (the scheduler ticks no faster).
fn parse_period_ms(s: &str) -> Result<f64, FlagError> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.1..1e7).contains(&v) => Ok(v),
        _ => Err(FlagError::Period(s.to_string())),
    }
}

fn parse_class_depth(s: &str) -> Result<(u8, u32), FlagError> {
    let bad = || FlagError::ClassDepth(s.to_string());
    let (k, v) = s.split_once('=').ok_or_else(bad)?;
    let class: u8 = k.trim().parse().map_err(|_| bad())?;
    let depth: u32 = v.trim().parse().map_err(|_| bad())?;
    if class >= corefarm_smp::stream::CLASSES || depth == 0 {
        return Err(bad());
    }
    Ok((class, depth))
}

/// `--class-depths` pairs as the server's per-class table.
fn class_depths(pairs: &[(u8, u32)]) -> Vec<Option<u32>> {
    let mut v = vec![None; corefarm_smp::stream::CLASSES as usize];
    for &(k, d) in pairs {
        v[k as usize] = Some(d);
    }
    v
}

impl ServerTuning {
    pub fn options(&self, nodes_listen: String, users_listen: String) -> ServerOptions {
        ServerOptions {
            nodes_listen,
            users_listen,
            policy: self.policy,
            credit: self.credit,
            credit_adaptive: self.credit_window == "adaptive",
            credit_max_bytes: self.credit_max_bytes,
            user_window: self.user_window,
            max_message: self.max_message,
            config_timeout: Duration::from_secs_f64(self.config_timeout),
            node_timeout: Duration::from_secs_f64(self.node_timeout),
            hedge: corefarm_server::dispatch::progress::Hedge::new(
                self.hedge_factor,
                Duration::from_secs_f64(self.hedge_floor_ms / 1e3),
            ),
            io_timeout: Duration::from_secs_f64(self.io_timeout),
            node_wait: Duration::from_secs_f64(self.node_wait),
            user_idle_timeout: Duration::from_secs_f64(self.user_idle_timeout),
            read_timeout: Duration::from_secs_f64(self.read_timeout),
            node_hello_grace: Duration::from_secs_f64(self.node_hello_grace),
            max_users: self.max_users,
            max_nodes: self.max_nodes,
            auth: None,
            allow_legacy: false,
            insecure_open: self.insecure_open,
            sharing: self.sharing,
            monitor_period: Duration::from_secs_f64(self.monitor_period / 1e3),
            queue_limit: self.queue_limit.max(1),
            class_depths: class_depths(&self.class_depths),
            tls: None,
            node_chunk_size: self.node_chunk_size,
            memory_budget: self.memory_budget,
            message_timeout: Duration::from_secs_f64(self.message_timeout),
            metrics_nodes: self.metrics_nodes,
        }
    }
}

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

pub(crate) fn announce(server: &Server, metrics: Option<std::net::SocketAddr>) {
    use std::io::Write;
    println!(
        "listening nodes={} users={}{}",
        server.nodes_addr(),
        server.users_addr(),
        metrics_field(metrics)
    );
    let _ = std::io::stdout().flush();
}

/// `--metrics-listen`: binds now (so a bad address fails at start) and
/// serves `/metrics` and `/status` until `stop`.
pub async fn serve_metrics(
    addr: Option<&str>,
    endpoints: impl corefarm_telemetry::Endpoints,
    stop: &CancellationToken,
) -> anyhow::Result<Option<std::net::SocketAddr>> {
    let Some(addr) = addr else { return Ok(None) };
    let server = corefarm_telemetry::MetricsServer::bind(addr).await?;
    let bound = server.local_addr();
    tokio::spawn(server.run(std::sync::Arc::new(endpoints), stop.clone()));
    Ok(Some(bound))
}

/// The `metrics=ADDR` field of the "listening" line, when serving metrics.
pub(crate) fn metrics_field(addr: Option<std::net::SocketAddr>) -> String {
    addr.map_or(String::new(), |a| format!(" metrics={a}"))
}

pub(crate) fn stop_on_signal(stop: &CancellationToken) {
    let stop = stop.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
}

pub fn run_server(args: ServerArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let auth = match &args.auth_file {
            Some(p) => Some(std::sync::Arc::new(
                corefarm_server::auth::AuthConfig::load(p).map_err(anyhow::Error::msg)?,
            )),
            None => None,
        };
        let (nodes, users) = if auth.is_some() {
            (defaults::NODES_LISTEN_AUTH, defaults::USERS_LISTEN_AUTH)
        } else {
            (defaults::NODES_LISTEN, defaults::USERS_LISTEN)
        };
        let mut opts = args.tuning.options(
            args.nodes_listen.unwrap_or_else(|| nodes.into()),
            args.users_listen.unwrap_or_else(|| users.into()),
        );
        opts.auth = auth;
        opts.allow_legacy = args.allow_legacy;
        opts.tls = args.tls.load()?;
        let server = Server::bind(opts).await?;
        if args.auth_file.is_none() {
            eprintln!("{}", exposure_note(&server, args.tuning.insecure_open));
        }
        let stop = CancellationToken::new();
        let metrics = serve_metrics(
            args.metrics_listen.as_deref(),
            server.status_handle(),
            &stop,
        )
        .await?;
        announce(&server, metrics);
        stop_on_signal(&stop);
        server.run(stop).await;
        Ok(())
    })
}

/// What a server without an auth file tells its operator at start.
fn exposure_note(server: &Server, insecure_open: bool) -> String {
    if insecure_open {
        format!(
            "warning: no --auth-file and --insecure-open: anyone who reaches nodes={} users={} \
             can run code on every node",
            server.nodes_addr(),
            server.users_addr()
        )
    } else {
        "note: no --auth-file, so both ports listen on loopback only; see docs/operations.md \
         to accept other hosts"
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hedge_flags_take_numbers_and_off() {
        assert_eq!(parse_hedge_factor("4").unwrap(), 4.0);
        assert_eq!(parse_hedge_factor(" off ").unwrap(), 0.0);
        assert_eq!(parse_hedge_floor("0").unwrap(), 0.0);
        assert_eq!(parse_hedge_floor("12.5").unwrap(), 12.5);
        for bad in ["-1", "nan", "inf", "fast", ""] {
            assert!(parse_hedge_factor(bad).is_err(), "{bad}");
        }
        // Either at zero turns the rule off.
        let t = |f, ms| {
            corefarm_server::dispatch::progress::Hedge::new(f, Duration::from_secs_f64(ms / 1e3))
        };
        assert!(t(0.0, 50.0).is_none() && t(4.0, 0.0).is_none());
        assert!(t(4.0, 50.0).is_some());
    }
}

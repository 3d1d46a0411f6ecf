//! `corefarm server`, `corefarm node` and `corefarm local`.

use std::time::Duration;

use clap::Args;
use corefarm_node::NodeOptions;
use corefarm_server::{defaults, Policy, Server, ServerOptions, Sharing};
use tokio_util::sync::CancellationToken;

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
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..1e9).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds")),
    }
}

/// `--trust`: a public key in hex, or a file holding one.
fn parse_trust(s: &str) -> Result<corefarm_cores::signature::PublicKey, String> {
    corefarm_cores::signature::PublicKey::parse_or_read(s)
}

/// `--isolation`: process or in-process.
pub fn parse_isolation(s: &str) -> Result<corefarm_cores::Isolation, String> {
    s.trim().parse()
}

/// Seconds for a timeout: zero would fire at once, so it must be positive.
fn parse_timeout(s: &str) -> Result<f64, String> {
    match parse_seconds(s)? {
        v if v > 0.0 => Ok(v),
        _ => Err(format!("{s:?}: a timeout must be more than 0 seconds")),
    }
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
    /// Credit policy: `adaptive` grows a node's window while the window
    /// starves it and shrinks it while messages only wait at the node;
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
    #[arg(long, default_value_t = defaults::MAX_MESSAGE)]
    pub max_message: u32,
    /// Seconds a node may take to answer a configuration.
    #[arg(long, default_value_t = defaults::CONFIG_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub config_timeout: f64,
    /// Seconds a node with work in flight may go without returning a result.
    #[arg(long, default_value_t = defaults::NODE_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub node_timeout: f64,
    /// Seconds a write to a peer may make no progress before the peer is dropped.
    #[arg(long, default_value_t = defaults::IO_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub io_timeout: f64,
    /// Seconds a new user waits for free nodes when none (or fewer than it asked for) are free.
    #[arg(long, default_value_t = defaults::NODE_WAIT.as_secs_f64(), value_parser = parse_seconds)]
    pub node_wait: f64,
    /// Seconds a user with nothing outstanding may stay silent; then its
    /// session ends (hello users get a timeout error) and its nodes return to
    /// the pool for other users.
    #[arg(long, default_value_t = defaults::USER_IDLE_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub user_idle_timeout: f64,
    /// Seconds within which a begun message header must be complete, and
    /// longest pause inside a message, for users and nodes alike (a peer
    /// trickling bytes is cut off). Waiting between messages is not bounded by it.
    #[arg(long, default_value_t = defaults::READ_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub read_timeout: f64,
    /// Concurrent user connections; more are refused with a reason.
    #[arg(long, default_value_t = defaults::MAX_USERS)]
    pub max_users: usize,
    /// Concurrent node connections; more are refused with a reason.
    #[arg(long, default_value_t = defaults::MAX_NODES)]
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
    /// Bytes per chunk on the node link (issue 11): a data message or result
    /// larger than this travels as chunks interleaved by priority class, with
    /// nodes that negotiate chunks (the smaller size of the two wins). 0: off.
    #[arg(long, default_value_t = defaults::NODE_CHUNK_SIZE)]
    pub node_chunk_size: u32,
}

/// `--monitor-period`: milliseconds, at least 0.1 (the scheduler ticks no faster).
fn parse_period_ms(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.1..1e7).contains(&v) => Ok(v),
        _ => Err(format!(
            "{s:?} is not a period in milliseconds (0.1 or more)"
        )),
    }
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
            io_timeout: Duration::from_secs_f64(self.io_timeout),
            node_wait: Duration::from_secs_f64(self.node_wait),
            user_idle_timeout: Duration::from_secs_f64(self.user_idle_timeout),
            read_timeout: Duration::from_secs_f64(self.read_timeout),
            max_users: self.max_users,
            max_nodes: self.max_nodes,
            auth: None,
            allow_legacy: false,
            insecure_open: self.insecure_open,
            sharing: self.sharing,
            monitor_period: Duration::from_secs_f64(self.monitor_period / 1e3),
            queue_limit: self.queue_limit.max(1),
            tls: None,
            node_chunk_size: self.node_chunk_size,
        }
    }
}

#[derive(Args, Clone)]
pub struct NodeArgs {
    /// Server node port, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:8888")]
    pub server: String,
    /// File holding the node secret of a server with an auth file (mode
    /// 600). Default: $COREFARM_SECRET, or the file $COREFARM_SECRET_FILE.
    #[arg(long)]
    pub secret_file: Option<std::path::PathBuf>,
    /// Number of independent node managers (separate connections) to run in this process.
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    /// Serve Prometheus metrics at http://ADDR/metrics and the node managers' status as JSON at /status.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    #[command(flatten)]
    pub tls: crate::cmd_tls::ClientTlsArgs,
    #[command(flatten)]
    pub node: NodeTuning,
}

#[derive(Args, Clone)]
pub struct NodeTuning {
    /// Node name announced to the server (suffixed with -<i> when --count > 1).
    #[arg(long, default_value = "node")]
    pub name: String,
    /// Memory guard: bytes of queued input and unsent output a node may hold
    /// before it stops reading from the server.
    #[arg(long, default_value_t = 512 * 1024 * 1024)]
    pub memory_limit: usize,
    /// Largest message payload this node accepts or sends, in bytes; a
    /// configuration whose inputs or outputs cannot fit is refused with the
    /// reason (the server's own limit applies too when it is smaller).
    #[arg(long, default_value_t = corefarm_smp::DEFAULT_MAX_MESSAGE)]
    pub node_max_message: u32,
    /// Behave exactly like a seed-format node: no hello, no error messages.
    #[arg(long)]
    pub no_hello: bool,
    /// Exit when the connection ends instead of reconnecting.
    #[arg(long)]
    pub once: bool,
    /// Run only images signed by one of these Ed25519 public keys (64 hex
    /// digits, or a .pub file from `corefarm image keygen`); anything else
    /// is refused with the reason. Default: run every image.
    #[arg(long, value_name = "PUBKEY", num_args = 1.., value_parser = parse_trust)]
    pub trust: Vec<corefarm_cores::signature::PublicKey>,
    /// Milliseconds every configuration takes before it is answered: emulates
    /// a board's programming time (tens to hundreds of ms for a bitstream),
    /// so shared-mode reconfiguration can be studied in simulation.
    #[arg(long, default_value_t = 0)]
    pub reconfigure_delay_ms: u64,
    /// Bytes per chunk a message is cut into for streaming handlers
    /// (docs/streams.md); at most 65 472.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..=65472))]
    pub spin_chunk_size: u32,
    /// Payload handlers of one message running at once (streaming handlers).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub spin_threads: u32,
    /// Offer chunks on the server link (issue 11) with this chunk size in
    /// bytes: the server sends data larger than the size in force (the
    /// smaller of this and its `--node-chunk-size`) as chunks interleaved by
    /// priority class, and streaming handlers start on a message's first
    /// chunk. 0: do not offer chunks.
    #[arg(long, default_value_t = corefarm_smp::stream::DEFAULT_CHUNK_SIZE)]
    pub chunk_size: u32,
    /// Peer port of the node fabric (groups, docs/collectives.md): where the
    /// other members of a group reach this node. An unspecified IP means the
    /// interface the node reaches the server through; port 0 picks a free
    /// port (give port 0 with --count > 1); `none` disables groups.
    #[arg(long, default_value = "0.0.0.0:0", value_parser = parse_peer_listen)]
    pub peer_listen: PeerListen,
    /// Hardware-core backends this node may load, comma-separated: native
    /// (HLS C++ compiled for this CPU), rtl (Verilog simulated by Verilator),
    /// fpga (Cyclone V bitstream through the HPS-to-FPGA bridge). The node
    /// announces the matching targets and refuses configurations it cannot run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "native,rtl",
        value_parser = ["native", "rtl", "fpga"],
        help_heading = "Backends"
    )]
    pub backends: Vec<String>,
    /// Seconds one job may keep a core busy before the core counts as hung:
    /// the job fails with an error, the core is reset where the backend can.
    #[arg(long, default_value_t = 10.0, value_parser = NodeTuning::parse_seconds, help_heading = "Backends")]
    pub core_timeout: f64,
    /// Where native and RTL cores run: `process` (a worker process per
    /// core: a core that crashes, overruns its memories or hangs fails its
    /// job and is restarted) or `in-process` (on the node's threads, a
    /// little faster but unsafe: a faulty core can take the node down).
    #[arg(long, default_value_t = corefarm_cores::Isolation::Process, value_parser = parse_isolation, help_heading = "Backends")]
    pub isolation: corefarm_cores::Isolation,
    /// File mapped for the HPS-to-FPGA bridge (opened read/write, O_SYNC).
    #[arg(
        long,
        default_value = "/dev/mem",
        help_heading = "FPGA backend (--backends fpga)"
    )]
    pub fpga_device: std::path::PathBuf,
    /// Physical address of the bridge window; core-table
    /// addresses in base..base+span are physical, those below span are
    /// bridge-relative. Decimal or 0x-hex.
    #[arg(long, default_value = "0xC0000000", value_parser = NodeTuning::parse_u64, help_heading = "FPGA backend (--backends fpga)")]
    pub fpga_base: u64,
    /// Offset of the bridge within --fpga-device (default: --fpga-base,
    /// which is right for /dev/mem). Decimal or 0x-hex.
    #[arg(long, value_parser = NodeTuning::parse_u64, help_heading = "FPGA backend (--backends fpga)")]
    pub fpga_device_offset: Option<u64>,
    /// Bytes of the bridge window. Decimal or 0x-hex.
    #[arg(long, default_value = "0x3C000000", value_parser = NodeTuning::parse_u64, help_heading = "FPGA backend (--backends fpga)")]
    pub fpga_span: u64,
    /// How bitstreams are programmed. `fpga-manager` uses the
    /// socfpga kernels' /sys/class/fpga_manager/fpga0 with /lib/firmware;
    /// anything else is a command line (shell-style quoting, not run by a
    /// shell) where `{bitstream}` becomes the path of a file holding the
    /// bitstream; without the placeholder the bitstream is piped to its
    /// standard input, e.g. "dd of=/dev/fpga0". It must exit 0.
    #[arg(long, default_value = "fpga-manager", value_parser = NodeTuning::parse_programmer, help_heading = "FPGA backend (--backends fpga)")]
    pub fpga_programmer: corefarm_cores::fpga::Programmer,
}

/// `--peer-listen`: an address, or none.
#[derive(Debug, Clone, Copy)]
pub struct PeerListen(Option<std::net::SocketAddr>);

fn parse_peer_listen(s: &str) -> Result<PeerListen, String> {
    if s == "none" {
        return Ok(PeerListen(None));
    }
    s.parse()
        .map(|a| PeerListen(Some(a)))
        .map_err(|e| format!("{s:?} is not IP:PORT or none: {e}"))
}

impl NodeTuning {
    pub fn options(&self, server: String) -> NodeOptions {
        let has = |b: &str| self.backends.iter().any(|x| x == b);
        let fpga = has("fpga").then(|| corefarm_cores::fpga::FpgaOptions {
            programmer: self.fpga_programmer.clone(),
            device: self.fpga_device.clone(),
            device_offset: self.fpga_device_offset.unwrap_or(self.fpga_base),
            base: self.fpga_base,
            span: self.fpga_span,
        });
        let defaults = corefarm_cores::LoadOptions::default();
        NodeOptions {
            server,
            name: self.name.clone(),
            hello: !self.no_hello,
            memory_limit: self.memory_limit,
            max_message: self.node_max_message,
            reconnect: !self.once,
            reconfigure_delay: Duration::from_millis(self.reconfigure_delay_ms),
            load: corefarm_cores::LoadOptions {
                native: has("native"),
                rtl: has("rtl"),
                fpga,
                driver: corefarm_cores::DriverOptions {
                    timeout: Duration::from_secs_f64(self.core_timeout),
                    ..defaults.driver
                },
                isolation: self.isolation,
                trust: corefarm_cores::signature::Trust(self.trust.clone()),
                ..defaults
            },
            peer_listen: self.peer_listen.0,
            spin: corefarm_node::spin::SpinOptions {
                chunk_size: self.spin_chunk_size as usize,
                threads: self.spin_threads as usize,
            },
            chunk_size: self.chunk_size,
            ..NodeOptions::default()
        }
    }

    /// `--fpga-base`/`--fpga-span`: decimal or 0x-prefixed hexadecimal.
    fn parse_u64(s: &str) -> Result<u64, String> {
        let t = s.trim().replace('_', "");
        let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(h) => u64::from_str_radix(h, 16),
            None => t.parse(),
        };
        r.map_err(|e| format!("{s:?} is not a decimal or 0x-hex number: {e}"))
    }

    /// `--core-timeout`: positive, finite seconds (Duration panics otherwise).
    fn parse_seconds(s: &str) -> Result<f64, String> {
        match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(v),
            _ => Err(format!("{s:?} is not a positive number of seconds")),
        }
    }

    /// `--fpga-programmer`: `fpga-manager` or a command line.
    fn parse_programmer(s: &str) -> Result<corefarm_cores::fpga::Programmer, String> {
        if s.trim() == "fpga-manager" {
            return Ok(corefarm_cores::fpga::Programmer::default());
        }
        match shlex::split(s) {
            Some(argv) if !argv.is_empty() => Ok(corefarm_cores::fpga::Programmer::Command(argv)),
            Some(_) => Err("empty programmer command".into()),
            None => Err(format!(
                "{s:?}: unbalanced quotes in the programmer command"
            )),
        }
    }
}

/// `corefarm local`: only what applies to a cluster inside one process.
/// The nodes are simulated here, so node flags about reaching a remote
/// server (`--once`) or a board (the FPGA backend) are not offered.
#[derive(Args, Clone)]
pub struct LocalArgs {
    /// Number of simulated nodes.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Address the user port listens on; the default is the port
    /// `corefarm.connect()` and the Rust client use.
    #[arg(long, default_value_t = local_users_listen())]
    pub users_listen: String,
    /// Address the node port listens on (port 0 = any free port). The
    /// simulated nodes connect here; `corefarm node` can add more.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub nodes_listen: String,
    /// Serve Prometheus metrics at http://ADDR/metrics and the status as JSON at /status.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    #[command(flatten, next_help_heading = "Server")]
    pub tuning: ServerTuning,
    #[command(flatten, next_help_heading = "Simulated nodes")]
    pub node: LocalNodeArgs,
}

/// Loopback only: an in-process cluster is not meant to be reachable from
/// other machines unless `--users-listen` says so.
fn local_users_listen() -> String {
    format!("127.0.0.1:{}", corefarm_client::DEFAULT_USER_PORT)
}

/// The node flags that make sense for simulated nodes.
#[derive(Args, Clone)]
pub struct LocalNodeArgs {
    /// Node name prefix (nodes are named <name>-<i>).
    #[arg(long, default_value = "node")]
    pub name: String,
    /// Memory guard per node: bytes of queued input and unsent output it may
    /// hold before it stops reading from the server.
    #[arg(long, default_value_t = 512 * 1024 * 1024)]
    pub memory_limit: usize,
    /// Hardware-core backends the nodes may load, comma-separated: native
    /// (HLS C++ compiled for this CPU), rtl (Verilog simulated by Verilator).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "native,rtl",
        value_parser = ["native", "rtl"]
    )]
    pub backends: Vec<String>,
    /// Seconds one job may keep a core busy before the core counts as hung.
    #[arg(long, default_value_t = 10.0, value_parser = parse_timeout)]
    pub core_timeout: f64,
    /// Where user cores run: `process` (a worker process per core, so a
    /// crashing core fails only its job) or `in-process` (faster to start,
    /// unsafe: a faulty core takes the node down).
    #[arg(long, default_value_t = corefarm_cores::Isolation::Process, value_parser = parse_isolation)]
    pub isolation: corefarm_cores::Isolation,
    /// Bytes per chunk a message is cut into for streaming handlers
    /// (docs/streams.md); at most 65 472.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..=65472))]
    pub spin_chunk_size: u32,
    /// Payload handlers of one message running at once (streaming handlers).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub spin_threads: u32,
}

impl LocalNodeArgs {
    /// The node options: `corefarm node`'s defaults with these flags applied.
    pub fn options(&self) -> anyhow::Result<NodeOptions> {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            node: NodeTuning,
        }
        use clap::Parser;
        let backends = self.backends.join(",");
        let core_timeout = self.core_timeout.to_string();
        let memory_limit = self.memory_limit.to_string();
        let isolation = self.isolation.to_string();
        let tuning = Defaults::try_parse_from([
            "local",
            "--isolation",
            &isolation,
            "--name",
            &self.name,
            "--memory-limit",
            &memory_limit,
            "--backends",
            &backends,
            "--core-timeout",
            &core_timeout,
            "--spin-chunk-size",
            &self.spin_chunk_size.to_string(),
            "--spin-threads",
            &self.spin_threads.to_string(),
        ])?;
        Ok(tuning.node.options(String::new()))
    }
}

/// Where a program on this machine connects to reach `addr` (an unspecified
/// address such as 0.0.0.0 listens on loopback too).
fn connect_hint(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn announce(server: &Server, metrics: Option<std::net::SocketAddr>) {
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
fn metrics_field(addr: Option<std::net::SocketAddr>) -> String {
    addr.map_or(String::new(), |a| format!(" metrics={a}"))
}

fn stop_on_signal(stop: &CancellationToken) {
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

pub fn run_node(args: NodeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.count >= 1, "--count must be at least 1");
    let secret = corefarm_smp::auth::Secret::from_file_or_env(args.secret_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    runtime()?.block_on(async {
        let stop = CancellationToken::new();
        stop_on_signal(&stop);
        let mut opts = args.node.options(args.server);
        opts.secret = secret;
        opts.tls = args.tls.load()?;
        if let Some(addr) = args.metrics_listen.as_deref() {
            let t = std::sync::Arc::new(corefarm_node::metrics::NodeTelemetry::default());
            opts.telemetry = Some(t.clone());
            let endpoints = corefarm_node::metrics::NodeEndpoints(t);
            let bound = serve_metrics(Some(addr), endpoints, &stop).await?;
            println!("listening{}", metrics_field(bound));
            use std::io::Write;
            let _ = std::io::stdout().flush();
        }
        corefarm_node::run_many(opts, args.count, stop).await?;
        Ok(())
    })
}

/// An embedded cluster: a server and `nodes` node managers in this process.
pub struct LocalCluster {
    pub users_addr: std::net::SocketAddr,
    pub nodes_addr: std::net::SocketAddr,
    pub stop: CancellationToken,
    pub status: corefarm_server::StatusHandle,
}

pub async fn start_local(
    nodes: usize,
    opts: ServerOptions,
    node: NodeOptions,
) -> anyhow::Result<(LocalCluster, tokio::task::JoinHandle<()>)> {
    let server = Server::bind(opts).await?;
    let stop = CancellationToken::new();
    let cluster = LocalCluster {
        users_addr: server.users_addr(),
        nodes_addr: server.nodes_addr(),
        stop: stop.clone(),
        status: server.status_handle(),
    };
    let mut node = node;
    node.server = cluster.nodes_addr.to_string();
    let handle = tokio::spawn({
        let stop = stop.clone();
        async move {
            if nodes > 0 {
                tokio::spawn(corefarm_node::run_many(node, nodes, stop.clone()));
            }
            server.run(stop).await;
        }
    });
    Ok((cluster, handle))
}

pub fn run_local(args: LocalArgs) -> anyhow::Result<()> {
    let node = args.node.options()?;
    runtime()?.block_on(async {
        let opts = args.tuning.options(args.nodes_listen, args.users_listen);
        let (cluster, handle) = start_local(args.nodes, opts, node).await?;
        let metrics = serve_metrics(
            args.metrics_listen.as_deref(),
            cluster.status.clone(),
            &cluster.stop,
        )
        .await?;
        // First line: what a person needs; second: what scripts parse
        // (the same line as `corefarm server`).
        println!(
            "corefarm local: users connect to {} ({} simulated node{})",
            connect_hint(cluster.users_addr),
            args.nodes,
            if args.nodes == 1 { "" } else { "s" }
        );
        println!(
            "listening nodes={} users={}{}",
            cluster.nodes_addr,
            cluster.users_addr,
            metrics_field(metrics)
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
        stop_on_signal(&cluster.stop);
        let _ = handle.await;
        Ok(())
    })
}

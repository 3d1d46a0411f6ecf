//! `corefarm local`: a server and simulated nodes in one process.

use clap::Args;
use corefarm_node::NodeOptions;
use corefarm_server::{Server, ServerOptions};
use tokio_util::sync::CancellationToken;

use crate::cmd_node::NodeTuning;
use crate::cmd_server::{
    metrics_field, parse_timeout, runtime, serve_metrics, stop_on_signal, ServerTuning,
};

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
    /// Node name prefix (nodes are named `<name>-<i>`).
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
    /// Bytes per chunk a message is cut into for streaming handlers
    /// (docs/streams.md); at most 65 472.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..=65472))]
    pub spin_chunk_size: u32,
    /// Payload handlers of one message running at once (streaming handlers).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub spin_threads: u32,
    /// Handler worker processes per handler-carrying configuration, so
    /// that many messages run their streaming handlers at once (each
    /// worker runs one message at a time, so a crash fails only its
    /// message; all share the handler sets' memory). Default: 2, or 1 on a
    /// one-CPU machine.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub handler_workers: Option<u32>,
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
        let spin_chunk_size = self.spin_chunk_size.to_string();
        let spin_threads = self.spin_threads.to_string();
        let handler_workers = self.handler_workers.map(|n| n.to_string());
        let mut args = vec![
            "local",
            "--name",
            &self.name,
            "--memory-limit",
            &memory_limit,
            "--backends",
            &backends,
            "--core-timeout",
            &core_timeout,
            "--spin-chunk-size",
            &spin_chunk_size,
            "--spin-threads",
            &spin_threads,
        ];
        if let Some(n) = &handler_workers {
            args.extend(["--handler-workers", n]);
        }
        let tuning = Defaults::try_parse_from(args)?;
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

/// An embedded cluster: a server and `nodes` node managers in this process.
pub struct LocalCluster {
    pub users_addr: std::net::SocketAddr,
    pub nodes_addr: std::net::SocketAddr,
    pub stop: CancellationToken,
    pub status: corefarm_server::StatusHandle,
}

/// How long a stopping embedded cluster's nodes may take to end their sessions.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// An embedded cluster on a runtime of its own, for the commands that
/// measure on one while their own code blocks (`bench sharing`, `hol`,
/// `collectives`, `classes`). Dropping it stops the server and waits
/// (bounded) for the nodes to end their sessions before the runtime goes.
pub struct EmbeddedCluster {
    pub cluster: LocalCluster,
    rt: Option<tokio::runtime::Runtime>,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl EmbeddedCluster {
    /// Starts it; returns once every node has joined.
    pub fn start(nodes: usize, opts: ServerOptions, node: NodeOptions) -> anyhow::Result<Self> {
        let rt = runtime()?;
        let (cluster, handle) = rt.block_on(start_local(nodes, opts, node))?;
        let embedded = EmbeddedCluster {
            cluster,
            rt: Some(rt),
            handle: Some(handle),
        };
        // A measurement on fewer nodes than asked would be wrong, not slow.
        let joined = embedded.cluster.status.get().nodes.len();
        anyhow::ensure!(
            joined >= nodes,
            "only {joined} of {nodes} embedded node(s) joined within 30 s"
        );
        Ok(embedded)
    }
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        self.cluster.stop.cancel();
        if let (Some(rt), Some(handle)) = (self.rt.take(), self.handle.take()) {
            // The timer is made inside the runtime: it needs its time driver.
            rt.block_on(async move {
                let _ = tokio::time::timeout(SHUTDOWN_GRACE * 2, handle).await;
            });
            rt.shutdown_timeout(SHUTDOWN_GRACE);
        }
    }
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
            let nodes = (nodes > 0)
                .then(|| tokio::spawn(corefarm_node::run_many(node, nodes, stop.clone())));
            server.run(stop).await;
            // The nodes end their sessions on the same token: whoever waits
            // for this task waits for them too (bounded), so dropping the
            // runtime afterwards does not cut a session off midway.
            if let Some(n) = nodes {
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, n).await;
            }
        }
    });
    wait_for_nodes(&cluster, nodes).await;
    Ok((cluster, handle))
}

/// Until every node has joined (said hello and been answered), so that a
/// user who connects as soon as the address is printed finds them all free.
/// Bounded: a node that cannot start is the node's error to report.
async fn wait_for_nodes(cluster: &LocalCluster, nodes: usize) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while cluster.status.get().nodes.len() < nodes {
        if tokio::time::Instant::now() > deadline {
            tracing::warn!(
                "{} of {nodes} node(s) joined within 30 s; going on",
                cluster.status.get().nodes.len()
            );
            return;
        }
        // The join is quick (one hello round trip); the poll is short.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
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

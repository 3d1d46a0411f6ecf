//! `corefarm local`: a server and simulated nodes in one process.

use clap::Args;
use corefarm_bench::cluster::start_local;
use corefarm_node::NodeOptions;

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

//! The embedded cluster: a server and `--nodes` node managers in this
//! process on OS-assigned loopback ports, one user connected to it.

use std::time::Duration;

use anyhow::{Context, Result};
use corefarm_client::{Client, ClientOptions};
use corefarm_node::NodeOptions;
use corefarm_server::ServerOptions;
use corefarm_smp::Configuration;

use super::stream::{stream, StreamSpec, Streamed};
use super::Target;

pub struct ClusterSpec {
    pub target: Target,
    pub family: corefarm_cores::image::Family,
    pub nodes: u32,
    pub cores: u32,
}

/// Starts the cluster, configures its nodes with `cfg`, streams the
/// workload through it and stops it again (also when streaming failed).
pub fn run(
    c: &ClusterSpec,
    cfg: &Configuration,
    s: &StreamSpec,
    say: &dyn Fn(&str),
) -> Result<Streamed> {
    let rt = crate::cmd_server::runtime()?;
    let server = ServerOptions {
        nodes_listen: "127.0.0.1:0".into(),
        users_listen: "127.0.0.1:0".into(),
        // Enough credit per node to keep every core busy with one queued behind it.
        credit: (2 * c.cores).max(4),
        ..ServerOptions::default()
    };
    // Nodes restricted to the demo's backend, so the run measures that one.
    let node = NodeOptions {
        name: "demo-node".into(),
        reconnect: false,
        // Cores in worker processes, as `corefarm node` runs them.
        load: c
            .target
            .load_options(c.family, corefarm_cores::Isolation::Process),
        ..NodeOptions::default()
    };
    let (cluster, handle) = rt.block_on(corefarm_bench::cluster::start_local(
        c.nodes as usize,
        server,
        node,
    ))?;
    say(&format!(
        "local cluster on {} with {} node(s); seed {}",
        cluster.users_addr, c.nodes, s.seed
    ));
    let streamed = (|| -> Result<Streamed> {
        let client = Client::connect(
            &cluster.users_addr.to_string(),
            ClientOptions {
                name: Some("corefarm-demo".into()),
                nodes: Some(c.nodes),
                io_timeout: Some(s.timeout),
                ..ClientOptions::default()
            },
        )?;
        if let Some(n) = client.nodes() {
            anyhow::ensure!(
                n == c.nodes,
                "the server assigned {n} of {} node(s)",
                c.nodes
            );
        }
        client.configure(cfg).context("configuring the cluster")?;
        stream(client, s)
    })();
    cluster.stop.cancel();
    rt.block_on(async {
        let _ = tokio::time::timeout(Duration::from_secs(5), handle).await;
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    streamed
}

//! An embedded cluster: a server and simulated node managers in this
//! process, for the benchmarks that measure on one (`sharing`, `hol`,
//! `collectives`, `classes`), the demo and `corefarm local`.

use corefarm_node::NodeOptions;
use corefarm_server::{Server, ServerOptions};
use tokio_util::sync::CancellationToken;

/// A server and `nodes` node managers running on the caller's runtime.
pub struct LocalCluster {
    pub users_addr: std::net::SocketAddr,
    pub nodes_addr: std::net::SocketAddr,
    pub stop: CancellationToken,
    pub status: corefarm_server::StatusHandle,
}

/// How long a stopping embedded cluster's nodes may take to end their sessions.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// An embedded cluster on a runtime of its own, for the callers that
/// measure on one while their own code blocks. Dropping it stops the server
/// and waits (bounded) for the nodes to end their sessions before the
/// runtime goes.
pub struct EmbeddedCluster {
    pub cluster: LocalCluster,
    rt: Option<tokio::runtime::Runtime>,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl EmbeddedCluster {
    /// Starts it; returns once every node has joined.
    pub fn start(nodes: usize, opts: ServerOptions, node: NodeOptions) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
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

    /// Where users connect, as `host:port`.
    pub fn users_addr(&self) -> String {
        self.cluster.users_addr.to_string()
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

/// Binds the server, starts `nodes` node managers against it on the current
/// runtime and returns once they have joined (or 30 s have passed); the
/// handle ends when `stop` is cancelled and the nodes have ended (bounded).
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

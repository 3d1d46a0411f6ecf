//! `corefarm bench hol`'s arguments: head-of-line blocking on one user
//! link ([`corefarm_bench::hol`]). One JSON object on stdout.

use anyhow::Result;
use clap::Args;
use corefarm_bench::hol::{self, EmbeddedSpec, HolOptions};

#[derive(Args)]
pub struct HolArgs {
    /// The server's user port; without it, an embedded cluster of
    /// `--nodes` nodes in this process.
    #[arg(long)]
    server: Option<String>,
    /// Nodes of the embedded cluster.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Bytes per input; a small message is one input.
    #[arg(long, default_value_t = 4096)]
    input_size: u32,
    /// Bytes per output of the benchmarking core (at least 16).
    #[arg(long, default_value_t = 16)]
    output_size: u32,
    /// Bulk message sizes in MiB, cycled (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    bulk_mib: Vec<usize>,
    /// Bulk messages in flight.
    #[arg(long, default_value_t = 2)]
    bulk_window: usize,
    /// Cap on the bulk stream's average rate, MB/s (default: uncapped).
    /// Each bulk message still goes at full speed; the cap spaces them.
    #[arg(long)]
    bulk_mbps: Option<f64>,
    /// Small messages per second.
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// Small messages measured per run.
    #[arg(long, default_value_t = 500)]
    samples: usize,
    /// Chunk size to ask for, bytes (default: the protocol's, 128 KiB).
    #[arg(long)]
    chunk_size: Option<u32>,
    /// EmbeddedSpec cluster: the server's chunk size on its node links (0: whole
    /// frames there, so the `unchunked` run is unchunked end to end).
    #[arg(long, default_value_t = corefarm_server::defaults::NODE_CHUNK_SIZE)]
    node_chunk_size: u32,
}

pub fn run(a: HolArgs) -> Result<()> {
    let o = HolOptions {
        input_size: a.input_size,
        output_size: a.output_size,
        bulk_sizes: a.bulk_mib.iter().map(|m| m << 20).collect(),
        bulk_window: a.bulk_window,
        bulk_rate: a.bulk_mbps.map(|m| m * 1e6),
        rate: a.rate,
        samples: a.samples,
        chunk_size: a.chunk_size,
        ..HolOptions::default()
    };
    let embedded = EmbeddedSpec {
        nodes: a.nodes,
        node_chunk_size: a.node_chunk_size,
    };
    let report = hol::run_on(&o, a.server, embedded)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

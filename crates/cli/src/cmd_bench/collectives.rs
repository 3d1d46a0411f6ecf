//! `corefarm bench collectives`'s arguments: latency of a group's
//! collectives beside the model ([`corefarm_bench::collectives`]). The grid
//! is also `corefarm model calibrate`'s.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use corefarm_bench::collectives::{self, Grid};
use corefarm_model::collectives::{Algo, Op};

use crate::flags::FlagError;

/// A size in bytes: a number with an optional K/M/G suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, FlagError> {
    let t = s.trim().trim_end_matches("iB").trim_end_matches('B');
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let v: u64 = num.parse().map_err(|_| FlagError::Size(s.to_string()))?;
    v.checked_mul(mul)
        .filter(|&b| b <= 1 << 30)
        .ok_or_else(|| FlagError::SizeTooLarge(s.to_string()))
}

/// What to measure and how long.
#[derive(Args)]
pub struct GridArgs {
    /// A running cluster's user port; default: an embedded cluster on
    /// loopback with as many nodes as the largest group.
    #[arg(long)]
    pub server: Option<String>,
    /// Group sizes (node count), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16")]
    pub nodes: Vec<u32>,
    /// Bytes per rank, comma-separated (suffixes K, M); whole int32 elements.
    #[arg(long, value_delimiter = ',', value_parser = parse_size,
          default_value = "8,32,128,512,2K,8K,32K,128K,512K,2M,4M")]
    pub sizes: Vec<u64>,
    /// bcast, reduce, allreduce, allgather, barrier (among the nodes);
    /// scatter, gather (the user's, through the server).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bcast,reduce,allreduce,allgather,barrier,scatter,gather"
    )]
    pub ops: Vec<Op>,
    /// Trees, comma-separated: linear, binomial, star.
    #[arg(long, value_delimiter = ',', default_value = "linear,binomial,star")]
    pub algos: Vec<Algo>,
    /// Untimed calls before each point.
    #[arg(long, default_value_t = 3)]
    pub warmup: u32,
    /// Fewest timed calls per point.
    #[arg(long, default_value_t = 5)]
    pub min_iters: u32,
    /// Most timed calls per point.
    #[arg(long, default_value_t = 100)]
    pub iters: u32,
    /// Seconds of timed calls per point, within the two bounds above.
    #[arg(long, default_value_t = 0.3)]
    pub budget: f64,
    /// TLS to --server's user port.
    #[command(flatten)]
    pub tls: crate::cmd_tls::ClientTlsArgs,
}

impl GridArgs {
    /// The grid, with the TLS settings loaded (a CA file that cannot be
    /// read is an error here).
    fn grid(self) -> Result<Grid> {
        Ok(Grid {
            tls: self.tls.load()?,
            server: self.server,
            nodes: self.nodes,
            sizes: self.sizes,
            ops: self.ops,
            algos: self.algos,
            warmup: self.warmup,
            min_iters: self.min_iters,
            iters: self.iters,
            budget: self.budget,
        })
    }
}

#[derive(Args)]
pub struct CollectivesArgs {
    #[command(flatten)]
    grid: GridArgs,
    /// Calibration to predict with (default: `corefarm model calibrate`'s
    /// default file); without one, the model is fitted to this run.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Write the JSON report here instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress lines on standard error.
    #[arg(long)]
    quiet: bool,
}

pub fn run(a: CollectivesArgs) -> Result<()> {
    let report = collectives::run(&a.grid.grid()?, a.model.as_deref(), a.quiet)?;
    let text = serde_json::to_string_pretty(&report)?;
    match &a.out {
        Some(p) => {
            std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))
        }
        None => {
            println!("{text}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_size("1KB").unwrap(), 1024);
        assert!(matches!(parse_size("x"), Err(FlagError::Size(s)) if s == "x"));
        assert!(matches!(parse_size("2G"), Err(FlagError::SizeTooLarge(s)) if s == "2G"));
    }
}

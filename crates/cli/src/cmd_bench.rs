//! `corefarm bench …` (owned by the benchmarks work).

#[derive(clap::Subcommand)]
pub enum BenchCmd {}

pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {}
}

//! `corefarm image …` (owned by the hardware-cores work).

#[derive(clap::Subcommand)]
pub enum ImageCmd {}

pub fn run(cmd: ImageCmd) -> anyhow::Result<()> {
    match cmd {}
}

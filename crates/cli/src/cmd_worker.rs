//! `corefarm __core-worker` (hidden): the process a node starts for each
//! isolated hardware core (corefarm_cores::worker). It is started by the
//! node with its descriptors in place, never by hand.

use clap::Args;

#[derive(Args)]
pub struct WorkerArgs {}

pub fn run(_: WorkerArgs) -> ! {
    corefarm_cores::worker::main()
}

//! corefarm benchmarks (seed 000 chapter 4 and the experiments of seeds
//! 001 and 002). The `corefarm bench` command parses arguments and calls
//! in here; every measurement and its report is this crate's.
//!
//! - [`echo`]: the SMP echo server and clients of §4.2.1 (networking ceiling).
//! - [`user`]: the benchmarking user of §4.2.2, driving a real server with the
//!   benchmarking configuration and measuring throughput and latency.
//! - [`node`]: the isolated node-manager benchmark of §4.2.3: the benchmark
//!   is the node's server and streams data straight to one `corefarm node`.
//! - [`sharing`]: shared nodes (seed 002 §5.5): concurrent applications
//!   calling random functions; makespan and utilisation per variant.
//! - [`collectives`]: latency of a group's collectives against size, group
//!   and tree, beside the calibrated model's prediction.
//! - [`direct`]: throughput of a group's direct data path (no data through
//!   the server), with the server's CPU.
//! - [`hol`]: head-of-line blocking of small messages behind bulk ones on
//!   one user link, unchunked against chunked with priority classes.
//! - [`irq`]: a core's completion by interrupt against polling: the
//!   node's CPU per job on a fake Zynq board.
//! - [`classes`]: priority classes against the queueing model (seed 001 §IV).
//! - [`soak`]: hours of load on real processes with nodes killed, users
//!   coming and going and bad peers; checks exactly-once and flat memory.
//! - [`scale`]: the server at thousands of simulated nodes (memory, CPU,
//!   fan-out, status and metrics per node) and the shared scheduler against
//!   node and function counts.
//! - [`compare`]: compares two suite result files point by point.
//! - [`suite`]: the sweep over the seeds' parameter spaces, `bench/suite.py`
//!   (it runs the `corefarm` binary as separate processes).
//! - [`cluster`]: a server and node managers in this process, to measure on.
//! - [`cpu`]: CPU time of another process (the server) over a measurement window.
//! - [`stats`]: latency histogram, throughput and spread arithmetic shared by all.

pub mod classes;
pub mod cluster;
pub mod collectives;
pub mod compare;
pub mod cpu;
pub mod direct;
pub mod echo;
pub mod hol;
pub mod irq;
pub mod node;
pub mod scale;
pub mod sharing;
pub mod soak;
pub mod stats;
pub mod suite;
pub mod user;

/// Monotonic nanoseconds since a process-wide epoch. Both the sending and the
/// receiving loop of a benchmark read this clock, so a timestamp written into
/// an input by one thread can be subtracted from "now" in another.
pub fn now_ns() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    epoch.elapsed().as_nanos() as u64
}

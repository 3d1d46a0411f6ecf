//! corefarm benchmarks (seed 000 chapter 4).
//!
//! - [`echo`]: the SMP echo server and clients of §4.2.1 (networking ceiling).
//! - [`user`]: the benchmarking user of §4.2.2, driving a real server with the
//!   benchmarking configuration and measuring throughput and latency.
//! - [`hol`]: head-of-line blocking of small messages behind bulk ones on
//!   one user link, unchunked against chunked with priority classes.
//! - [`node`]: the isolated node-manager benchmark of §4.2.3: the benchmark
//!   is the node's server and streams data straight to one `corefarm node`.
//! - [`compare`]: compares two suite result files point by point.
//! - [`cpu`]: CPU time of another process (the server) over a measurement window.
//! - [`soak`]: hours of load on real processes with nodes killed, users
//!   coming and going and bad peers; checks exactly-once and flat memory.
//! - [`stats`]: latency histogram, throughput and spread arithmetic shared by all.
//!
//! The suite that sweeps these over the seed's parameter spaces lives in
//! `bench/suite.py` (it runs the `corefarm` binary as separate processes).

pub mod compare;
pub mod cpu;
pub mod echo;
pub mod hol;
pub mod node;
pub mod soak;
pub mod stats;
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

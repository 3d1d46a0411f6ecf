//! Analytical performance models, each a plain function of measured
//! parameters so that the client, the benchmarks and the documentation use
//! the same arithmetic.
//!
//! - [`partition`]: how much of a workload to send to accelerators (the
//!   cluster) and how much to keep on the local CPU — seed 002 §4.4,
//!   equations 4.1–4.8, used by the client's CPU/cluster co-working.
//! - [`control`]: the server as a control plane: its memory and CPU per
//!   node, user and event, and when one server saturates.
//! - [`queueing`]: M/M/1 per hop and non-preemptive priority classes
//!   (seed 001 §IV; Cobham's formula), per-class buffer depths.
//!
//! Units throughout: throughputs in items per second, times in seconds,
//! workload sizes in items (an item is one unit of work both sides can
//! process: for corefarm, one data message).

pub mod collectives;
pub mod control;
pub mod error;
pub mod lsq;
pub mod partition;
pub mod queueing;

pub use error::ModelError;
pub use partition::Partition;

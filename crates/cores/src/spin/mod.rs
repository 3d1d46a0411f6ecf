//! Streaming handlers (seed 004, the sPIN model as FPsPIN builds it):
//! user code that runs on a data message chunk by chunk as it arrives,
//! selected by matching rules, instead of (or before) the hardware cores.
//!
//! - [`rules`]: FPsPIN's matching rules and rulesets.
//! - [`engine`]: head/payload/tail scheduling on a bounded pool, per-message
//!   scratchpads, shared memory and counters, budgets, outcomes.
//! - [`native`]: handler sets in C (`include/corefarm/spin.h`).
//!
//! Handlers run in the calling process here; running them in the cores'
//! worker process (so a crashing or looping handler takes down only its
//! message) and feeding them from chunked frames are the node's part.

pub mod engine;
pub mod native;
pub mod rules;

pub use engine::{
    Budgets, Context, ContextMemory, Engine, Finished, Handlers, Message, Outcome, Pool, Stage,
};
pub use native::NativeHandlers;
pub use rules::{Mode, Rule, Ruleset};

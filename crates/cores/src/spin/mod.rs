//! Streaming handlers (seed 004, the sPIN model as FPsPIN builds it):
//! user code that runs on a data message chunk by chunk as it arrives,
//! selected by matching rules, instead of (or before) the hardware cores.
//!
//! - [`rules`]: FPsPIN's matching rules and rulesets.
//! - [`engine`]: head/payload/tail scheduling on a bounded pool, per-message
//!   scratchpads, shared memory and counters, budgets, outcomes.
//! - [`memory`]: scratchpads, shared memory and counters (on the heap,
//!   or in the mapping a node's handler workers share).
//! - [`native`]: handler sets in C (`include/corefarm/spin.h`).
//! - [`manifest`]: handler sets as images declare them.
//!
//! The engine runs handlers in the calling process; a node runs it inside
//! a handler worker process (`crate::worker::HandlerWorker`), so that a
//! crashing or looping handler takes down only its message.

pub mod engine;
pub mod manifest;
pub mod memory;
pub mod native;
pub mod rules;

pub use engine::{
    Budgets, Context, ContextMemory, Engine, Finished, Handlers, Message, Outcome, Pool, Stage,
};
pub use manifest::{BudgetSpec, HandlerSet, ResultTypes};
pub use native::NativeHandlers;
pub use rules::{Mode, Rule, Ruleset};

/// The handler sets of a configuration, started in a handler worker
/// process: `None` when the configuration carries none (a raw bitstream,
/// or an image without `handler_sets`). Call after [`crate::load`]
/// accepted the configuration (it checks the signature against the
/// node's trusted keys). `threads`: payload handlers running at once.
#[cfg(target_os = "linux")]
pub fn load_handlers(
    cfg: &corefarm_smp::Configuration,
    opts: &crate::LoadOptions,
    threads: usize,
) -> Result<Option<crate::worker::HandlerWorker>, crate::LoadError> {
    use crate::image::{self, Image};
    use crate::LoadError;
    if !image::is_image(&cfg.bitstream) {
        return Ok(None);
    }
    let img = Image::parse(cfg.bitstream.clone()).map_err(|e| LoadError::Invalid(e.to_string()))?;
    let m = &img.manifest;
    if m.handler_sets.is_empty() {
        return Ok(None);
    }
    // Also checked by `crate::load`; a node with its own loader relies on this.
    if !opts.trust.is_empty() {
        opts.trust.check(&img)?;
    }
    let Some(target) = manifest::spin_target() else {
        return Err(LoadError::Unsupported(
            "handler sets need Linux on x86_64, aarch64 or armv7".into(),
        ));
    };
    let Some(idx) = img.find(&target) else {
        return Err(LoadError::Unsupported(format!(
            "image {:?} has {} handler sets but no {target} artifact for this machine (it carries {:?})",
            m.name,
            m.handler_sets.len(),
            img.targets()
        )));
    };
    let so = img
        .verified_artifact(idx)
        .map_err(|e| LoadError::Invalid(e.to_string()))?;
    crate::worker::HandlerWorker::start(&so, m.handler_sets.clone(), threads, opts).map(Some)
}

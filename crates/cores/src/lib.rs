//! Hardware cores behind one interface (work in progress: see issue 3).
//!
//! The node manager only sees [`Core`]: give it one input, get one output.
//! Backends (native soft cores, RTL simulation, FPGA) implement it.

pub mod toolchain;

use corefarm_smp::Configuration;

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("{0}")]
    Failed(String),
    #[error("core timed out after {0:?}")]
    Timeout(std::time::Duration),
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Invalid(String),
}

/// One hardware core instance, driven by exactly one core handler thread.
pub trait Core: Send {
    /// Processes one input (`input_size` bytes) into one output (`output_size` bytes).
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError>;
}

/// Node-side options that decide which backends may load and how.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {}

/// The cores a configuration instantiates on this node.
pub struct Loaded {
    pub cores: Vec<Box<dyn Core>>,
    /// Human-readable description for logs ("2 × native mat_mul_64x64").
    pub description: String,
}

/// Configuration targets this node can run.
pub fn supported_targets(_opts: &LoadOptions) -> Vec<String> {
    Vec::new()
}

/// Instantiates the cores of a (non-benchmark) configuration.
pub fn load(_cfg: &Configuration, _opts: &LoadOptions) -> Result<Loaded, LoadError> {
    Err(LoadError::Unsupported(
        "no hardware-core backend is built in yet".into(),
    ))
}

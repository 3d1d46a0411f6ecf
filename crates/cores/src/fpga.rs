//! Cyclone V SoC FPGA backend (in progress).

use corefarm_smp::Configuration;

use crate::{DriverOptions, LoadError, Loaded};

/// How to program the FPGA and where its bridge is.
#[derive(Debug, Clone, Default)]
pub struct FpgaOptions {}

pub(crate) fn load(
    _opts: &FpgaOptions,
    _cfg: &Configuration,
    _bitstream: &[u8],
    _name: &str,
    _driver: DriverOptions,
) -> Result<Loaded, LoadError> {
    Err(LoadError::Unsupported(
        "the FPGA backend is not built in yet".into(),
    ))
}

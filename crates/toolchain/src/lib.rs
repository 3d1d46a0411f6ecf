//! Building hardware cores for the CPU and packing them into configuration
//! images: HLS C/C++ sources compiled natively (native soft-core ABI) and
//! Verilog simulated by Verilator (RTL simulation ABI), both as shared
//! objects, plus the image writer. See docs/interfaces.md for both ABIs and
//! cores/README.md for the Verilog port list.
//!
//! This is the build side only; nodes run images with `corefarm-cores`
//! (which reads and verifies images but never compiles anything), so a node
//! manager or the Python extension does not carry this driver.
//!
//! Everything the builds need from this repository (`corefarm/hls.h`, the
//! RTL wrapper) is embedded, so the functions work from any working
//! directory and from an installed binary. Only the external tools are
//! required: a C/C++ compiler (`$CXX`/`$CC`, default `c++`/`cc`) and, for
//! RTL, Verilator (`$VERILATOR`, default `verilator`) plus `make`.

mod builder;
mod cache;
mod hls;
pub mod hls_probe;
pub mod rtl_probe;
pub mod sign;
mod sizes;
mod spin;
mod tools;
mod verilator;
pub mod vitis;

pub use builder::{
    build_image, build_native_image, merge_images, BuildError, BuildSpec, Built, ImageBuilder,
};
pub use cache::{cache_key, cached_build, default_cache_dir, BuildKind};
pub use hls::{build_native, build_native_for, ARCHES, HLS_HEADER};
pub use sizes::SizeError;
pub use spin::{build_handlers_for, SPIN_HEADER};
pub use tools::{
    check_cxx, check_verilator, cxx_available, require_tool, verilator_available, Tool,
    ToolchainError,
};
pub use verilator::{
    build_rtl, build_rtl_with, verilator_root, RtlBuild, RtlOptions, RTL_AXI_LIBRARY,
    RTL_AXI_WRAPPER, RTL_CSR, RTL_WRAPPER,
};

#[cfg(test)]
pub(crate) mod test_util {
    use std::path::{Path, PathBuf};

    pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

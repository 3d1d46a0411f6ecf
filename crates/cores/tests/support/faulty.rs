//! The faulty core (`cores/faulty/faulty.cpp`: fault chosen by the first
//! input byte, output = input ^ 0x5A) built once (cached in the target dir) and
//! loaded in isolated workers: the set-up the isolation tests share.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use corefarm_cores::image::{self, ArtifactKind};
use corefarm_cores::{load, DriverOptions, LoadOptions, Loaded, WorkerCommand};
use corefarm_smp::Configuration;
use corefarm_toolchain::{self as toolchain, require_tool, BuildKind, ImageBuilder, Tool};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("isolation-cache")
}

/// Isolated workers (the test binary's own worker program) with a job
/// timeout of `timeout_ms`.
pub fn opts(timeout_ms: u64) -> LoadOptions {
    LoadOptions {
        driver: DriverOptions {
            timeout: Duration::from_millis(timeout_ms),
            poll: Duration::from_millis(1),
        },
        worker: WorkerCommand::Program(env!("CARGO_BIN_EXE_corefarm-core-worker").into()),
        ..LoadOptions::default()
    }
}

/// The faulty core in an image of `cores` cores with the given sizes;
/// `None` when the C++ compiler is missing (a failure under
/// `COREFARM_REQUIRE_TOOLS=1`, as the test suite runs).
pub fn faulty_image(test: &str, cores: u32, input: u32, output: u32) -> Option<Vec<u8>> {
    if !require_tool(Tool::Cxx, test) {
        return None;
    }
    let src = repo().join("cores/faulty/faulty.cpp");
    Some(native_image(&src, "faulty", cores, input, output))
}

/// An image of `cores` cores running `entry` of the native source `src`
/// (built once per cache), with the given sizes.
pub fn native_image(src: &Path, entry: &str, cores: u32, input: u32, output: u32) -> Vec<u8> {
    let so =
        toolchain::cached_build(&BuildKind::Native, &[src.to_path_buf()], "", &cache()).unwrap();
    let table = image::default_core_table(cores, input, output).unwrap();
    let target = image::native_target().unwrap();
    let so = std::fs::read(so).unwrap();
    ImageBuilder::new(entry, input, output, table)
        .artifact(target, ArtifactKind::Native, entry, so)
        .build()
        .unwrap()
}

/// [`native_image`] of the C source text `c` (written to a file of its
/// own) as a configuration; `None` when the compiler is missing (a failure
/// under `COREFARM_REQUIRE_TOOLS=1`, as the test suite runs).
pub fn c_configuration(
    test: &str,
    c: &str,
    entry: &str,
    cores: u32,
    size: u32,
) -> Option<Configuration> {
    if !require_tool(Tool::Cxx, test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join(format!("{entry}.c"));
    std::fs::write(&src, c).unwrap();
    let img = native_image(&src, entry, cores, size, size);
    Some(image::configuration(Bytes::from(img)).unwrap())
}

/// One faulty core of 64-byte input and output, loaded isolated.
pub fn load_faulty(test: &str, timeout_ms: u64) -> Option<Loaded> {
    let img = faulty_image(test, 1, 64, 64)?;
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    Some(load(&cfg, &opts(timeout_ms)).unwrap())
}

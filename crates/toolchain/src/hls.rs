//! HLS C/C++ sources compiled for the CPU into native soft cores (the native
//! soft-core ABI of docs/interfaces.md).

use std::path::Path;
use std::process::Command;

use crate::tools::{self, io_err, ToolchainError, CXX_HINT};

/// `include/corefarm/hls.h`, written next to native builds.
pub const HLS_HEADER: &str = include_str!("../../../include/corefarm/hls.h");

/// Compiles one HLS C/C++ source (`.c` with `$CC`, anything else with
/// `$CXX`) into a native soft core: a shared object at `out` exporting the
/// component function with C linkage (docs/interfaces.md).
pub fn build_native(source: &Path, out: &Path) -> Result<(), ToolchainError> {
    tools::check_source(source)?;
    let is_c = source.extension().is_some_and(|e| e == "c");
    let program = if is_c {
        tools::cc_program()
    } else {
        tools::cxx_program()
    };
    tools::require(&program, CXX_HINT)?;

    let dir = tools::build_dir()?;
    let include = dir.path().join("include");
    std::fs::create_dir_all(include.join("corefarm"))
        .map_err(io_err("creating the include directory"))?;
    std::fs::write(include.join("corefarm").join("hls.h"), HLS_HEADER)
        .map_err(io_err("writing corefarm/hls.h"))?;
    let so = dir.path().join("core.so");
    let mut cmd = Command::new(&program);
    // -fwrapv: HLS sources such as the seed's matrix multiplier rely on
    // two's-complement wrap-around, which is what the hardware does.
    cmd.args(["-O3", "-shared", "-fPIC", "-fwrapv"])
        .arg(format!("-I{}", include.display()))
        .arg(source)
        .arg("-o")
        .arg(&so);
    tools::run(&program, &mut cmd)?;
    tools::install(&so, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::write;
    use crate::{require_tool, Tool};
    use corefarm_cores::native::{NativeCore, NativeLib};
    use corefarm_cores::Core;

    const NATIVE_SRC: &str = r#"
#include "corefarm/hls.h"
hls_avalon_agent_component
component void twice(hls_avalon_agent_memory_argument(4) uint8_t *in,
                     hls_avalon_agent_memory_argument(4) uint8_t *out) {
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(in[i] * 2 + 1);
}
"#;

    #[test]
    fn native_core_builds_and_runs() {
        if !require_tool(Tool::Cxx, "native_core_builds_and_runs") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // .c goes through the C compiler, .cpp through C++: both must export
        // the plain symbol.
        for name in ["twice.cpp", "twice.c"] {
            let src = write(dir.path(), name, NATIVE_SRC);
            let so = dir.path().join(format!("{name}.so"));
            build_native(&src, &so).unwrap();
            let mut core = NativeCore::new(NativeLib::open(&so, "twice").unwrap(), 4, 4);
            let mut out = [0u8; 4];
            core.process(&[1, 2, 200, 255], &mut out).unwrap();
            assert_eq!(out, [3, 5, 145, 255], "{name}");
        }
    }

    #[test]
    fn native_compile_error_carries_stderr() {
        if !require_tool(Tool::Cxx, "native_compile_error_carries_stderr") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let src = write(
            dir.path(),
            "bad.cpp",
            "component void f( { this_is_not_cpp }\n",
        );
        let err = build_native(&src, &dir.path().join("bad.so")).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ToolchainError::Failed { .. }), "{text}");
        assert!(text.contains("bad.cpp"), "stderr missing from: {text}");
        assert!(!dir.path().join("bad.so").exists());
    }

    #[test]
    fn missing_source_is_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let err = build_native(&dir.path().join("nope.cpp"), &dir.path().join("x.so")).unwrap_err();
        assert!(matches!(err, ToolchainError::Invalid(_)), "{err}");
    }
}

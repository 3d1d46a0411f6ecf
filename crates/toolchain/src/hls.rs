//! HLS C/C++ sources compiled for the CPU into native soft cores (the native
//! soft-core ABI of docs/interfaces.md).

use std::path::Path;

use crate::tools::{self, ToolchainError, CXX_HINT};

/// `include/corefarm/hls.h`, written next to native builds.
pub const HLS_HEADER: &str = include_str!("../../../include/corefarm/hls.h");

/// Architectures a native artifact can be built for, as named in targets
/// (`native-<arch>-linux`), with the GNU triple of Debian's cross compilers.
pub const ARCHES: &[(&str, &str)] = &[
    ("x86_64", "x86_64-linux-gnu"),
    // The Cyclone V HPS of seed 000 (Cortex-A9): Debian's armhf ABI.
    ("armv7", "arm-linux-gnueabihf"),
    ("aarch64", "aarch64-linux-gnu"),
];

/// Compiles one HLS C/C++ source (`.c` with `$CC`, anything else with
/// `$CXX`) into a native soft core: a shared object at `out` exporting the
/// component function with C linkage (docs/interfaces.md).
pub fn build_native(source: &Path, out: &Path) -> Result<(), ToolchainError> {
    build_native_for(source, out, None)
}

/// The compiler for `arch` (`None` or this machine's: `$CC`/`$CXX`; another:
/// `$COREFARM_CC_<ARCH>`/`$COREFARM_CXX_<ARCH>`, else Debian's cross compiler
/// `<triple>-gcc`/`<triple>-g++`) and what to install when it is missing.
pub(crate) fn compiler(arch: Option<&str>, is_c: bool) -> Result<(String, String), ToolchainError> {
    let host = corefarm_cores::image::host_arch();
    let arch = match arch {
        None => return Ok((host_compiler(is_c), CXX_HINT.to_string())),
        Some(a) if Some(a) == host => return Ok((host_compiler(is_c), CXX_HINT.to_string())),
        Some(a) => a,
    };
    let Some((_, triple)) = ARCHES.iter().find(|(a, _)| *a == arch) else {
        let known: Vec<&str> = ARCHES.iter().map(|(a, _)| *a).collect();
        return Err(ToolchainError::Invalid(format!(
            "unknown architecture {arch:?}; known: {}",
            known.join(", ")
        )));
    };
    let var = format!(
        "COREFARM_{}_{}",
        if is_c { "CC" } else { "CXX" },
        arch.to_uppercase()
    );
    let program = std::env::var(&var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| format!("{triple}-{}", if is_c { "gcc" } else { "g++" }));
    let hint = format!(
        "install the cross compiler (e.g. `apt-get install -y g++-{}`) or set ${var}",
        triple.replace("x86_64", "x86-64")
    );
    Ok((program, hint))
}

fn host_compiler(is_c: bool) -> String {
    if is_c {
        tools::cc_program()
    } else {
        tools::cxx_program()
    }
}

/// [`build_native`] for another architecture (`native-<arch>-linux`
/// artifacts for boards whose CPUs are not this machine's, see [`ARCHES`]).
pub fn build_native_for(
    source: &Path,
    out: &Path,
    arch: Option<&str>,
) -> Result<(), ToolchainError> {
    tools::check_source(source)?;
    let is_c = source.extension().is_some_and(|e| e == "c");
    let (program, hint) = compiler(arch, is_c)?;
    tools::require(&program, &hint)?;

    // -fwrapv: HLS sources such as the seed's matrix multiplier rely on
    // two's-complement wrap-around, which is what the hardware does. -x:
    // a source named otherwise than .c/.cpp (`vadd.hls`) would be taken
    // for a linker input and fail with a linker error.
    let lang = if is_c { "c" } else { "c++" };
    tools::compile_shared(
        &program,
        ("hls.h", HLS_HEADER),
        &["-x", lang, "-O3", "-shared", "-fPIC", "-fwrapv"],
        &[source],
        out,
    )
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
        // .c goes through the C compiler, .cpp (and any other name) through
        // C++: all must export the plain symbol.
        for name in ["twice.cpp", "twice.c", "twice.hls"] {
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
    fn cross_compilers_are_named_and_explained() {
        let dir = tempfile::tempdir().unwrap();
        let src = write(dir.path(), "twice.cpp", NATIVE_SRC);
        let out = dir.path().join("x.so");
        let err = build_native_for(&src, &out, Some("sparc")).unwrap_err();
        assert!(err.to_string().contains("x86_64, armv7, aarch64"), "{err}");
        let (program, hint) = compiler(Some("aarch64"), false).unwrap();
        if corefarm_cores::image::host_arch() != Some("aarch64") {
            assert_eq!(program, "aarch64-linux-gnu-g++");
            assert!(hint.contains("g++-aarch64-linux-gnu"), "{hint}");
        }
        let (program, _) = compiler(Some("armv7"), true).unwrap();
        if corefarm_cores::image::host_arch() != Some("armv7") {
            assert_eq!(program, "arm-linux-gnueabihf-gcc");
        }
    }

    #[test]
    fn missing_source_is_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let err = build_native(&dir.path().join("nope.cpp"), &dir.path().join("x.so")).unwrap_err();
        assert!(matches!(err, ToolchainError::Invalid(_)), "{err}");
    }
}

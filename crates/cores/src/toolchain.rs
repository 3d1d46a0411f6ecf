//! Building hardware cores for the CPU: HLS C/C++ sources compiled natively
//! (native soft-core ABI) and Verilog simulated by Verilator (RTL simulation
//! ABI), both as shared objects. See docs/interfaces.md for both ABIs and
//! cores/README.md for the Verilog port list.
//!
//! Everything the builds need from this repository (`corefarm/hls.h`, the
//! RTL wrapper) is embedded, so the functions work from any working
//! directory and from an installed binary. Only the external tools are
//! required: a C/C++ compiler (`$CXX`/`$CC`, default `c++`/`cc`) and, for
//! RTL, Verilator (`$VERILATOR`, default `verilator`) plus `make`.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// `include/corefarm/hls.h`, written next to native builds.
pub const HLS_HEADER: &str = include_str!("../../../include/corefarm/hls.h");

/// `cores/rtl/cf_rtl_wrapper.cpp`: RTL ABI over the Verilated top module.
pub const RTL_WRAPPER: &str = include_str!("../../../cores/rtl/cf_rtl_wrapper.cpp");
/// The shared control/status register block (`cf_csr`), offered to every RTL
/// build as a Verilog library so cores instantiate it without listing it.
pub const RTL_CSR: &str = include_str!("../../../cores/rtl/cf_csr.v");

/// Bumped whenever flags or the build recipe change, so cached objects built
/// by an older recipe are not reused.
const RECIPE_VERSION: &str = "corefarm-toolchain-1";

/// Compile stderr kept in errors: the head of a compiler's output names the
/// first problem, but a runaway error list must not flood the logs.
const MAX_LOG: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ToolchainError {
    /// A required external program could not be started.
    #[error("{tool} is not available ({reason}); {hint}")]
    ToolMissing {
        tool: String,
        reason: String,
        hint: String,
    },
    /// A tool ran and failed; `output` is its stderr (and stdout).
    #[error("{tool} failed ({status}) running `{command}`:\n{output}")]
    Failed {
        tool: String,
        status: String,
        command: String,
        output: String,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid build request: {0}")]
    Invalid(String),
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ToolchainError {
    let context = context.into();
    move |source| ToolchainError::Io { context, source }
}

fn cxx_program() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

fn cc_program() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

fn verilator_program() -> String {
    std::env::var("VERILATOR").unwrap_or_else(|_| "verilator".into())
}

/// First line of `<program> --version`, or `None` if it cannot run.
fn tool_version(program: &str) -> Option<String> {
    let out = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Some(text.lines().next().unwrap_or("").trim().to_string())
}

/// True if the C++ compiler (`$CXX`, default `c++`) runs.
pub fn cxx_available() -> bool {
    tool_version(&cxx_program()).is_some()
}

/// True if Verilator, `make` and the C++ compiler all run (an RTL build
/// needs the three).
pub fn verilator_available() -> bool {
    tool_version(&verilator_program()).is_some()
        && tool_version("make").is_some()
        && cxx_available()
}

fn require(program: &str, hint: &str) -> Result<String, ToolchainError> {
    match Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string()),
        Ok(out) => Err(ToolchainError::ToolMissing {
            tool: program.into(),
            reason: format!("`{program} --version` exited with {}", out.status),
            hint: hint.into(),
        }),
        Err(e) => Err(ToolchainError::ToolMissing {
            tool: program.into(),
            reason: e.to_string(),
            hint: hint.into(),
        }),
    }
}

const CXX_HINT: &str = "install a C/C++ compiler (e.g. `apt-get install -y g++`) or set $CXX/$CC";
const VERILATOR_HINT: &str =
    "install Verilator 5 and make (e.g. `apt-get install -y verilator make`) or set $VERILATOR";

/// Runs `cmd`, turning a non-zero exit into [`ToolchainError::Failed`] that
/// carries the tool's output.
fn run(tool: &str, cmd: &mut Command) -> Result<(), ToolchainError> {
    let rendered = format!("{cmd:?}");
    // A parent make's jobserver settings would confuse Verilator's make.
    cmd.env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .stdin(Stdio::null());
    let out = cmd.output().map_err(|e| ToolchainError::ToolMissing {
        tool: tool.into(),
        reason: e.to_string(),
        hint: if tool == "verilator" {
            VERILATOR_HINT.into()
        } else {
            CXX_HINT.into()
        },
    })?;
    if out.status.success() {
        return Ok(());
    }
    let mut output = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.trim().is_empty() {
        if !output.is_empty() {
            output.push_str("\n--- stdout ---\n");
        }
        output.push_str(&stdout);
    }
    if output.len() > MAX_LOG {
        let mut cut = MAX_LOG;
        while !output.is_char_boundary(cut) {
            cut -= 1;
        }
        output.truncate(cut);
        output.push_str("\n[... truncated]");
    }
    Err(ToolchainError::Failed {
        tool: tool.into(),
        status: out.status.to_string(),
        command: rendered,
        output,
    })
}

fn check_source(source: &Path) -> Result<(), ToolchainError> {
    if !source.is_file() {
        return Err(ToolchainError::Invalid(format!(
            "source {} does not exist or is not a file",
            source.display()
        )));
    }
    Ok(())
}

/// Copies a finished build to `out` via a sibling temporary file and a
/// rename, so a concurrent reader never loads a half-written object.
fn install(built: &Path, out: &Path) -> Result<(), ToolchainError> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let tmp = tempfile::Builder::new()
        .prefix(".corefarm-build-")
        .tempfile_in(&dir)
        .map_err(io_err(format!(
            "creating a temporary file in {}",
            dir.display()
        )))?;
    std::fs::copy(built, tmp.path()).map_err(io_err(format!(
        "copying {} to {}",
        built.display(),
        tmp.path().display()
    )))?;
    tmp.persist(out)
        .map_err(|e| io_err(format!("moving the build to {}", out.display()))(e.error))?;
    Ok(())
}

fn build_dir() -> Result<tempfile::TempDir, ToolchainError> {
    let dir = tempfile::Builder::new()
        .prefix("corefarm-build-")
        .tempdir()
        .map_err(io_err("creating a temporary build directory"))?;
    // Verilator's generated makefiles cannot quote paths with whitespace.
    if dir.path().to_string_lossy().contains(char::is_whitespace) {
        return Err(ToolchainError::Invalid(format!(
            "temporary directory {} contains whitespace; set TMPDIR to a path without spaces",
            dir.path().display()
        )));
    }
    Ok(dir)
}

/// Compiles one HLS C/C++ source (`.c` with `$CC`, anything else with
/// `$CXX`) into a native soft core: a shared object at `out` exporting the
/// component function with C linkage (docs/interfaces.md).
pub fn build_native(source: &Path, out: &Path) -> Result<(), ToolchainError> {
    check_source(source)?;
    let is_c = source.extension().is_some_and(|e| e == "c");
    let program = if is_c { cc_program() } else { cxx_program() };
    require(&program, CXX_HINT)?;

    let dir = build_dir()?;
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
    run(&program, &mut cmd)?;
    install(&so, out)
}

/// Verilator's root directory (`verilator --getenv VERILATOR_ROOT`).
pub fn verilator_root() -> Result<PathBuf, ToolchainError> {
    let program = verilator_program();
    let out = Command::new(&program)
        .args(["--getenv", "VERILATOR_ROOT"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ToolchainError::ToolMissing {
            tool: program.clone(),
            reason: e.to_string(),
            hint: VERILATOR_HINT.into(),
        })?;
    let root = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || root.is_empty() {
        return Err(ToolchainError::Failed {
            tool: program,
            status: out.status.to_string(),
            command: "verilator --getenv VERILATOR_ROOT".into(),
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(PathBuf::from(root))
}

fn valid_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Verilates `sources` with `top` as the top module (which must have the
/// corefarm port list, cores/README.md) and links the model, the embedded
/// RTL wrapper and the Verilator runtime into one shared object at `out`
/// exporting the RTL simulation ABI (docs/interfaces.md).
pub fn build_rtl(sources: &[PathBuf], top: &str, out: &Path) -> Result<(), ToolchainError> {
    if sources.is_empty() {
        return Err(ToolchainError::Invalid("no Verilog sources given".into()));
    }
    if !valid_identifier(top) {
        return Err(ToolchainError::Invalid(format!(
            "top module name {top:?} is not a Verilog identifier"
        )));
    }
    for s in sources {
        check_source(s)?;
    }
    let verilator = verilator_program();
    require(&verilator, VERILATOR_HINT)?;
    require("make", VERILATOR_HINT)?;
    require(&cxx_program(), CXX_HINT)?;
    // Verilator's make compiles its runtime (verilated.cpp,
    // verilated_threads.cpp) into the object from here; a package without
    // it would fail late with a confusing make error.
    let runtime = verilator_root()?.join("include").join("verilated.cpp");
    if !runtime.is_file() {
        return Err(ToolchainError::ToolMissing {
            tool: verilator,
            reason: format!("its runtime source {} is missing", runtime.display()),
            hint: VERILATOR_HINT.into(),
        });
    }

    let dir = build_dir()?;
    let d = dir.path();
    std::fs::write(d.join("cf_csr.v"), RTL_CSR).map_err(io_err("writing cf_csr.v"))?;
    std::fs::write(d.join("cf_rtl_wrapper.cpp"), RTL_WRAPPER)
        .map_err(io_err("writing the RTL wrapper"))?;
    std::fs::write(
        d.join("cf_rtl_config.h"),
        format!("#define CF_RTL_TOP_NAME \"{top}\"\n"),
    )
    .map_err(io_err("writing cf_rtl_config.h"))?;
    // Only the ABI is exported: two RTL cores loaded into one process must
    // not bind to each other's copy of the Verilator runtime.
    let map = d.join("exports.map");
    std::fs::write(&map, "{\n  global: cf_rtl_*;\n  local: *;\n};\n")
        .map_err(io_err("writing the export map"))?;
    let obj = d.join("obj");
    let jobs = std::thread::available_parallelism()
        .map(|n| n.get().min(4))
        .unwrap_or(1);

    let mut cmd = Command::new(&verilator);
    cmd.args(["--cc", "--exe", "--build", "-O3"])
        // Speed over X-pessimism: cores must not depend on X propagation.
        .args(["--x-assign", "fast", "--x-initial", "fast", "--noassert"])
        .args(["--no-timing", "-Wno-fatal", "-Wno-lint", "-Wno-style"])
        .args(["--prefix", "Vcftop", "--top-module", top])
        .arg("-Mdir")
        .arg(&obj)
        .arg("-CFLAGS")
        .arg(format!("-fPIC -I{}", d.display()))
        .arg("-LDFLAGS")
        .arg(format!("-shared -Wl,--version-script={}", map.display()))
        // Verilator defaults to -Os; the simulation loop is the hot path.
        .args(["-MAKEFLAGS", "OPT_FAST=-O2 OPT_SLOW=-O1 OPT_GLOBAL=-O2"])
        .arg("-j")
        .arg(jobs.to_string())
        .args(["-o", "cf_rtl.so"])
        .args(sources)
        .arg("-v")
        .arg(d.join("cf_csr.v"))
        .arg(d.join("cf_rtl_wrapper.cpp"));
    run("verilator", &mut cmd)?;
    let so = obj.join("cf_rtl.so");
    if !so.is_file() {
        return Err(ToolchainError::Invalid(format!(
            "verilator succeeded but produced no {}",
            so.display()
        )));
    }
    install(&so, out)
}

/// What [`cached_build`] builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildKind {
    /// [`build_native`] of exactly one source.
    Native,
    /// [`build_rtl`] with this top module.
    Rtl { top: String },
}

/// Default cache directory: `$COREFARM_CACHE`, else
/// `$XDG_CACHE_HOME/corefarm`, else `~/.cache/corefarm`, else a directory
/// under the system temp dir.
pub fn default_cache_dir() -> PathBuf {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = non_empty("COREFARM_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = non_empty("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("corefarm");
    }
    if let Some(home) = non_empty("HOME") {
        return PathBuf::from(home).join(".cache").join("corefarm");
    }
    std::env::temp_dir().join("corefarm-cache")
}

fn tool_versions(kind: &BuildKind) -> String {
    static CXX: OnceLock<String> = OnceLock::new();
    static CC: OnceLock<String> = OnceLock::new();
    static VERILATOR: OnceLock<String> = OnceLock::new();
    let cxx = CXX.get_or_init(|| tool_version(&cxx_program()).unwrap_or_default());
    match kind {
        BuildKind::Native => {
            let cc = CC.get_or_init(|| tool_version(&cc_program()).unwrap_or_default());
            format!("{cxx}\n{cc}")
        }
        BuildKind::Rtl { .. } => {
            let v =
                VERILATOR.get_or_init(|| tool_version(&verilator_program()).unwrap_or_default());
            format!("{cxx}\n{v}")
        }
    }
}

/// The cache key of a build: SHA-256 over the recipe version, the kind (and
/// top module), `extra_key` (e.g. the entry symbol), the tool versions, the
/// embedded header/wrapper and every source's name and contents.
pub fn cache_key(
    kind: &BuildKind,
    sources: &[PathBuf],
    extra_key: &str,
) -> Result<String, ToolchainError> {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        // Length-prefixed fields: concatenations cannot collide.
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(RECIPE_VERSION.as_bytes());
    match kind {
        BuildKind::Native => {
            field(b"native");
            field(HLS_HEADER.as_bytes());
        }
        BuildKind::Rtl { top } => {
            field(b"rtl");
            field(top.as_bytes());
            field(RTL_WRAPPER.as_bytes());
            field(RTL_CSR.as_bytes());
        }
    }
    field(extra_key.as_bytes());
    field(tool_versions(kind).as_bytes());
    for s in sources {
        let name = s.file_name().map(|n| n.to_string_lossy().into_owned());
        field(name.unwrap_or_default().as_bytes());
        let mut content = Vec::new();
        std::fs::File::open(s)
            .and_then(|mut f| f.read_to_end(&mut content))
            .map_err(io_err(format!("reading {}", s.display())))?;
        field(&content);
    }
    Ok(hex::encode(h.finalize()))
}

/// Builds `sources` as `kind` unless an identical build (same
/// [`cache_key`]) is already in `cache_dir`, and returns the shared
/// object's path there. Concurrent callers may build the same key twice; the
/// results are identical and each lands atomically.
pub fn cached_build(
    kind: &BuildKind,
    sources: &[PathBuf],
    extra_key: &str,
    cache_dir: &Path,
) -> Result<PathBuf, ToolchainError> {
    let key = cache_key(kind, sources, extra_key)?;
    let (prefix, mut name) = match kind {
        BuildKind::Native => ("native", String::new()),
        BuildKind::Rtl { top } => ("rtl", top.clone()),
    };
    if name.is_empty() {
        name = sources
            .first()
            .and_then(|s| s.file_stem())
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
    }
    name.retain(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let mut file = format!("{prefix}-");
    if !name.is_empty() {
        let _ = write!(file, "{name}-");
    }
    file.push_str(&key[..32]);
    file.push_str(".so");
    let path = cache_dir.join(file);
    if path.is_file() {
        return Ok(path);
    }
    match kind {
        BuildKind::Native => {
            let [source] = sources else {
                return Err(ToolchainError::Invalid(format!(
                    "a native build takes exactly one source, got {}",
                    sources.len()
                )));
            };
            build_native(source, &path)?;
        }
        BuildKind::Rtl { top } => build_rtl(sources, top, &path)?,
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

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
        if !cxx_available() {
            eprintln!("SKIP native_core_builds_and_runs: no C++ compiler");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // .c goes through the C compiler, .cpp through C++: both must export
        // the plain symbol.
        for name in ["twice.cpp", "twice.c"] {
            let src = write(dir.path(), name, NATIVE_SRC);
            let so = dir.path().join(format!("{name}.so"));
            build_native(&src, &so).unwrap();
            let lib = unsafe { libloading::Library::new(&so) }.unwrap();
            let f: libloading::Symbol<unsafe extern "C" fn(*const u8, *mut u8)> =
                unsafe { lib.get(b"twice") }.unwrap();
            let input = [1u8, 2, 200, 255];
            let mut out = [0u8; 4];
            unsafe { f(input.as_ptr(), out.as_mut_ptr()) };
            assert_eq!(out, [3, 5, 145, 255], "{name}");
        }
    }

    #[test]
    fn native_compile_error_carries_stderr() {
        if !cxx_available() {
            eprintln!("SKIP native_compile_error_carries_stderr: no C++ compiler");
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
        let err = build_rtl(&[], "top", &dir.path().join("x.so")).unwrap_err();
        assert!(matches!(err, ToolchainError::Invalid(_)), "{err}");
        let v = write(dir.path(), "a.v", "module a; endmodule\n");
        let err = build_rtl(&[v], "a\"; x", &dir.path().join("x.so")).unwrap_err();
        assert!(matches!(err, ToolchainError::Invalid(_)), "{err}");
    }

    /// Smallest core with the corefarm port list: on start it stores
    /// `~in[0]` into `out[0]` and is done one cycle later.
    const INVERT_V: &str = r#"
module invert (
    input clock, input resetn,
    input [31:0] avs_cra_address, input avs_cra_read, input avs_cra_write,
    input [63:0] avs_cra_writedata, input [7:0] avs_cra_byteenable, output reg [63:0] avs_cra_readdata,
    input [31:0] avs_in_address, input avs_in_read, input avs_in_write,
    input [63:0] avs_in_writedata, input [7:0] avs_in_byteenable, output reg [63:0] avs_in_readdata,
    input [31:0] avs_out_address, input avs_out_read, input avs_out_write,
    input [63:0] avs_out_writedata, input [7:0] avs_out_byteenable, output reg [63:0] avs_out_readdata,
    output irq);
  reg [63:0] in0, out0;
  reg busy, done, ie;
  assign irq = done & ie;
  always @(posedge clock) begin
    if (!resetn) begin busy <= 0; done <= 0; ie <= 0; end
    else begin
      if (avs_cra_read) avs_cra_readdata <= avs_cra_address == 0 ? {63'd0, busy} :
                                            avs_cra_address == 2 ? {63'd0, ie} :
                                            avs_cra_address == 3 ? {63'd0, done} : 64'd0;
      if (avs_cra_write && avs_cra_address == 2) ie <= avs_cra_writedata[0];
      if (avs_cra_write && avs_cra_address == 3 && avs_cra_writedata[0]) done <= 0;
      if (avs_cra_write && avs_cra_address == 1 && avs_cra_writedata[0] && !busy) busy <= 1;
      if (busy) begin out0 <= ~in0; busy <= 0; done <= 1; end
    end
    if (avs_in_write && avs_in_address == 0) in0 <= avs_in_writedata;
    if (avs_in_read) avs_in_readdata <= in0;
    if (avs_out_read) avs_out_readdata <= out0;
  end
endmodule
"#;

    #[test]
    fn rtl_core_builds_and_runs_through_the_abi() {
        if !verilator_available() {
            eprintln!("SKIP rtl_core_builds_and_runs_through_the_abi: verilator not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let src = write(dir.path(), "invert.v", INVERT_V);
        let cache = dir.path().join("cache");
        let kind = BuildKind::Rtl {
            top: "invert".into(),
        };
        let so = cached_build(&kind, std::slice::from_ref(&src), "", &cache).unwrap();
        let modified = std::fs::metadata(&so).unwrap().modified().unwrap();
        // Second request hits the cache: same path, not rebuilt.
        let again = cached_build(&kind, std::slice::from_ref(&src), "", &cache).unwrap();
        assert_eq!(so, again);
        assert_eq!(
            std::fs::metadata(&again).unwrap().modified().unwrap(),
            modified
        );

        unsafe {
            let lib = libloading::Library::new(&so).unwrap();
            let version: libloading::Symbol<unsafe extern "C" fn() -> u32> =
                lib.get(b"cf_rtl_abi_version").unwrap();
            assert_eq!(version(), 1);
            let name: libloading::Symbol<unsafe extern "C" fn() -> *const std::ffi::c_char> =
                lib.get(b"cf_rtl_top_name").unwrap();
            assert_eq!(std::ffi::CStr::from_ptr(name()).to_str().unwrap(), "invert");
            type Ptr = *mut std::ffi::c_void;
            let create: libloading::Symbol<unsafe extern "C" fn() -> Ptr> =
                lib.get(b"cf_rtl_create").unwrap();
            let destroy: libloading::Symbol<unsafe extern "C" fn(Ptr)> =
                lib.get(b"cf_rtl_destroy").unwrap();
            let read: libloading::Symbol<unsafe extern "C" fn(Ptr, u32, u32) -> u64> =
                lib.get(b"cf_rtl_read").unwrap();
            let write: libloading::Symbol<unsafe extern "C" fn(Ptr, u32, u32, u64, u8)> =
                lib.get(b"cf_rtl_write").unwrap();
            let tick: libloading::Symbol<unsafe extern "C" fn(Ptr, u32)> =
                lib.get(b"cf_rtl_tick").unwrap();
            let cycles: libloading::Symbol<unsafe extern "C" fn(Ptr) -> u64> =
                lib.get(b"cf_rtl_cycles").unwrap();
            let irq: libloading::Symbol<unsafe extern "C" fn(Ptr) -> i32> =
                lib.get(b"cf_rtl_irq").unwrap();

            let inst = create();
            assert!(!inst.is_null());
            write(inst, 1, 0, 0x0123_4567_89ab_cdef, 0xff);
            assert_eq!(read(inst, 1, 0), 0x0123_4567_89ab_cdef);
            write(inst, 0, 2, 1, 0xff); // interrupt enable
            assert_eq!(read(inst, 0, 3), 0);
            assert_eq!(irq(inst), 0);
            write(inst, 0, 1, 1, 0xff); // start
            tick(inst, 2);
            assert_eq!(read(inst, 0, 3) & 1, 1, "done");
            assert_eq!(irq(inst), 1);
            assert_eq!(read(inst, 2, 0), !0x0123_4567_89ab_cdef_u64);
            write(inst, 0, 3, 1, 0xff); // clear done
            assert_eq!(read(inst, 0, 3), 0);
            assert_eq!(irq(inst), 0);
            let before = cycles(inst);
            tick(inst, 1000);
            read(inst, 0, 0);
            assert_eq!(cycles(inst), before + 1001);
            destroy(inst);
        }
    }

    #[test]
    fn rtl_error_carries_verilator_output() {
        if !verilator_available() {
            eprintln!("SKIP rtl_error_carries_verilator_output: verilator not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let src = write(
            dir.path(),
            "broken.v",
            "module broken(input clock);\n  wire = ;\nendmodule\n",
        );
        let out = dir.path().join("broken.so");
        let err = build_rtl(std::slice::from_ref(&src), "broken", &out).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ToolchainError::Failed { .. }), "{text}");
        assert!(
            text.contains("broken.v"),
            "verilator output missing from: {text}"
        );
        assert!(!out.exists());
    }

    #[test]
    fn cache_key_tracks_sources_and_kind() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a.v", "module a; endmodule\n");
        let rtl = |top: &str| BuildKind::Rtl { top: top.into() };
        let k1 = cache_key(&rtl("a"), std::slice::from_ref(&a), "").unwrap();
        assert_eq!(
            k1,
            cache_key(&rtl("a"), std::slice::from_ref(&a), "").unwrap()
        );
        assert_ne!(
            k1,
            cache_key(&rtl("b"), std::slice::from_ref(&a), "").unwrap()
        );
        assert_ne!(
            k1,
            cache_key(&rtl("a"), std::slice::from_ref(&a), "x").unwrap()
        );
        assert_ne!(
            k1,
            cache_key(&BuildKind::Native, std::slice::from_ref(&a), "").unwrap()
        );
        std::fs::write(&a, "module a; wire w; endmodule\n").unwrap();
        assert_ne!(
            k1,
            cache_key(&rtl("a"), std::slice::from_ref(&a), "").unwrap()
        );
    }
}

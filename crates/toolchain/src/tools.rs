//! The external programs a build runs (`$CXX`/`$CC`, Verilator, `make`):
//! finding them, running them with their output kept for errors, and
//! installing what they produce atomically.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Compile stderr kept in errors: the head of a compiler's output names the
/// first problem, but a runaway error list must not flood the logs.
const MAX_LOG: usize = 16 * 1024;

pub(crate) const CXX_HINT: &str =
    "install a C/C++ compiler (e.g. `apt-get install -y g++`) or set $CXX/$CC";
pub(crate) const VERILATOR_HINT: &str =
    "install Verilator 5 and make (e.g. `apt-get install -y verilator make`) or set $VERILATOR";

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
    /// `--strict`: Verilator's lint warnings fail the build.
    #[error("Verilator reported {} warning(s); --strict makes them errors:\n{}", .0.len(), .0.join("\n"))]
    Lint(Vec<String>),
}

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ToolchainError {
    let context = context.into();
    move |source| ToolchainError::Io { context, source }
}

pub(crate) fn cxx_program() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

pub(crate) fn cc_program() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

pub(crate) fn verilator_program() -> String {
    std::env::var("VERILATOR").unwrap_or_else(|_| "verilator".into())
}

/// First line of `<program> --version`, or why it cannot run.
pub(crate) fn require(program: &str, hint: &str) -> Result<String, ToolchainError> {
    let missing = |reason: String| ToolchainError::ToolMissing {
        tool: program.into(),
        reason,
        hint: hint.into(),
    };
    let out = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| missing(e.to_string()))?;
    if !out.status.success() {
        return Err(missing(format!(
            "`{program} --version` exited with {}",
            out.status
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

/// First line of `<program> --version`, or `None` if it cannot run.
pub(crate) fn tool_version(program: &str) -> Option<String> {
    require(program, "").ok()
}

/// The C++ compiler (`$CXX`, default `c++`) runs, or why not.
pub fn check_cxx() -> Result<(), ToolchainError> {
    require(&cxx_program(), CXX_HINT).map(drop)
}

/// Verilator, `make` and the C++ compiler all run (an RTL build needs the
/// three), or the first that does not.
pub fn check_verilator() -> Result<(), ToolchainError> {
    require(&verilator_program(), VERILATOR_HINT)?;
    require("make", VERILATOR_HINT)?;
    check_cxx()
}

/// True if the C++ compiler (`$CXX`, default `c++`) runs.
pub fn cxx_available() -> bool {
    check_cxx().is_ok()
}

/// True if Verilator, `make` and the C++ compiler all run.
pub fn verilator_available() -> bool {
    check_verilator().is_ok()
}

/// External tools a test may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    /// The C/C++ compiler (native soft cores, testbenches).
    Cxx,
    /// Verilator with `make` and the C++ compiler (RTL simulation).
    Verilator,
}

/// For tests that need an external tool: true if it is there. When it is
/// not, the test fails (panics, naming the tool) if `COREFARM_REQUIRE_TOOLS=1`
/// — CI sets it, so no test passes there by skipping — and otherwise prints
/// a SKIP line and returns false. The line goes straight to the process's
/// stderr, past the test harness's output capture, so a skip is never silent.
pub fn require_tool(tool: Tool, test: &str) -> bool {
    let check = match tool {
        Tool::Cxx => check_cxx(),
        Tool::Verilator => check_verilator(),
    };
    let strict = std::env::var("COREFARM_REQUIRE_TOOLS").is_ok_and(|v| v == "1");
    present_or_skip(check, test, strict)
}

fn present_or_skip(check: Result<(), ToolchainError>, test: &str, strict: bool) -> bool {
    let Err(e) = check else {
        return true;
    };
    if strict {
        panic!("{test} needs a tool that is missing (COREFARM_REQUIRE_TOOLS=1): {e}");
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIP {test}: {e} (set COREFARM_REQUIRE_TOOLS=1 to make this a failure)"
    );
    false
}

/// Runs `cmd`, turning a non-zero exit into [`ToolchainError::Failed`] that
/// carries the tool's output.
pub(crate) fn run(tool: &str, cmd: &mut Command) -> Result<(), ToolchainError> {
    run_capture(tool, cmd).map(drop)
}

/// [`run`], returning the tool's stderr on success (where warnings go).
pub(crate) fn run_capture(tool: &str, cmd: &mut Command) -> Result<String, ToolchainError> {
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
        return Ok(String::from_utf8_lossy(&out.stderr).into_owned());
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

pub(crate) fn check_source(source: &Path) -> Result<(), ToolchainError> {
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
pub(crate) fn install(built: &Path, out: &Path) -> Result<(), ToolchainError> {
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

pub(crate) fn build_dir() -> Result<tempfile::TempDir, ToolchainError> {
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

/// Compiles `sources` with `program` and `flags` into a shared object at
/// `out`, with `header` (a file name under `corefarm/` and its text) on the
/// include path, as the project's headers are not installed anywhere.
pub(crate) fn compile_shared(
    program: &str,
    header: (&str, &str),
    flags: &[&str],
    sources: &[&Path],
    out: &Path,
) -> Result<(), ToolchainError> {
    let dir = build_dir()?;
    let include = dir.path().join("include");
    std::fs::create_dir_all(include.join("corefarm"))
        .map_err(io_err("creating the include directory"))?;
    std::fs::write(include.join("corefarm").join(header.0), header.1)
        .map_err(io_err(format!("writing corefarm/{}", header.0)))?;
    let so = dir.path().join("out.so");
    let mut cmd = Command::new(program);
    cmd.args(flags)
        .arg(format!("-I{}", include.display()))
        .args(sources)
        .arg("-o")
        .arg(&so);
    run(program, &mut cmd)?;
    install(&so, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_named_with_a_hint() {
        let e = require("corefarm-no-such-tool", CXX_HINT).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, ToolchainError::ToolMissing { .. }), "{text}");
        assert!(
            text.contains("corefarm-no-such-tool") && text.contains("g++"),
            "{text}"
        );
        assert_eq!(tool_version("corefarm-no-such-tool"), None);
    }

    fn missing() -> Result<(), ToolchainError> {
        require("corefarm-no-such-tool", VERILATOR_HINT).map(drop)
    }

    #[test]
    fn a_present_tool_runs_the_test_and_a_missing_one_skips_loudly() {
        assert!(present_or_skip(Ok(()), "t", true));
        assert!(!present_or_skip(missing(), "skip-path self-test", false));
    }

    #[test]
    #[should_panic(expected = "corefarm-no-such-tool")]
    fn a_missing_tool_fails_the_test_when_tools_are_required() {
        present_or_skip(missing(), "t", true);
    }

    #[test]
    fn failing_commands_carry_their_output() {
        let e = run(
            "sh",
            Command::new("sh").args(["-c", "echo oops >&2; exit 3"]),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, ToolchainError::Failed { .. }), "{text}");
        assert!(text.contains("oops") && text.contains('3'), "{text}");
    }
}

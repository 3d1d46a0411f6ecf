//! The benchmark suite (`bench/suite.py`, run as separate processes of the
//! `corefarm` binary): finding the script and the command that runs it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Result};

/// Finds bench/suite.py: $COREFARM_ROOT first, then the source tree this
/// binary was built from.
pub fn script() -> Result<PathBuf> {
    let mut tried = Vec::new();
    if let Some(root) = std::env::var_os("COREFARM_ROOT") {
        tried.push(Path::new(&root).join("bench/suite.py"));
    }
    tried.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/suite.py"));
    for p in &tried {
        if p.is_file() {
            return Ok(p.clone());
        }
    }
    bail!(
        "bench/suite.py not found (tried {}); set COREFARM_ROOT to the repository",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// `python3 <script> <experiment> [--quick] [--out DIR] <rest…>`, driving
/// `bin` (the caller's own binary) unless $COREFARM_BIN names another.
pub fn command(
    script: &Path,
    experiment: &str,
    quick: bool,
    out: Option<&Path>,
    rest: &[String],
    bin: &Path,
) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(experiment);
    if quick {
        cmd.arg("--quick");
    }
    if let Some(out) = out {
        cmd.arg("--out").arg(out);
    }
    cmd.args(rest);
    if std::env::var_os("COREFARM_BIN").is_none() {
        cmd.env("COREFARM_BIN", bin);
    }
    cmd
}

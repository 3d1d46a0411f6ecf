//! The external tools a test needs (C++ compiler, Verilator, make).
//!
//! A missing tool skips the test with a notice on a developer's machine, and
//! fails it, naming the tool, when `COREFARM_REQUIRE_TOOLS=1` (CI sets it), so
//! a CI run can never pass by skipping.

use std::process::{Command, Stdio};

#[derive(Clone, Copy, Debug)]
pub enum Tool {
    /// `$CXX`, default `c++`.
    Cxx,
    /// `$VERILATOR`, default `verilator`.
    Verilator,
    Make,
    /// Prometheus' `promtool` (Debian package `prometheus`).
    Promtool,
    /// `tmux`, to drive a terminal program.
    Tmux,
}

impl Tool {
    fn program(self) -> String {
        let var = |k: &str, default: &str| std::env::var(k).unwrap_or_else(|_| default.into());
        match self {
            Tool::Cxx => var("CXX", "c++"),
            Tool::Verilator => var("VERILATOR", "verilator"),
            Tool::Make => "make".into(),
            Tool::Promtool => "promtool".into(),
            Tool::Tmux => "tmux".into(),
        }
    }

    fn describe(self) -> String {
        match self {
            Tool::Cxx => format!("a C++ compiler ($CXX = {:?})", self.program()),
            Tool::Verilator => format!("Verilator ($VERILATOR = {:?})", self.program()),
            Tool::Make => "make".into(),
            Tool::Promtool => "promtool (Debian package prometheus)".into(),
            Tool::Tmux => "tmux".into(),
        }
    }

    /// Whether `<program> --version` runs and succeeds.
    fn runs(self) -> bool {
        let flag = if matches!(self, Tool::Tmux) {
            "-V"
        } else {
            "--version"
        };
        Command::new(self.program())
            .arg(flag)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// True if every tool in `needed` runs. Otherwise prints a skip notice and
/// returns false, or panics naming the missing tools when
/// `COREFARM_REQUIRE_TOOLS=1`. `purpose` says what the test needs them for.
pub fn available(needed: &[Tool], purpose: &str) -> bool {
    let missing: Vec<String> = needed
        .iter()
        .filter(|t| !t.runs())
        .map(|t| t.describe())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let what = format!("{} does not run ({purpose})", missing.join(" and "));
    if std::env::var("COREFARM_REQUIRE_TOOLS").is_ok_and(|v| v == "1") {
        panic!("COREFARM_REQUIRE_TOOLS=1 but {what}");
    }
    eprintln!("SKIPPED: {what}; set COREFARM_REQUIRE_TOOLS=1 to make this a failure");
    false
}

//! Handler sets for the sPIN tests: C sources compiled into a shared
//! object with the system compiler, against the project's
//! `include/corefarm/spin.h`, warnings as errors.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A reference handler set's source (`cores/spin/NAME.c`).
pub fn reference(name: &str) -> PathBuf {
    root().join(format!("cores/spin/{name}.c"))
}

/// Compiles `sources` (C, `std`, e.g. "c11") with `defines` (`-D` values)
/// into the shared object `so`, failing the test with the compiler's
/// message if it does not build; returns the object's path.
pub fn shared_object(sources: &[PathBuf], std: &str, defines: &[String], so: &Path) -> PathBuf {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args([
            "-O2",
            &format!("-std={std}"),
            "-Wall",
            "-Werror",
            "-shared",
            "-fPIC",
        ])
        .arg(format!("-I{}", root().join("include").display()))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .args(sources)
        .arg("-o")
        .arg(so)
        .output()
        .expect("running the C compiler");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    so.to_path_buf()
}

/// [`shared_object`] of one source written from `text` into `dir`.
pub fn from_text(dir: &Path, name: &str, text: &str, std: &str, defines: &[String]) -> Vec<u8> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, text).unwrap();
    let so = shared_object(&[src], std, defines, &dir.join(format!("{name}.so")));
    std::fs::read(so).unwrap()
}

/// A ruleset that takes the messages whose first word is `word0`.
pub fn selector(word0: u32) -> corefarm_cores::spin::Ruleset {
    use corefarm_cores::spin::{Mode, Rule, Ruleset};
    Ruleset {
        mode: Mode::And,
        rules: vec![Rule {
            index: 0,
            mask: u32::MAX,
            start: word0,
            end: word0,
        }],
    }
}

/// A handler set `name` that takes the messages whose first word is `word0`.
pub fn set(
    name: &str,
    word0: u32,
    budgets: corefarm_cores::spin::BudgetSpec,
) -> corefarm_cores::spin::HandlerSet {
    corefarm_cores::spin::HandlerSet {
        name: name.into(),
        ruleset: selector(word0),
        budgets,
        result_type: None,
    }
}

//! `corefarm image build|inspect` as a user runs them: sizes and types from
//! the source, mistakes reported as one clear message (exit 1, or 2 for a
//! wrong flag) and never a Rust backtrace.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tools::Tool;

use crate::tools;

const BIN: &str = env!("CARGO_BIN_EXE_corefarm");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `corefarm args` with backtraces requested, as a user who set
/// RUST_BACKTRACE=1 once would.
fn corefarm(args: &[&str]) -> (i32, String, String) {
    let out: Output = Command::new(BIN)
        .args(args)
        .current_dir(repo())
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run corefarm");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// A user error: exit code 1, one `error:` line first, no backtrace.
fn user_error(args: &[&str]) -> String {
    let (code, _, err) = corefarm(args);
    assert_eq!(code, 1, "{args:?}: {err}");
    assert!(err.starts_with("error: "), "{err}");
    for bad in ["stack backtrace", "panicked", "Caused by", "Backtrace"] {
        assert!(!err.contains(bad), "{args:?} printed {bad:?}:\n{err}");
    }
    err
}

#[test]
fn sizes_and_types_come_from_the_hls_source_and_inspect_shows_them() {
    if !tools::available(&[Tool::Cxx], "to build the HLS core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("saxpy.cfimg");
    let img = img.to_str().unwrap();
    let args = [
        "image",
        "build",
        "--hls",
        "examples/saxpy/saxpy.cpp",
        "--entry",
        "saxpy",
    ];
    let (code, _, err) = corefarm(&[&args[..], &["-o", img]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("input: 2056 bytes, int32[514] (from the first argument of saxpy in examples/saxpy/saxpy.cpp)"),
        "{err}"
    );
    let (code, out, err) = corefarm(&["image", "inspect", img]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("input size:  2056 bytes, int32[514]"), "{out}");
    assert!(out.contains("output size: 1024 bytes, int32[256]"), "{out}");
    // The digest of the file, and the label status and metrics show for it.
    let digest = corefarm_server::metrics::bitstream_digest(&std::fs::read(img).unwrap());
    assert!(out.contains(&format!("sha256:      {digest}\n")), "{out}");
    let shown = format!("shown as:    saxpy (sha256:{}) ", &digest[..12]);
    assert!(out.contains(&shown), "{out}");
    let (_, out, _) = corefarm(&["image", "inspect", "--json", img]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["sha256"], digest);
    assert_eq!(v["function"], format!("saxpy (sha256:{})", &digest[..12]));
    assert_eq!(v["manifest"]["input_type"]["dtype"], "int32");
    assert_eq!(v["manifest"]["output_type"]["shape"][0], 256);

    let err = user_error(&[&args[..], &["--input-size", "2048", "-o", img]].concat());
    assert_eq!(
        err.trim_end(),
        "error: input size: --input-size says 2048 bytes but the first argument of saxpy in \
         examples/saxpy/saxpy.cpp says 2056 bytes"
    );
}

#[test]
fn user_errors_are_one_message_without_a_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.cfimg");
    let out = out.to_str().unwrap();
    let err = user_error(&[
        "image", "build", "--hls", "nope.cpp", "--entry", "f", "-o", out,
    ]);
    assert!(err.contains("source nope.cpp does not exist"), "{err}");
    let err = user_error(&["image", "build", "--rbf", "README.md", "-o", out]);
    assert!(
        err.contains(
            "cannot tell the input size: a bitstream does not state it; give --input-size"
        ),
        "{err}"
    );
    let err = user_error(&["image", "inspect", "no-such.cfimg"]);
    assert!(err.contains("reading no-such.cfimg"), "{err}");
    // A wrong flag is clap's usage error: exit 2.
    let (code, _, err) = corefarm(&["image", "build", "--no-such-flag"]);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("backtrace"), "{err}");
    let (code, _, err) = corefarm(&[
        "image",
        "build",
        "--rbf",
        "README.md",
        "--input-type",
        "int24[3]",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("unknown element type") && err.contains("int16[4127]"),
        "{err}"
    );
}

#[test]
fn bad_verilog_and_lint_under_strict_are_user_errors() {
    if !tools::available(&[Tool::Cxx, Tool::Verilator, Tool::Make], "to verilate") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.cfimg");
    let out = out.to_str().unwrap();
    let bad = dir.path().join("broken.v");
    std::fs::write(&bad, "module broken(input clock);\n  wire = ;\nendmodule\n").unwrap();
    let err = user_error(&[
        "image",
        "build",
        "--verilog",
        bad.to_str().unwrap(),
        "--top",
        "broken",
        "--input-size",
        "8",
        "--output-size",
        "8",
        "-o",
        out,
    ]);
    assert!(err.contains("broken.v:2"), "{err}");

    // examples/template/mycore.v is lint-clean; a truncating copy is not.
    let src = std::fs::read_to_string(repo().join("examples/template/mycore.v")).unwrap();
    let lint = dir.path().join("mycore.v");
    // A 16-bit counter fed 32-bit values: WIDTH warnings.
    let truncating = src.replace("reg [31:0] idx;", "reg [15:0] idx;");
    assert_ne!(src, truncating, "template changed: update this test");
    std::fs::write(&lint, truncating).unwrap();
    let err = user_error(&[
        "image",
        "build",
        "--verilog",
        lint.to_str().unwrap(),
        "--top",
        "mycore",
        "--strict",
        "-o",
        out,
    ]);
    assert!(
        err.contains("--strict makes them errors") && err.contains("%Warning-WIDTH"),
        "{err}"
    );
    assert!(!Path::new(out).exists());
}

#[test]
fn inspect_names_a_file_that_is_not_an_image() {
    let (code, out, err) = corefarm(&["image", "inspect", "README.md"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("README.md: not a corefarm image"), "{out}");
}

#[test]
fn handler_sets_declare_their_result_types_and_a_bad_one_names_its_set() {
    if !tools::available(&[Tool::Cxx], "this test compiles handlers and a core") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("spin.cfimg");
    let img = img.to_str().unwrap();
    let build = |sets: &str, out: &str| {
        [
            "image",
            "build",
            "--hls",
            "tests/fixtures/spin/echo.cpp",
            "--entry",
            "echo",
            "--handlers",
            sets,
            "--handler-source",
            "cores/spin/sum.c",
            "cores/spin/filter.c",
            "cores/spin/histogram.c",
            "cores/spin/strided.c",
            "-o",
            out,
        ]
        .map(str::to_string)
    };
    let args = build("cores/spin/sets.json", img);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = corefarm(&args);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = corefarm(&["image", "inspect", img]);
    assert_eq!(code, 0, "{err}");
    for (set, ty) in [
        ("sum", "int64[1]"),
        ("filter", "int32[4]"),
        ("histogram", "uint64[256]"),
        ("strided", "uint8[1]"),
    ] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{set} ")))
            .unwrap_or_else(|| panic!("no line for {set}: {out}"));
        assert!(line.ends_with(&format!(", results {ty})")), "{line}");
    }

    let sets = dir.path().join("sets.json");
    std::fs::write(
        &sets,
        r#"[{"name":"sum","ruleset":{"mode":"and","rules":[{"index":0,"mask":4294967295,"start":1,"end":1}]},"result_type":"int64"}]"#,
    )
    .unwrap();
    let bad = dir.path().join("bad.cfimg");
    let args = build(sets.to_str().unwrap(), bad.to_str().unwrap());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = user_error(&args);
    assert!(
        err.starts_with(
            r#"error: handler set 0 ("sum"): result_type: "int64" is not a type like int16[4127] or int32[64,64]: no [shape] (element types: int8,"#
        ),
        "{err}"
    );
    assert!(!bad.exists());
}

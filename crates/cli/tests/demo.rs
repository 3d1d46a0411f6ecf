//! `corefarm demo` as a user runs it: the real binary, an embedded cluster on
//! OS-assigned loopback ports, every result checked against software.

use std::process::{Command, Output};

use tools::Tool;

use crate::tools;

const BIN: &str = env!("CARGO_BIN_EXE_corefarm");

fn demo(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("demo").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run corefarm demo")
}

fn report(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "corefarm demo failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn assert_all_verified(r: &serde_json::Value, jobs: u64) {
    assert_eq!(r["jobs"], jobs, "{r}");
    assert_eq!(r["verified"], jobs, "{r}");
    assert_eq!(r["mismatches"], 0, "{r}");
    assert_eq!(r["failed"], 0, "{r}");
    assert_eq!(r["all_verified"], true, "{r}");
    assert!(r["first_bad_job"].is_null(), "{r}");
    assert_eq!(r["latency_ms"]["samples"], jobs, "{r}");
    assert!(r["matrices_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["software"]["matrices"].as_u64().unwrap() >= 1, "{r}");
    assert!(r["ratio_vs_software"].as_f64().unwrap() > 0.0, "{r}");
}

/// An RTL build needs all three.
const RTL_TOOLS: &[Tool] = &[Tool::Cxx, Tool::Verilator, Tool::Make];

#[test]
fn native_demo_verifies_every_result() {
    if !tools::available(&[Tool::Cxx], "to build the native core") {
        return;
    }
    let out = demo(
        &[
            "--json",
            "--jobs",
            "40",
            "--nodes",
            "2",
            "--cores",
            "2",
            "--baseline-seconds",
            "0.05",
            "--seed",
            "7",
        ],
        &[],
    );
    let r = report(&out);
    assert_all_verified(&r, 40);
    assert_eq!(r["target"], "native");
    assert_eq!(r["instances"], 4);
    assert_eq!(r["seed"], 7);
    assert!(
        r["artifact"].as_str().unwrap().starts_with("native-"),
        "{r}"
    );
    assert!(r["rtl"].is_null(), "{r}");
}

#[test]
fn rtl_demo_verifies_every_result_and_counts_cycles() {
    if !tools::available(RTL_TOOLS, "to build the RTL simulation") {
        return;
    }
    let out = demo(
        &[
            "--json",
            "--target",
            "rtl",
            "--jobs",
            "6",
            "--nodes",
            "1",
            "--cores",
            "2",
            "--baseline-seconds",
            "0.05",
        ],
        &[],
    );
    let r = report(&out);
    assert_all_verified(&r, 6);
    assert_eq!(r["target"], "rtl");
    assert!(r["artifact"].as_str().unwrap().starts_with("rtl-"), "{r}");
    // One multiply-accumulate per cycle (cores/README.md) plus bus transfers.
    let cycles = r["rtl"]["cycles_per_job"].as_u64().unwrap();
    assert!(cycles >= 64 * 64 * 64, "{r}");
    assert!(r["rtl"]["standalone_cycles_per_s"].as_f64().unwrap() > 0.0);
    assert!(
        r["rtl"]["cluster_cycles_per_s_per_instance"]
            .as_f64()
            .unwrap()
            > 0.0
    );
}

/// `--family amd`: the AXI matrix multiplier (ap_ctrl_hs, the core
/// mastering the simulated host memory) through the same cluster, every
/// product right. The build cache is the one the cores crate's tests fill,
/// so the suite Verilates the AXI core once.
#[test]
fn amd_rtl_demo_runs_the_axi_core() {
    if !tools::available(RTL_TOOLS, "to build the RTL simulation") {
        return;
    }
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("corefarm-cache");
    let out = demo(
        &[
            "--json",
            "--target",
            "rtl",
            "--family",
            "amd",
            "--jobs",
            "4",
            "--nodes",
            "1",
            "--cores",
            "2",
            "--baseline-seconds",
            "0.05",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        &[],
    );
    let r = report(&out);
    assert_all_verified(&r, 4);
    assert_eq!((&r["target"], &r["family"]), (&"rtl".into(), &"amd".into()));
    // The multiply-accumulates plus the core's own bursts to and from memory.
    let cycles = r["rtl"]["cycles_per_job"].as_u64().unwrap();
    assert!(cycles > 64 * 64 * 64 + 3 * 2048, "{r}");
}

#[test]
fn human_report_names_the_figures() {
    if !tools::available(&[Tool::Cxx], "to build the native core") {
        return;
    }
    let out = demo(&["--jobs", "5", "--baseline-seconds", "0.05"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for needle in [
        "5/5 results equal the software computation",
        "matrices/s",
        "p99",
        "corefarm / software",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn missing_compiler_is_a_clear_error() {
    let out = demo(
        &["--jobs", "1"],
        &[
            ("CXX", "/nonexistent/c++"),
            ("COREFARM_CACHE", "/nonexistent/cache"),
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("apt-get install -y g++"), "{err}");
}

#[test]
fn missing_verilator_is_a_clear_error() {
    // The compiler check comes first, so this error needs a working compiler.
    if !tools::available(&[Tool::Cxx], "the demo checks for it before Verilator") {
        return;
    }
    let out = demo(
        &["--target", "rtl", "--jobs", "1"],
        &[("VERILATOR", "/nonexistent/verilator")],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("apt-get install -y verilator"), "{err}");
    assert!(err.contains("--target native"), "{err}");
}

/// A core that computes wrong products makes the demo fail, naming the first
/// bad job: a wrong object is planted in a private build cache under the
/// name of the real build, so the demo runs it as its native core.
#[test]
fn a_wrong_core_fails_the_demo_naming_the_first_bad_job() {
    if !tools::available(&[Tool::Cxx], "to build the native core") {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap();
    let out = demo(
        &[
            "--json",
            "--jobs",
            "1",
            "--baseline-seconds",
            "0",
            "--cache-dir",
            cache_arg,
        ],
        &[],
    );
    report(&out);
    let built: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "so"))
        .collect();
    assert_eq!(built.len(), 1, "{built:?}");

    // Right product, then one element off by one.
    let src = cache.path().join("wrong.cpp");
    std::fs::write(
        &src,
        r#"#include <stdint.h>
extern "C" void mat_mul_64x64(const uint8_t *in_, uint8_t *out_) {
  const int32_t *in = (const int32_t *)in_; int32_t *out = (int32_t *)out_;
  for (int i = 0; i < 64; i++) for (int j = 0; j < 64; j++) {
    int32_t s = 0;
    for (int k = 0; k < 64; k++) s += in[i * 64 + k] * in[4096 + k * 64 + j];
    out[i * 64 + j] = s;
  }
  out[3 * 64 + 5] += 1;
}
"#,
    )
    .unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let st = Command::new(cxx)
        .args(["-O2", "-shared", "-fPIC", "-fwrapv", "-o"])
        .arg(&built[0])
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());

    let out = demo(
        &[
            "--json",
            "--jobs",
            "4",
            "--baseline-seconds",
            "0",
            "--cache-dir",
            cache_arg,
        ],
        &[],
    );
    assert!(!out.status.success(), "a wrong core must fail the demo");
    let r: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(r["all_verified"], false, "{r}");
    assert_eq!(r["mismatches"], 4, "{r}");
    assert_eq!(r["verified"], 0, "{r}");
    assert_eq!(r["first_bad_job"]["job"], 0, "{r}");
    let reason = r["first_bad_job"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("C[3][5] = "), "{reason}");
    assert_eq!(r["software"]["output_verified"], false, "{r}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("first bad job: 0"), "{err}");
}

#[test]
fn several_matrices_per_message_are_all_verified() {
    if !tools::available(&[Tool::Cxx], "to build the native core") {
        return;
    }
    // 7 jobs in messages of 3: the last message carries only one matrix pair.
    let out = demo(
        &[
            "--json", "--jobs", "7", "--count", "3", "--nodes", "1", "--cores", "2",
        ]
        .into_iter()
        .chain(["--baseline-seconds", "0.05", "--seed", "11"])
        .collect::<Vec<_>>(),
        &[],
    );
    let r = report(&out);
    assert_eq!(r["count"], 3, "{r}");
    assert_eq!(r["messages"], 3, "{r}");
    assert_eq!(r["jobs"], 7, "{r}");
    assert_eq!(r["verified"], 7, "{r}");
    assert_eq!(r["all_verified"], true, "{r}");
}

//! The program run without its two arguments says how to call it and
//! fails. (Its run against a cluster is examples/saxpy/test_example.py,
//! which needs an image built from the C++ core.) Being an integration
//! test, this also makes `cargo test` build the program's binary.

use std::process::Command;

#[test]
fn without_arguments_it_prints_its_usage_and_fails() {
    let out = Command::new(env!("CARGO_BIN_EXE_saxpy-user"))
        .output()
        .expect("running saxpy-user");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("usage: saxpy-user HOST:PORT saxpy.cfimg"),
        "{stderr}"
    );
}

//! A test that changes or counts what belongs to the whole process (its
//! environment, its children) runs in a process of its own: this test
//! binary again, asked for that one test. Beside it, the other tests of the
//! binary, on other threads, would read its environment or spawn children.

use std::process::Command;

/// Set in the child: the test runs there.
const CHILD: &str = "COREFARM_TEST_ALONE";

/// Whether the test `name` (in the module `module`, from `module_path!()`)
/// should run its body here: true in the child, which runs it alone. In the
/// test binary's own run, runs the child, asserts that the test passed
/// there, and returns false.
pub fn here(module: &str, name: &str) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    // The path of the test as libtest names it: without the crate's name.
    let module = module.split_once("::").map_or("", |(_, m)| m);
    let test = format!("{module}::{name}");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([&test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{test} alone in a process:\n{stdout}\n{stderr}"
    );
    false
}

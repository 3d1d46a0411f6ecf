//! What the client's integration tests share: finding the `corefarm`
//! binary they run as a real server.

use std::path::PathBuf;

/// The `corefarm` binary: $COREFARM_BIN, else the one built beside this
/// test (`cargo test --workspace` builds it in the same profile's
/// directory), else this workspace's release or debug build. Missing, it
/// is a failure under `COREFARM_REQUIRE_TOOLS=1` (the test suite's
/// setting) and a reported skip otherwise.
pub fn binary() -> Option<PathBuf> {
    let mut c: Vec<PathBuf> = Vec::new();
    if let Some(b) = std::env::var_os("COREFARM_BIN") {
        c.push(b.into());
    }
    // This test runs from <target>/<profile>/deps/.
    if let Some(profile) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(|p| p.to_path_buf()))
    {
        c.push(profile.join("corefarm"));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut targets = vec![root.join("target")];
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        targets.insert(0, t.into());
    }
    for t in targets {
        c.push(t.join("release/corefarm"));
        c.push(t.join("debug/corefarm"));
    }
    let found = c.into_iter().find(|p| p.is_file());
    if found.is_none() {
        let what = "no corefarm binary (cargo build -p corefarm-cli, or set COREFARM_BIN)";
        if std::env::var("COREFARM_REQUIRE_TOOLS").is_ok_and(|v| v == "1") {
            panic!("COREFARM_REQUIRE_TOOLS=1 but there is {what}");
        }
        eprintln!("SKIPPED: {what}; set COREFARM_REQUIRE_TOOLS=1 to make this a failure");
    }
    found
}

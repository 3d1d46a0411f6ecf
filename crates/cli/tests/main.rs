//! The crate's integration tests: each file of tests/ is a module of this
//! one test binary. A binary per file linked the whole stack once per file,
//! which was most of the test suite's build time.

mod cluster_harness;
mod support;
mod tools;

mod bench_streams;
mod cli_misuse;
mod cluster;
mod collectives_model;
mod cowork;
mod demo;
mod failover;
mod groups;
mod hostile;
mod image_cli;
mod isolation;
mod local;
mod matmul_cluster;
mod metrics;
mod secure;
mod sharing_cluster;
mod soak;
mod spin;
mod spin_notify;
mod spin_pool;
mod status;
mod tenants;
mod tls;
mod top;

/// With `autotests = false` (one binary per crate), a file of a crate's
/// tests/ not declared in its tests/main.rs would be neither built nor run.
/// One check for every crate of the workspace that has a tests/main.rs.
#[test]
fn every_file_of_tests_is_a_module_of_its_crates_binary() {
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for krate in std::fs::read_dir(&crates).unwrap() {
        let dir = krate.unwrap().path().join("tests");
        let Ok(main) = std::fs::read_to_string(dir.join("main.rs")) else {
            continue;
        };
        checked += 1;
        for e in std::fs::read_dir(&dir).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            let module = name.strip_suffix(".rs").unwrap_or(&name);
            let declared = [format!("mod {module};"), format!("mod {module} {{")];
            assert!(
                module == "main" || declared.iter().any(|d| main.contains(d.as_str())),
                "{} is not a module of its tests/main.rs",
                dir.join(&name).display()
            );
        }
    }
    // bench, cli, cores, node, server, smp.
    assert!(
        checked >= 6,
        "found only {checked} crates with a tests/main.rs"
    );
}

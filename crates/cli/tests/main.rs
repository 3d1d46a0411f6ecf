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
mod tls;
mod top;

/// With `autotests = false` (one binary), a file of tests/ not declared
/// above would be neither built nor run.
#[test]
fn every_file_of_tests_is_a_module_of_this_binary() {
    let main = include_str!("main.rs");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let module = name.strip_suffix(".rs").unwrap_or(&name);
        let declared = [format!("mod {module};"), format!("mod {module} {{")];
        assert!(
            module == "main" || declared.iter().any(|d| main.contains(d.as_str())),
            "tests/{name} is not a module of tests/main.rs"
        );
    }
}

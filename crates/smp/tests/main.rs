//! The crate's integration tests: each file of tests/ is a module of this
//! one test binary. A binary per file linked the whole stack once per file,
//! which was most of the test suite's build time.

mod common;

mod chunk_vectors;
mod doc_examples;
mod group_vectors;
mod notify_vectors;
mod peer_vectors;
mod prop_chunk;
mod prop_decoder;
mod prop_peer;
mod vectors;

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

//! A native core whose initialiser kills its worker while the worker loads
//! it: the load fails with the cause, and nothing is left on disk (the
//! worker dlopens the sealed artifact through /proc; a copy written to a
//! temporary file could not be removed by a worker killed mid-load). Alone
//! in a process of its own: it points TMPDIR, which the workers inherit, at
//! a directory of its own.

use crate::support::{alone, faulty};

use corefarm_cores::load;
use faulty::{c_configuration, opts};

const DIES: &str = r#"
#include <signal.h>
#include <stdint.h>

__attribute__((constructor)) static void die(void) { raise(SIGKILL); }

void dies(const uint8_t *in, uint8_t *out) { out[0] = in[0]; }
"#;

#[test]
fn a_core_that_kills_its_worker_while_loading_leaves_no_file_behind() {
    let name = "a_core_that_kills_its_worker_while_loading_leaves_no_file_behind";
    if !alone::here(module_path!(), name) {
        return;
    }
    let test = "a_core_that_kills_its_worker_while_loading";
    let Some(cfg) = c_configuration(test, DIES, "dies", 2, 64) else {
        return;
    };

    let tmp = tempfile::tempdir().unwrap();
    // The only test of this process: no other thread reads the environment.
    std::env::set_var("TMPDIR", tmp.path());
    let e = load(&cfg, &opts(1000))
        .err()
        .expect("the load fails")
        .to_string();
    assert!(e.contains("SIGKILL") || e.contains("signal 9"), "{e}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|f| f.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}

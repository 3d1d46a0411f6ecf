//! Native cores loaded in the node's own process (`--isolation
//! in-process`) are dlopened from memory files: nothing is written to
//! TMPDIR, so a node whose TMPDIR is unusable still loads them (and one
//! killed by a core's initialiser leaves nothing there). Alone in a process
//! of its own: it points TMPDIR at a directory that does not exist.

use crate::support::{alone, faulty};

use corefarm_cores::{load, Isolation, LoadOptions};
use faulty::c_configuration;

const TWICE: &str = r#"
#include <stdint.h>
static int calls; /* per copy of the code: per core */
void twice(const uint8_t *in, uint8_t *out) {
    for (int i = 0; i < 7; i++) out[i] = (uint8_t)(in[i] * 2);
    out[7] = (uint8_t)++calls;
}
"#;

#[test]
fn in_process_native_cores_load_without_a_usable_tmpdir() {
    let test = "in_process_native_cores_load_without_a_usable_tmpdir";
    if !alone::here(module_path!(), test) {
        return;
    }
    let Some(cfg) = c_configuration(test, TWICE, "twice", 2, 8) else {
        return;
    };
    let gone = tempfile::tempdir().unwrap();

    // The only test of this process: no other thread reads the environment.
    std::env::set_var("TMPDIR", gone.path().join("does-not-exist"));
    let opts = LoadOptions {
        isolation: Isolation::InProcess,
        ..LoadOptions::default()
    };
    let mut loaded = load(&cfg, &opts).expect("loaded from memory");
    assert_eq!(loaded.cores.len(), 2);
    // Each core has its own copy of the code, so its own `calls`: the
    // loader, which knows an object by its path, must not have been given
    // the same /proc/self/fd/N twice.
    let mut run = |k: usize| {
        let mut out = [0u8; 8];
        loaded.cores[k]
            .process(&[1, 2, 3, 4, 5, 6, 7, 0], &mut out)
            .unwrap();
        assert_eq!(out[..7], [2, 4, 6, 8, 10, 12, 14]);
        out[7]
    };
    assert_eq!([run(0), run(0), run(1), run(0), run(1)], [1, 2, 1, 3, 2]);
}

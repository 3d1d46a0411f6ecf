//! What a user reads when a core is built wrong or fails inside: a C++
//! entry without `extern "C"` is refused naming the mangled symbol the
//! object does export, and a failed `assert` in a core (or in its
//! initialiser) reaches the error with the assertion's text, not only the
//! node's stderr.

use crate::support::faulty::{c_configuration, opts};

use bytes::Bytes;
use corefarm_cores::image::{self, ArtifactKind};
use corefarm_cores::native::NativeLib;
use corefarm_cores::{load, CoreError, LoadError};
use corefarm_toolchain::{build_native, require_tool, ImageBuilder, Tool};

/// A CRC-32 entry written as plain C++: its symbol is mangled.
const MANGLED: &str = r#"
#include <stdint.h>
void crc32(const uint8_t *in, uint8_t *out) {
    uint32_t c = 0xFFFFFFFFu;
    for (int i = 0; i < 16; i++) {
        c ^= in[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(~c >> (8 * i));
}
void crc32_table(uint8_t *t) { t[0] = 0; }
"#;

#[test]
fn an_entry_without_extern_c_is_refused_naming_its_mangled_symbol() {
    if !require_tool(Tool::Cxx, "an_entry_without_extern_c") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("crc.cpp");
    std::fs::write(&src, MANGLED).unwrap();
    let so = dir.path().join("crc.so");
    build_native(&src, &so).unwrap();

    // What `corefarm image build` runs.
    let e = NativeLib::open(&so, "crc32").err().expect("no plain crc32");
    match &e {
        LoadError::NoEntry(n) => {
            assert_eq!(n.entry, "crc32");
            assert_eq!(n.mangled, vec!["_Z5crc32PKhPh".to_string()]);
        }
        other => panic!("expected NoEntry, got {other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.starts_with("native artifact has no entry symbol \"crc32\""),
        "{text}"
    );
    assert!(
        text.contains("_Z5crc32PKhPh") && text.contains("extern \"C\""),
        "{text}"
    );

    // What a node answers, from its worker process.
    let table = image::default_core_table(1, 16, 4).unwrap();
    let img = ImageBuilder::new("crc32", 16, 4, table)
        .artifact(
            image::native_target().unwrap(),
            ArtifactKind::Native,
            "crc32",
            std::fs::read(&so).unwrap(),
        )
        .build()
        .unwrap();
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let e = load(&cfg, &opts(5000))
        .err()
        .expect("load fails")
        .to_string();
    assert!(
        e.contains("_Z5crc32PKhPh") && e.contains("extern \"C\""),
        "{e}"
    );

    // An entry nothing resembles: the exported functions are listed.
    let e = NativeLib::open(&so, "vadd").err().unwrap().to_string();
    assert!(
        e.contains("_Z5crc32PKhPh") && e.contains("_Z11crc32_tablePh"),
        "{e}"
    );
}

const ASSERTS: &str = r#"
#include <assert.h>
#include <stdint.h>
#include <string.h>
void checked(const uint8_t *in, uint8_t *out) {
    assert(in[0] != 0xAA && "the first byte is a header, never 0xAA");
    memcpy(out, in, 16);
}
"#;

#[test]
fn a_failed_assert_reaches_the_error_with_its_text() {
    let Some(cfg) = c_configuration(
        "a_failed_assert_reaches_the_error",
        ASSERTS,
        "checked",
        1,
        16,
    ) else {
        return;
    };
    let mut loaded = load(&cfg, &opts(5000)).unwrap();
    let core = &mut loaded.cores[0];
    let mut out = [0u8; 16];
    let mut input = [1u8; 16];
    core.process(&input, &mut out).unwrap();
    input[0] = 0xAA;
    let e = core.process(&input, &mut out).unwrap_err();
    assert!(matches!(e, CoreError::Worker(_)), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("SIGABRT"), "{text}");
    assert!(
        text.contains("the first byte is a header, never 0xAA") && text.contains("Assertion"),
        "{text}"
    );
    // The next job runs on a fresh worker whose stderr starts empty.
    input[0] = 2;
    core.process(&input, &mut out).unwrap();
    assert_eq!(out, input);
}

const ASSERTS_AT_LOAD: &str = r#"
#include <assert.h>
#include <stdint.h>
static int ready;
__attribute__((constructor)) static void init(void) {
    assert(ready && "init: the lookup table is missing");
}
void early(const uint8_t *in, uint8_t *out) { out[0] = in[0]; }
"#;

#[test]
fn a_failed_assert_while_loading_reaches_the_load_error() {
    let Some(cfg) = c_configuration(
        "a_failed_assert_while_loading",
        ASSERTS_AT_LOAD,
        "early",
        1,
        16,
    ) else {
        return;
    };
    let e = load(&cfg, &opts(5000))
        .err()
        .expect("load fails")
        .to_string();
    assert!(
        e.contains("SIGABRT") && e.contains("init: the lookup table is missing"),
        "{e}"
    );
}

/// A handler set whose payload handler asserts on a record it cannot take.
const ASSERTING_HANDLER: &str = r#"
#include <assert.h>
#include <corefarm/spin.h>
int picky_payload(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    assert(a->len % 16 == 0 && "picky: records are 16 bytes");
    return 0;
}
"#;

#[test]
fn a_failed_assert_in_a_handler_reaches_the_message_error() {
    use crate::support::cc;
    use corefarm_cores::spin::{BudgetSpec, Outcome};
    use corefarm_cores::worker::HandlerWorker;

    if !require_tool(Tool::Cxx, "a_failed_assert_in_a_handler") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let so = cc::from_text(dir.path(), "picky", ASSERTING_HANDLER, "c11", &[]);
    let set = cc::set("picky", 9, BudgetSpec::default());
    let mut w = HandlerWorker::start(&so, vec![set], 1, &opts(5000)).unwrap();
    let mut msg: Vec<u8> = [9u32, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    msg.extend_from_slice(&[0u8; 10]);
    let ctx = w.select(&msg).expect("the set takes word 0 = 9");
    match w.run(ctx, 1, &msg, 4096).outcome {
        Outcome::Failed(why) => assert!(
            why.contains("SIGABRT") && why.contains("picky: records are 16 bytes"),
            "{why}"
        ),
        other => panic!("expected a failure, got {other:?}"),
    }
}

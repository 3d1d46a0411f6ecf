//! Native soft-core backend end to end: C source → shared object → image →
//! configuration → load → Driver over the emulated CSR bus.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use corefarm_cores::image::{self, ArtifactKind, ImageBuilder};
use corefarm_cores::{load, CoreError, DriverOptions, LoadError, LoadOptions};
use corefarm_smp::Configuration;

/// out[i] = in[2i] + in[2i+1] (the seed's vector-add example); an input
/// starting with 0xFF makes the core hang (sleeping, so it burns no CPU).
const VADD: &str = r#"
#include <unistd.h>
#include "corefarm/hls.h"
hls_avalon_agent_component
component void vadd(hls_avalon_agent_memory_argument(16) uint8_t *in,
                    hls_avalon_agent_memory_argument(8) uint8_t *out) {
    if (in[0] == 0xFF) for (;;) sleep(1000);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(in[i] + in[8 + i]);
}
"#;

fn source(dir: &tempfile::TempDir) -> PathBuf {
    let p = dir.path().join("vadd.cpp");
    std::fs::write(&p, VADD).unwrap();
    p
}

fn vadd_image(cores: u32) -> Option<(tempfile::TempDir, Vec<u8>)> {
    if !corefarm_cores::toolchain::cxx_available() {
        eprintln!("SKIP: no C++ compiler");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let img =
        corefarm_cores::build_native_image(&source(&dir), "vadd", cores, 16, 8, "vadd").unwrap();
    Some((dir, img))
}

fn opts(timeout_ms: u64) -> LoadOptions {
    LoadOptions {
        driver: DriverOptions {
            timeout: Duration::from_millis(timeout_ms),
            poll: Duration::from_millis(1),
        },
        ..LoadOptions::default()
    }
}

fn expected(input: &[u8]) -> Vec<u8> {
    (0..8)
        .map(|i| input[i].wrapping_add(input[8 + i]))
        .collect()
}

#[test]
fn native_image_runs_end_to_end() {
    let Some((_d, img)) = vadd_image(3) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    assert_eq!(cfg.cores.len(), 3);
    // Through the SMP encoding, as a node receives it.
    let cfg = Configuration::parse(Bytes::from(cfg.encode_payload())).unwrap();
    let mut loaded = load(&cfg, &LoadOptions::default()).unwrap();
    assert_eq!(loaded.cores.len(), 3);
    assert!(
        loaded.description.contains("native vadd"),
        "{}",
        loaded.description
    );
    for (k, core) in loaded.cores.iter_mut().enumerate() {
        for j in 0..4u8 {
            let input: Vec<u8> = (0..16).map(|i| i * 7 + j + k as u8).collect();
            let mut out = [0u8; 8];
            core.process(&input, &mut out).unwrap();
            assert_eq!(out.to_vec(), expected(&input));
        }
        assert_eq!(core.stats().jobs, 4);
    }
}

#[test]
fn stuck_core_times_out_while_other_cores_work() {
    let Some((_d, img)) = vadd_image(2) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let mut loaded = load(&cfg, &opts(200)).unwrap();
    let good: Vec<u8> = (1..=16).collect();
    let mut stuck = good.clone();
    stuck[0] = 0xFF;
    let mut out = [0u8; 8];
    let e = loaded.cores[0].process(&stuck, &mut out).unwrap_err();
    assert!(matches!(e, CoreError::Timeout(_)), "{e}");
    assert_eq!(loaded.cores[0].stats().timeouts, 1);
    // The next job on another core still works...
    loaded.cores[1].process(&good, &mut out).unwrap();
    assert_eq!(out.to_vec(), expected(&good));
    // ...and so does the stuck core after its reset.
    let mut out = [0u8; 8];
    loaded.cores[0].process(&good, &mut out).unwrap();
    assert_eq!(out.to_vec(), expected(&good));
}

fn refused(cfg: &Configuration, opts: &LoadOptions) -> LoadError {
    match load(cfg, opts) {
        Ok(_) => panic!("configuration was accepted"),
        Err(e) => e,
    }
}

#[test]
fn refusals_say_why() {
    let Some((_d, img)) = vadd_image(2) else {
        return;
    };
    let good = image::configuration(Bytes::from(img.clone())).unwrap();

    // Raw bitstream without an FPGA backend.
    let mut raw = good.clone();
    raw.bitstream = Bytes::from_static(b"\x00\x01not-an-image-rbf");
    let e = refused(&raw, &LoadOptions::default());
    assert!(
        matches!(e, LoadError::Unsupported(_)) && e.to_string().contains("no FPGA backend"),
        "{e}"
    );

    // Corrupted artifact.
    let mut bad = img.clone();
    let n = bad.len();
    bad[n - 100] ^= 0x40;
    let mut cfg = good.clone();
    cfg.bitstream = Bytes::from(bad);
    let e = refused(&cfg, &LoadOptions::default());
    assert!(e.to_string().contains("checksum"), "{e}");

    // Sizes and core table must match the manifest.
    let mut cfg = good.clone();
    cfg.output_size = 16;
    assert!(refused(&cfg, &LoadOptions::default())
        .to_string()
        .contains("16"));
    let mut cfg = good.clone();
    cfg.cores.pop();
    assert!(refused(&cfg, &LoadOptions::default())
        .to_string()
        .contains("core table"));
    let mut cfg = good.clone();
    cfg.cores[1] = cfg.cores[0];
    assert!(refused(&cfg, &LoadOptions::default())
        .to_string()
        .contains("overlap"));

    // Native disabled: nothing this node can run.
    let no_native = LoadOptions {
        native: false,
        ..LoadOptions::default()
    };
    let e = refused(&good, &no_native);
    assert!(
        matches!(e, LoadError::Unsupported(_)) && e.to_string().contains("native-"),
        "{e}"
    );
}

#[test]
fn wrong_target_is_refused() {
    let table = image::default_core_table(1, 16, 8).unwrap();
    let img = ImageBuilder::new("alien", 16, 8, table)
        .artifact(
            "native-riscv64-linux",
            ArtifactKind::Native,
            "vadd",
            b"\x7fELF".to_vec(),
        )
        .build()
        .unwrap();
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let e = refused(&cfg, &LoadOptions::default());
    assert!(matches!(e, LoadError::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("native-riscv64-linux"), "{e}");
}

#[test]
fn missing_entry_symbol_is_refused() {
    let Some((_dir, good)) = vadd_image(1) else {
        return;
    };
    // `image build` refuses a missing entry, so forge such an image by hand,
    // as a hand-made or corrupted image could be.
    let good = image::Image::parse(Bytes::from(good)).unwrap();
    let target = image::native_target().unwrap();
    let so = good.artifact_bytes(good.find(&target).unwrap()).unwrap();
    let img = ImageBuilder::new("vadd", 16, 8, good.manifest.cores.clone())
        .artifact(target, ArtifactKind::Native, "nope", so.to_vec())
        .build()
        .unwrap();
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let e = refused(&cfg, &LoadOptions::default());
    assert!(e.to_string().contains("nope"), "{e}");
}

#[test]
fn image_build_refuses_an_entry_the_object_does_not_export() {
    if !corefarm_cores::toolchain::cxx_available() {
        eprintln!("SKIP: no C++ compiler");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let err = corefarm_cores::build_native_image(&source(&dir), "not_vadd", 1, 16, 8, "vadd")
        .expect_err("a missing entry symbol is a build error");
    assert!(err.to_string().contains("not_vadd"), "{err}");
}

//! Native soft-core backend end to end: C source → shared object → image →
//! configuration → load → the C function called on the test's thread.

use std::path::PathBuf;

use bytes::Bytes;
use corefarm_cores::image::{self, ArtifactKind};
use corefarm_cores::{load, CoreError, LoadError, LoadOptions, WorkerCommand};
use corefarm_smp::Configuration;
use corefarm_toolchain::{build_native_image, require_tool, ImageBuilder, Tool};

/// out[i] = in[i] + in[8+i] (the seed's vector-add example); out[8..16]
/// counts the calls in static state, which must be per core.
const VADD: &str = r#"
#include "corefarm/hls.h"
static uint8_t calls;
hls_avalon_agent_component
component void vadd(hls_avalon_agent_memory_argument(16) uint8_t *in,
                    hls_avalon_agent_memory_argument(16) uint8_t *out) {
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(in[i] + in[8 + i]);
    calls++;
    for (int i = 8; i < 16; i++) out[i] = calls;
}
"#;

/// The default options (isolated cores), with this crate's worker executable.
fn opts() -> LoadOptions {
    LoadOptions {
        worker: WorkerCommand::Program(env!("CARGO_BIN_EXE_corefarm-core-worker").into()),
        ..LoadOptions::default()
    }
}

fn source(dir: &tempfile::TempDir) -> PathBuf {
    let p = dir.path().join("vadd.cpp");
    std::fs::write(&p, VADD).unwrap();
    p
}

fn vadd_image(test: &str, cores: u32) -> Option<(tempfile::TempDir, Vec<u8>)> {
    if !require_tool(Tool::Cxx, test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = build_native_image(&source(&dir), "vadd", cores, 16, 16, "vadd").unwrap();
    Some((dir, img))
}

fn expected(input: &[u8], calls: u8) -> Vec<u8> {
    (0..8)
        .map(|i| input[i].wrapping_add(input[8 + i]))
        .chain([calls; 8])
        .collect()
}

#[test]
fn native_image_runs_end_to_end() {
    let Some((_d, img)) = vadd_image("native_image_runs_end_to_end", 3) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    assert_eq!(cfg.cores.len(), 3);
    // Through the SMP encoding, as a node receives it.
    let cfg = Configuration::parse(Bytes::from(cfg.encode_payload())).unwrap();
    let mut loaded = load(&cfg, &opts()).unwrap();
    assert_eq!(loaded.cores.len(), 3);
    assert!(
        loaded.description.contains("native vadd"),
        "{}",
        loaded.description
    );
    for (k, core) in loaded.cores.iter_mut().enumerate() {
        for j in 0..4u8 {
            let input: Vec<u8> = (0..16).map(|i| i * 7 + j + k as u8).collect();
            let mut out = [0u8; 16];
            core.process(&input, &mut out).unwrap();
            // Each core has its own copy of the static counter.
            assert_eq!(out.to_vec(), expected(&input, j + 1));
        }
        assert_eq!(core.stats().jobs, 4);
    }
}

#[test]
fn unaligned_buffers_and_wrong_sizes() {
    let Some((_d, img)) = vadd_image("unaligned_buffers_and_wrong_sizes", 1) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let mut loaded = load(&cfg, &opts()).unwrap();
    let core = &mut loaded.cores[0];
    // Slices at every offset within a 16-byte alignment: the core copies
    // through its aligned buffers where needed, with the same results.
    let mut inbuf = [0u8; 16 + 32];
    let mut outbuf = [0u8; 16 + 32];
    for off in 0..16u8 {
        let o = off as usize;
        for (i, b) in inbuf[o..o + 16].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(off + 3);
        }
        let input = inbuf[o..o + 16].to_vec();
        core.process(&inbuf[o..o + 16], &mut outbuf[o..o + 16])
            .unwrap();
        assert_eq!(
            outbuf[o..o + 16].to_vec(),
            expected(&input, off + 1),
            "offset {off}"
        );
    }
    let mut out = [0u8; 16];
    let e = core.process(&[0; 15], &mut out).unwrap_err();
    assert!(
        matches!(e, CoreError::Failed(_)) && e.to_string().contains("15"),
        "{e}"
    );
    let e = core.process(&[0; 16], &mut out[..8]).unwrap_err();
    assert!(matches!(e, CoreError::Failed(_)), "{e}");
    assert_eq!(core.stats().jobs, 16);
}

fn refused(cfg: &Configuration, opts: &LoadOptions) -> LoadError {
    match load(cfg, opts) {
        Ok(_) => panic!("configuration was accepted"),
        Err(e) => e,
    }
}

#[test]
fn refusals_say_why() {
    let Some((_d, img)) = vadd_image("refusals_say_why", 2) else {
        return;
    };
    let good = image::configuration(Bytes::from(img.clone())).unwrap();

    // Raw bitstream without an FPGA backend.
    let mut raw = good.clone();
    raw.bitstream = Bytes::from_static(b"\x00\x01not-an-image-rbf");
    let e = refused(&raw, &opts());
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
    let e = refused(&cfg, &opts());
    assert!(e.to_string().contains("checksum"), "{e}");

    // Sizes and core table must match the manifest.
    let mut cfg = good.clone();
    cfg.output_size = 8;
    assert!(refused(&cfg, &opts()).to_string().contains("16 / 8"));
    let mut cfg = good.clone();
    cfg.cores.pop();
    assert!(refused(&cfg, &opts()).to_string().contains("core table"));
    let mut cfg = good.clone();
    cfg.cores[1] = cfg.cores[0];
    assert!(refused(&cfg, &opts()).to_string().contains("overlap"));

    // Native disabled: nothing this node can run.
    let no_native = LoadOptions {
        native: false,
        ..opts()
    };
    let e = refused(&good, &no_native);
    assert!(
        matches!(e, LoadError::Unsupported(_)) && e.to_string().contains("native-"),
        "{e}"
    );
}

#[test]
fn wrong_target_is_refused() {
    let table = image::default_core_table(1, 16, 16).unwrap();
    let img = ImageBuilder::new("alien", 16, 16, table)
        .artifact(
            "native-riscv64-linux",
            ArtifactKind::Native,
            "vadd",
            b"\x7fELF".to_vec(),
        )
        .build()
        .unwrap();
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let e = refused(&cfg, &opts());
    assert!(matches!(e, LoadError::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("native-riscv64-linux"), "{e}");
}

#[test]
fn missing_entry_symbol_is_refused() {
    let Some((_dir, good)) = vadd_image("missing_entry_symbol_is_refused", 1) else {
        return;
    };
    // `image build` refuses a missing entry, so forge such an image by hand,
    // as a hand-made or corrupted image could be.
    let good = image::Image::parse(Bytes::from(good)).unwrap();
    let target = image::native_target().unwrap();
    let so = good.artifact_bytes(good.find(&target).unwrap()).unwrap();
    let img = ImageBuilder::new("vadd", 16, 16, good.manifest.cores.clone())
        .artifact(target, ArtifactKind::Native, "nope", so.to_vec())
        .build()
        .unwrap();
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let e = refused(&cfg, &opts());
    assert!(e.to_string().contains("nope"), "{e}");
}

#[test]
fn image_build_refuses_an_entry_the_object_does_not_export() {
    if !require_tool(
        Tool::Cxx,
        "image_build_refuses_an_entry_the_object_does_not_export",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let err = build_native_image(&source(&dir), "not_vadd", 1, 16, 16, "vadd")
        .expect_err("a missing entry symbol is a build error");
    assert!(err.to_string().contains("not_vadd"), "{err}");
}

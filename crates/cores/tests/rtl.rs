//! RTL simulation backend with the reference Verilog cores, Verilated by
//! corefarm_toolchain::cached_build (cached under the test target dir).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use corefarm_cores::image::{self, ArtifactKind};
use corefarm_cores::{load, CoreError, DriverOptions, Isolation, LoadOptions};
use corefarm_toolchain::{self as toolchain, require_tool, BuildKind, ImageBuilder, Tool};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds `cores/<dir>/<file>` with `top` and wraps it in an RTL-only image.
fn rtl_image(dir: &str, file: &str, top: &str, cores: u32, i: u32, o: u32) -> Option<Vec<u8>> {
    if !require_tool(Tool::Verilator, &format!("RTL test of cores/{dir}")) {
        return None;
    }
    let src = repo().join("cores").join(dir).join(file);
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rtl-cache");
    let kind = BuildKind::Rtl { top: top.into() };
    let so = toolchain::cached_build(&kind, &[src], "", &cache).unwrap();
    let table = image::default_core_table(cores, i, o).unwrap();
    let target = image::rtl_target().unwrap();
    Some(
        ImageBuilder::new(top, i, o, table)
            .artifact(target, ArtifactKind::Rtl, top, std::fs::read(so).unwrap())
            .build()
            .unwrap(),
    )
}

fn opts(timeout_ms: u64) -> LoadOptions {
    LoadOptions {
        driver: DriverOptions {
            timeout: Duration::from_millis(timeout_ms),
            poll: Duration::from_millis(1),
        },
        // The driver's own timeout and reset, in this process; the
        // isolated form is tested in isolation.rs.
        isolation: Isolation::InProcess,
        ..LoadOptions::default()
    }
}

#[test]
fn verilated_vadd_runs_through_the_driver() {
    let Some(img) = rtl_image("vadd", "vadd.v", "vadd", 2, 2048, 1024) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let mut loaded = load(&cfg, &opts(60_000)).unwrap();
    assert!(
        loaded.description.contains("rtl vadd"),
        "{}",
        loaded.description
    );
    for (k, core) in loaded.cores.iter_mut().enumerate() {
        for j in 0..2u32 {
            let input: Vec<u8> = (0..2048u32)
                .map(|i| (i * 31 + j * 7 + k as u32) as u8)
                .collect();
            let mut out = vec![0u8; 1024];
            core.process(&input, &mut out).unwrap();
            let want: Vec<u8> = (0..1024)
                .map(|i| input[i].wrapping_add(input[1024 + i]))
                .collect();
            assert_eq!(out, want);
        }
        let s = core.stats();
        assert_eq!(s.jobs, 2);
        // At least the bus transfers (256 input + 128 output words) plus the
        // 128 compute cycles the core documents.
        let last = s.last_cycles.unwrap();
        assert!(last >= 256 + 128 + 128, "{last} cycles");
        assert!(s.cycles.unwrap() >= 2 * last - 8);
    }
}

#[test]
fn verilated_stuck_core_times_out_and_recovers_its_bus() {
    let Some(img) = rtl_image("stuck", "stuck.v", "stuck", 1, 16, 16) else {
        return;
    };
    let cfg = image::configuration(Bytes::from(img)).unwrap();
    let mut loaded = load(&cfg, &opts(100)).unwrap();
    let mut out = [0u8; 16];
    for _ in 0..2 {
        let e = loaded.cores[0].process(&[1; 16], &mut out).unwrap_err();
        assert!(matches!(e, CoreError::Timeout(_)), "{e}");
    }
    let s = loaded.cores[0].stats();
    assert_eq!((s.timeouts, s.resets, s.jobs), (2, 2, 0));
}

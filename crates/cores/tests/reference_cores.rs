//! Reference cores (top-level `cores/`) built with `corefarm_toolchain`
//! and checked by their C++ testbenches (`cores/*/tb_*.cpp`,
//! `cores/tb/test_hls_native.cpp`), plus a Rust-side cross-check of the RTL
//! and native forms through their ABIs.
//!
//! Without Verilator (or a C++ compiler) a test prints SKIP and returns,
//! unless COREFARM_REQUIRE_TOOLS=1 (set by CI), where it fails instead.

use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use corefarm_cores::native::{NativeCore, NativeLib};
use corefarm_cores::Core;
use corefarm_toolchain::{self as toolchain, require_tool, BuildKind, Tool};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cores_dir() -> PathBuf {
    repo().join("cores")
}

/// Build products persist under the target dir so reruns hit the cache.
fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("corefarm-cache")
}

/// Serialises builds: the machine is small and parallel Verilator builds of
/// the same core would only duplicate work.
fn build_lock() -> &'static Mutex<()> {
    static L: OnceLock<Mutex<()>> = OnceLock::new();
    L.get_or_init(|| Mutex::new(()))
}

fn build(kind: BuildKind, sources: &[&str]) -> PathBuf {
    let _g = build_lock().lock().unwrap_or_else(|e| e.into_inner());
    let sources: Vec<PathBuf> = sources.iter().map(|s| cores_dir().join(s)).collect();
    toolchain::cached_build(&kind, &sources, "", &cache_dir())
        .unwrap_or_else(|e| panic!("building {sources:?}: {e}"))
}

fn rtl(top: &str, source: &str) -> PathBuf {
    build(BuildKind::Rtl { top: top.into() }, &[source])
}

fn native(source: &str) -> PathBuf {
    build(BuildKind::Native, &[source])
}

/// Compiles a testbench program (cached by its sources' hash).
fn testbench(source: &str) -> PathBuf {
    let _g = build_lock().lock().unwrap_or_else(|e| e.into_inner());
    let src = cores_dir().join(source);
    let deps = [
        src.clone(),
        cores_dir().join("tb/cf_tb.h"),
        cores_dir().join("tb/ref.h"),
    ];
    let key = toolchain::cache_key(&BuildKind::Native, &deps, "testbench").unwrap();
    let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
    let exe = cache_dir().join(format!("tb-{stem}-{}", &key[..16]));
    if exe.is_file() {
        return exe;
    }
    std::fs::create_dir_all(cache_dir()).unwrap();
    let tmp = exe.with_extension("tmp");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(cxx)
        .args(["-O2", "-std=c++17", "-Wall"])
        .arg(format!("-I{}", cores_dir().join("tb").display()))
        .arg(&src)
        .arg("-ldl")
        .arg("-o")
        .arg(&tmp)
        .output()
        .expect("running c++");
    assert!(
        out.status.success(),
        "compiling {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &exe).unwrap();
    exe
}

/// Runs a testbench and asserts it passed; returns its stdout.
fn run_testbench(exe: &Path, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(exe)
        .args(args)
        .output()
        .expect("running testbench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    assert!(
        out.status.success() && stdout.lines().last().is_some_and(|l| l.starts_with("PASS")),
        "{} failed ({}):\n{stdout}\n{stderr}",
        exe.display(),
        out.status
    );
    stdout
}

#[test]
fn vadd_rtl_testbench() {
    if !require_tool(Tool::Verilator, "vadd_rtl_testbench") {
        return;
    }
    let so = rtl("vadd", "vadd/vadd.v");
    run_testbench(&testbench("vadd/tb_vadd.cpp"), &[so.as_os_str()]);
}

#[test]
fn matmul_rtl_testbench() {
    if !require_tool(Tool::Verilator, "matmul_rtl_testbench") {
        return;
    }
    let so = rtl("mat_mul_64x64", "matmul/matmul.v");
    run_testbench(&testbench("matmul/tb_matmul.cpp"), &[so.as_os_str()]);
}

fn rtl_axi(top: &str, source: &str) -> PathBuf {
    build(BuildKind::RtlAxi { top: top.into() }, &[source])
}

/// The AXI cores: register map, results, AXI rules on the master port.
#[test]
fn axi_rtl_testbenches() {
    if !require_tool(Tool::Verilator, "axi_rtl_testbenches") {
        return;
    }
    let tb = testbench("tb/tb_axi.cpp");
    for (name, top, src) in [
        ("vadd", "vadd", "vadd/vadd_axi.v"),
        ("matmul", "mat_mul_64x64", "matmul/matmul_axi.v"),
    ] {
        let so = rtl_axi(top, src);
        run_testbench(&tb, &[name.as_ref(), so.as_os_str()]);
    }
}

/// The AXI wrapper's memory model catches a master that breaks the rules
/// (so `axi_rtl_testbenches`' "no violation" means something): the wrapper
/// compiled against a scripted top module, no Verilator involved.
#[test]
fn axi_rule_checks_catch_violations() {
    if !require_tool(Tool::Cxx, "axi_rule_checks_catch_violations") {
        return;
    }
    let _g = build_lock().lock().unwrap_or_else(|e| e.into_inner());
    let tb = cores_dir().join("tb");
    let deps = [
        tb.join("tb_axi_rules.cpp"),
        tb.join("cf_tb.h"),
        tb.join("fake_top/Vcftop.h"),
        tb.join("fake_top/verilated.h"),
        cores_dir().join("rtl/cf_rtl_axi_wrapper.cpp"),
    ];
    let key = toolchain::cache_key(&BuildKind::Native, &deps, "axi-rules").unwrap();
    let exe = cache_dir().join(format!("tb-axi-rules-{}", &key[..16]));
    if !exe.is_file() {
        std::fs::create_dir_all(cache_dir()).unwrap();
        let tmp = exe.with_extension("tmp");
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let out = Command::new(cxx)
            .args(["-O1", "-std=c++17", "-Wall"])
            .arg(format!("-I{}", tb.join("fake_top").display()))
            .arg(format!("-I{}", tb.display()))
            .arg(format!("-I{}", cores_dir().join("rtl").display()))
            .arg(&deps[0])
            .arg("-ldl")
            .arg("-o")
            .arg(&tmp)
            .output()
            .expect("running c++");
        assert!(
            out.status.success(),
            "compiling tb_axi_rules:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &exe).unwrap();
    }
    drop(_g);
    run_testbench(&exe, &[]);
}

#[test]
fn stuck_rtl_testbench() {
    if !require_tool(Tool::Verilator, "stuck_rtl_testbench") {
        return;
    }
    let so = rtl("stuck", "stuck/stuck.v");
    run_testbench(&testbench("stuck/tb_stuck.cpp"), &[so.as_os_str()]);
}

#[test]
fn hls_sources_native() {
    if !require_tool(Tool::Cxx, "hls_sources_native") {
        return;
    }
    let tb = testbench("tb/test_hls_native.cpp");
    for (name, src) in [("vadd", "vadd/vadd.cpp"), ("matmul", "matmul/matmul.cpp")] {
        let so = native(src);
        run_testbench(&tb, &[name.as_ref(), so.as_os_str()]);
    }
}

/// The RTL ABI, resolved from one shared object, for the Rust-side checks.
struct Rtl {
    _lib: libloading::Library,
    top_name: unsafe extern "C" fn() -> *const c_char,
    create: unsafe extern "C" fn() -> *mut c_void,
    destroy: unsafe extern "C" fn(*mut c_void),
    read: unsafe extern "C" fn(*mut c_void, u32, u32) -> u64,
    write: unsafe extern "C" fn(*mut c_void, u32, u32, u64, u8),
    tick: unsafe extern "C" fn(*mut c_void, u32),
}

impl Rtl {
    fn open(path: &Path) -> Rtl {
        // SAFETY: a shared object built by the toolchain from our sources;
        // the symbol types are the documented RTL ABI.
        unsafe {
            let lib = libloading::Library::new(path).unwrap();
            Rtl {
                top_name: *lib.get(b"cf_rtl_top_name").unwrap(),
                create: *lib.get(b"cf_rtl_create").unwrap(),
                destroy: *lib.get(b"cf_rtl_destroy").unwrap(),
                read: *lib.get(b"cf_rtl_read").unwrap(),
                write: *lib.get(b"cf_rtl_write").unwrap(),
                tick: *lib.get(b"cf_rtl_tick").unwrap(),
                _lib: lib,
            }
        }
    }

    /// One job with the seed's host sequence: input, start, poll done,
    /// output, clear done.
    fn job(&self, inst: *mut c_void, input: &[u8], output: &mut [u8]) {
        // SAFETY: `inst` comes from this library's cf_rtl_create and is not
        // yet destroyed; interface 1/2 word numbers stay within the core's
        // memories (input/output lengths are the core's sizes).
        unsafe {
            for (w, chunk) in input.chunks(8).enumerate() {
                let mut b = [0u8; 8];
                b[..chunk.len()].copy_from_slice(chunk);
                let be = (1u16 << chunk.len()) - 1;
                (self.write)(inst, 1, w as u32, u64::from_le_bytes(b), be as u8);
            }
            (self.write)(inst, 0, 1, 1, 0xff);
            let mut polls = 0;
            while (self.read)(inst, 0, 3) & 1 == 0 {
                (self.tick)(inst, 1024);
                polls += 1;
                assert!(polls < 1_000_000, "core never finished");
            }
            for (w, chunk) in output.chunks_mut(8).enumerate() {
                let v = (self.read)(inst, 2, w as u32).to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
            (self.write)(inst, 0, 3, 1, 0xff);
        }
    }
}

/// The two forms of each reference core agree on the same random inputs,
/// with both loaded in one process (the RTL objects export only the ABI, so
/// two Verilator runtimes coexist).
#[test]
fn rtl_and_native_forms_agree() {
    if !require_tool(Tool::Verilator, "rtl_and_native_forms_agree") {
        return;
    }
    let cases = [
        (
            "vadd",
            "vadd/vadd.v",
            "vadd/vadd.cpp",
            "vadd",
            2048usize,
            1024usize,
        ),
        (
            "mat_mul_64x64",
            "matmul/matmul.v",
            "matmul/matmul.cpp",
            "mat_mul_64x64",
            32768,
            16384,
        ),
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        // xorshift64*: deterministic data without an RNG dependency.
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let libs: Vec<_> = cases
        .iter()
        .map(|(top, v, _, _, _, _)| Rtl::open(&rtl(top, v)))
        .collect();
    for ((top, _, cpp, entry, in_size, out_size), sim) in cases.iter().zip(&libs) {
        // SAFETY: the RTL ABI returns a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr((sim.top_name)()) };
        assert_eq!(name.to_str().unwrap(), *top);
        let lib = NativeLib::open(&native(cpp), entry).unwrap();
        let mut nat = NativeCore::new(lib, *in_size as u32, *out_size as u32);
        // SAFETY: cf_rtl_create has no preconditions.
        let inst = unsafe { (sim.create)() };
        assert!(!inst.is_null());
        for job in 0..3 {
            let input: Vec<u8> = (0..*in_size).map(|_| next() as u8).collect();
            let mut want = vec![0u8; *out_size];
            let mut got = vec![0xa5u8; *out_size];
            nat.process(&input, &mut want).unwrap();
            sim.job(inst, &input, &mut got);
            assert!(
                want == got,
                "{top} job {job}: RTL and native outputs differ"
            );
            assert!(want.iter().any(|&b| b != 0), "{top}: trivial output");
        }
        // SAFETY: `inst` came from this library's cf_rtl_create, destroyed once.
        unsafe { (sim.destroy)(inst) };
    }
}

/// The AMD-style cores give the Intel-style cores' results through
/// corefarm's loader: the AXI Verilog through the driver's ap_ctrl_hs path
/// (buffers in the simulated host memory, the interrupt), in this process
/// and in a worker process, and the Vitis C++ sources as native soft cores
/// through their generated shims. One image carries all of them; the
/// families a node accepts decide which one it runs.
#[test]
fn amd_style_cores_match_the_intel_style_ones() {
    use corefarm_cores::image::{self, ArtifactKind, Family, Image};
    use corefarm_cores::{load, Isolation, LoadOptions, WorkerCommand};
    use corefarm_toolchain::{merge_images, BuildSpec, ImageBuilder};

    if !require_tool(
        Tool::Verilator,
        "amd_style_cores_match_the_intel_style_ones",
    ) {
        return;
    }
    // (top, AXI Verilog, Intel HLS, Vitis C++, sizes, fixed scalars)
    type Case = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        u32,
        u32,
        Vec<(String, u32)>,
    );
    let cases: [Case; 2] = [
        (
            "vadd",
            "vadd/vadd_axi.v",
            "vadd/vadd.cpp",
            "vadd/vadd_vitis.cpp",
            2048,
            1024,
            vec![("n".into(), 1024)],
        ),
        (
            "mat_mul_64x64",
            "matmul/matmul_axi.v",
            "matmul/matmul.cpp",
            "matmul/matmul_vitis.cpp",
            32768,
            16384,
            vec![],
        ),
    ];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    };
    for (top, axi_v, intel_cpp, vitis_cpp, isz, osz, scalars) in cases {
        let table = image::default_core_table(2, isz, osz).unwrap();
        let amd_native = corefarm_toolchain::build_image(&BuildSpec {
            name: top.into(),
            cores: 2,
            hls: Some((cores_dir().join(vitis_cpp), top.into())),
            family: Family::Amd,
            scalars,
            ..BuildSpec::default()
        })
        .unwrap();
        assert_eq!(
            (
                amd_native.manifest.input_size,
                amd_native.manifest.output_size
            ),
            (isz, osz)
        );
        let control = amd_native.manifest.artifacts[0].control.clone();
        let amd_rtl = ImageBuilder::new(top, isz, osz, table.clone())
            .artifact_for(
                image::rtl_target().unwrap(),
                ArtifactKind::Rtl,
                top,
                Family::Amd,
                control,
                std::fs::read(rtl_axi(top, axi_v)).unwrap(),
            )
            .build()
            .unwrap();
        let intel = ImageBuilder::new(top, isz, osz, table)
            .artifact(
                image::native_target().unwrap(),
                ArtifactKind::Native,
                top,
                std::fs::read(native(intel_cpp)).unwrap(),
            )
            .build()
            .unwrap();
        // A node that runs Intel-style cores only has nothing to run in an
        // AMD-only image, and says so.
        let amd_only = image::configuration(amd_rtl.clone().into()).unwrap();
        let intel_only = LoadOptions {
            families: vec![Family::Intel],
            isolation: Isolation::InProcess,
            ..LoadOptions::default()
        };
        assert!(matches!(
            load(&amd_only, &intel_only),
            Err(corefarm_cores::LoadError::Unsupported(_))
        ));
        let merged = merge_images(&[intel, amd_native.image, amd_rtl]).unwrap();
        assert_eq!(
            Image::parse(merged.clone().into())
                .unwrap()
                .manifest
                .artifacts
                .len(),
            3
        );
        let cfg = image::configuration(merged.into()).unwrap();
        let opts = |native: bool, families: &[Family], isolation| LoadOptions {
            native,
            rtl: !native,
            families: families.to_vec(),
            isolation,
            worker: WorkerCommand::Program(env!("CARGO_BIN_EXE_corefarm-core-worker").into()),
            ..LoadOptions::default()
        };
        let mut runs = Vec::new();
        for (native, family, isolation) in [
            (true, Family::Intel, Isolation::InProcess),
            (true, Family::Amd, Isolation::InProcess),
            (false, Family::Amd, Isolation::InProcess),
            (false, Family::Amd, Isolation::Process),
        ] {
            let loaded = load(&cfg, &opts(native, &[family], isolation)).unwrap();
            assert!(
                loaded.description.contains(family.name()),
                "{}",
                loaded.description
            );
            runs.push(loaded);
        }
        let input: Vec<u8> = (0..isz).map(|_| next() as u8).collect();
        let mut want = vec![0u8; osz as usize];
        runs[0].cores[0].process(&input, &mut want).unwrap();
        for (r, loaded) in runs.iter_mut().enumerate().skip(1) {
            for core in loaded.cores.iter_mut() {
                let mut out = vec![0u8; osz as usize];
                core.process(&input, &mut out).unwrap();
                assert!(
                    out == want,
                    "{top}: run {r} differs from the Intel-style core"
                );
            }
        }
        // The simulated AXI core counts its cycles, memory traffic included.
        let cycles = runs[2].cores[1].stats().last_cycles.unwrap();
        let compute = if top == "vadd" { 128 } else { 262_144 };
        assert!(cycles > compute, "{top}: {cycles} cycles");
    }
}

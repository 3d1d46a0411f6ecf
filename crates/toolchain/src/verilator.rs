//! Verilog simulated by Verilator, linked into a shared object that exports
//! the RTL simulation ABI of docs/interfaces.md (port list: cores/README.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use corefarm_cores::image::Family;

use crate::tools::{self, io_err, ToolchainError, CXX_HINT, VERILATOR_HINT};

/// `cores/rtl/cf_rtl_wrapper.cpp`: RTL ABI over the Verilated top module.
pub const RTL_WRAPPER: &str = include_str!("../../../cores/rtl/cf_rtl_wrapper.cpp");
/// The shared control/status register block (`cf_csr`), offered to every RTL
/// build as a Verilog library so cores instantiate it without listing it.
pub const RTL_CSR: &str = include_str!("../../../cores/rtl/cf_csr.v");
/// `cores/rtl/cf_rtl_axi_wrapper.cpp`: the same ABI over an AXI (Vitis-style)
/// top module, with the host-memory model behind its master port.
pub const RTL_AXI_WRAPPER: &str = include_str!("../../../cores/rtl/cf_rtl_axi_wrapper.cpp");
/// The Verilog every AXI build gets: the `ap_ctrl_hs` AXI4-Lite slave, the
/// AXI4 master, the port list and their instantiation (file name, text).
pub const RTL_AXI_LIBRARY: [(&str, &str); 4] = [
    (
        "cf_axil_ctrl.v",
        include_str!("../../../cores/rtl/cf_axil_ctrl.v"),
    ),
    (
        "cf_axi_dma.v",
        include_str!("../../../cores/rtl/cf_axi_dma.v"),
    ),
    (
        "cf_axi_ports.vh",
        include_str!("../../../cores/rtl/cf_axi_ports.vh"),
    ),
    (
        "cf_axi_instances.vh",
        include_str!("../../../cores/rtl/cf_axi_instances.vh"),
    ),
];

/// Verilator's root directory (`verilator --getenv VERILATOR_ROOT`).
pub fn verilator_root() -> Result<PathBuf, ToolchainError> {
    let program = tools::verilator_program();
    let out = Command::new(&program)
        .args(["--getenv", "VERILATOR_ROOT"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ToolchainError::ToolMissing {
            tool: program.clone(),
            reason: e.to_string(),
            hint: VERILATOR_HINT.into(),
        })?;
    let root = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || root.is_empty() {
        return Err(ToolchainError::Failed {
            tool: program,
            status: out.status.to_string(),
            command: "verilator --getenv VERILATOR_ROOT".into(),
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(PathBuf::from(root))
}

fn valid_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// How [`build_rtl_with`] treats Verilator's warnings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RtlOptions {
    /// Verilator's warnings fail the build ([`ToolchainError::Lint`]).
    pub strict: bool,
    /// The top module's port list: Intel (three Avalon agents, cores/README.md)
    /// or AMD (an `ap_ctrl_hs` AXI4-Lite slave and an AXI4 master,
    /// `cores/rtl/cf_axi_ports.vh`), which decides the wrapper.
    pub family: Family,
}

/// What a successful RTL build reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RtlBuild {
    /// Verilator's warnings (lint: width truncation, unused bits, ...), one
    /// entry per warning with its source excerpt, as Verilator printed them.
    pub warnings: Vec<String>,
}

/// The `%Warning-…` blocks of Verilator's output: the first line and the
/// indented lines after it (instance, source excerpt, hints).
pub(crate) fn verilator_warnings(output: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut inside = false;
    for line in output.lines() {
        if line.starts_with("%Warning") {
            out.push(line.to_string());
            inside = true;
        } else if inside && line.starts_with(char::is_whitespace) {
            let last = out.last_mut().expect("inside a warning");
            last.push('\n');
            last.push_str(line);
        } else {
            inside = false;
        }
    }
    out
}

/// True if Verilator failed only because warnings are fatal (no `%Error`
/// other than its closing "Exiting due to N warning(s)").
fn failed_on_warnings_only(output: &str) -> bool {
    let errors = output
        .lines()
        .filter(|l| l.starts_with("%Error") && !l.contains("Exiting due to"))
        .count();
    errors == 0 && output.lines().any(|l| l.starts_with("%Warning"))
}

/// Checks what every Verilator run needs: sources, a valid top name, the
/// tools. Returns the Verilator program.
pub(crate) fn check_rtl_request(sources: &[PathBuf], top: &str) -> Result<String, ToolchainError> {
    if sources.is_empty() {
        return Err(ToolchainError::Invalid("no Verilog sources given".into()));
    }
    if !valid_identifier(top) {
        return Err(ToolchainError::Invalid(format!(
            "top module name {top:?} is not a Verilog identifier"
        )));
    }
    for s in sources {
        tools::check_source(s)?;
    }
    let verilator = tools::verilator_program();
    tools::require(&verilator, VERILATOR_HINT)?;
    Ok(verilator)
}

/// Verilates `sources` with `top` as the top module (which must have the
/// corefarm port list, cores/README.md) and links the model, the embedded
/// RTL wrapper and the Verilator runtime into one shared object at `out`
/// exporting the RTL simulation ABI (docs/interfaces.md). Verilator's
/// warnings are dropped; [`build_rtl_with`] returns them.
pub fn build_rtl(sources: &[PathBuf], top: &str, out: &Path) -> Result<(), ToolchainError> {
    build_rtl_with(sources, top, out, RtlOptions::default()).map(drop)
}

/// [`build_rtl`] with Verilator's lint warnings (on by default) returned,
/// or, with `strict`, turned into a [`ToolchainError::Lint`] error.
pub fn build_rtl_with(
    sources: &[PathBuf],
    top: &str,
    out: &Path,
    opts: RtlOptions,
) -> Result<RtlBuild, ToolchainError> {
    let verilator = check_rtl_request(sources, top)?;
    tools::require("make", VERILATOR_HINT)?;
    tools::require(&tools::cxx_program(), CXX_HINT)?;
    // Verilator's make compiles its runtime (verilated.cpp,
    // verilated_threads.cpp) into the object from here; a package without
    // it would fail late with a confusing make error.
    let runtime = verilator_root()?.join("include").join("verilated.cpp");
    if !runtime.is_file() {
        return Err(ToolchainError::ToolMissing {
            tool: verilator,
            reason: format!("its runtime source {} is missing", runtime.display()),
            hint: VERILATOR_HINT.into(),
        });
    }

    let dir = tools::build_dir()?;
    let d = dir.path();
    let axi = opts.family == Family::Amd;
    let (wrapper, library): (&str, Vec<&str>) = if axi {
        for (name, text) in RTL_AXI_LIBRARY {
            std::fs::write(d.join(name), text).map_err(io_err(format!("writing {name}")))?;
        }
        (RTL_AXI_WRAPPER, vec!["cf_axil_ctrl.v", "cf_axi_dma.v"])
    } else {
        std::fs::write(d.join("cf_csr.v"), RTL_CSR).map_err(io_err("writing cf_csr.v"))?;
        (RTL_WRAPPER, vec!["cf_csr.v"])
    };
    std::fs::write(d.join("cf_rtl_wrapper.cpp"), wrapper)
        .map_err(io_err("writing the RTL wrapper"))?;
    std::fs::write(
        d.join("cf_rtl_config.h"),
        format!("#define CF_RTL_TOP_NAME \"{top}\"\n"),
    )
    .map_err(io_err("writing cf_rtl_config.h"))?;
    // Only the ABI is exported: two RTL cores loaded into one process must
    // not bind to each other's copy of the Verilator runtime.
    let map = d.join("exports.map");
    std::fs::write(&map, "{\n  global: cf_rtl_*;\n  local: *;\n};\n")
        .map_err(io_err("writing the export map"))?;
    let obj = d.join("obj");
    let jobs = std::thread::available_parallelism()
        .map(|n| n.get().min(4))
        .unwrap_or(1);

    let mut cmd = Command::new(&verilator);
    cmd.args(["--cc", "--exe", "--build", "-O3"])
        // Speed over X-pessimism: cores must not depend on X propagation.
        .args(["--x-assign", "fast", "--x-initial", "fast", "--noassert"])
        .arg("--no-timing")
        .args(["--prefix", "Vcftop", "--top-module", top])
        .arg("-Mdir")
        .arg(&obj)
        .arg("-CFLAGS")
        .arg(format!("-fPIC -I{}", d.display()))
        .arg("-LDFLAGS")
        .arg(format!("-shared -Wl,--version-script={}", map.display()))
        // Verilator defaults to -Os; the simulation loop is the hot path.
        .args(["-MAKEFLAGS", "OPT_FAST=-O2 OPT_SLOW=-O1 OPT_GLOBAL=-O2"])
        .arg("-j")
        .arg(jobs.to_string())
        .args(["-o", "cf_rtl.so"])
        // The port list and instances of AXI cores are `include`d from here.
        .arg(format!("-I{}", d.display()))
        .args(sources);
    for lib in library {
        cmd.arg("-v").arg(d.join(lib));
    }
    cmd.arg(d.join("cf_rtl_wrapper.cpp"));
    // Lint warnings stay on (Verilator's default set, no style warnings):
    // a truncated accumulator is a bug worth seeing before any node runs it.
    if !opts.strict {
        cmd.arg("-Wno-fatal");
    }
    let warnings = match tools::run_capture("verilator", &mut cmd) {
        Ok(stderr) => verilator_warnings(&stderr),
        Err(ToolchainError::Failed { output, .. })
            if opts.strict && failed_on_warnings_only(&output) =>
        {
            return Err(ToolchainError::Lint(verilator_warnings(&output)));
        }
        Err(e) => return Err(e),
    };
    let so = obj.join("cf_rtl.so");
    if !so.is_file() {
        return Err(ToolchainError::Invalid(format!(
            "verilator succeeded but produced no {}",
            so.display()
        )));
    }
    tools::install(&so, out)?;
    Ok(RtlBuild { warnings })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::write;
    use crate::{cached_build, require_tool, BuildKind, Tool};

    #[test]
    fn invalid_requests_are_refused_before_running_anything() {
        let dir = tempfile::tempdir().unwrap();
        let err = build_rtl(&[], "top", &dir.path().join("x.so")).unwrap_err();
        assert!(matches!(err, ToolchainError::Invalid(_)), "{err}");
        let v = write(dir.path(), "a.v", "module a; endmodule\n");
        let err = build_rtl(&[v], "a\"; x", &dir.path().join("x.so")).unwrap_err();
        assert!(matches!(err, ToolchainError::Invalid(_)), "{err}");
        let err = build_rtl(&[dir.path().join("nope.v")], "a", &dir.path().join("x.so"));
        assert!(matches!(err, Err(ToolchainError::Invalid(_))), "{err:?}");
    }

    /// Smallest core with the corefarm port list: on start it stores
    /// `~in[0]` into `out[0]` and is done one cycle later.
    const INVERT_V: &str = r#"
module invert (
    input clock, input resetn,
    input [31:0] avs_cra_address, input avs_cra_read, input avs_cra_write,
    input [63:0] avs_cra_writedata, input [7:0] avs_cra_byteenable, output reg [63:0] avs_cra_readdata,
    input [31:0] avs_in_address, input avs_in_read, input avs_in_write,
    input [63:0] avs_in_writedata, input [7:0] avs_in_byteenable, output reg [63:0] avs_in_readdata,
    input [31:0] avs_out_address, input avs_out_read, input avs_out_write,
    input [63:0] avs_out_writedata, input [7:0] avs_out_byteenable, output reg [63:0] avs_out_readdata,
    output irq);
  reg [63:0] in0, out0;
  reg busy, done, ie;
  assign irq = done & ie;
  always @(posedge clock) begin
    if (!resetn) begin busy <= 0; done <= 0; ie <= 0; end
    else begin
      if (avs_cra_read) avs_cra_readdata <= avs_cra_address == 0 ? {63'd0, busy} :
                                            avs_cra_address == 2 ? {63'd0, ie} :
                                            avs_cra_address == 3 ? {63'd0, done} : 64'd0;
      if (avs_cra_write && avs_cra_address == 2) ie <= avs_cra_writedata[0];
      if (avs_cra_write && avs_cra_address == 3 && avs_cra_writedata[0]) done <= 0;
      if (avs_cra_write && avs_cra_address == 1 && avs_cra_writedata[0] && !busy) busy <= 1;
      if (busy) begin out0 <= ~in0; busy <= 0; done <= 1; end
    end
    if (avs_in_write && avs_in_address == 0) in0 <= avs_in_writedata;
    if (avs_in_read) avs_in_readdata <= in0;
    if (avs_out_read) avs_out_readdata <= out0;
  end
endmodule
"#;

    #[test]
    fn rtl_core_builds_and_runs_through_the_abi() {
        if !require_tool(Tool::Verilator, "rtl_core_builds_and_runs_through_the_abi") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let src = write(dir.path(), "invert.v", INVERT_V);
        let cache = dir.path().join("cache");
        let kind = BuildKind::Rtl {
            top: "invert".into(),
        };
        let so = cached_build(&kind, std::slice::from_ref(&src), "", &cache).unwrap();
        let modified = std::fs::metadata(&so).unwrap().modified().unwrap();
        // Second request hits the cache: same path, not rebuilt.
        let again = cached_build(&kind, std::slice::from_ref(&src), "", &cache).unwrap();
        assert_eq!(so, again);
        assert_eq!(
            std::fs::metadata(&again).unwrap().modified().unwrap(),
            modified
        );

        // SAFETY: the object was just built from INVERT_V and the embedded
        // wrapper; its initialisers are the Verilator runtime's. Each symbol
        // is declared with the type the RTL ABI (docs/interfaces.md) gives
        // it, `inst` is used only between create and destroy, and the
        // interface/word numbers are within the invert core's windows.
        unsafe {
            let lib = libloading::Library::new(&so).unwrap();
            let version: libloading::Symbol<unsafe extern "C" fn() -> u32> =
                lib.get(b"cf_rtl_abi_version").unwrap();
            assert_eq!(version(), 1);
            let name: libloading::Symbol<unsafe extern "C" fn() -> *const std::ffi::c_char> =
                lib.get(b"cf_rtl_top_name").unwrap();
            assert_eq!(std::ffi::CStr::from_ptr(name()).to_str().unwrap(), "invert");
            type Ptr = *mut std::ffi::c_void;
            let create: libloading::Symbol<unsafe extern "C" fn() -> Ptr> =
                lib.get(b"cf_rtl_create").unwrap();
            let destroy: libloading::Symbol<unsafe extern "C" fn(Ptr)> =
                lib.get(b"cf_rtl_destroy").unwrap();
            let read: libloading::Symbol<unsafe extern "C" fn(Ptr, u32, u32) -> u64> =
                lib.get(b"cf_rtl_read").unwrap();
            let write: libloading::Symbol<unsafe extern "C" fn(Ptr, u32, u32, u64, u8)> =
                lib.get(b"cf_rtl_write").unwrap();
            let tick: libloading::Symbol<unsafe extern "C" fn(Ptr, u32)> =
                lib.get(b"cf_rtl_tick").unwrap();
            let cycles: libloading::Symbol<unsafe extern "C" fn(Ptr) -> u64> =
                lib.get(b"cf_rtl_cycles").unwrap();
            let irq: libloading::Symbol<unsafe extern "C" fn(Ptr) -> i32> =
                lib.get(b"cf_rtl_irq").unwrap();

            let inst = create();
            assert!(!inst.is_null());
            write(inst, 1, 0, 0x0123_4567_89ab_cdef, 0xff);
            assert_eq!(read(inst, 1, 0), 0x0123_4567_89ab_cdef);
            write(inst, 0, 2, 1, 0xff); // interrupt enable
            assert_eq!(read(inst, 0, 3), 0);
            assert_eq!(irq(inst), 0);
            write(inst, 0, 1, 1, 0xff); // start
            tick(inst, 2);
            assert_eq!(read(inst, 0, 3) & 1, 1, "done");
            assert_eq!(irq(inst), 1);
            assert_eq!(read(inst, 2, 0), !0x0123_4567_89ab_cdef_u64);
            write(inst, 0, 3, 1, 0xff); // clear done
            assert_eq!(read(inst, 0, 3), 0);
            assert_eq!(irq(inst), 0);
            let before = cycles(inst);
            tick(inst, 1000);
            read(inst, 0, 0);
            assert_eq!(cycles(inst), before + 1001);
            destroy(inst);
        }
    }

    #[test]
    fn rtl_error_carries_verilator_output() {
        if !require_tool(Tool::Verilator, "rtl_error_carries_verilator_output") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let src = write(
            dir.path(),
            "broken.v",
            "module broken(input clock);\n  wire = ;\nendmodule\n",
        );
        let out = dir.path().join("broken.so");
        let err = build_rtl(std::slice::from_ref(&src), "broken", &out).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ToolchainError::Failed { .. }), "{text}");
        assert!(
            text.contains("broken.v"),
            "verilator output missing from: {text}"
        );
        assert!(!out.exists());
    }
}

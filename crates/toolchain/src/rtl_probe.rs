//! What a Verilog core says about its sizes: the top module's parameters as
//! Verilator elaborates them (`--xml-only`), and the memories' word counts
//! probed through the built RTL object's bus (docs/writing-a-core.md rules:
//! reads beyond a memory return 0, writes there are ignored).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tools::{self, io_err, ToolchainError};
use crate::verilator::{check_rtl_request, RTL_CSR};

/// The top module's parameters and localparams whose elaborated value is a
/// constant that fits a u64 (others, e.g. strings or X, are left out).
pub fn top_parameters(
    sources: &[PathBuf],
    top: &str,
) -> Result<BTreeMap<String, u64>, ToolchainError> {
    let verilator = check_rtl_request(sources, top)?;
    let dir = tools::build_dir()?;
    let d = dir.path();
    std::fs::write(d.join("cf_csr.v"), RTL_CSR).map_err(io_err("writing cf_csr.v"))?;
    let xml = d.join("top.xml");
    let mut cmd = Command::new(&verilator);
    // Warnings are the build's business (shown once, there); this run only
    // elaborates the design.
    cmd.args(["--xml-only", "-Wno-fatal", "-Wno-lint", "-Wno-style"])
        .args(["--top-module", top])
        .arg("-Mdir")
        .arg(d.join("obj"))
        .arg("--xml-output")
        .arg(&xml)
        .args(sources)
        .arg("-v")
        .arg(d.join("cf_csr.v"));
    tools::run("verilator", &mut cmd)?;
    let text = std::fs::read_to_string(&xml).map_err(io_err("reading Verilator's XML output"))?;
    parameters_from_xml(&text, top)
}

fn parameters_from_xml(text: &str, top: &str) -> Result<BTreeMap<String, u64>, ToolchainError> {
    let doc = roxmltree::Document::parse(text)
        .map_err(|e| ToolchainError::Invalid(format!("Verilator's XML output: {e}")))?;
    let module = doc
        .descendants()
        .find(|n| n.has_tag_name("module") && n.attribute("topModule") == Some("1"))
        .or_else(|| {
            doc.descendants()
                .find(|n| n.has_tag_name("module") && n.attribute("origName") == Some(top))
        })
        .ok_or_else(|| {
            ToolchainError::Invalid(format!("Verilator's XML output has no module {top}"))
        })?;
    let mut out = BTreeMap::new();
    // Direct children only: parameters of submodules are not the top's.
    for var in module.children().filter(|n| n.has_tag_name("var")) {
        let is_param =
            var.attribute("param") == Some("true") || var.attribute("localparam") == Some("true");
        let (Some(name), true) = (var.attribute("name"), is_param) else {
            continue;
        };
        let value = var
            .children()
            .find(|n| n.has_tag_name("const"))
            .and_then(|c| c.attribute("name"))
            .and_then(verilog_constant);
        if let Some(v) = value {
            out.insert(name.to_string(), v);
        }
    }
    Ok(out)
}

/// Value of an elaborated Verilog constant as Verilator prints it
/// (`32'h808`, `32'sh80`, `8'd5`, `4'b1010`), if it fits a u64.
fn verilog_constant(c: &str) -> Option<u64> {
    let (_, rest) = c.split_once('\'')?;
    let rest = rest.strip_prefix('s').unwrap_or(rest);
    let mut chars = rest.chars();
    let radix = match chars.next()? {
        'h' => 16,
        'd' => 10,
        'o' => 8,
        'b' => 2,
        _ => return None,
    };
    u64::from_str_radix(&chars.as_str().replace('_', ""), radix).ok()
}

/// RTL ABI interface numbers of the two memories (docs/interfaces.md).
pub const IFACE_INPUT: u32 = 1;
pub const IFACE_OUTPUT: u32 = 2;

/// Largest memory the probe looks for, in 64-bit words (128 MiB).
const MAX_WORDS: u64 = 1 << 24;

/// Result of probing one memory through the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryProbe {
    /// Words 0..n hold what is written; word n reads 0 after a write.
    Words(u64),
    /// Word 0 does not hold a written value: the memory cannot be probed.
    NotWritable,
    /// Every word probed up to the limit holds a value (address aliasing?).
    AtLeast(u64),
}

/// Why a built RTL object could not be driven for the probe.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The object or one of the RTL ABI's symbols could not be loaded.
    #[error("{0}")]
    Load(#[from] libloading::Error),
    #[error("RTL ABI version {0} (expected 1)")]
    AbiVersion(u32),
    #[error("cf_rtl_create returned null")]
    NullInstance,
}

type Inst = *mut std::ffi::c_void;

/// An instance of a built RTL object, driven through the RTL ABI.
struct Rtl {
    _lib: libloading::Library,
    inst: Inst,
    destroy: unsafe extern "C" fn(Inst),
    read: unsafe extern "C" fn(Inst, u32, u32) -> u64,
    write: unsafe extern "C" fn(Inst, u32, u32, u64, u8),
}

impl Rtl {
    fn open(so: &Path) -> Result<Rtl, ProbeError> {
        // SAFETY: `so` was just built by build_rtl_with from the user's
        // Verilog and corefarm's wrapper (the builder already runs such
        // code, e.g. when it checks a native entry). Each symbol is declared
        // with its RTL ABI type (docs/interfaces.md); the function pointers
        // are used only while `_lib` keeps the object loaded.
        unsafe {
            let lib = libloading::Library::new(so)?;
            let version: unsafe extern "C" fn() -> u32 = *lib.get(b"cf_rtl_abi_version\0")?;
            if version() != 1 {
                return Err(ProbeError::AbiVersion(version()));
            }
            let create: unsafe extern "C" fn() -> Inst = *lib.get(b"cf_rtl_create\0")?;
            let destroy = *lib.get(b"cf_rtl_destroy\0")?;
            let read = *lib.get(b"cf_rtl_read\0")?;
            let write = *lib.get(b"cf_rtl_write\0")?;
            let inst = create();
            if inst.is_null() {
                return Err(ProbeError::NullInstance);
            }
            Ok(Rtl {
                _lib: lib,
                inst,
                destroy,
                read,
                write,
            })
        }
    }

    /// Writes a value unique to (iface, word) and reads it back.
    fn holds(&self, iface: u32, word: u64) -> bool {
        let w = word as u32; // word < MAX_WORDS < 2^32
        let pattern = 0xC0FE_0000_0000_0000 | (u64::from(iface) << 40) | word;
        // SAFETY: `inst` is live until drop; the ABI accepts any word address
        // (out-of-range accesses are the core's to ignore).
        unsafe {
            (self.write)(self.inst, iface, w, pattern, 0xff);
            (self.read)(self.inst, iface, w) == pattern
        }
    }
}

impl Drop for Rtl {
    fn drop(&mut self) {
        // SAFETY: created by cf_rtl_create, destroyed once.
        unsafe { (self.destroy)(self.inst) }
    }
}

/// Probes the word counts of the input and output memories of the RTL
/// object `so`. `expected` are the words the sizes need; they are checked
/// first (two accesses each), so a matching core costs four bus cycles.
pub fn probe_memories(so: &Path, expected: [u64; 2]) -> Result<[MemoryProbe; 2], ProbeError> {
    let rtl = Rtl::open(so)?;
    let probe = |iface: u32, want: u64| {
        if !rtl.holds(iface, 0) {
            return MemoryProbe::NotWritable;
        }
        if (1..MAX_WORDS).contains(&want) && rtl.holds(iface, want - 1) && !rtl.holds(iface, want) {
            return MemoryProbe::Words(want);
        }
        // Holding is monotonic in the word address for a memory that starts
        // at word 0: find the first word that does not hold.
        let mut hi = 1;
        while rtl.holds(iface, hi) {
            if hi >= MAX_WORDS / 2 {
                return MemoryProbe::AtLeast(hi + 1);
            }
            hi *= 2;
        }
        let mut lo = hi / 2; // holds
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if rtl.holds(iface, mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        MemoryProbe::Words(hi)
    };
    Ok([
        probe(IFACE_INPUT, expected[0]),
        probe(IFACE_OUTPUT, expected[1]),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_as_verilator_prints_them() {
        assert_eq!(verilog_constant("32'h808"), Some(2056));
        assert_eq!(verilog_constant("32'sh80"), Some(128));
        assert_eq!(verilog_constant("8'd5"), Some(5));
        assert_eq!(verilog_constant("4'b1010"), Some(10));
        assert_eq!(verilog_constant("\"text\""), None);
        assert_eq!(verilog_constant("32'hxx"), None);
    }

    #[test]
    fn only_the_top_modules_own_parameters_are_read() {
        let xml = r#"<verilator_xml><netlist>
          <module name="top" origName="top" topModule="1">
            <var name="INPUT_SIZE" param="true"><const name="32'h808"/></var>
            <var name="OUTPUT_SIZE" localparam="true"><const name="32'sh400"/></var>
            <var name="clock" dir="input"/>
            <instance name="u"/>
          </module>
          <module name="sub" origName="sub">
            <var name="INPUT_SIZE" param="true"><const name="32'h1"/></var>
          </module>
        </netlist></verilator_xml>"#;
        let p = parameters_from_xml(xml, "top").unwrap();
        assert_eq!(p.get("INPUT_SIZE"), Some(&2056));
        assert_eq!(p.get("OUTPUT_SIZE"), Some(&1024));
        assert_eq!(p.len(), 2);
    }
}

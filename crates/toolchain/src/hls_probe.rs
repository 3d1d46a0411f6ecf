//! What an HLS component declares about its memories, as the compiler sees
//! it: the source is compiled once more with `hls_avalon_agent_memory_argument(N)`
//! redefined to insert a tag parameter `cf_probe_mem<(N)>` before each memory
//! argument, so the compiler evaluates every `N` (macros, `sizeof`,
//! constants of the file) into the entry's type. A generated function then
//! reports the entry's parameter list — each tag's N, each pointer's
//! element kind and size — and the builder calls it through dlopen.

use std::path::Path;
use std::process::Command;

use corefarm_cores::image::Dtype;

use crate::hls::HLS_HEADER;
use crate::tools::{self, io_err, ToolchainError, CXX_HINT};

/// Element type of a memory argument's pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    /// A numeric element type that names the data (e.g. `int32_t *`).
    Typed(Dtype),
    /// `uint8_t *`, `unsigned char *`, `char *`, `void *`: plain bytes, the
    /// seed's own spelling of a memory. Recorded as `uint8`, so that a client
    /// refuses an array of wider elements instead of sending its bytes as
    /// several inputs; `--<side>-type` may give the bytes another type.
    Bytes,
    /// Anything else (a struct, `bool`, `long double`): size only.
    Other,
}

/// One memory argument: bytes from its `hls_avalon_agent_memory_argument(N)`
/// and the pointer's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryArg {
    pub bytes: u64,
    pub element: Element,
    /// `sizeof` the element (0 for `void`).
    pub element_size: u64,
}

/// The entry's two memory arguments, in order: input, output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HlsInterface {
    pub input: MemoryArg,
    pub output: MemoryArg,
}

/// Wrapper found as `corefarm/hls.h` by the probe: corefarm's header, then
/// the memory-argument macros redefined to tag parameters.
const PROBE_HEADER: &str = r#"#ifndef COREFARM_HLS_PROBE_H
#define COREFARM_HLS_PROBE_H
#include "cf_hls_real.h"
#include <type_traits>
template <unsigned long long CfN> struct cf_probe_mem {};
#undef hls_avalon_agent_memory_argument
#undef hls_avalon_slave_memory_argument
#define hls_avalon_agent_memory_argument(n) cf_probe_mem<(n)>,
#define hls_avalon_slave_memory_argument(n) cf_probe_mem<(n)>,
#endif
"#;

/// The probe's own part, after the user's source. `what`: 0 tag, 1 pointer,
/// 2 anything else; `kind`: i/u/f integer and float, c char, v void, o other.
const PROBE_REPORT: &str = r#"
namespace cf_probe {
struct cf_arg { unsigned long long cf_what, cf_kind, cf_size, cf_bytes; };
template <class CfT, bool CfV = std::is_void<CfT>::value> struct cf_size_of {
    static constexpr unsigned long long cf_v = sizeof(CfT);
};
template <class CfT> struct cf_size_of<CfT, true> { static constexpr unsigned long long cf_v = 0; };
template <class CfT> constexpr unsigned long long cf_kind_of() {
    typedef typename std::remove_cv<CfT>::type CfU;
    return std::is_same<CfU, char>::value ? 'c'
         : std::is_same<CfU, bool>::value ? 'o'
         : std::is_void<CfU>::value ? 'v'
         : std::is_floating_point<CfU>::value ? 'f'
         : std::is_integral<CfU>::value ? (std::is_signed<CfU>::value ? 'i' : 'u')
         : 'o';
}
template <class CfT> struct cf_desc {
    static constexpr cf_arg cf_v() { return cf_arg{2, 0, 0, 0}; }
};
template <unsigned long long CfN> struct cf_desc<cf_probe_mem<CfN> > {
    static constexpr cf_arg cf_v() { return cf_arg{0, 0, 0, CfN}; }
};
template <class CfT> struct cf_desc<CfT *> {
    static constexpr cf_arg cf_v() { return cf_arg{1, cf_kind_of<CfT>(), cf_size_of<CfT>::cf_v, 0}; }
};
template <class CfF> struct cf_sig;
template <class CfR, class... CfA> struct cf_sig<CfR(CfA...)> {
    static unsigned cf_report(cf_arg *cf_out, unsigned cf_max) {
        const cf_arg cf_all[] = {cf_desc<CfA>::cf_v()..., cf_arg{3, 0, 0, 0}};
        unsigned cf_n = sizeof...(CfA);
        for (unsigned cf_i = 0; cf_i < cf_n && cf_i < cf_max; cf_i++) cf_out[cf_i] = cf_all[cf_i];
        return cf_n;
    }
};
}  // namespace cf_probe
extern "C" __attribute__((visibility("default"))) unsigned cf_probe_report(
    cf_probe::cf_arg *cf_out, unsigned cf_max) {
    return cf_probe::cf_sig<decltype(::CF_PROBE_ENTRY)>::cf_report(cf_out, cf_max);
}
"#;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Arg {
    what: u64,
    kind: u64,
    size: u64,
    bytes: u64,
}

/// Why the sizes could not be read from a source (the build then needs
/// explicit sizes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure(pub String);

fn element(kind: u64, size: u64) -> Element {
    let dtype = match (kind as u8, size) {
        (b'i', 1) => Dtype::Int8,
        (b'i', 2) => Dtype::Int16,
        (b'i', 4) => Dtype::Int32,
        (b'i', 8) => Dtype::Int64,
        (b'u', 1) | (b'c', 1) | (b'v', _) => return Element::Bytes,
        (b'u', 2) => Dtype::Uint16,
        (b'u', 4) => Dtype::Uint32,
        (b'u', 8) => Dtype::Uint64,
        (b'f', 4) => Dtype::Float32,
        (b'f', 8) => Dtype::Float64,
        _ => return Element::Other,
    };
    Element::Typed(dtype)
}

/// Reads the entry's memory arguments from `source` (compiled as C++ with
/// `$CXX`). `Err(ProbeFailure)` says why they are unknown; a missing
/// compiler is a [`ToolchainError`].
pub fn probe_hls(
    source: &Path,
    entry: &str,
) -> Result<Result<HlsInterface, ProbeFailure>, ToolchainError> {
    let fail = |why: String| Ok(Err(ProbeFailure(why)));
    if !(entry.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(ToolchainError::Invalid(format!(
            "entry {entry:?} is not a C identifier"
        )));
    }
    let program = tools::cxx_program();
    tools::require(&program, CXX_HINT)?;
    let source =
        std::fs::canonicalize(source).map_err(io_err(format!("reading {}", source.display())))?;
    let dir = tools::build_dir()?;
    let d = dir.path();
    let include = d.join("include");
    std::fs::create_dir_all(include.join("corefarm"))
        .map_err(io_err("creating the include dir"))?;
    std::fs::write(include.join("cf_hls_real.h"), HLS_HEADER)
        .map_err(io_err("writing the probe header"))?;
    std::fs::write(include.join("corefarm").join("hls.h"), PROBE_HEADER)
        .map_err(io_err("writing the probe header"))?;
    // The source is included by absolute path; a path with a quote or a
    // backslash would need escaping, so such a source simply is not probed.
    let shown = source.display().to_string();
    if shown.contains(['"', '\\', '\n']) {
        return fail(format!("its path {shown:?} cannot be #included"));
    }
    let probe = d.join("probe.cpp");
    let tu = format!("#include \"{shown}\"\n#define CF_PROBE_ENTRY {entry}\n{PROBE_REPORT}");
    std::fs::write(&probe, tu).map_err(io_err("writing the probe"))?;
    let so = d.join("probe.so");
    let mut cmd = Command::new(&program);
    cmd.args(["-x", "c++", "-O0", "-shared", "-fPIC", "-fwrapv", "-w"])
        .arg(format!("-I{}", include.display()))
        .arg(&probe)
        .arg("-o")
        .arg(&so);
    if let Err(e) = tools::run(&program, &mut cmd) {
        let detail = match e {
            ToolchainError::Failed { output, .. } => first_error(&output),
            other => other.to_string(),
        };
        return fail(format!(
            "compiling it with hls_avalon_agent_memory_argument(N) redefined to read N failed \
             ({detail}); a source that also calls its component (a testbench main) cannot be \
             probed: keep the testbench in its own file"
        ));
    }
    let mut args = [Arg::default(); 16];
    // SAFETY: probe.so was just compiled from the user's source (which the
    // builder compiles and loads anyway) and the generated report above;
    // `cf_probe_report` has exactly this signature and writes at most
    // `max` = args.len() records.
    let n = unsafe {
        let lib = match libloading::Library::new(&so) {
            Ok(l) => l,
            Err(e) => return fail(format!("loading the probe: {e}")),
        };
        let report: libloading::Symbol<unsafe extern "C" fn(*mut Arg, u32) -> u32> =
            match lib.get(b"cf_probe_report\0") {
                Ok(f) => f,
                Err(e) => return fail(format!("the probe has no report: {e}")),
            };
        report(args.as_mut_ptr(), args.len() as u32) as usize
    };
    Ok(interface(entry, &args[..n.min(args.len())], n))
}

/// Names the parameter list the probe saw and picks the two memory arguments.
fn interface(entry: &str, args: &[Arg], n: usize) -> Result<HlsInterface, ProbeFailure> {
    let mut mems = Vec::new();
    let mut params = 0;
    let mut i = 0;
    while i < args.len() {
        match args[i].what {
            0 if args.get(i + 1).is_some_and(|p| p.what == 1) => {
                let p = args[i + 1];
                mems.push(MemoryArg {
                    bytes: args[i].bytes,
                    element: element(p.kind, p.size),
                    element_size: p.size,
                });
                i += 2;
            }
            0 => {
                return Err(ProbeFailure(format!(
                    "a hls_avalon_agent_memory_argument of {entry} is not on a pointer parameter"
                )))
            }
            _ => i += 1,
        }
        params += 1;
    }
    match (mems.as_slice(), params, n == args.len()) {
        ([input, output], 2, true) => Ok(HlsInterface {
            input: *input,
            output: *output,
        }),
        _ => Err(ProbeFailure(format!(
            "{entry} has {params} parameter(s), {} of them hls_avalon_agent_memory_argument(N) \
             pointers; a core takes exactly two: input, then output",
            mems.len()
        ))),
    }
}

/// The first compiler error line (the rest is context the user can get by
/// compiling the file).
fn first_error(output: &str) -> String {
    output
        .lines()
        .find(|l| l.contains("error"))
        .unwrap_or_else(|| output.lines().next().unwrap_or(""))
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::write;
    use crate::{require_tool, Tool};

    fn probe(src: &str, entry: &str) -> Result<HlsInterface, ProbeFailure> {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "core.cpp", src);
        probe_hls(&p, entry).unwrap()
    }

    #[test]
    fn sizes_and_element_types_come_from_the_compiler() {
        if !require_tool(Tool::Cxx, "sizes_and_element_types_come_from_the_compiler") {
            return;
        }
        let src = r#"
#include "corefarm/hls.h"
#define N 4127
static constexpr int ROWS = 64;
struct pair { int a, b; };
hls_avalon_agent_component
component void f(hls_avalon_agent_memory_argument(N * sizeof(int16_t)) const int16_t *in,
                 hls_avalon_agent_memory_argument(ROWS * ROWS * 4) int *out) {
    out[0] = in[0];
}
component void g(hls_avalon_agent_memory_argument(3 + 5) uint8_t *in,
                 hls_avalon_agent_memory_argument(sizeof(pair) * 2) pair *out) {}
component void h(hls_avalon_agent_memory_argument(8) double *in,
                 hls_avalon_agent_memory_argument(8) void *out) {}
"#;
        let f = probe(src, "f").unwrap();
        assert_eq!(f.input.bytes, 8254);
        assert_eq!(f.input.element, Element::Typed(Dtype::Int16));
        assert_eq!(f.output.bytes, 16384);
        assert_eq!(f.output.element, Element::Typed(Dtype::Int32));
        let g = probe(src, "g").unwrap();
        assert_eq!((g.input.bytes, g.input.element), (8, Element::Bytes));
        assert_eq!((g.output.bytes, g.output.element), (16, Element::Other));
        let h = probe(src, "h").unwrap();
        assert_eq!(h.input.element, Element::Typed(Dtype::Float64));
        assert_eq!(h.output.element, Element::Bytes);
    }

    #[test]
    fn sources_that_do_not_declare_two_memories_say_why() {
        if !require_tool(
            Tool::Cxx,
            "sources_that_do_not_declare_two_memories_say_why",
        ) {
            return;
        }
        let src = r#"
#include "corefarm/hls.h"
component void plain(const uint8_t *in, uint8_t *out) { out[0] = in[0]; }
component void three(hls_avalon_agent_memory_argument(4) uint8_t *a,
                     hls_avalon_agent_memory_argument(4) uint8_t *b, int n) {}
"#;
        let e = probe(src, "plain").unwrap_err().0;
        assert!(e.contains("2 parameter(s), 0 of them"), "{e}");
        let e = probe(src, "three").unwrap_err().0;
        assert!(e.contains("3 parameter(s), 2 of them"), "{e}");
        // A testbench's call no longer matches the probed signature.
        let with_main = r#"
#include "corefarm/hls.h"
component void f(hls_avalon_agent_memory_argument(4) uint8_t *in,
                 hls_avalon_agent_memory_argument(4) uint8_t *out) {}
int main() { uint8_t x[4]; f(x, x); }
"#;
        let e = probe(with_main, "f").unwrap_err().0;
        assert!(e.contains("testbench"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "core.cpp", src);
        assert!(matches!(
            probe_hls(&p, "f; int x"),
            Err(ToolchainError::Invalid(_))
        ));
    }
}

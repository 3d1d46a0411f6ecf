//! A content-addressed cache of built shared objects, so demos and tests
//! rebuild a core only when its sources, the recipe or the tools change.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::hls::{build_native, HLS_HEADER};
use crate::tools::{self, io_err, ToolchainError};
use crate::verilator::{build_rtl, build_rtl_with, RtlOptions, RTL_CSR, RTL_WRAPPER};
use crate::verilator::{RTL_AXI_LIBRARY, RTL_AXI_WRAPPER};
use corefarm_cores::image::Family;

/// Bumped whenever flags or the build recipe change, so cached objects built
/// by an older recipe are not reused.
const RECIPE_VERSION: &str = "corefarm-toolchain-1";

/// What [`cached_build`] builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildKind {
    /// [`build_native`] of exactly one source.
    Native,
    /// [`build_rtl`] with this top module.
    Rtl { top: String },
    /// An AXI (AMD/Vitis-style) top module with the AXI wrapper.
    RtlAxi { top: String },
}

/// Default cache directory: `$COREFARM_CACHE`, else
/// `$XDG_CACHE_HOME/corefarm`, else `~/.cache/corefarm`, else a directory
/// under the system temp dir.
pub fn default_cache_dir() -> PathBuf {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = non_empty("COREFARM_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = non_empty("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("corefarm");
    }
    if let Some(home) = non_empty("HOME") {
        return PathBuf::from(home).join(".cache").join("corefarm");
    }
    std::env::temp_dir().join("corefarm-cache")
}

fn tool_versions(kind: &BuildKind) -> String {
    static CXX: OnceLock<String> = OnceLock::new();
    static CC: OnceLock<String> = OnceLock::new();
    static VERILATOR: OnceLock<String> = OnceLock::new();
    let version = |p: String| tools::tool_version(&p).unwrap_or_default();
    let cxx = CXX.get_or_init(|| version(tools::cxx_program()));
    match kind {
        BuildKind::Native => {
            let cc = CC.get_or_init(|| version(tools::cc_program()));
            format!("{cxx}\n{cc}")
        }
        BuildKind::Rtl { .. } | BuildKind::RtlAxi { .. } => {
            let v = VERILATOR.get_or_init(|| version(tools::verilator_program()));
            format!("{cxx}\n{v}")
        }
    }
}

/// The cache key of a build: SHA-256 over the recipe version, the kind (and
/// top module), `extra_key` (e.g. the entry symbol), the tool versions, the
/// embedded header/wrapper and every source's name and contents.
pub fn cache_key(
    kind: &BuildKind,
    sources: &[PathBuf],
    extra_key: &str,
) -> Result<String, ToolchainError> {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        // Length-prefixed fields: concatenations cannot collide.
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(RECIPE_VERSION.as_bytes());
    match kind {
        BuildKind::Native => {
            field(b"native");
            field(HLS_HEADER.as_bytes());
        }
        BuildKind::Rtl { top } => {
            field(b"rtl");
            field(top.as_bytes());
            field(RTL_WRAPPER.as_bytes());
            field(RTL_CSR.as_bytes());
        }
        BuildKind::RtlAxi { top } => {
            field(b"rtl-axi");
            field(top.as_bytes());
            field(RTL_AXI_WRAPPER.as_bytes());
            for (name, text) in RTL_AXI_LIBRARY {
                field(name.as_bytes());
                field(text.as_bytes());
            }
        }
    }
    field(extra_key.as_bytes());
    field(tool_versions(kind).as_bytes());
    for s in sources {
        let name = s.file_name().map(|n| n.to_string_lossy().into_owned());
        field(name.unwrap_or_default().as_bytes());
        let mut content = Vec::new();
        std::fs::File::open(s)
            .and_then(|mut f| f.read_to_end(&mut content))
            .map_err(io_err(format!("reading {}", s.display())))?;
        field(&content);
    }
    Ok(hex::encode(h.finalize()))
}

/// Builds `sources` as `kind` unless an identical build (same
/// [`cache_key`]) is already in `cache_dir`, and returns the shared
/// object's path there. Concurrent callers may build the same key twice; the
/// results are identical and each lands atomically.
pub fn cached_build(
    kind: &BuildKind,
    sources: &[PathBuf],
    extra_key: &str,
    cache_dir: &Path,
) -> Result<PathBuf, ToolchainError> {
    let key = cache_key(kind, sources, extra_key)?;
    let (prefix, mut name) = match kind {
        BuildKind::Native => ("native", String::new()),
        BuildKind::Rtl { top } => ("rtl", top.clone()),
        BuildKind::RtlAxi { top } => ("rtl-axi", top.clone()),
    };
    if name.is_empty() {
        name = sources
            .first()
            .and_then(|s| s.file_stem())
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
    }
    name.retain(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let mut file = format!("{prefix}-");
    if !name.is_empty() {
        let _ = write!(file, "{name}-");
    }
    file.push_str(&key[..32]);
    file.push_str(".so");
    let path = cache_dir.join(file);
    if path.is_file() {
        return Ok(path);
    }
    match kind {
        BuildKind::Native => {
            let [source] = sources else {
                return Err(ToolchainError::Invalid(format!(
                    "a native build takes exactly one source, got {}",
                    sources.len()
                )));
            };
            build_native(source, &path)?;
        }
        BuildKind::Rtl { top } => build_rtl(sources, top, &path)?,
        BuildKind::RtlAxi { top } => {
            let opts = RtlOptions {
                family: Family::Amd,
                ..RtlOptions::default()
            };
            build_rtl_with(sources, top, &path, opts)?;
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::write;

    #[test]
    fn cache_key_tracks_sources_and_kind() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a.v", "module a; endmodule\n");
        let rtl = |top: &str| BuildKind::Rtl { top: top.into() };
        let key = |kind: &BuildKind, extra: &str| {
            cache_key(kind, std::slice::from_ref(&a), extra).unwrap()
        };
        let k1 = key(&rtl("a"), "");
        assert_eq!(k1, key(&rtl("a"), ""));
        assert_ne!(k1, key(&rtl("b"), ""));
        assert_ne!(k1, key(&rtl("a"), "x"));
        assert_ne!(k1, key(&BuildKind::Native, ""));
        std::fs::write(&a, "module a; wire w; endmodule\n").unwrap();
        assert_ne!(k1, key(&rtl("a"), ""));
    }

    #[test]
    fn a_native_build_takes_one_source() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(dir.path(), "a.c", "");
        let e = cached_build(&BuildKind::Native, &[a.clone(), a], "", dir.path()).unwrap_err();
        assert!(matches!(e, ToolchainError::Invalid(_)), "{e}");
    }
}

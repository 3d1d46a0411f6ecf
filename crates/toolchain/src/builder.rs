//! Writing configuration images (the format corefarm_cores::image reads,
//! docs/images.md) and building one from sources (`corefarm image build`).

use std::path::{Path, PathBuf};

use corefarm_cores::image::{self, ArtifactEntry, Manifest, HEADER_LEN, MAGIC, MAX_MANIFEST};
use corefarm_cores::image::{ArtifactKind, ImageError, VERSION};
use corefarm_cores::native::NativeLib;
use corefarm_smp::CoreInfo;
use sha2::{Digest, Sha256};

use crate::tools::ToolchainError;

/// Artifacts to put in a new image.
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    name: String,
    input_size: u32,
    output_size: u32,
    cores: Vec<CoreInfo>,
    artifacts: Vec<(String, ArtifactKind, String, Vec<u8>)>,
}

impl ImageBuilder {
    pub fn new(
        name: impl Into<String>,
        input_size: u32,
        output_size: u32,
        cores: Vec<CoreInfo>,
    ) -> Self {
        ImageBuilder {
            name: name.into(),
            input_size,
            output_size,
            cores,
            artifacts: Vec::new(),
        }
    }

    pub fn artifact(
        mut self,
        target: impl Into<String>,
        kind: ArtifactKind,
        entry: impl Into<String>,
        bytes: Vec<u8>,
    ) -> Self {
        self.artifacts
            .push((target.into(), kind, entry.into(), bytes));
        self
    }

    /// Serialises the image: header, manifest, artifacts back to back.
    pub fn build(self) -> Result<Vec<u8>, ImageError> {
        if self.input_size == 0 {
            return Err(ImageError::Build(
                "input size must be at least 1 byte".into(),
            ));
        }
        if self.cores.is_empty() {
            return Err(ImageError::Build("an image needs at least one core".into()));
        }
        if self.artifacts.is_empty() {
            return Err(ImageError::Build(
                "an image needs at least one artifact".into(),
            ));
        }
        let mut offset = 0u64;
        let mut entries = Vec::with_capacity(self.artifacts.len());
        for (target, kind, entry, bytes) in &self.artifacts {
            entries.push(ArtifactEntry {
                target: target.clone(),
                kind: *kind,
                entry: entry.clone(),
                offset,
                length: bytes.len() as u64,
                sha256: hex::encode(Sha256::digest(bytes)),
            });
            offset += bytes.len() as u64;
        }
        let manifest = Manifest {
            name: self.name,
            input_size: self.input_size,
            output_size: self.output_size,
            cores: self.cores,
            artifacts: entries,
        };
        let json = serde_json::to_vec(&manifest).map_err(|e| ImageError::Build(e.to_string()))?;
        let mlen = u32::try_from(json.len())
            .ok()
            .filter(|&l| l <= MAX_MANIFEST)
            .ok_or_else(|| ImageError::Build("manifest too large".into()))?;
        let mut out = Vec::with_capacity(HEADER_LEN + json.len() + offset as usize);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&mlen.to_le_bytes());
        out.extend_from_slice(&json);
        for (_, _, _, bytes) in &self.artifacts {
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Toolchain(#[from] ToolchainError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("{0}")]
    Io(String),
}

/// What to put in a new image (`corefarm image build`).
#[derive(Debug, Clone, Default)]
pub struct BuildSpec {
    pub name: String,
    pub input_size: u32,
    pub output_size: u32,
    /// Number of cores for the default core table (ignored with `core_table`).
    pub cores: u32,
    /// Explicit core table instead of the default one.
    pub core_table: Option<Vec<CoreInfo>>,
    /// HLS C/C++ source and its component (entry) function → native artifact.
    pub hls: Option<(PathBuf, String)>,
    /// Verilog sources and top module → RTL simulation artifact.
    pub verilog: Option<(Vec<PathBuf>, String)>,
    /// Cyclone V raw binary file → `fpga-cyclonev` artifact.
    pub rbf: Option<PathBuf>,
}

/// Builds every artifact the spec names (compiling HLS C++ natively and
/// Verilog with Verilator for this machine) and packs them into one image.
pub fn build_image(spec: &BuildSpec) -> Result<Vec<u8>, BuildError> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        BuildError::Io(format!("{what} {}: {e}", p.display()))
    };
    let table = match &spec.core_table {
        Some(t) => t.clone(),
        None => image::default_core_table(spec.cores, spec.input_size, spec.output_size)?,
    };
    let mut b = ImageBuilder::new(&spec.name, spec.input_size, spec.output_size, table);
    let dir =
        tempfile::tempdir().map_err(|e| BuildError::Io(format!("temporary directory: {e}")))?;
    let no_target = || {
        BuildError::Io(format!(
            "no native target for architecture {}",
            std::env::consts::ARCH
        ))
    };
    if let Some((source, entry)) = &spec.hls {
        let so = dir.path().join("native.so");
        crate::build_native(source, &so)?;
        // Catch a wrong --entry now rather than on every node at configuration time.
        NativeLib::open(&so, entry)
            .map_err(|e| BuildError::Io(format!("{}: {e}", source.display())))?;
        let bytes = std::fs::read(&so).map_err(|e| io("reading", &so, e))?;
        b = b.artifact(
            image::native_target().ok_or_else(no_target)?,
            ArtifactKind::Native,
            entry,
            bytes,
        );
    }
    if let Some((sources, top)) = &spec.verilog {
        let so = dir.path().join("rtl.so");
        crate::build_rtl(sources, top, &so)?;
        let bytes = std::fs::read(&so).map_err(|e| io("reading", &so, e))?;
        b = b.artifact(
            image::rtl_target().ok_or_else(no_target)?,
            ArtifactKind::Rtl,
            top,
            bytes,
        );
    }
    if let Some(rbf) = &spec.rbf {
        let bytes = std::fs::read(rbf).map_err(|e| io("reading", rbf, e))?;
        b = b.artifact(image::FPGA_TARGET, ArtifactKind::Bitstream, "", bytes);
    }
    Ok(b.build()?)
}

/// Compiles an HLS C/C++ `source` into a native soft core and wraps it in an
/// image with the default core table for `cores` cores.
pub fn build_native_image(
    source: &Path,
    entry: &str,
    cores: u32,
    input_size: u32,
    output_size: u32,
    name: &str,
) -> Result<Vec<u8>, BuildError> {
    build_image(&BuildSpec {
        name: name.into(),
        input_size,
        output_size,
        cores,
        hls: Some((source.to_path_buf(), entry.into())),
        ..BuildSpec::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<CoreInfo> {
        image::default_core_table(1, 16, 16).unwrap()
    }

    #[test]
    fn incomplete_images_are_refused() {
        let art = |b: ImageBuilder| b.artifact("t", ArtifactKind::Bitstream, "", vec![1]);
        for (b, why) in [
            (art(ImageBuilder::new("x", 0, 16, table())), "input size"),
            (art(ImageBuilder::new("x", 16, 16, vec![])), "core"),
            (ImageBuilder::new("x", 16, 16, table()), "artifact"),
        ] {
            let e = b.build().unwrap_err();
            assert!(matches!(&e, ImageError::Build(m) if m.contains(why)), "{e}");
        }
    }

    #[test]
    fn a_spec_without_sources_or_with_a_missing_file_is_an_error() {
        let spec = BuildSpec {
            name: "x".into(),
            input_size: 16,
            output_size: 16,
            cores: 1,
            ..BuildSpec::default()
        };
        assert!(matches!(build_image(&spec), Err(BuildError::Image(_))));
        let spec = BuildSpec {
            rbf: Some("/nonexistent/x.rbf".into()),
            ..spec
        };
        let e = build_image(&spec).unwrap_err();
        assert!(e.to_string().contains("x.rbf"), "{e}");
    }
}

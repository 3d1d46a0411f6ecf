//! Writing configuration images (the format corefarm_cores::image reads,
//! docs/images.md) and building one from sources (`corefarm image build`).

use std::path::{Path, PathBuf};

use corefarm_cores::image::{self, ArtifactEntry, Manifest, HEADER_LEN, MAGIC, MAX_MANIFEST};
use corefarm_cores::image::{ArtifactKind, Control, DataType, Family, ImageError, VERSION};
use corefarm_cores::native::NativeLib;
use corefarm_cores::spin::HandlerSet;
use corefarm_smp::CoreInfo;
use sha2::{Digest, Sha256};

use corefarm_cores::image::Image;

use crate::hls_probe::{probe_hls, Element, MemoryArg};
use crate::rtl_probe::{probe_memories, top_parameters, MemoryProbe};
use crate::sizes::{decide, Side, SizeError};
use crate::tools::ToolchainError;
use crate::verilator::RtlOptions;

/// Artifacts to put in a new image.
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    name: String,
    input_size: u32,
    output_size: u32,
    types: (Option<DataType>, Option<DataType>),
    cores: Vec<CoreInfo>,
    artifacts: Vec<Pending>,
    handler_sets: Vec<HandlerSet>,
}

/// An artifact waiting to be packed.
#[derive(Debug, Clone)]
struct Pending {
    target: String,
    kind: ArtifactKind,
    entry: String,
    family: Family,
    control: Option<Control>,
    bytes: Vec<u8>,
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
            types: (None, None),
            cores,
            artifacts: Vec::new(),
            handler_sets: Vec::new(),
        }
    }

    /// Records the element type and shape of one input and one output
    /// (checked against the sizes by [`ImageBuilder::build`]).
    pub fn types(mut self, input: Option<DataType>, output: Option<DataType>) -> Self {
        self.types = (input, output);
        self
    }

    /// Streaming handler sets (their code goes in a `spin-<arch>-linux`
    /// artifact, see [`crate::build_handlers_for`]).
    pub fn handler_sets(mut self, sets: Vec<HandlerSet>) -> Self {
        self.handler_sets = sets;
        self
    }

    pub fn artifact(
        self,
        target: impl Into<String>,
        kind: ArtifactKind,
        entry: impl Into<String>,
        bytes: Vec<u8>,
    ) -> Self {
        self.artifact_for(target, kind, entry, Family::Intel, None, bytes)
    }

    /// An artifact of `family` driven through `control` (`None`: the
    /// Avalon CSR of an Intel-style core).
    pub fn artifact_for(
        mut self,
        target: impl Into<String>,
        kind: ArtifactKind,
        entry: impl Into<String>,
        family: Family,
        control: Option<Control>,
        bytes: Vec<u8>,
    ) -> Self {
        self.artifacts.push(Pending {
            target: target.into(),
            kind,
            entry: entry.into(),
            family,
            control,
            bytes,
        });
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
        for a in &self.artifacts {
            entries.push(ArtifactEntry {
                target: a.target.clone(),
                kind: a.kind,
                entry: a.entry.clone(),
                offset,
                length: a.bytes.len() as u64,
                sha256: hex::encode(Sha256::digest(&a.bytes)),
                family: a.family,
                control: a.control.clone(),
            });
            offset += a.bytes.len() as u64;
        }
        let manifest = Manifest {
            name: self.name,
            input_size: self.input_size,
            output_size: self.output_size,
            input_type: self.types.0,
            output_type: self.types.1,
            cores: self.cores,
            artifacts: entries,
            handler_sets: self.handler_sets,
        };
        manifest
            .check()
            .map_err(|e| ImageError::Build(e.to_string()))?;
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
        for a in &self.artifacts {
            out.extend_from_slice(&a.bytes);
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
    /// The sizes or types the flags and sources state disagree or are unknown.
    #[error(transparent)]
    Sizes(#[from] SizeError),
}

/// What to put in a new image (`corefarm image build`).
#[derive(Debug, Clone, Default)]
pub struct BuildSpec {
    pub name: String,
    /// Bytes of one input; `None`: from the sources (every statement of it,
    /// here and in the sources, must agree).
    pub input_size: Option<u32>,
    /// Bytes of one output; `None`: from the sources.
    pub output_size: Option<u32>,
    /// Element type and shape of one input (recorded in the manifest; its
    /// byte count must equal the input size).
    pub input_type: Option<DataType>,
    /// Element type and shape of one output.
    pub output_type: Option<DataType>,
    /// Number of cores for the default core table (ignored with `core_table`).
    pub cores: u32,
    /// Explicit core table instead of the default one.
    pub core_table: Option<Vec<CoreInfo>>,
    /// HLS C/C++ source and its component (entry) function → native artifact.
    pub hls: Option<(PathBuf, String)>,
    /// Architectures of the native artifacts (names of [`crate::ARCHES`]);
    /// empty: this machine's only. Each becomes a `native-<arch>-linux`
    /// artifact, so one image serves x86 hosts and ARM boards alike.
    pub arches: Vec<String>,
    /// Verilog sources and top module → RTL simulation artifact.
    pub verilog: Option<(Vec<PathBuf>, String)>,
    /// Cyclone V raw binary file → `fpga-cyclonev` artifact.
    pub rbf: Option<PathBuf>,
    /// Verilator's warnings fail the build.
    pub strict: bool,
    /// Streaming handler sets (docs/streams.md) and the C sources of
    /// their functions, compiled into `spin-<arch>-linux` artifacts for
    /// the same architectures as the native ones.
    pub handler_sets: Vec<HandlerSet>,
    pub handler_sources: Vec<PathBuf>,
    /// The vendor flow of the HLS source and the Verilog: Intel (Avalon
    /// agent, `hls_avalon_agent_memory_argument`s) or AMD (a Vitis HLS top
    /// function with `m_axi` pointers; its Verilog an AXI core). An AMD
    /// build reads the core's arguments from the C++ source.
    pub family: Family,
    /// AMD: values of the top function's scalar arguments, fixed in the
    /// manifest; the scalars not named here come from each job's input.
    pub scalars: Vec<(String, u32)>,
}

/// A built image and what the build has to say about it.
#[derive(Debug, Clone)]
pub struct Built {
    pub image: Vec<u8>,
    pub manifest: Manifest,
    /// Where the sizes and types came from, one line per side.
    pub notes: Vec<String>,
    /// Verilator's warnings, and checks that could not be made.
    pub warnings: Vec<String>,
}

/// Builds every artifact the spec names (compiling HLS C++ natively and
/// Verilog with Verilator for this machine) and packs them into one image.
///
/// Sizes: the HLS entry's `hls_avalon_agent_memory_argument(N)`s (evaluated
/// by the compiler), the Verilog top module's `INPUT_SIZE`/`OUTPUT_SIZE`
/// parameters, `input_size`/`output_size` and the types' byte counts must
/// all agree; whichever are present decide. The Verilog memories are then
/// probed through the built object's bus and must hold the sizes.
pub fn build_image(spec: &BuildSpec) -> Result<Built, BuildError> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        BuildError::Io(format!("{what} {}: {e}", p.display()))
    };
    if spec.hls.is_none() && spec.verilog.is_none() && spec.rbf.is_none() {
        return Err(ImageError::Build("an image needs at least one artifact".into()).into());
    }
    let dir =
        tempfile::tempdir().map_err(|e| BuildError::Io(format!("temporary directory: {e}")))?;
    let no_target = || {
        BuildError::Io(format!(
            "no native target for architecture {}",
            std::env::consts::ARCH
        ))
    };
    let mut input = Side {
        name: "input",
        flag_size: spec.input_size,
        flag_type: spec.input_type.clone(),
        ..Side::default()
    };
    let mut output = Side {
        name: "output",
        flag_size: spec.output_size,
        flag_type: spec.output_type.clone(),
        ..Side::default()
    };
    let mut warnings = Vec::new();
    let mut artifacts: Vec<Pending> = Vec::new();
    let amd = spec.family == Family::Amd;
    if amd && spec.rbf.is_some() {
        return Err(ImageError::Build(
            "a Cyclone V bitstream is an Intel-family artifact (--family intel)".into(),
        )
        .into());
    }
    // AMD: the Vitis top function's interface, which the native shim, the
    // sizes and every artifact's argument list come from.
    let vitis =
        match (&spec.hls, amd) {
            (Some((source, entry)), true) => {
                let text = std::fs::read_to_string(source).map_err(|e| io("reading", source, e))?;
                let iface = crate::vitis::parse_interface(&text, entry, &spec.scalars)
                    .map_err(|e| BuildError::Io(format!("{}: {e}", source.display())))?;
                let shim = dir.path().join("cf_vitis_shim.cpp");
                let abs = std::path::absolute(source).map_err(|e| io("resolving", source, e))?;
                std::fs::write(&shim, iface.shim(&abs)).map_err(|e| io("writing", &shim, e))?;
                Some((iface, shim))
            }
            (None, true) => return Err(ImageError::Build(
                "an AMD-family core's arguments come from its Vitis C++ top function: give --hls"
                    .into(),
            )
            .into()),
            _ => None,
        };
    let control = vitis.as_ref().map(|(i, _)| Control::ap_ctrl_hs(i.args()));
    let family = spec.family;

    if let Some((source, entry)) = &spec.hls {
        let so = dir.path().join("native.so");
        let (compiled, symbol) = match &vitis {
            Some((iface, shim)) => (shim.as_path(), iface.shim_symbol()),
            None => (source.as_path(), entry.clone()),
        };
        crate::build_native(compiled, &so)?;
        // Catch a wrong --entry now rather than on every node at configuration time.
        NativeLib::open(&so, &symbol)
            .map_err(|e| BuildError::Io(format!("{}: {e}", source.display())))?;
        let probed = match &vitis {
            Some((iface, _)) => {
                let (i, o) = Control::ap_ctrl_hs(iface.args()).sizes();
                let at = format!("the arguments of {entry} in {}", source.display());
                // Several buffers (and scalars) per side: sizes, no one type.
                let mem = |bytes: u64| MemoryArg {
                    bytes,
                    element: Element::Other,
                    element_size: 0,
                };
                input.hls = Some((at.clone(), mem(i)));
                output.hls = Some((at, mem(o)));
                None
            }
            None => Some(probe_hls(source, entry)?),
        };
        match probed {
            None => {}
            Some(Ok(iface)) => {
                let at = |n: &str| format!("the {n} argument of {entry} in {}", source.display());
                input.hls = Some((at("first"), iface.input));
                output.hls = Some((at("second"), iface.output));
            }
            Some(Err(why)) => {
                let why = format!("{}: {}", source.display(), why.0);
                input.unknown.push(why.clone());
                output.unknown.push(why);
            }
        }
        let host = image::host_arch().ok_or_else(no_target)?;
        let arches: Vec<&str> = if spec.arches.is_empty() {
            vec![host]
        } else {
            spec.arches.iter().map(String::as_str).collect()
        };
        for (i, arch) in arches.iter().enumerate() {
            if arches[..i].contains(arch) {
                continue;
            }
            // The host build above checked the entry; a cross build is only
            // compiled (this machine cannot load it).
            let so = if *arch == host {
                so.clone()
            } else {
                let cross = dir.path().join(format!("native-{arch}.so"));
                crate::build_native_for(compiled, &cross, Some(arch))?;
                cross
            };
            let bytes = std::fs::read(&so).map_err(|e| io("reading", &so, e))?;
            artifacts.push(Pending {
                target: format!("native-{arch}-linux"),
                kind: ArtifactKind::Native,
                entry: symbol.clone(),
                family,
                control: control.clone(),
                bytes,
            });
        }
    }
    // An AXI core's sizes are its arguments', stated by the C++ source.
    if let Some((sources, top)) = spec.verilog.as_ref().filter(|_| !amd) {
        let params = top_parameters(sources, top)?;
        for (side, param) in [(&mut input, "INPUT_SIZE"), (&mut output, "OUTPUT_SIZE")] {
            match params.get(param) {
                Some(&n) => side.verilog = Some((format!("parameter {param} of module {top}"), n)),
                None => side.unknown.push(format!(
                    "the Verilog top module {top} declares no {param} parameter"
                )),
            }
        }
    }
    if spec.rbf.is_some() {
        for side in [&mut input, &mut output] {
            side.unknown.push("a bitstream does not state it".into());
        }
    }
    let input = decide(&input)?;
    let output = decide(&output)?;

    if let Some((sources, top)) = &spec.verilog {
        let so = dir.path().join("rtl.so");
        let opts = RtlOptions {
            strict: spec.strict,
            family,
        };
        let built = crate::build_rtl_with(sources, top, &so, opts)?;
        warnings.extend(built.warnings);
        // The memory probe speaks the Avalon agents; an AXI core has none.
        if !amd {
            check_memories(&so, top, input.size, output.size, &mut warnings)?;
        }
        let bytes = std::fs::read(&so).map_err(|e| io("reading", &so, e))?;
        artifacts.push(Pending {
            target: image::rtl_target().ok_or_else(no_target)?,
            kind: ArtifactKind::Rtl,
            entry: top.clone(),
            family,
            control: control.clone(),
            bytes,
        });
    }
    if let Some(rbf) = &spec.rbf {
        let bytes = std::fs::read(rbf).map_err(|e| io("reading", rbf, e))?;
        artifacts.push(Pending {
            target: image::FPGA_TARGET.into(),
            kind: ArtifactKind::Bitstream,
            entry: String::new(),
            family,
            control: None,
            bytes,
        });
    }

    if !spec.handler_sets.is_empty() || !spec.handler_sources.is_empty() {
        handler_artifacts(spec, dir.path(), &mut artifacts)?;
    }
    let table = match &spec.core_table {
        Some(t) => t.clone(),
        None => image::default_core_table(spec.cores, input.size, output.size)?,
    };
    let mut b = ImageBuilder::new(&spec.name, input.size, output.size, table)
        .types(input.dtype.clone(), output.dtype.clone())
        .handler_sets(spec.handler_sets.clone());
    for a in artifacts {
        b = b.artifact_for(a.target, a.kind, a.entry, a.family, a.control, a.bytes);
    }
    let image = b.build()?;
    let manifest = Image::parse(image.clone().into())?.manifest;
    Ok(Built {
        image,
        manifest,
        notes: vec![input.note, output.note],
        warnings,
    })
}

/// Combines images of one function into one that carries all their
/// artifacts (`corefarm image merge`), e.g. an Intel-style and an AMD-style
/// build: each node then runs the artifact it supports. The images must
/// agree on the sizes, the types they state, the core table and the
/// handler sets, and no target may appear twice for one family. Signatures
/// are not carried over (sign the merged image).
pub fn merge_images(images: &[Vec<u8>]) -> Result<Vec<u8>, ImageError> {
    let parsed = images
        .iter()
        .map(|b| Image::parse(b.clone().into()))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(first) = parsed.first() else {
        return Err(ImageError::Build("no images to merge".into()));
    };
    let m0 = &first.manifest;
    let mut types = (m0.input_type.clone(), m0.output_type.clone());
    let mut seen: Vec<(String, Family)> = Vec::new();
    let mut b = ImageBuilder::new(&m0.name, m0.input_size, m0.output_size, m0.cores.clone())
        .handler_sets(m0.handler_sets.clone());
    for (i, img) in parsed.iter().enumerate() {
        let m = &img.manifest;
        let differs = |what: &str| {
            ImageError::Build(format!(
                "image {i} ({:?}) differs from image 0 ({:?}) in its {what}",
                m.name, m0.name
            ))
        };
        if (m.input_size, m.output_size) != (m0.input_size, m0.output_size) {
            return Err(differs("input/output sizes"));
        }
        if m.cores != m0.cores {
            return Err(differs("core table"));
        }
        if m.handler_sets != m0.handler_sets {
            return Err(differs("handler sets"));
        }
        for (mine, theirs) in [
            (&mut types.0, &m.input_type),
            (&mut types.1, &m.output_type),
        ] {
            match (&*mine, theirs) {
                (Some(a), Some(b)) if a != b => return Err(differs("types")),
                (None, Some(b)) => *mine = Some(b.clone()),
                _ => {}
            }
        }
        for (k, a) in m.artifacts.iter().enumerate() {
            if seen.contains(&(a.target.clone(), a.family)) {
                return Err(ImageError::Build(format!(
                    "two {} artifacts for {} (image {i})",
                    a.family, a.target
                )));
            }
            seen.push((a.target.clone(), a.family));
            let bytes = img.verified_artifact(k)?;
            b = b.artifact_for(
                &a.target,
                a.kind,
                &a.entry,
                a.family,
                a.control.clone(),
                bytes.to_vec(),
            );
        }
    }
    b.types(types.0, types.1).build()
}

/// Compiles the handler sources for each architecture and checks, on this
/// machine's build, that every handler set's functions exist.
fn handler_artifacts(
    spec: &BuildSpec,
    dir: &Path,
    artifacts: &mut Vec<Pending>,
) -> Result<(), BuildError> {
    if spec.handler_sets.is_empty() {
        return Err(ImageError::Build("handler sources but no handler sets".into()).into());
    }
    corefarm_cores::spin::manifest::check(&spec.handler_sets)
        .map_err(|e| ImageError::Build(e.to_string()))?;
    let host = image::host_arch()
        .ok_or_else(|| BuildError::Io(format!("no target for {}", std::env::consts::ARCH)))?;
    let so = dir.join("spin.so");
    crate::build_handlers_for(&spec.handler_sources, &so, None)?;
    for s in &spec.handler_sets {
        corefarm_cores::spin::NativeHandlers::open(&so, &s.name)
            .map_err(|e| ImageError::Build(format!("handler set {:?}: {e}", s.name)))?;
    }
    let mut arches: Vec<&str> = spec.arches.iter().map(String::as_str).collect();
    if arches.is_empty() {
        arches.push(host);
    }
    for (i, arch) in arches.iter().enumerate() {
        if arches[..i].contains(arch) {
            continue;
        }
        let built = if *arch == host {
            so.clone()
        } else {
            let cross = dir.join(format!("spin-{arch}.so"));
            crate::build_handlers_for(&spec.handler_sources, &cross, Some(arch))?;
            cross
        };
        let bytes = std::fs::read(&built)
            .map_err(|e| BuildError::Io(format!("reading {}: {e}", built.display())))?;
        artifacts.push(Pending {
            target: format!("spin-{arch}-linux"),
            kind: ArtifactKind::Native,
            entry: String::new(),
            family: Family::Intel,
            control: None,
            bytes,
        });
    }
    Ok(())
}

/// The RTL memories must hold the decided sizes (in whole 64-bit words).
fn check_memories(
    so: &Path,
    top: &str,
    input: u32,
    output: u32,
    warnings: &mut Vec<String>,
) -> Result<(), BuildError> {
    let words = |n: u32| u64::from(n).div_ceil(8);
    let found = probe_memories(so, [words(input), words(output)])
        .map_err(|e| BuildError::Io(format!("loading the RTL build of {top}: {e}")))?;
    for ((name, size), probe) in [("input", input), ("output", output)]
        .into_iter()
        .zip(found)
    {
        let need = words(size);
        match probe {
            MemoryProbe::Words(w) if w == need => {}
            MemoryProbe::Words(words) => {
                return Err(SizeError::Memory {
                    side: name,
                    size,
                    need,
                    top: top.to_string(),
                    words,
                }
                .into())
            }
            MemoryProbe::NotWritable if size == 0 => {}
            MemoryProbe::NotWritable => warnings.push(format!(
                "the {name} size was not checked against {top}: word 0 of its {name} memory \
                 does not keep a value written through the bus"
            )),
            MemoryProbe::AtLeast(w) => warnings.push(format!(
                "the {name} size was not checked against {top}: its {name} memory answers at \
                 every word probed (at least {w}); reads beyond a memory must return 0"
            )),
        }
    }
    Ok(())
}

/// Compiles an HLS C/C++ `source` into a native soft core and wraps it in an
/// image with the default core table for `cores` cores. The sizes must
/// agree with the source's memory arguments.
pub fn build_native_image(
    source: &Path,
    entry: &str,
    cores: u32,
    input_size: u32,
    output_size: u32,
    name: &str,
) -> Result<Vec<u8>, BuildError> {
    let built = build_image(&BuildSpec {
        name: name.into(),
        input_size: Some(input_size),
        output_size: Some(output_size),
        cores,
        hls: Some((source.to_path_buf(), entry.into())),
        ..BuildSpec::default()
    })?;
    Ok(built.image)
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
            input_size: Some(16),
            output_size: Some(16),
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

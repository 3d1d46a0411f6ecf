//! Configuration images: the container corefarm carries in the bitstream
//! field of an SMP configuration message (docs/interfaces.md, docs/images.md).
//!
//! ```text
//! 0   8  magic "CFIMAGE\0"
//! 8   4  u32 LE format version (1)
//! 12  4  u32 LE manifest length M
//! 16  M  manifest, UTF-8 JSON
//! 16+M   artifact bytes; artifact offsets are relative to 16+M
//! ```
//!
//! Parsing is check-then-parse on untrusted bytes: every offset and length is
//! checked against the bytes present, so a hostile image yields an error.

use bytes::Bytes;
use corefarm_smp::{Configuration, CoreInfo};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const MAGIC: &[u8; 8] = b"CFIMAGE\0";
pub const VERSION: u32 = 1;
/// Bytes before the manifest: magic, version, manifest length.
pub const HEADER_LEN: usize = 16;
/// Target name of Cyclone V SoC bitstreams (raw binary file, RBF).
pub const FPGA_TARGET: &str = "fpga-cyclonev";
/// Base of the HPS-to-FPGA bridge window, where default core tables start.
pub const DEFAULT_BASE: u32 = corefarm_smp::DEFAULT_CORE_BASE;
/// Upper bound on the manifest: it only holds a core table and a few
/// artifact records, so anything bigger is garbage, not a configuration.
pub const MAX_MANIFEST: u32 = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ImageError {
    #[error("not a corefarm image (no CFIMAGE magic)")]
    NoMagic,
    #[error("image is truncated: {0}")]
    Truncated(String),
    #[error("image format version {0} is not supported (this build reads version {VERSION})")]
    Version(u32),
    #[error("image manifest is invalid: {0}")]
    Manifest(String),
    #[error("artifact {index} ({target}) lies outside the image: offset {offset} + length {length} > {available} artifact bytes")]
    OutOfBounds {
        index: usize,
        target: String,
        offset: u64,
        length: u64,
        available: u64,
    },
    #[error("artifact {index} ({target}) fails its checksum: manifest says sha256 {expected}, content hashes to {actual}")]
    Checksum {
        index: usize,
        target: String,
        expected: String,
        actual: String,
    },
    #[error("{0}")]
    Build(String),
    #[error("image signature: {0}")]
    Signature(crate::signature::SignatureError),
}

/// What an artifact is, which decides the backend that can run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArtifactKind {
    /// Shared object exporting `void entry(const uint8_t*, uint8_t*)`.
    Native,
    /// Verilator-built shared object implementing the RTL simulation ABI.
    Rtl,
    /// Raw FPGA bitstream (Cyclone V RBF).
    Bitstream,
}

impl ArtifactKind {
    pub fn name(self) -> &'static str {
        match self {
            ArtifactKind::Native => "native",
            ArtifactKind::Rtl => "rtl",
            ArtifactKind::Bitstream => "bitstream",
        }
    }
}

/// One artifact record of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactEntry {
    pub target: String,
    pub kind: ArtifactKind,
    /// Native: the C symbol to call; RTL: the top module; bitstream: empty.
    #[serde(default)]
    pub entry: String,
    pub offset: u64,
    pub length: u64,
    /// Lower-case hex SHA-256 of the artifact bytes.
    pub sha256: String,
    /// Whose flow the core follows; absent in the JSON means Intel.
    #[serde(default, skip_serializing_if = "Family::is_intel")]
    pub family: Family,
    /// How the node drives the core and where its data goes; absent means
    /// the Avalon CSR of table 3.1 with the core's own input and output
    /// memories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<Control>,
}

/// The FPGA vendor flow a core was written for. It decides the core's
/// interfaces (and so which artifact a node runs), never the result: an
/// image may carry the same function in both styles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Intel HLS / Platform Designer: Avalon agent, memories inside the core.
    #[default]
    Intel,
    /// AMD Vitis HLS: AXI4-Lite `s_axi_control`, `m_axi` pointers into host memory.
    Amd,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Intel, Family::Amd];

    pub fn name(self) -> &'static str {
        match self {
            Family::Intel => "intel",
            Family::Amd => "amd",
        }
    }

    fn is_intel(&self) -> bool {
        *self == Family::Intel
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Text that names no [`Family`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an FPGA family (intel, amd)")]
pub struct UnknownFamily(pub String);

impl std::str::FromStr for Family {
    type Err = UnknownFamily;
    fn from_str(s: &str) -> Result<Self, UnknownFamily> {
        match s {
            "intel" => Ok(Family::Intel),
            "amd" => Ok(Family::Amd),
            _ => Err(UnknownFamily(s.to_string())),
        }
    }
}

/// The register protocol between the driver and a core.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlProtocol {
    /// Seed 000 table 3.1: busy, start, interrupt enable, done (64-bit words).
    #[default]
    AvalonCsr,
    /// Vitis HLS `ap_ctrl_hs` on an AXI4-Lite slave (32-bit registers).
    ApCtrlHs,
}

/// One argument of an `ap_ctrl_hs` core, in the order of its registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Argument {
    /// An `m_axi` pointer the core reads: the next `size` bytes of a job's
    /// input, placed in memory the core can reach.
    In { name: String, size: u32 },
    /// An `m_axi` pointer the core writes: the next `size` bytes of a job's
    /// output.
    Out { name: String, size: u32 },
    /// A 32-bit scalar: `value` from the manifest, or, when absent, four
    /// bytes (little-endian) at the head of each job's input, in argument
    /// order before the pointer inputs.
    Scalar {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<u32>,
    },
}

impl Argument {
    pub fn name(&self) -> &str {
        match self {
            Argument::In { name, .. }
            | Argument::Out { name, .. }
            | Argument::Scalar { name, .. } => name,
        }
    }
}

/// A core's control protocol and argument list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    pub protocol: ControlProtocol,
    /// `ap_ctrl_hs` only: the top function's arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<Argument>,
}

impl Control {
    /// An `ap_ctrl_hs` core with these arguments.
    pub fn ap_ctrl_hs(args: Vec<Argument>) -> Control {
        Control {
            protocol: ControlProtocol::ApCtrlHs,
            args,
        }
    }

    /// Bytes of a job's input and output this argument list accounts for:
    /// scalars taken from the message and the `In` buffers; the `Out` buffers.
    pub fn sizes(&self) -> (u64, u64) {
        let (mut i, mut o) = (0u64, 0u64);
        for a in &self.args {
            match a {
                Argument::In { size, .. } => i += u64::from(*size),
                Argument::Out { size, .. } => o += u64::from(*size),
                Argument::Scalar { value: None, .. } => i += 4,
                Argument::Scalar { .. } => {}
            }
        }
        (i, o)
    }

    /// The argument list fits the protocol and the job sizes.
    pub fn check(&self, input_size: u32, output_size: u32) -> Result<(), String> {
        match self.protocol {
            ControlProtocol::AvalonCsr if !self.args.is_empty() => Err(
                "the avalon_csr protocol takes no argument list (its memories are the core's)"
                    .into(),
            ),
            ControlProtocol::AvalonCsr => Ok(()),
            ControlProtocol::ApCtrlHs => {
                if self.args.len() > MAX_ARGS {
                    return Err(format!(
                        "{} arguments (at most {MAX_ARGS})",
                        self.args.len()
                    ));
                }
                if let Some(a) = self.args.iter().find(|a| a.name().len() > MAX_TARGET) {
                    return Err(format!(
                        "argument name of {} bytes (at most {MAX_TARGET})",
                        a.name().len()
                    ));
                }
                let (i, o) = self.sizes();
                if (i, o) != (u64::from(input_size), u64::from(output_size)) {
                    return Err(format!(
                        "the arguments take {i} input / {o} output bytes but the image's sizes are \
                         {input_size} / {output_size}"
                    ));
                }
                if !self.args.iter().any(|a| matches!(a, Argument::Out { .. })) {
                    return Err("no output pointer argument".into());
                }
                Ok(())
            }
        }
    }
}

/// Most arguments of an `ap_ctrl_hs` core.
pub const MAX_ARGS: usize = 64;

pub use crate::dtype::{DataType, Dtype, MAX_DIMS};

/// The JSON manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub input_size: u32,
    pub output_size: u32,
    /// Element type and shape of one input, when the builder knows it
    /// (clients check their arrays against it; nodes ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_type: Option<DataType>,
    /// Element type and shape of one output, when the builder knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_type: Option<DataType>,
    pub cores: Vec<CoreInfo>,
    pub artifacts: Vec<ArtifactEntry>,
    /// Streaming handler sets (docs/streams.md); their code is the
    /// `spin-<arch>-linux` artifact. Checked by [`crate::spin::manifest`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handler_sets: Vec<crate::spin::HandlerSet>,
}

/// Longest image name, artifact target and entry symbol, and most
/// artifacts: they go into error messages and logs, so an image cannot
/// make those as large as its manifest.
pub const MAX_NAME: usize = 256;
pub const MAX_TARGET: usize = 64;
pub const MAX_ARTIFACTS: usize = 64;

impl Manifest {
    /// The text fields and the artifact list within their bounds (checked
    /// before anything quotes them).
    fn check_lengths(&self) -> Result<(), ImageError> {
        let long = |what: &str, len: usize, max: usize| {
            ImageError::Manifest(format!("{what} of {len} bytes (at most {max})"))
        };
        if self.name.len() > MAX_NAME {
            return Err(long("the name", self.name.len(), MAX_NAME));
        }
        if self.artifacts.len() > MAX_ARTIFACTS {
            return Err(ImageError::Manifest(format!(
                "{} artifacts (at most {MAX_ARTIFACTS})",
                self.artifacts.len()
            )));
        }
        for (i, a) in self.artifacts.iter().enumerate() {
            if a.target.len() > MAX_TARGET {
                return Err(long(
                    &format!("artifact {i}'s target"),
                    a.target.len(),
                    MAX_TARGET,
                ));
            }
            if a.entry.len() > MAX_NAME {
                return Err(long(
                    &format!("artifact {i}'s entry"),
                    a.entry.len(),
                    MAX_NAME,
                ));
            }
        }
        Ok(())
    }

    /// Sizes positive where required, types consistent with the sizes.
    pub fn check(&self) -> Result<(), ImageError> {
        if self.input_size == 0 {
            return Err(ImageError::Manifest("input_size is 0".into()));
        }
        for (what, t, size) in [
            ("input", &self.input_type, self.input_size),
            ("output", &self.output_type, self.output_size),
        ] {
            let Some(t) = t else { continue };
            t.check_shape()
                .map_err(|e| ImageError::Manifest(format!("{what}_type {t}: {e}")))?;
            if t.bytes() != Some(u64::from(size)) {
                return Err(ImageError::Manifest(format!(
                    "{what}_type {t} is {} bytes but {what}_size is {size}",
                    t.bytes().map_or("too many".into(), |b| b.to_string())
                )));
            }
        }
        for (i, a) in self.artifacts.iter().enumerate() {
            if a.target == FPGA_TARGET && a.family != Family::Intel {
                return Err(ImageError::Manifest(format!(
                    "artifact {i}: a {FPGA_TARGET} bitstream is an Intel-family core, not {}",
                    a.family
                )));
            }
            if let Some(c) = &a.control {
                c.check(self.input_size, self.output_size).map_err(|e| {
                    ImageError::Manifest(format!("artifact {i} ({}): {e}", a.target))
                })?;
            }
        }
        crate::spin::manifest::check(&self.handler_sets)
            .map_err(|e| ImageError::Manifest(e.to_string()))?;
        let spin = crate::spin::manifest::SPIN_TARGET_PREFIX;
        if !self.handler_sets.is_empty()
            && !self.artifacts.iter().any(|a| a.target.starts_with(spin))
        {
            return Err(ImageError::Manifest(format!(
                "{} handler sets but no {spin}<arch>-linux artifact holding their code",
                self.handler_sets.len()
            )));
        }
        Ok(())
    }
}

/// A parsed image: manifest plus the artifact region (shared, not copied).
#[derive(Debug, Clone)]
pub struct Image {
    pub manifest: Manifest,
    /// Who signed it, if anyone (checked by [`crate::signature::Trust`]).
    pub signature: Option<crate::signature::SignatureRecord>,
    /// Header and manifest, as covered by a signature.
    head: Bytes,
    data: Bytes,
}

/// Whether these bytes start with the image magic (otherwise, to a node, they
/// are a raw Cyclone V bitstream).
pub fn is_image(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

impl Image {
    /// Parses the container and checks every artifact's bounds. Checksums are
    /// checked separately ([`Image::verify`]) so that `inspect` can report them.
    pub fn parse(bytes: Bytes) -> Result<Image, ImageError> {
        if !is_image(&bytes) {
            return Err(ImageError::NoMagic);
        }
        let (unsigned, signature) =
            crate::signature::split(&bytes).map_err(ImageError::Signature)?;
        let bytes = bytes.slice(..unsigned.len());
        if bytes.len() < HEADER_LEN {
            return Err(ImageError::Truncated(format!(
                "{} bytes, the header alone needs {HEADER_LEN}",
                bytes.len()
            )));
        }
        let u32_at =
            |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        let version = u32_at(8);
        if version != VERSION {
            return Err(ImageError::Version(version));
        }
        let mlen = u32_at(12);
        if mlen > MAX_MANIFEST {
            return Err(ImageError::Manifest(format!(
                "manifest length {mlen} exceeds the limit of {MAX_MANIFEST} bytes"
            )));
        }
        let mend = HEADER_LEN + mlen as usize;
        if bytes.len() < mend {
            return Err(ImageError::Truncated(format!(
                "manifest of {mlen} bytes declared, only {} present",
                bytes.len() - HEADER_LEN
            )));
        }
        let manifest: Manifest = serde_json::from_slice(&bytes[HEADER_LEN..mend])
            .map_err(|e| ImageError::Manifest(e.to_string()))?;
        manifest.check_lengths()?;
        let data = bytes.slice(mend..);
        let available = data.len() as u64;
        for (index, a) in manifest.artifacts.iter().enumerate() {
            let fits = a
                .offset
                .checked_add(a.length)
                .is_some_and(|end| end <= available);
            if !fits {
                return Err(ImageError::OutOfBounds {
                    index,
                    target: a.target.clone(),
                    offset: a.offset,
                    length: a.length,
                    available,
                });
            }
            if a.sha256.len() != 64 || !a.sha256.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(ImageError::Manifest(format!(
                    "artifact {index} ({}) has a malformed sha256 {:?}",
                    a.target, a.sha256
                )));
            }
        }
        manifest.check()?;
        Ok(Image {
            manifest,
            signature,
            head: bytes.slice(..mend),
            data,
        })
    }

    /// What a signature of this image covers ([`crate::signature::signed_message`]).
    pub fn signed_message(&self) -> Vec<u8> {
        let arts = (0..self.manifest.artifacts.len()).filter_map(|i| self.artifact_bytes(i));
        crate::signature::signed_message(&self.head, arts)
    }

    /// The image without its signature trailer (what a new signature covers).
    pub fn unsigned_bytes(&self) -> Vec<u8> {
        let mut v = self.head.to_vec();
        v.extend_from_slice(&self.data);
        v
    }

    /// Bytes of artifact `index` (bounds were checked by `parse`), unverified.
    pub fn artifact_bytes(&self, index: usize) -> Option<Bytes> {
        let a = self.manifest.artifacts.get(index)?;
        Some(
            self.data
                .slice(a.offset as usize..(a.offset + a.length) as usize),
        )
    }

    /// Checks artifact `index` against its checksum and returns its bytes.
    pub fn verified_artifact(&self, index: usize) -> Result<Bytes, ImageError> {
        let a = self
            .manifest
            .artifacts
            .get(index)
            .ok_or_else(|| ImageError::Manifest(format!("no artifact {index}")))?;
        let bytes = self.artifact_bytes(index).expect("index checked above");
        let actual = sha256_hex(&bytes);
        if !actual.eq_ignore_ascii_case(&a.sha256) {
            return Err(ImageError::Checksum {
                index,
                target: a.target.clone(),
                expected: a.sha256.clone(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Checksum status of every artifact, in manifest order.
    pub fn verify(&self) -> Vec<Result<(), ImageError>> {
        (0..self.manifest.artifacts.len())
            .map(|i| self.verified_artifact(i).map(|_| ()))
            .collect()
    }

    /// Index of the first artifact for `target`.
    pub fn find(&self, target: &str) -> Option<usize> {
        self.manifest
            .artifacts
            .iter()
            .position(|a| a.target == target)
    }

    /// Index of the first artifact for `target` whose family is one of
    /// `families` (an image may carry one target in both styles).
    pub fn find_for(&self, target: &str, families: &[Family]) -> Option<usize> {
        self.manifest
            .artifacts
            .iter()
            .position(|a| a.target == target && families.contains(&a.family))
    }

    /// Targets this image carries, in manifest order.
    pub fn targets(&self) -> Vec<String> {
        self.manifest
            .artifacts
            .iter()
            .map(|a| a.target.clone())
            .collect()
    }
}

/// The default core table of docs/interfaces.md: base 0xC000_0000,
/// S = next power of two ≥ max(input_size, output_size, 4096); core i at
/// control = base + 4·S·i, input = control + S, output = control + 2·S.
/// Fails if the table would not fit the 32-bit address space.
pub fn default_core_table(
    n: u32,
    input_size: u32,
    output_size: u32,
) -> Result<Vec<CoreInfo>, ImageError> {
    corefarm_smp::default_core_table(n, input_size, output_size)
        .map_err(|e| ImageError::Build(e.to_string()))
}

/// Architecture name used in targets, for the machine this code runs on.
pub fn host_arch() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Some("x86_64"),
        "aarch64" => Some("aarch64"),
        "arm" => Some("armv7"),
        _ => None,
    }
}

/// `native-<arch>-linux` for this machine.
pub fn native_target() -> Option<String> {
    if cfg!(target_os = "linux") {
        host_arch().map(|a| format!("native-{a}-linux"))
    } else {
        None
    }
}

/// `rtl-<arch>-linux` for this machine.
pub fn rtl_target() -> Option<String> {
    if cfg!(target_os = "linux") {
        host_arch().map(|a| format!("rtl-{a}-linux"))
    } else {
        None
    }
}

/// The SMP configuration that carries `image`: sizes and core table taken
/// from its manifest, the whole image as the bitstream.
pub fn configuration(image: Bytes) -> Result<Configuration, ImageError> {
    let parsed = Image::parse(image.clone())?;
    Ok(Configuration {
        input_size: parsed.manifest.input_size,
        output_size: parsed.manifest.output_size,
        cores: parsed.manifest.cores,
        bitstream: image,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_table_matches_the_contract() {
        let t = default_core_table(3, 32768, 16384).unwrap();
        let s = 32768;
        assert_eq!(t[0].control, 0xC000_0000);
        assert_eq!(t[0].input, 0xC000_0000 + s);
        assert_eq!(t[0].output, 0xC000_0000 + 2 * s);
        assert_eq!(t[2].control, 0xC000_0000 + 8 * s);
        // Small sizes still get 4 KiB windows.
        let t = default_core_table(2, 16, 16).unwrap();
        assert_eq!(t[1].control - t[0].control, 4 * 4096);
        assert!(default_core_table(4096, 1 << 20, 16).is_err());
    }

    #[test]
    fn host_targets() {
        if let Some(t) = native_target() {
            assert!(t.starts_with("native-") && t.ends_with("-linux"));
        }
    }

    fn image_with(manifest_json: &str) -> Bytes {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(manifest_json.len() as u32).to_le_bytes());
        b.extend_from_slice(manifest_json.as_bytes());
        Bytes::from(b)
    }

    #[test]
    fn names_targets_and_artifact_counts_are_bounded() {
        let with = |name: &str, artifacts: &str| {
            image_with(&format!(
                r#"{{"name":"{name}","input_size":8,"output_size":4,"cores":[],"artifacts":[{artifacts}]}}"#
            ))
        };
        let art = |target: &str| {
            format!(
                r#"{{"target":"{target}","kind":"native","entry":"f","offset":0,"length":0,"sha256":"{}"}}"#,
                "0".repeat(64)
            )
        };
        assert!(Image::parse(with(&"n".repeat(MAX_NAME), "")).is_ok());
        let e = Image::parse(with(&"\\u007f".repeat(MAX_NAME + 1), "")).unwrap_err();
        assert!(e.to_string().contains("the name of 257 bytes"), "{e}");
        let e = Image::parse(with("x", &art(&"t".repeat(MAX_TARGET + 1)))).unwrap_err();
        assert!(e.to_string().contains("target of 65 bytes"), "{e}");
        assert!(e.to_string().len() < 200, "{e}");
        let many = vec![art("native-x86_64-linux"); MAX_ARTIFACTS + 1].join(",");
        let e = Image::parse(with("x", &many)).unwrap_err();
        assert!(e.to_string().contains("65 artifacts"), "{e}");
    }

    #[test]
    fn manifest_types_must_match_the_sizes() {
        let m = |t: &str| {
            format!(r#"{{"name":"x","input_size":8,"output_size":4,{t}"cores":[],"artifacts":[]}}"#)
        };
        let ok = Image::parse(image_with(&m(
            r#""input_type":{"dtype":"int16","shape":[2,2]},"output_type":{"dtype":"float32","shape":[1]},"#,
        )))
        .unwrap();
        assert_eq!(ok.manifest.input_type.unwrap().to_string(), "int16[2,2]");
        assert_eq!(
            Image::parse(image_with(&m("")))
                .unwrap()
                .manifest
                .input_type,
            None
        );
        for (t, why) in [
            (
                r#""input_type":{"dtype":"int32","shape":[4]},"#,
                "16 bytes but input_size is 8",
            ),
            (
                r#""output_type":{"dtype":"int8","shape":[]},"#,
                "dimensions",
            ),
            (r#""output_type":{"dtype":"int8","shape":[0]},"#, "zero"),
            (
                r#""input_type":{"dtype":"float64","shape":[4294967295,4294967295,4294967295]},"#,
                "too many",
            ),
            (
                r#""input_type":{"dtype":"complex","shape":[1]},"#,
                "complex",
            ),
        ] {
            let e = Image::parse(image_with(&m(t))).unwrap_err().to_string();
            assert!(e.contains(why), "{t}: {e}");
        }
    }

    #[test]
    fn family_and_control_are_read_and_checked_against_the_sizes() {
        let art = |extra: &str| {
            image_with(&format!(
                r#"{{"name":"x","input_size":20,"output_size":8,"cores":[],"artifacts":[{{"target":"rtl-x86_64-linux","kind":"rtl","entry":"vadd","offset":0,"length":0,"sha256":"{}"{extra}}}]}}"#,
                "0".repeat(64)
            ))
        };
        // Without the fields: an Intel core with the Avalon CSR.
        let old = Image::parse(art("")).unwrap();
        assert_eq!(old.manifest.artifacts[0].family, Family::Intel);
        assert_eq!(old.manifest.artifacts[0].control, None);
        assert!(!serde_json::to_string(&old.manifest)
            .unwrap()
            .contains("family"));
        let args = r#"[{"kind":"scalar","name":"n"},{"kind":"in","name":"a","size":8},{"kind":"in","name":"b","size":8},{"kind":"out","name":"c","size":8},{"kind":"scalar","name":"k","value":3}]"#;
        let amd = Image::parse(art(&format!(
            r#","family":"amd","control":{{"protocol":"ap_ctrl_hs","args":{args}}}"#
        )))
        .unwrap();
        let a = &amd.manifest.artifacts[0];
        assert_eq!(a.family, Family::Amd);
        let c = a.control.as_ref().unwrap();
        assert_eq!(c.protocol, ControlProtocol::ApCtrlHs);
        assert_eq!(c.sizes(), (20, 8));
        assert_eq!(amd.find_for("rtl-x86_64-linux", &[Family::Intel]), None);
        assert_eq!(amd.find_for("rtl-x86_64-linux", &Family::ALL), Some(0));
        // Arguments that do not add up to the image's sizes.
        let short = r#"[{"kind":"in","name":"a","size":8},{"kind":"out","name":"c","size":8}]"#;
        let e = Image::parse(art(&format!(
            r#","family":"amd","control":{{"protocol":"ap_ctrl_hs","args":{short}}}"#
        )))
        .unwrap_err();
        assert!(
            matches!(&e, ImageError::Manifest(m) if m.contains("8 input / 8 output")),
            "{e}"
        );
        // A Cyclone V bitstream is an Intel core.
        let bad = image_with(&format!(
            r#"{{"name":"x","input_size":8,"output_size":8,"cores":[],"artifacts":[{{"target":"{FPGA_TARGET}","kind":"bitstream","offset":0,"length":0,"sha256":"{}","family":"amd"}}]}}"#,
            "0".repeat(64)
        ));
        assert!(matches!(Image::parse(bad), Err(ImageError::Manifest(_))));
    }

    #[test]
    fn raw_bytes_are_not_an_image() {
        assert!(!is_image(b"RBFDATA"));
        assert_eq!(
            Image::parse(Bytes::from_static(b"RBFDATA")).unwrap_err(),
            ImageError::NoMagic
        );
        // Every prefix of a header is an error, never a panic.
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&4u32.to_le_bytes());
        header.extend_from_slice(b"{}  ");
        for cut in 0..=header.len() {
            assert!(Image::parse(Bytes::copy_from_slice(&header[..cut])).is_err());
        }
    }
}

//! What a node's hello announces it can run (its `targets`), and whether
//! that covers a configuration: the server sends a configuration only to
//! nodes that announced a target and family one of its image's artifacts
//! is for, so no node is sent an image it could only refuse.
//!
//! A target is announced as the image format names it
//! (`native-x86_64-linux`, `rtl-x86_64-linux`, `fpga-cyclonev`,
//! `fpga-zynq`): the node runs that target's artifacts of every FPGA
//! family. A node that runs some families' cores only announces the target
//! once per family it runs, qualified: `rtl-x86_64-linux:amd`. An artifact
//! of family F for target T fits a node that announced `T` or `T:F`; an
//! artifact whose manifest names no family is an Intel-style one.

use serde::Deserialize;

/// Between a target and a family in an announced target.
pub const FAMILY_SEPARATOR: char = ':';

/// The family of an artifact whose manifest names none.
pub const DEFAULT_FAMILY: &str = "intel";

/// `target` announced for `family` only: `rtl-x86_64-linux:amd`.
pub fn qualified(target: &str, family: &str) -> String {
    format!("{target}{FAMILY_SEPARATOR}{family}")
}

/// Why a node is not sent a configuration: in the words of a node that
/// refuses an image for want of an artifact it runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("image {name:?} carries artifacts for {carried:?} but this node runs {announced:?}")]
pub struct Unfit {
    /// The image's name.
    pub name: String,
    /// The image's artifacts' targets, qualified for families other than
    /// the default.
    pub carried: Vec<String>,
    /// The node's announced targets.
    pub announced: Vec<String>,
}

/// The targets and families of a configuration image's artifacts, read
/// from its manifest once per configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    name: String,
    artifacts: Vec<(String, String)>,
}

impl Carried {
    /// The artifacts of the image in a configuration's bitstream field;
    /// `None` for anything else (a raw bitstream, the benchmarking
    /// configuration, a manifest that does not parse): the nodes decide
    /// those, and say why they refuse.
    pub fn of(bitstream: &[u8]) -> Option<Carried> {
        // docs/images.md: magic, version, manifest length, JSON manifest.
        const MAGIC: &[u8] = b"CFIMAGE\0";
        const HEADER: usize = 16;
        #[derive(Deserialize)]
        struct Manifest {
            #[serde(default)]
            name: String,
            artifacts: Vec<Artifact>,
        }
        #[derive(Deserialize)]
        struct Artifact {
            target: String,
            #[serde(default)]
            family: Option<String>,
        }
        if !bitstream.starts_with(MAGIC) || bitstream.len() < HEADER {
            return None;
        }
        let len = u32::from_le_bytes(bitstream[12..HEADER].try_into().expect("4 bytes")) as usize;
        let manifest = bitstream.get(HEADER..HEADER.checked_add(len)?)?;
        let m: Manifest = serde_json::from_slice(manifest).ok()?;
        Some(Carried {
            name: m.name,
            artifacts: m
                .artifacts
                .into_iter()
                .map(|a| {
                    let f = a.family.unwrap_or_else(|| DEFAULT_FAMILY.to_string());
                    (a.target, f)
                })
                .collect(),
        })
    }

    /// Whether a node that announced `announced` runs one of the
    /// artifacts. A node that announced nothing (a seed node, or one
    /// without a hello) is sent the configuration: it decides.
    pub fn fits(&self, announced: &[String]) -> Result<(), Unfit> {
        if announced.is_empty() {
            return Ok(());
        }
        let runs = |t: &str, f: &str| {
            announced.iter().any(|a| {
                a == t
                    || a.split_once(FAMILY_SEPARATOR)
                        .is_some_and(|(at, af)| at == t && af == f)
            })
        };
        if self.artifacts.iter().any(|(t, f)| runs(t, f)) {
            return Ok(());
        }
        let mut carried: Vec<String> = Vec::new();
        for (t, f) in &self.artifacts {
            let c = match f == DEFAULT_FAMILY {
                true => t.clone(),
                false => qualified(t, f),
            };
            if !carried.contains(&c) {
                carried.push(c);
            }
        }
        Err(Unfit {
            name: self.name.clone(),
            carried,
            announced: announced.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(artifacts: &str) -> Vec<u8> {
        let m = format!(
            r#"{{"name":"x","input_size":8,"output_size":8,"cores":[],"artifacts":[{artifacts}]}}"#
        );
        let mut b = b"CFIMAGE\0".to_vec();
        b.extend(1u32.to_le_bytes());
        b.extend((m.len() as u32).to_le_bytes());
        b.extend(m.as_bytes());
        b
    }

    fn announced(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_artifact_fits_its_target_announced_plain_or_for_its_family() {
        let amd = Carried::of(&image(
            r#"{"target":"rtl-x86_64-linux","kind":"rtl","family":"amd"}"#,
        ))
        .unwrap();
        let intel = Carried::of(&image(r#"{"target":"rtl-x86_64-linux","kind":"rtl"}"#)).unwrap();
        let both = Carried::of(&image(
            r#"{"target":"rtl-x86_64-linux","kind":"rtl"},{"target":"rtl-x86_64-linux","kind":"rtl","family":"amd"}"#,
        ))
        .unwrap();
        let every = announced(&["native-x86_64-linux", "rtl-x86_64-linux"]);
        let intel_only = announced(&["native-x86_64-linux:intel", "rtl-x86_64-linux:intel"]);
        let amd_only = announced(&["rtl-x86_64-linux:amd"]);
        for c in [&amd, &intel, &both] {
            assert_eq!(c.fits(&every), Ok(()));
            assert_eq!(c.fits(&[]), Ok(()), "a node that announced nothing decides");
        }
        assert_eq!(amd.fits(&amd_only), Ok(()));
        assert_eq!(intel.fits(&intel_only), Ok(()));
        assert_eq!(both.fits(&amd_only), Ok(()));
        assert_eq!(both.fits(&intel_only), Ok(()));
        assert_eq!(
            amd.fits(&intel_only),
            Err(Unfit {
                name: "x".into(),
                carried: announced(&["rtl-x86_64-linux:amd"]),
                announced: intel_only.clone(),
            })
        );
        // In the words of a node refusing it.
        assert_eq!(
            intel.fits(&amd_only).unwrap_err().to_string(),
            r#"image "x" carries artifacts for ["rtl-x86_64-linux"] but this node runs ["rtl-x86_64-linux:amd"]"#
        );
        assert!(intel.fits(&amd_only).is_err());
        // Another target altogether.
        assert!(intel.fits(&announced(&["fpga-cyclonev"])).is_err());
        assert_eq!(
            Carried::of(&image(
                r#"{"target":"fpga-zynq","kind":"bitstream","family":"amd"}"#
            ))
            .unwrap()
            .fits(&announced(&["fpga-zynq", "native-x86_64-linux:intel"])),
            Ok(())
        );
    }

    #[test]
    fn what_is_no_readable_image_is_left_to_the_nodes() {
        assert_eq!(Carried::of(b"raw bitstream bytes"), None);
        assert_eq!(Carried::of(b"CFIMAGE\0\x01\0\0\0\xff\0\0\0{}"), None);
        assert_eq!(Carried::of(&image("oops")), None);
    }
}

//! Streaming handler sets in C (`include/corefarm/spin.h`, docs/streams.md)
//! compiled into one shared object: an image's `spin-<arch>-linux`
//! artifact.

use std::path::{Path, PathBuf};

use crate::tools::{self, ToolchainError};

/// `include/corefarm/spin.h`, written next to handler builds.
pub const SPIN_HEADER: &str = include_str!("../../../include/corefarm/spin.h");

/// Compiles the C `sources` into one shared object at `out` for `arch`
/// (`None`: this machine; others use the cross compilers of
/// [`crate::build_native_for`]).
pub fn build_handlers_for(
    sources: &[PathBuf],
    out: &Path,
    arch: Option<&str>,
) -> Result<(), ToolchainError> {
    if sources.is_empty() {
        return Err(ToolchainError::Invalid(
            "handler sets need at least one C source".into(),
        ));
    }
    for s in sources {
        tools::check_source(s)?;
    }
    let (program, hint) = crate::hls::compiler(arch, true)?;
    tools::require(&program, &hint)?;
    let sources: Vec<&Path> = sources.iter().map(PathBuf::as_path).collect();
    tools::compile_shared(
        &program,
        ("spin.h", SPIN_HEADER),
        &["-O2", "-std=c11", "-shared", "-fPIC"],
        &sources,
        out,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::write;
    use crate::{require_tool, Tool};
    use corefarm_cores::spin::NativeHandlers;

    #[test]
    fn handler_sources_build_into_one_object() {
        if !require_tool(Tool::Cxx, "handler_sources_build_into_one_object") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let a = write(
            dir.path(),
            "a.c",
            "#include <corefarm/spin.h>\nint one_tail(const cf_spin_args *a, const cf_spin_ops *o) { (void)a; (void)o; return 0; }\n",
        );
        let b = write(
            dir.path(),
            "b.c",
            "#include <corefarm/spin.h>\nint two_head(const cf_spin_args *a, const cf_spin_ops *o) { (void)a; (void)o; return 0; }\n",
        );
        let so = dir.path().join("spin.so");
        build_handlers_for(&[a, b.clone()], &so, None).unwrap();
        assert!(NativeHandlers::open(&so, "one").is_ok());
        assert!(NativeHandlers::open(&so, "two").is_ok());
        let bad = write(dir.path(), "bad.c", "int x = ;\n");
        let e = build_handlers_for(&[b, bad], &so, None).unwrap_err();
        assert!(e.to_string().contains("bad.c"), "{e}");
    }

    #[test]
    fn a_signature_covers_the_handler_sets_and_their_code() {
        use corefarm_cores::image::{default_core_table, ArtifactKind, Image};
        use corefarm_cores::signature::Trust;
        use corefarm_cores::spin::{BudgetSpec, HandlerSet, Mode, Rule, Ruleset};
        let set = |start| HandlerSet {
            name: "sum".into(),
            ruleset: Ruleset {
                mode: Mode::And,
                rules: vec![Rule {
                    index: 0,
                    mask: 0xFF,
                    start,
                    end: 9,
                }],
            },
            budgets: BudgetSpec::default(),
            result_type: None,
        };
        let image = |start, code: &[u8]| {
            crate::ImageBuilder::new("s", 16, 16, default_core_table(1, 16, 16).unwrap())
                .artifact(
                    "native-x86_64-linux",
                    ArtifactKind::Native,
                    "f",
                    b"core".to_vec(),
                )
                .artifact("spin-x86_64-linux", ArtifactKind::Native, "", code.to_vec())
                .handler_sets(vec![set(start)])
                .build()
                .unwrap()
        };
        let key = crate::sign::SecretKey::generate();
        let trust = Trust(vec![key.public()]);
        let signed = crate::sign::sign(&image(1, b"code"), &key).unwrap();
        let ok = Image::parse(signed.clone().into()).unwrap();
        trust.check(&ok).unwrap();
        // The same signature on an image whose ruleset or handler code differs.
        for other in [image(2, b"code"), image(1, b"c0de")] {
            let sig = &signed[image(1, b"code").len()..];
            let forged = [&other[..], sig].concat();
            let img = Image::parse(forged.into()).unwrap();
            assert!(trust
                .check(&img)
                .unwrap_err()
                .to_string()
                .contains("bad signature"));
        }
        // A handler set needs its code.
        let none = crate::ImageBuilder::new("s", 16, 16, default_core_table(1, 16, 16).unwrap())
            .artifact(
                "native-x86_64-linux",
                ArtifactKind::Native,
                "f",
                b"core".to_vec(),
            )
            .handler_sets(vec![set(1)])
            .build()
            .unwrap_err();
        assert!(
            none.to_string().contains("no spin-<arch>-linux artifact"),
            "{none}"
        );
    }
}

//! `corefarm image keygen` and `corefarm image sign` (docs/operations.md,
//! "Signed images"); `image inspect` shows the signer.

use std::path::PathBuf;

use anyhow::Context;
use corefarm_cores::image::Image;
use corefarm_cores::signature;
use corefarm_toolchain::sign::{self, SecretKey};

#[derive(clap::Args)]
pub struct KeygenArgs {
    /// Secret key file to create (mode 600, never overwritten); the public
    /// key goes to the same name plus `.pub`.
    #[arg(short = 'o', long = "output", value_name = "KEY")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct SignArgs {
    /// The image to sign (an earlier signature is replaced).
    file: PathBuf,
    /// Secret key file made by `corefarm image keygen`.
    #[arg(long, value_name = "KEY")]
    key: PathBuf,
    /// Where to write the signed image (default: replace FILE).
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    out: Option<PathBuf>,
}

pub fn keygen(a: KeygenArgs) -> anyhow::Result<()> {
    let key = SecretKey::generate();
    let public = key.write(&a.out).map_err(anyhow::Error::msg)?;
    eprintln!(
        "wrote {} (secret: keep it private) and {} (public)",
        a.out.display(),
        public.display()
    );
    println!("{}", key.public());
    Ok(())
}

pub fn sign(a: SignArgs) -> anyhow::Result<()> {
    let key = SecretKey::read(&a.key).map_err(anyhow::Error::msg)?;
    let bytes = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let signed = sign::sign(&bytes, &key)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("signing {}", a.file.display()))?;
    let out = a.out.unwrap_or(a.file);
    std::fs::write(&out, signed).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("signed {} with key {}", out.display(), key.public());
    Ok(())
}

/// `image inspect`'s view of the signature: text, JSON, and whether it is bad.
pub fn describe(img: &Image) -> (String, serde_json::Value, bool) {
    match &img.signature {
        None => ("none (unsigned)".into(), serde_json::Value::Null, false),
        Some(rec) => {
            let r = signature::verify(img, rec);
            let text = match &r {
                Ok(()) => format!("ed25519 key {} (valid)", rec.key),
                Err(e) => format!("BAD: {e}"),
            };
            let json = serde_json::json!({
                "algorithm": "ed25519", "key": rec.key.to_string(), "valid": r.is_ok(),
            });
            (text, json, r.is_err())
        }
    }
}

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
    anyhow::ensure!(
        a.out.extension().is_none_or(|e| e != "pub"),
        "{}: a secret key named .pub would be taken for a public key; choose a name without .pub \
         (the public half is written to NAME.pub)",
        a.out.display()
    );
    let key = SecretKey::generate();
    let public = key.write(&a.out)?;
    eprintln!(
        "wrote {} (secret: keep it private) and {} (public)",
        a.out.display(),
        public.display()
    );
    println!("{}", key.public());
    Ok(())
}

pub fn sign(a: SignArgs) -> anyhow::Result<()> {
    check_secret_key_path(&a.key)?;
    let key = SecretKey::read(&a.key)?;
    let bytes = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let signed =
        sign::sign(&bytes, &key).with_context(|| format!("signing {}", a.file.display()))?;
    let out = a.out.unwrap_or(a.file);
    std::fs::write(&out, signed).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("signed {} with key {}", out.display(), key.public());
    Ok(())
}

/// Refuses what cannot be the secret half of a key pair before the key is
/// read. Both halves are 64 hex digits, so the public half read as a
/// secret would sign with a key nobody trusts; and the permission check on
/// a directory or a public file would advise `chmod 600`, which helps no one.
fn check_secret_key_path(path: &std::path::Path) -> anyhow::Result<()> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read key {}", path.display()))?;
    anyhow::ensure!(
        !meta.is_dir(),
        "{} is a directory; --key takes the secret key file made by `corefarm image keygen -o KEY`",
        path.display()
    );
    if path.extension().is_some_and(|e| e == "pub") {
        let secret = path.with_extension("");
        anyhow::bail!(
            "{} is a public key (the .pub half); sign with the secret key{} and give the .pub file to nodes (--trust)",
            path.display(),
            if secret.is_file() {
                format!(" {}", secret.display())
            } else {
                " made with it by `corefarm image keygen`".into()
            }
        );
    }
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

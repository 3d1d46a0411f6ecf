//! Signing images (verification is `corefarm_cores::signature`, on the
//! nodes): key pairs and the signature trailer.
//!
//! Key files are one line of hex: the secret file holds the 32-byte Ed25519
//! seed and must be private to its owner (mode 600); the public file
//! (`NAME.pub`) holds the 32-byte public key that `corefarm node --trust`
//! takes.

use std::path::{Path, PathBuf};

use corefarm_cores::image::{Image, ImageError};
use corefarm_cores::signature::{PublicKey, SignatureRecord};
use ed25519_dalek::{Signer, SigningKey};
use rand::RngCore;

/// Why a key could not be read or written, or an image not signed. The
/// causes are part of each message (what `corefarm image` prints).
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The secret key file may be read by others, or cannot be checked.
    #[error("{0}")]
    NotPrivate(String),
    #[error("cannot read key {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file is not 64 hex digits.
    #[error(
        "{} is not a corefarm secret key (64 hex digits); a .pub file is the public half",
        path.display()
    )]
    NotAKey { path: PathBuf },
    /// The key file exists already (keys are never overwritten) or its
    /// directory cannot be written.
    #[error("cannot create {}: {error}", path.display())]
    Create {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("writing {}: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The bytes are not an image.
    #[error("{0}")]
    NotAnImage(ImageError),
    /// An artifact's checksum does not match: a signature would vouch for it.
    #[error("refusing to sign: {0}")]
    Broken(ImageError),
}

/// A signing key read from, or about to be written to, a secret key file.
pub struct SecretKey(SigningKey);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey(public {})", self.public())
    }
}

impl SecretKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> Self {
        let mut seed = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut seed);
        SecretKey(SigningKey::from_bytes(&seed))
    }

    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key().to_bytes())
    }

    /// Reads a secret key file, refusing one that other users may read.
    pub fn read(path: &Path) -> Result<Self, SignError> {
        corefarm_smp::auth::check_private(path)
            .map_err(|e| SignError::NotPrivate(e.to_string()))?;
        let text = std::fs::read_to_string(path).map_err(|error| SignError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let seed = hex::decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| SignError::NotAKey {
                path: path.to_path_buf(),
            })?;
        Ok(SecretKey(SigningKey::from_bytes(&seed)))
    }

    /// Writes `path` (secret, mode 600, never overwritten) and `path.pub`.
    /// Returns the public file's path.
    pub fn write(&self, path: &Path) -> Result<PathBuf, SignError> {
        use std::io::Write;
        let public = PathBuf::from(format!("{}.pub", path.display()));
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        let mut f = o.open(path).map_err(|error| SignError::Create {
            path: path.to_path_buf(),
            error,
        })?;
        writeln!(f, "{}", hex::encode(self.0.to_bytes())).map_err(|error| SignError::Write {
            path: path.to_path_buf(),
            error,
        })?;
        std::fs::write(&public, format!("{}\n", self.public())).map_err(|error| {
            SignError::Write {
                path: public.clone(),
                error,
            }
        })?;
        Ok(public)
    }
}

/// `image` signed with `key`: the image (any earlier signature removed)
/// followed by the signature trailer.
pub fn sign(image: &[u8], key: &SecretKey) -> Result<Vec<u8>, SignError> {
    let img = Image::parse(bytes::Bytes::copy_from_slice(image)).map_err(SignError::NotAnImage)?;
    // A signature vouches for the checksums; never sign a broken image.
    if let Some(Err(e)) = img.verify().into_iter().find(|r| r.is_err()) {
        return Err(SignError::Broken(e));
    }
    let record = SignatureRecord {
        key: key.public(),
        signature: key.0.sign(&img.signed_message()).to_bytes(),
    };
    let mut out = img.unsigned_bytes();
    out.extend_from_slice(&record.trailer());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use corefarm_cores::signature::Trust;

    fn image() -> Vec<u8> {
        let cores = corefarm_cores::image::default_core_table(1, 8, 8).unwrap();
        crate::ImageBuilder::new("signed", 8, 8, cores)
            .artifact(
                "native-x86_64-linux",
                corefarm_cores::image::ArtifactKind::Native,
                "f",
                b"code".to_vec(),
            )
            .build()
            .unwrap()
    }

    #[test]
    fn keys_round_trip_and_signing_replaces_an_earlier_signature() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = SecretKey::generate();
        let public = key.write(&path).unwrap();
        assert!(
            matches!(key.write(&path), Err(SignError::Create { error, .. })
                if error.kind() == std::io::ErrorKind::AlreadyExists),
            "an existing key is never overwritten"
        );
        let again = SecretKey::read(&path).unwrap();
        assert_eq!(again.public(), key.public());
        let pub_text = std::fs::read_to_string(&public).unwrap();
        assert_eq!(
            PublicKey::parse_or_read(public.to_str().unwrap()).unwrap(),
            key.public()
        );
        assert_eq!(pub_text.trim(), key.public().to_string());

        let once = sign(&image(), &key).unwrap();
        let other = SecretKey::generate();
        let twice = sign(&once, &other).unwrap();
        let img = Image::parse(twice.into()).unwrap();
        assert_eq!(img.signature.as_ref().unwrap().key, other.public());
        assert_eq!(img.unsigned_bytes(), image());
        assert_eq!(Trust(vec![other.public()]).check(&img), Ok(()));
        assert!(Trust(vec![key.public()]).check(&img).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn secret_keys_are_private_and_broken_images_are_not_signed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        SecretKey::generate().write(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        match SecretKey::read(&path) {
            // The advice is the contract: `corefarm image sign` prints it.
            Err(SignError::NotPrivate(m)) => assert!(m.contains("chmod 600"), "{m}"),
            other => panic!("{other:?}"),
        }

        let mut broken = image();
        let last = broken.len() - 1;
        broken[last] ^= 1;
        let e = sign(&broken, &SecretKey::generate()).unwrap_err();
        assert!(matches!(e, SignError::Broken(_)), "{e}");
        assert!(e.to_string().starts_with("refusing to sign: "), "{e}");
    }
}

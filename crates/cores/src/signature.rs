//! Ed25519 signatures of configuration images: verified here (where images
//! are read), made by `corefarm-toolchain` (where they are built).
//!
//! A signed image is an image followed by a trailer:
//!
//! ```text
//! image (header, manifest, artifacts)
//! S bytes  signature record, UTF-8 JSON {"algorithm":"ed25519","key":HEX32,"signature":HEX64}
//! 4 bytes  u32 LE S
//! 8 bytes  "CFSIGv1\0"
//! ```
//!
//! The signature is over the [`signed_message`]: one line naming the scheme,
//! the SHA-256 of the image's first 16+M bytes (header and manifest, so
//! name, sizes, core table, targets and the recorded checksums) and the
//! SHA-256 of every artifact's bytes as they are, in manifest order. Any
//! change to the manifest or to an artifact changes the message; bytes
//! appended to the artifact region fall outside every artifact and are
//! refused because the trailer must end the image.

use std::fmt;

use ed25519_dalek::{Signature as EdSignature, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::image::Image;

/// Last 8 bytes of a signed image.
pub const TRAILER_MAGIC: &[u8; 8] = b"CFSIGv1\0";
/// Trailer bytes after the record: its length and the magic.
pub const TRAILER_LEN: usize = 12;
/// A signature record is about 200 bytes; anything longer is not one.
const MAX_RECORD: u32 = 4096;

/// Why a key did not parse (`--trust`, `corefarm image`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("{0:?} is not an Ed25519 public key (64 hex digits)")]
    NotHex(String),
    #[error("{0:?} is not a valid Ed25519 point")]
    NotAPoint(String),
    #[error("reading {path}: {error}")]
    Read { path: String, error: String },
    #[error("{path}: {error}")]
    InFile { path: String, error: Box<KeyError> },
}

/// Why a signature trailer is malformed or an image may not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("signature trailer declares a {0}-byte record")]
    RecordLength(u32),
    #[error("signature record is invalid: {0}")]
    Record(String),
    #[error(
        "image {name:?} is unsigned; this node runs only images signed by a trusted key \
         (--trust {trusted})"
    )]
    Unsigned { name: String, trusted: String },
    #[error(
        "unsigned: a raw bitstream carries no signature, and this node runs only images \
         signed by a trusted key (--trust)"
    )]
    RawBitstream,
    #[error("image {name:?} has a tampered artifact: {error}")]
    Tampered { name: String, error: String },
    #[error(
        "image {name:?} is signed by key {key}, which this node does not trust (--trust {trusted})"
    )]
    Untrusted {
        name: String,
        key: PublicKey,
        trusted: String,
    },
    #[error(
        "bad signature by key {key}: the image changed after it was signed, or the \
         signature was not made with this key"
    )]
    BadSignature { key: PublicKey },
    /// [`SignatureError::BadSignature`] of a named image.
    #[error("image {name:?}: {error}")]
    Image {
        name: String,
        error: Box<SignatureError>,
    },
}

/// An Ed25519 public key (32 bytes), shown as lower-case hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    /// 64 hex digits, or the path of a file holding them (a `.pub` file
    /// written by `corefarm image keygen`).
    pub fn parse_or_read(s: &str) -> Result<Self, KeyError> {
        match s.trim().parse() {
            Ok(k) => Ok(k),
            Err(_) if std::path::Path::new(s).is_file() => std::fs::read_to_string(s)
                .map_err(|e| KeyError::Read {
                    path: s.to_string(),
                    error: e.to_string(),
                })?
                .parse()
                .map_err(|e| KeyError::InFile {
                    path: s.to_string(),
                    error: Box::new(e),
                }),
            Err(e) => Err(e),
        }
    }
}

impl std::str::FromStr for PublicKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        let b = hex::decode(s.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| KeyError::NotHex(s.trim().to_string()))?;
        VerifyingKey::from_bytes(&b).map_err(|_| KeyError::NotAPoint(s.to_string()))?;
        Ok(PublicKey(b))
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// The signature record of a signed image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureRecord {
    pub key: PublicKey,
    pub signature: [u8; 64],
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    algorithm: String,
    key: String,
    signature: String,
}

impl SignatureRecord {
    /// The trailer that makes an image signed (record, length, magic).
    pub fn trailer(&self) -> Vec<u8> {
        let r = Record {
            algorithm: "ed25519".into(),
            key: self.key.to_string(),
            signature: hex::encode(self.signature),
        };
        let mut t = serde_json::to_vec(&r).expect("plain data");
        t.extend_from_slice(&(t.len() as u32).to_le_bytes());
        t.extend_from_slice(TRAILER_MAGIC);
        t
    }

    /// The error names what is wrong with the record.
    fn parse(json: &[u8]) -> Result<Self, SignatureError> {
        let invalid = |why: String| SignatureError::Record(why);
        let r: Record = serde_json::from_slice(json).map_err(|e| invalid(e.to_string()))?;
        if r.algorithm != "ed25519" {
            return Err(invalid(format!(
                "unknown signature algorithm {:?}",
                r.algorithm
            )));
        }
        let signature = hex::decode(&r.signature)
            .ok()
            .and_then(|b| <[u8; 64]>::try_from(b).ok())
            .ok_or_else(|| invalid("the signature is not 128 hex digits".into()))?;
        Ok(SignatureRecord {
            key: r
                .key
                .parse()
                .map_err(|e: KeyError| invalid(e.to_string()))?,
            signature,
        })
    }
}

/// Splits a possibly signed image into the image proper and its record.
/// An image without the trailer magic is unsigned; a trailer that is
/// present but malformed is an error (never silently "unsigned").
pub fn split(bytes: &[u8]) -> Result<(&[u8], Option<SignatureRecord>), SignatureError> {
    if !bytes.ends_with(TRAILER_MAGIC) || bytes.len() < TRAILER_LEN {
        return Ok((bytes, None));
    }
    let n = bytes.len();
    let len = u32::from_le_bytes(bytes[n - TRAILER_LEN..n - 8].try_into().expect("4 bytes"));
    if len > MAX_RECORD || len as usize > n - TRAILER_LEN {
        return Err(SignatureError::RecordLength(len));
    }
    let start = n - TRAILER_LEN - len as usize;
    let record = SignatureRecord::parse(&bytes[start..n - TRAILER_LEN])?;
    Ok((&bytes[..start], Some(record)))
}

/// What the signature covers (see the module documentation).
pub fn signed_message(head: &[u8], artifacts: impl Iterator<Item = bytes::Bytes>) -> Vec<u8> {
    let mut m = String::from("corefarm image signature v1\n");
    m += &format!("head {}\n", hex::encode(Sha256::digest(head)));
    for (i, a) in artifacts.enumerate() {
        m += &format!("artifact {i} {}\n", hex::encode(Sha256::digest(&a)));
    }
    m.into_bytes()
}

/// Keys an operator trusts (`corefarm node --trust`). Empty: every image
/// runs, signed or not (and the signature is not looked at).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trust(pub Vec<PublicKey>);

impl Trust {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `image` may run here; the error says why not.
    pub fn check(&self, img: &Image) -> Result<(), SignatureError> {
        let name = img.manifest.name.clone();
        let Some(rec) = &img.signature else {
            return Err(SignatureError::Unsigned {
                name,
                trusted: self.list(),
            });
        };
        if let Some(Err(e)) = img.verify().into_iter().find(|r| r.is_err()) {
            return Err(SignatureError::Tampered {
                name,
                error: e.to_string(),
            });
        }
        if !self.0.contains(&rec.key) {
            return Err(SignatureError::Untrusted {
                name,
                key: rec.key,
                trusted: self.list(),
            });
        }
        verify(img, rec).map_err(|e| SignatureError::Image {
            name,
            error: Box::new(e),
        })
    }

    fn list(&self) -> String {
        self.0
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Checks `rec` against the image's contents.
pub fn verify(img: &Image, rec: &SignatureRecord) -> Result<(), SignatureError> {
    let bad = || SignatureError::BadSignature { key: rec.key };
    // A key that is not a point never parsed into a `PublicKey`.
    let key = VerifyingKey::from_bytes(&rec.key.0).map_err(|_| bad())?;
    let sig = EdSignature::from_bytes(&rec.signature);
    key.verify_strict(&img.signed_message(), &sig)
        .map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::{HEADER_LEN, MAGIC, VERSION};
    use bytes::Bytes;
    use ed25519_dalek::{Signer, SigningKey};

    const ART: &[u8] = b"artifact-bytes";

    /// An image with one artifact, unsigned.
    fn image() -> Vec<u8> {
        let m = format!(
            r#"{{"name":"x","input_size":8,"output_size":4,"cores":[],"artifacts":[{{"target":"native-x86_64-linux","kind":"native","entry":"f","offset":0,"length":{},"sha256":"{}"}}]}}"#,
            ART.len(),
            hex::encode(Sha256::digest(ART))
        );
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(m.len() as u32).to_le_bytes());
        b.extend_from_slice(m.as_bytes());
        b.extend_from_slice(ART);
        b
    }

    fn key(n: u8) -> SigningKey {
        SigningKey::from_bytes(&[n; 32])
    }

    fn public(k: &SigningKey) -> PublicKey {
        PublicKey(k.verifying_key().to_bytes())
    }

    fn sign(bytes: &[u8], k: &SigningKey, claimed: PublicKey) -> Vec<u8> {
        let img = Image::parse(Bytes::copy_from_slice(bytes)).unwrap();
        let rec = SignatureRecord {
            key: claimed,
            signature: k.sign(&img.signed_message()).to_bytes(),
        };
        let mut out = bytes.to_vec();
        out.extend_from_slice(&rec.trailer());
        out
    }

    fn check(trust: &Trust, bytes: &[u8]) -> Result<(), SignatureError> {
        trust.check(&Image::parse(Bytes::copy_from_slice(bytes)).unwrap())
    }

    /// The signature failure inside a named image's.
    fn bad_by(e: SignatureError) -> PublicKey {
        match e {
            SignatureError::Image { error, .. } => match *error {
                SignatureError::BadSignature { key } => key,
                e => panic!("{e}"),
            },
            e => panic!("{e}"),
        }
    }

    #[test]
    fn a_trusted_signature_passes_and_inspect_sees_the_signer() {
        let k = key(1);
        let signed = sign(&image(), &k, public(&k));
        let img = Image::parse(Bytes::from(signed.clone())).unwrap();
        assert_eq!(img.signature.as_ref().unwrap().key, public(&k));
        // The trailer is not part of the artifact region.
        assert_eq!(img.unsigned_bytes(), image());
        assert_eq!(
            check(&Trust(vec![public(&key(9)), public(&k)]), &signed),
            Ok(())
        );
    }

    #[test]
    fn unsigned_wrong_key_tampered_and_forged_images_are_refused_with_the_reason() {
        let k = key(1);
        let trust = Trust(vec![public(&k)]);
        // The refusal is the reason a user reads: it names the trusted keys.
        let e = check(&trust, &image()).unwrap_err();
        assert!(matches!(e, SignatureError::Unsigned { .. }), "{e}");
        assert!(
            e.to_string().contains("unsigned") && e.to_string().contains(&public(&k).to_string()),
            "{e}"
        );

        let other = key(2);
        let e = check(&trust, &sign(&image(), &other, public(&other))).unwrap_err();
        assert!(
            matches!(&e, SignatureError::Untrusted { key, .. } if *key == public(&other)),
            "{e}"
        );
        assert!(e.to_string().contains("does not trust"), "{e}");

        // An artifact changed after signing fails its checksum first.
        let mut tampered = sign(&image(), &k, public(&k));
        let at = image().len() - 1;
        tampered[at] ^= 1;
        let e = check(&trust, &tampered).unwrap_err();
        assert!(matches!(e, SignatureError::Tampered { .. }), "{e}");

        // A manifest changed after signing (same length: name "x" -> "y").
        let signed = sign(&image(), &k, public(&k));
        let name = HEADER_LEN
            + signed[HEADER_LEN..]
                .iter()
                .position(|&b| b == b'x')
                .unwrap();
        let mut renamed = signed.clone();
        renamed[name] = b'y';
        let e = check(&trust, &renamed).unwrap_err();
        assert!(e.to_string().contains("bad signature"), "{e}");
        assert_eq!(bad_by(e), public(&k));

        // Signed by another key but claiming the trusted one.
        let e = check(&trust, &sign(&image(), &other, public(&k))).unwrap_err();
        assert_eq!(bad_by(e), public(&k));
    }

    #[test]
    fn malformed_trailers_are_errors_not_unsigned() {
        let mut b = image();
        b.extend_from_slice(b"{}");
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(TRAILER_MAGIC);
        assert!(matches!(
            Image::parse(Bytes::from(b)),
            Err(crate::image::ImageError::Signature(_))
        ));
        let mut b = image();
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        b.extend_from_slice(TRAILER_MAGIC);
        assert!(Image::parse(Bytes::from(b)).is_err());
        // Every truncation of a signed image is an error or unsigned, never a panic.
        let signed = sign(&image(), &key(1), public(&key(1)));
        for cut in 0..signed.len() {
            let _ = Image::parse(Bytes::copy_from_slice(&signed[..cut]));
        }
    }

    #[test]
    fn public_keys_parse_from_hex_only() {
        let k = public(&key(1));
        assert_eq!(k.to_string().parse::<PublicKey>().unwrap(), k);
        assert!(matches!(
            "abcd".parse::<PublicKey>(),
            Err(KeyError::NotHex(_))
        ));
        assert!(matches!(
            PublicKey::parse_or_read("/nonexistent/key.pub"),
            Err(KeyError::NotHex(_))
        ));
    }
}

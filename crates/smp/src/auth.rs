//! Challenge–response authentication of hello peers (extension `auth`,
//! types 0x16 and 0x17).
//!
//! A peer that holds a secret announces the `auth` feature in its hello. A
//! server with an auth file answers that hello with an [`AuthChallenge`]
//! (32 random bytes, fresh per connection); the peer answers with an
//! [`AuthResponse`] holding
//!
//! ```text
//! HMAC-SHA256(secret, "corefarm-auth-v1" 0x00 || nonce || role || 0x00 || hello)
//! ```
//!
//! where `role` is `user` or `node` and `hello` is the hello payload exactly
//! as the peer sent it. Only then does the server send its own hello. The
//! secret never travels; a response is good for one nonce, one role and one
//! hello, so it cannot be replayed on another connection, and a user's
//! secret cannot produce a node's answer (the server checks each port's
//! role against that role's own secret).
//!
//! A user may name itself: the hello's `user` field names a tenant of the
//! server's auth file (`[users.<name>]`), and the answer then proves that
//! user's own secret. Without it the peer is the anonymous tenant and
//! proves the shared user secret. The name is inside the hello, so the
//! answer covers it: a tag made for one user cannot be passed off as
//! another's.

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::ProtocolError;
use crate::header::MsgType;
use crate::outframe::OutFrame;

/// Bytes of the server's nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of the peer's answer (an HMAC-SHA256 tag).
pub const MAC_LEN: usize = 32;
/// Shortest secret accepted anywhere: 16 bytes (128 bits if random).
pub const MIN_SECRET: usize = 16;
/// Domain separation: a tag made here is never valid for another protocol.
const CONTEXT: &[u8] = b"corefarm-auth-v1\0";

/// Environment variable holding a peer's secret itself.
pub const SECRET_ENV: &str = "COREFARM_SECRET";
/// Environment variable naming a file that holds a peer's secret.
pub const SECRET_FILE_ENV: &str = "COREFARM_SECRET_FILE";
/// Environment variable naming the user (tenant) a user program acts for.
pub const USER_ENV: &str = "COREFARM_USER";

/// Longest user name, in bytes.
pub const MAX_USER_NAME: usize = 64;
/// The account of users that name no tenant; no named user may take it.
pub const ANONYMOUS: &str = "anonymous";

/// Why a user name is refused. Names become TOML keys, log fields and
/// metrics label values, so they are kept to a small plain alphabet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserNameError {
    #[error("a user name may not be empty")]
    Empty,
    #[error("user name of {0} bytes; at most {MAX_USER_NAME}")]
    TooLong(usize),
    #[error("user name {0:?}: only letters, digits, '-', '_' and '.' are allowed")]
    BadChar(String),
    #[error("user name {ANONYMOUS:?} is the account of users that name none")]
    Reserved,
}

/// Checks a user (tenant) name: 1 to [`MAX_USER_NAME`] ASCII letters,
/// digits, `-`, `_` or `.`, and not [`ANONYMOUS`].
pub fn check_user_name(name: &str) -> Result<(), UserNameError> {
    if name.is_empty() {
        return Err(UserNameError::Empty);
    }
    if name.len() > MAX_USER_NAME {
        return Err(UserNameError::TooLong(name.len()));
    }
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !name.chars().all(ok) {
        let shown: String = name.chars().take(MAX_USER_NAME).collect();
        return Err(UserNameError::BadChar(shown));
    }
    if name == ANONYMOUS {
        return Err(UserNameError::Reserved);
    }
    Ok(())
}

/// The user named by `COREFARM_USER`, if set (and not empty).
pub fn user_from_env() -> Result<Option<String>, UserNameError> {
    match std::env::var(USER_ENV) {
        Ok(n) if !n.is_empty() => check_user_name(&n).map(|()| Some(n)),
        _ => Ok(None),
    }
}

/// `AuthChallenge` (0x16, server → peer): the nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthChallenge {
    pub nonce: [u8; NONCE_LEN],
}

impl AuthChallenge {
    pub fn parse(payload: &[u8]) -> Result<Self, ProtocolError> {
        Ok(AuthChallenge {
            nonce: fixed(payload, "auth challenge")?,
        })
    }

    pub fn to_frame(&self) -> OutFrame {
        OutFrame::small(
            MsgType::AuthChallenge,
            &[],
            Bytes::copy_from_slice(&self.nonce),
        )
    }
}

/// `AuthResponse` (0x17, peer → server): the tag over the challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthResponse {
    pub mac: [u8; MAC_LEN],
}

impl AuthResponse {
    pub fn parse(payload: &[u8]) -> Result<Self, ProtocolError> {
        Ok(AuthResponse {
            mac: fixed(payload, "auth response")?,
        })
    }

    /// The answer `secret` gives to `challenge` for a peer of `role` that sent `hello`.
    pub fn answer(secret: &Secret, challenge: &AuthChallenge, role: &str, hello: &[u8]) -> Self {
        AuthResponse {
            mac: mac(secret, &challenge.nonce, role, hello)
                .finalize()
                .into_bytes()
                .into(),
        }
    }

    /// Whether this answer proves `secret`; the comparison takes the same
    /// time wherever the tags differ.
    pub fn verify(
        &self,
        secret: &Secret,
        nonce: &[u8; NONCE_LEN],
        role: &str,
        hello: &[u8],
    ) -> bool {
        mac(secret, nonce, role, hello)
            .verify_slice(&self.mac)
            .is_ok()
    }

    pub fn to_frame(&self) -> OutFrame {
        OutFrame::small(
            MsgType::AuthResponse,
            &[],
            Bytes::copy_from_slice(&self.mac),
        )
    }
}

fn mac(secret: &Secret, nonce: &[u8; NONCE_LEN], role: &str, hello: &[u8]) -> Hmac<Sha256> {
    let mut m =
        <Hmac<Sha256> as Mac>::new_from_slice(&secret.0).expect("HMAC takes any key length");
    m.update(CONTEXT);
    m.update(nonce);
    m.update(role.as_bytes());
    m.update(&[0]);
    m.update(hello);
    m
}

fn fixed<const N: usize>(payload: &[u8], what: &'static str) -> Result<[u8; N], ProtocolError> {
    payload.try_into().map_err(|_| {
        ProtocolError::BadAuth(format!("{what} must be {N} bytes, got {}", payload.len()))
    })
}

/// A shared secret (bytes of text). Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// Why a secret, or a file meant to hold one, was refused. The text says
/// what to fix; it is what a user of the command line reads.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "a secret must be at least {MIN_SECRET} bytes, this one has {len} \
         (make one with: head -c 32 /dev/urandom | base64)"
    )]
    TooShort { len: usize },
    #[error("{SECRET_ENV} is not UTF-8")]
    EnvNotUtf8,
    /// A file could not be read; `what` names what it was meant to hold
    /// ("secret file ", or empty when only its permissions were checked).
    // The cause is in the message and not a `source`: error chains would
    // print it twice.
    #[error("cannot read {what}{}: {cause}", path.display())]
    Unreadable {
        what: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
    #[error(
        "{} is accessible to other users (mode {mode:03o}); it holds a secret, \
         so make it private: chmod 600 {}",
        path.display(),
        path.display()
    )]
    NotPrivate { path: PathBuf, mode: u32 },
    /// A bad secret, and where it came from (a file or a variable).
    #[error("{origin}: {error}")]
    From {
        origin: String,
        error: Box<SecretError>,
    },
}

impl SecretError {
    /// The refusal itself, without where the secret came from.
    pub fn root(&self) -> &SecretError {
        match self {
            SecretError::From { error, .. } => error.root(),
            e => e,
        }
    }

    fn came_from(origin: impl std::fmt::Display) -> impl FnOnce(SecretError) -> SecretError {
        let origin = origin.to_string();
        move |e| SecretError::From {
            origin,
            error: Box::new(e),
        }
    }
}

impl Secret {
    /// A secret given as text; surrounding whitespace (a file's final
    /// newline) is not part of it.
    pub fn new(text: &str) -> Result<Self, SecretError> {
        let t = text.trim();
        if t.len() < MIN_SECRET {
            return Err(SecretError::TooShort { len: t.len() });
        }
        Ok(Secret(t.as_bytes().to_vec()))
    }

    /// Reads a secret file. Like ssh with its keys, a file that other users
    /// may read is refused: anyone who can read it can act as this peer.
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        check_private(path)?;
        let text = std::fs::read_to_string(path).map_err(|cause| SecretError::Unreadable {
            what: "secret file ",
            path: path.to_path_buf(),
            cause,
        })?;
        Secret::new(&text).map_err(SecretError::came_from(path.display()))
    }

    /// The secret from the environment: `COREFARM_SECRET`, else the file
    /// named by `COREFARM_SECRET_FILE`; `None` when neither is set.
    pub fn from_env() -> Result<Option<Self>, SecretError> {
        if let Some(v) = std::env::var_os(SECRET_ENV) {
            let v = v.into_string().map_err(|_| SecretError::EnvNotUtf8)?;
            return Secret::new(&v)
                .map(Some)
                .map_err(SecretError::came_from(SECRET_ENV));
        }
        match std::env::var_os(SECRET_FILE_ENV) {
            Some(p) => Secret::from_file(Path::new(&p)).map(Some),
            None => Ok(None),
        }
    }

    /// `--secret-file` if given, else the environment.
    pub fn from_file_or_env(path: Option<&Path>) -> Result<Option<Self>, SecretError> {
        match path {
            Some(p) => Secret::from_file(p).map(Some),
            None => Secret::from_env(),
        }
    }
}

/// Refuses a file that its group or other users can read or write.
pub fn check_private(path: &Path) -> Result<(), SecretError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path).map_err(|cause| SecretError::Unreadable {
            what: "",
            path: path.to_path_buf(),
            cause,
        })?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::NotPrivate {
                path: path.to_path_buf(),
                mode,
            });
        }
    }
    let _ = path;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> Secret {
        Secret::new(s).unwrap()
    }

    #[test]
    fn answer_verifies_only_for_its_secret_role_nonce_and_hello() {
        let s = secret("0123456789abcdef-user");
        let ch = AuthChallenge {
            nonce: [7; NONCE_LEN],
        };
        let hello = br#"{"version":1,"role":"user"}"#;
        let r = AuthResponse::answer(&s, &ch, "user", hello);
        assert!(r.verify(&s, &ch.nonce, "user", hello));
        assert!(!r.verify(&secret("0123456789abcdef-node"), &ch.nonce, "user", hello));
        assert!(!r.verify(&s, &ch.nonce, "node", hello));
        assert!(!r.verify(&s, &[8; NONCE_LEN], "user", hello));
        assert!(!r.verify(
            &s,
            &ch.nonce,
            "user",
            br#"{"version":1,"role":"user","x":1}"#
        ));
    }

    #[test]
    fn user_names_are_plain_and_bounded() {
        assert_eq!(check_user_name("alice.b-2_x"), Ok(()));
        assert_eq!(check_user_name(""), Err(UserNameError::Empty));
        assert_eq!(
            check_user_name(&"a".repeat(65)),
            Err(UserNameError::TooLong(65))
        );
        assert!(matches!(
            check_user_name("a b"),
            Err(UserNameError::BadChar(_))
        ));
        assert!(matches!(
            check_user_name("é"),
            Err(UserNameError::BadChar(_))
        ));
        assert_eq!(check_user_name(ANONYMOUS), Err(UserNameError::Reserved));
    }

    #[test]
    fn frames_round_trip_and_wrong_sizes_are_refused() {
        let ch = AuthChallenge {
            nonce: [1; NONCE_LEN],
        };
        let wire = ch.to_frame().to_vec();
        assert_eq!(&wire[..8], &[0x16, 0, 0, 0, 32, 0, 0, 0]);
        assert_eq!(AuthChallenge::parse(&wire[8..]).unwrap(), ch);
        let r = AuthResponse { mac: [2; MAC_LEN] };
        let wire = r.to_frame().to_vec();
        assert_eq!(wire[0], 0x17);
        assert_eq!(AuthResponse::parse(&wire[8..]).unwrap(), r);
        assert!(AuthChallenge::parse(&[0; 31]).is_err());
        assert!(AuthResponse::parse(&[0; 33]).is_err());
    }

    #[test]
    fn short_secrets_are_refused_and_debug_hides_them() {
        assert!(matches!(
            Secret::new("short\n"),
            Err(SecretError::TooShort { len: 5 })
        ));
        let s = secret("  a-long-enough-secret\n");
        assert_eq!(s, secret("a-long-enough-secret"));
        assert!(!format!("{s:?}").contains("long"));
    }

    #[cfg(unix)]
    #[test]
    fn readable_secret_files_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secret");
        std::fs::write(&p, "a-long-enough-secret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Secret::from_file(&p).unwrap_err();
        assert!(
            matches!(&e, SecretError::NotPrivate { path, mode: 0o644 } if *path == p),
            "{e:?}"
        );
        // The text tells the user the fix.
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::write(&p, "short\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = Secret::from_file(&p).unwrap_err();
        assert!(
            matches!(e.root(), SecretError::TooShort { len: 5 }),
            "{e:?}"
        );
        assert!(e.to_string().starts_with(&p.display().to_string()), "{e}");
        std::fs::write(&p, "a-long-enough-secret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            Secret::from_file(&p).unwrap(),
            secret("a-long-enough-secret")
        );
    }
}

//! `--auth-file`: who may connect. Every connection passes `admit` before
//! it becomes a node or a user session: a hello peer must answer a fresh
//! challenge with its role's secret ([`corefarm_smp::auth`]); a seed-format
//! peer (no hello) is admitted only with `--allow-legacy`. The first message,
//! once read here, is handed on as a prefix of the connection's byte stream,
//! so the node and user handlers see exactly what the peer sent.
//!
//! Auth file (TOML, private to its owner):
//!
//! ```toml
//! [users]
//! secret = "…"   # held by user programs
//! [nodes]
//! secret = "…"   # held by node managers
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corefarm_smp::auth::{AuthChallenge, AuthResponse, Secret, NONCE_LEN};
use corefarm_smp::{
    hello::features, ConfigurationResponse, ErrorCode, ErrorMsg, Header, Hello, MsgType, OutFrame,
    ProtocolError, HEADER_LEN,
};
use rand::RngCore;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::tls::Stream;

use crate::limits::Port;

/// Largest hello accepted before authentication (a hello is a few hundred bytes).
const MAX_HELLO: u32 = 64 * 1024;
/// With `--allow-legacy`, a node that has said nothing for this long is a
/// seed-format node (those wait silently for a configuration).
pub const LEGACY_NODE_WAIT: Duration = Duration::from_secs(2);
/// Longest time spent telling a refused peer why.
const REFUSAL_WAIT: Duration = Duration::from_secs(5);

/// The secrets of an auth file.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    users: Secret,
    nodes: Secret,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    users: Role,
    nodes: Role,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Role {
    secret: String,
}

/// Why an auth file (or a pair of secrets) is refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    /// Other users may read it (see `smp::auth::check_private`).
    #[error(transparent)]
    NotPrivate(corefarm_smp::auth::SecretError),
    #[error("cannot read auth file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// What is wrong with its contents, with the file's name.
    #[error("auth file {}: {source}", path.display())]
    Contents {
        path: PathBuf,
        source: Box<AuthFileError>,
    },
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// A secret too weak to use; `role` is its table.
    #[error("[{role}]: {reason}")]
    BadSecret {
        role: &'static str,
        reason: corefarm_smp::auth::SecretError,
    },
    /// A user could then answer as a node and run code on every board.
    #[error("the user and node secrets must differ")]
    SameSecrets,
}

impl AuthConfig {
    /// Separate secrets for users and nodes. Equal secrets are refused: a
    /// user could then answer as a node and run code on every board.
    pub fn new(users: Secret, nodes: Secret) -> Result<Self, AuthFileError> {
        if users == nodes {
            return Err(AuthFileError::SameSecrets);
        }
        Ok(AuthConfig { users, nodes })
    }

    /// Reads `--auth-file`, refusing one that other users may read.
    pub fn load(path: &Path) -> Result<Self, AuthFileError> {
        corefarm_smp::auth::check_private(path).map_err(AuthFileError::NotPrivate)?;
        let text = std::fs::read_to_string(path).map_err(|source| AuthFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| AuthFileError::Contents {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    pub fn parse(text: &str) -> Result<Self, AuthFileError> {
        let f: File = toml::from_str(text)?;
        let secret = |role, text: &str| {
            Secret::new(text).map_err(|reason| AuthFileError::BadSecret { role, reason })
        };
        let users = secret("users", &f.users.secret)?;
        let nodes = secret("nodes", &f.nodes.secret)?;
        Self::new(users, nodes)
    }

    fn secret(&self, port: Port) -> &Secret {
        match port {
            Port::Users => &self.users,
            Port::Nodes => &self.nodes,
        }
    }
}

fn role(port: Port) -> &'static str {
    match port {
        Port::Users => "user",
        Port::Nodes => "node",
    }
}

/// Why a connection was refused, and what (if anything) the peer can understand of it.
struct Refusal {
    reason: String,
    reply: Option<OutFrame>,
}

impl Refusal {
    fn quiet(reason: String) -> Self {
        Refusal {
            reason,
            reply: None,
        }
    }

    /// A hello that cannot be read: only a peer that speaks the extensions
    /// sends one, so it is told why (`bad_hello`, `too-large`), as at a port
    /// without authentication.
    fn unreadable(e: ProtocolError) -> Self {
        let reason = format!("invalid hello: {e}");
        let reply = Some(ErrorMsg::new(ErrorMsg::NO_ID, e.code(), &reason).to_frame());
        Refusal { reason, reply }
    }

    /// To a hello peer: an error if it takes them, else just the close.
    fn hello(h: &Hello, reason: String) -> Self {
        let reply = h
            .has(features::ERROR)
            .then(|| ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Unauthorized, &reason).to_frame());
        Refusal { reason, reply }
    }
}

/// Authenticates a new connection. `Some(prefix)` admits it, `prefix` being
/// the bytes already read from it; `None` means it was refused (logged, and
/// told why in a form the peer understands) and closed.
pub(crate) async fn admit(
    mut stream: Stream,
    addr: SocketAddr,
    port: Port,
    cfg: &AuthConfig,
    allow_legacy: bool,
    timeout: Duration,
) -> Option<(Stream, Vec<u8>)> {
    let r = tokio::time::timeout(
        timeout,
        check(&mut stream, port, cfg, allow_legacy, timeout),
    )
    .await
    .unwrap_or_else(|_| {
        let seed = match port {
            // A seed-format node waits silently for its configuration.
            Port::Nodes => " (a seed-format node? those need --allow-legacy)",
            Port::Users => "",
        };
        Err(Refusal::quiet(format!(
            "did not authenticate within {timeout:?}{seed}"
        )))
    });
    match r {
        Ok((prefix, how)) => {
            tracing::info!(peer = %addr, "{} admitted: {how}", role(port));
            Some((stream, prefix))
        }
        Err(Refusal { reason, reply }) => {
            tracing::warn!(peer = %addr, "{} connection refused: {reason}", role(port));
            if let Some(f) = reply {
                // Answered here, holding the connection's slot, so refusals
                // stay bounded by --max-users/--max-nodes.
                let answer = async {
                    stream.write_all(&f.to_vec()).await?;
                    stream.shutdown().await?;
                    // Drain so the close does not reset the connection before the peer reads.
                    tokio::io::copy(&mut stream, &mut tokio::io::sink()).await
                };
                let _ = tokio::time::timeout(timeout.min(REFUSAL_WAIT), answer).await;
            }
            None
        }
    }
}

async fn check(
    stream: &mut Stream,
    port: Port,
    cfg: &AuthConfig,
    allow_legacy: bool,
    timeout: Duration,
) -> Result<(Vec<u8>, String), Refusal> {
    let io = |e: std::io::Error| Refusal::quiet(format!("read failed: {e}"));
    let mut hb = [0u8; HEADER_LEN];
    if port == Port::Nodes && allow_legacy {
        // A seed-format node never speaks first: silence means legacy. The
        // first byte is read rather than peeked (a TLS stream cannot peek)
        // and becomes part of the header below.
        match tokio::time::timeout(LEGACY_NODE_WAIT, stream.read(&mut hb[..1])).await {
            Err(_) => {
                let how = "seed-format node (silent), without authentication (--allow-legacy)";
                return Ok((Vec::new(), how.into()));
            }
            Ok(Ok(0)) => return Err(Refusal::quiet("closed before its first message".into())),
            Ok(r) => r.map_err(io)?,
        };
    } else {
        match stream.read_exact(&mut hb[..1]).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(Refusal::quiet("closed before its first message".into()))
            }
            Err(e) => return Err(io(e)),
        }
    }
    match stream.read_exact(&mut hb[1..]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(Refusal::quiet("closed within its first message".into()))
        }
        Err(e) => return Err(io(e)),
    }
    let header = match Header::decode(&hb, u32::MAX) {
        Ok(h) => h,
        Err(e) => return Err(Refusal::quiet(format!("invalid first message: {e}"))),
    };
    if header.ty != MsgType::Hello {
        if allow_legacy {
            let how = format!(
                "seed-format peer (first message: {}), without authentication (--allow-legacy)",
                header.ty.name()
            );
            return Ok((hb.to_vec(), how));
        }
        let reason = format!(
            "seed-format {} (first message: {}, no hello) refused: this server requires \
             authentication (--auth-file); seed-format peers need --allow-legacy",
            role(port),
            header.ty.name()
        );
        let reply = (port == Port::Users && header.ty == MsgType::Configuration).then(|| {
            ConfigurationResponse {
                status: ConfigurationResponse::FAILED,
            }
            .to_frame()
        });
        return Err(Refusal { reason, reply });
    }
    if header.size > MAX_HELLO {
        return Err(Refusal::unreadable(ProtocolError::TooLarge {
            size: header.size,
            max: MAX_HELLO,
        }));
    }
    let mut payload = vec![0u8; header.size as usize];
    stream.read_exact(&mut payload).await.map_err(io)?;
    let hello = Hello::decode(&payload).map_err(Refusal::unreadable)?;
    let want = role(port);
    if hello.role != want {
        let reason = format!("hello with role {:?} on the {want} port", hello.role);
        return Err(Refusal::hello(&hello, reason));
    }
    if !hello.has(features::AUTH) {
        let reason = format!(
            "this server requires authentication and the {want} offered none: give it the \
             {want} secret (--secret-file or COREFARM_SECRET)"
        );
        return Err(Refusal::hello(&hello, reason));
    }
    let mut nonce = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    stream
        .write_all(&AuthChallenge { nonce }.to_frame().to_vec())
        .await
        .map_err(|e| Refusal::quiet(format!("write failed: {e}")))?;
    let answer = read_response(stream, timeout)
        .await
        .map_err(|e| Refusal::hello(&hello, e.to_string()))?;
    if !answer.verify(cfg.secret(port), &nonce, want, &payload) {
        let reason = format!("authentication failed: the answer does not prove the {want} secret");
        return Err(Refusal::hello(&hello, reason));
    }
    let how = format!(
        "authenticated with the {want} secret (name {:?})",
        corefarm_telemetry::bounded(hello.name.as_deref().unwrap_or(""))
    );
    let mut prefix = hb.to_vec();
    prefix.extend_from_slice(&payload);
    Ok((prefix, how))
}

/// Why a peer's answer to the challenge could not be read; the message is
/// the reason the peer is told.
#[derive(Debug, thiserror::Error)]
enum NoAnswer {
    #[error("no answer to the challenge: {0}")]
    Io(#[from] std::io::Error),
    #[error("no answer to the challenge within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Header(#[from] corefarm_smp::ProtocolError),
    #[error("expected an auth-response, got a {0} message")]
    NotAResponse(&'static str),
    #[error("auth-response of {0} bytes")]
    Size(u32),
}

async fn read_response(stream: &mut Stream, timeout: Duration) -> Result<AuthResponse, NoAnswer> {
    let read = async {
        let mut hb = [0u8; HEADER_LEN];
        stream.read_exact(&mut hb).await?;
        Ok::<_, std::io::Error>(hb)
    };
    let hb = tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| NoAnswer::Timeout(timeout))??;
    let header = Header::decode(&hb, u32::MAX)?;
    if header.ty != MsgType::AuthResponse {
        return Err(NoAnswer::NotAResponse(header.ty.name()));
    }
    if header.size as usize != corefarm_smp::auth::MAC_LEN {
        return Err(NoAnswer::Size(header.size));
    }
    let mut mac = [0u8; corefarm_smp::auth::MAC_LEN];
    stream.read_exact(&mut mac).await?;
    Ok(AuthResponse { mac })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_file_parses_and_refuses_bad_contents() {
        let ok = "[users]\nsecret = \"user-secret-0123456789\"\n[nodes]\nsecret = \"node-secret-0123456789\"\n";
        let c = AuthConfig::parse(ok).unwrap();
        assert_ne!(c.secret(Port::Users), c.secret(Port::Nodes));
        let same = "[users]\nsecret = \"same-secret-0123456789\"\n[nodes]\nsecret = \"same-secret-0123456789\"\n";
        assert!(matches!(
            AuthConfig::parse(same),
            Err(AuthFileError::SameSecrets)
        ));
        let short = "[users]\nsecret = \"short\"\n[nodes]\nsecret = \"node-secret-0123456789\"\n";
        assert!(matches!(
            AuthConfig::parse(short),
            Err(AuthFileError::BadSecret { role: "users", .. })
        ));
        assert!(matches!(
            AuthConfig::parse("[users]\nsecret = \"user-secret-0123456789\"\n"),
            Err(AuthFileError::Toml(_))
        ));
        assert!(matches!(
            AuthConfig::parse(&format!("{ok}[admin]\nsecret=\"x\"\n")),
            Err(AuthFileError::Toml(_))
        ));
    }
}

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
//! secret = "…"   # held by user programs that name no user (optional)
//! [users.alice]  # a named user (tenant), with its own secret
//! secret = "…"
//! weight = 3                  # share of node time (default 1)
//! max_nodes = 4               # optional
//! max_queued_bytes = 1048576  # optional
//! [nodes]
//! secret = "…"   # held by node managers
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corefarm_smp::auth::{
    check_user_name, AuthChallenge, AuthResponse, Secret, UserNameError, ANONYMOUS, NONCE_LEN,
    USER_ENV,
};
use corefarm_smp::{
    hello::features, ConfigurationResponse, ErrorCode, ErrorMsg, Header, Hello, MsgType, OutFrame,
    ProtocolError, HEADER_LEN,
};
use corefarm_telemetry::bounded;
use rand::RngCore;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::tls::Stream;

use crate::limits::Port;

/// Largest hello accepted before authentication (a hello is a few hundred bytes).
const MAX_HELLO: u32 = 64 * 1024;
/// With `--allow-legacy`, a node that has said nothing for this long is a
/// seed-format node (those wait silently for a configuration).
pub const LEGACY_NODE_WAIT: Duration = Duration::from_secs(2);
/// Longest time spent telling a refused peer why.
const REFUSAL_WAIT: Duration = Duration::from_secs(5);

/// A tenant: who a user session acts for, with its share and limits.
/// Named tenants come from `[users.<name>]`; the shared `[users] secret`
/// (and a server without an auth file, for users that name none) is the
/// anonymous one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// `None`: the anonymous tenant.
    pub name: Option<String>,
    pub limits: Limits,
}

impl Tenant {
    /// The tenant of users that name none: weight 1, no limits.
    pub fn anonymous() -> Self {
        Tenant {
            name: None,
            limits: Limits::default(),
        }
    }

    /// A named tenant with the default share and no limits.
    pub fn named(name: &str) -> Self {
        Tenant {
            name: Some(name.to_string()),
            limits: Limits::default(),
        }
    }

    /// Its account's name: the user's, or [`ANONYMOUS`].
    pub fn account(&self) -> &str {
        self.name.as_deref().unwrap_or(ANONYMOUS)
    }
}

/// A tenant's share of node time and its limits (`[users.<name>]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Its share of node time against other active users (shared mode).
    #[serde(default = "one")]
    pub weight: u32,
    /// Most nodes its sessions hold at once.
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// Most bytes of its data messages waiting in the server at once.
    #[serde(default)]
    pub max_queued_bytes: Option<u64>,
}

fn one() -> u32 {
    1
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            weight: 1,
            max_nodes: None,
            max_queued_bytes: None,
        }
    }
}

/// The secrets of an auth file.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// The shared user secret: users that name none (the anonymous tenant).
    users: Option<Secret>,
    /// Named users, each with its own secret.
    named: BTreeMap<String, (Secret, Arc<Tenant>)>,
    nodes: Secret,
    anonymous: Arc<Tenant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    users: Users,
    nodes: Role,
}

/// `[users]`: the shared secret and/or `[users.<name>]` tables.
#[derive(Deserialize)]
struct Users {
    #[serde(default)]
    secret: Option<String>,
    #[serde(flatten)]
    named: BTreeMap<String, Named>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Named {
    secret: String,
    #[serde(flatten)]
    limits: Limits,
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
        role: String,
        reason: corefarm_smp::auth::SecretError,
    },
    /// A user could then answer as a node and run code on every board.
    #[error("the user and node secrets must differ")]
    SameSecrets,
    /// `[users.<name>]` with a name that cannot be a user's.
    #[error("[users.{name}]: {reason}")]
    BadName { name: String, reason: UserNameError },
    /// A weight of 0 would give the user no node time at all.
    #[error("[users.{0}]: weight must be at least 1")]
    ZeroWeight(String),
    /// Neither a shared `[users] secret` nor any `[users.<name>]`.
    #[error("[users] needs a secret, or at least one [users.<name>] with its own")]
    NoUsers,
}

impl AuthConfig {
    /// Separate secrets for users and nodes. Equal secrets are refused: a
    /// user could then answer as a node and run code on every board.
    pub fn new(users: Secret, nodes: Secret) -> Result<Self, AuthFileError> {
        if users == nodes {
            return Err(AuthFileError::SameSecrets);
        }
        Ok(AuthConfig {
            users: Some(users),
            named: BTreeMap::new(),
            nodes,
            anonymous: Arc::new(Tenant::anonymous()),
        })
    }

    /// Named users only: users that name none are refused.
    pub fn named_only(nodes: Secret) -> Self {
        AuthConfig {
            users: None,
            named: BTreeMap::new(),
            nodes,
            anonymous: Arc::new(Tenant::anonymous()),
        }
    }

    /// Adds (or replaces) the named user `name` with its own secret.
    pub fn add_user(
        &mut self,
        name: &str,
        secret: Secret,
        limits: Limits,
    ) -> Result<(), AuthFileError> {
        let bad = |reason| AuthFileError::BadName {
            name: name.to_string(),
            reason,
        };
        check_user_name(name).map_err(bad)?;
        if limits.weight == 0 {
            return Err(AuthFileError::ZeroWeight(name.to_string()));
        }
        if secret == self.nodes {
            return Err(AuthFileError::SameSecrets);
        }
        let tenant = Tenant {
            name: Some(name.to_string()),
            limits,
        };
        self.named
            .insert(name.to_string(), (secret, Arc::new(tenant)));
        Ok(())
    }

    /// Every named tenant, by name (their accounts exist from the start).
    pub fn tenants(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.named.values().map(|(_, t)| t)
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
        let secret = |role: &str, text: &str| {
            Secret::new(text).map_err(|reason| AuthFileError::BadSecret {
                role: role.to_string(),
                reason,
            })
        };
        let nodes = secret("nodes", &f.nodes.secret)?;
        let mut cfg = match &f.users.secret {
            Some(s) => Self::new(secret("users", s)?, nodes)?,
            None if f.users.named.is_empty() => return Err(AuthFileError::NoUsers),
            None => Self::named_only(nodes),
        };
        for (name, n) in f.users.named {
            let s = secret(&format!("users.{name}"), &n.secret)?;
            cfg.add_user(&name, s, n.limits)?;
        }
        Ok(cfg)
    }

    /// Checks a peer's answer to `nonce` against the secret its hello
    /// claims: the node secret on the node port; on the user port the
    /// named user's own (hello `user`), else the shared user secret.
    /// Returns the tenant a user session acts for.
    pub(crate) fn verify(
        &self,
        port: Port,
        hello: &Hello,
        payload: &[u8],
        nonce: &[u8; NONCE_LEN],
        answer: &AuthResponse,
    ) -> Result<Option<Arc<Tenant>>, Denied> {
        let want = role(port);
        let (secret, tenant) = match (port, &hello.user) {
            (Port::Nodes, _) => (&self.nodes, None),
            (Port::Users, Some(name)) => match self.named.get(name) {
                Some((s, t)) => (s, Some(t)),
                None => return Err(Denied::UnknownUser(bounded(name).into_owned())),
            },
            (Port::Users, None) => match &self.users {
                Some(s) => (s, Some(&self.anonymous)),
                None => return Err(Denied::NamedOnly),
            },
        };
        if !answer.verify(secret, nonce, want, payload) {
            return Err(match (port, &hello.user) {
                (Port::Users, Some(name)) => Denied::WrongUserSecret(name.clone()),
                _ => Denied::WrongSecret(want),
            });
        }
        Ok(tenant.cloned())
    }
}

/// Why a peer's answer to the challenge was refused (code `unauthorized`);
/// the text is the reason the peer is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The hello names a user the auth file does not have.
    #[error("authentication failed: unknown user {0:?}")]
    UnknownUser(String),
    /// The answer does not prove the named user's own secret.
    #[error("authentication failed: the answer does not prove the secret of user {0:?}")]
    WrongUserSecret(String),
    /// The answer does not prove the role's shared secret (`user`/`node`).
    #[error("authentication failed: the answer does not prove the {0} secret")]
    WrongSecret(&'static str),
    /// No shared user secret: every user must name itself.
    #[error(
        "authentication failed: this server admits named users only; name one \
         ({USER_ENV}, --user, or `user` in the client's options)"
    )]
    NamedOnly,
}

fn role(port: Port) -> &'static str {
    match port {
        Port::Users => "user",
        Port::Nodes => "node",
    }
}

/// Why [`admit`] refused a connection, as `errors_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    /// No or a wrong answer to the challenge, no `auth` feature, the wrong
    /// role for the port, a seed-format peer without `--allow-legacy`.
    #[error("not authenticated")]
    Auth,
    /// A hello that does not decode or is too large.
    #[error("invalid hello")]
    BadHello,
}

impl From<Refused> for crate::metrics::ErrorKind {
    fn from(r: Refused) -> Self {
        match r {
            Refused::Auth => crate::metrics::ErrorKind::AuthFailed,
            Refused::BadHello => crate::metrics::ErrorKind::BadHello,
        }
    }
}

/// Why a connection was refused, and what (if anything) the peer can understand of it.
struct Refusal {
    reason: String,
    reply: Option<OutFrame>,
    kind: Refused,
}

impl Refusal {
    fn quiet(reason: String) -> Self {
        Refusal {
            reason,
            reply: None,
            kind: Refused::Auth,
        }
    }

    /// A hello that cannot be read: only a peer that speaks the extensions
    /// sends one, so it is told why (`bad_hello`, `too-large`), as at a port
    /// without authentication.
    fn unreadable(e: ProtocolError) -> Self {
        let reason = format!("invalid hello: {e}");
        let reply = Some(ErrorMsg::new(ErrorMsg::NO_ID, e.code(), &reason).to_frame());
        Refusal {
            reason,
            reply,
            kind: Refused::BadHello,
        }
    }

    /// To a hello peer: an error if it takes them, else just the close.
    fn hello(h: &Hello, reason: String) -> Self {
        let reply = h
            .has(features::ERROR)
            .then(|| ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Unauthorized, &reason).to_frame());
        Refusal {
            reason,
            reply,
            kind: Refused::Auth,
        }
    }
}

/// A connection through the gate.
pub(crate) struct Admitted {
    /// The bytes already read from it.
    pub prefix: Vec<u8>,
    /// A user's tenant, proven by its answer; `None` for a node or a
    /// seed-format peer (admitted with `--allow-legacy`, so anonymous).
    pub tenant: Option<Arc<Tenant>>,
}

impl Admitted {
    fn unnamed(prefix: Vec<u8>) -> Self {
        Admitted {
            prefix,
            tenant: None,
        }
    }
}

/// Authenticates a new connection. `Ok(prefix)` admits it, `prefix` being
/// the bytes already read from it; `Err` means it was refused (logged, and
/// told why in a form the peer understands) and closed. A refusal is held
/// the longer the more its address failed lately ([`Throttle`]), and only
/// every power of two of an address's failures in a row is logged at warn
/// level (the rest at debug), so a flood of wrong answers costs its sender
/// time and the log a few lines.
pub(crate) async fn admit(
    mut stream: Stream,
    addr: SocketAddr,
    port: Port,
    (cfg, throttle, metrics): (&AuthConfig, &Throttle, &crate::metrics::Metrics),
    allow_legacy: bool,
    timeout: Duration,
) -> Result<(Stream, Admitted), Refused> {
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
        Ok((admitted, how)) => {
            tracing::info!(peer = %addr, "{} admitted: {how}", role(port));
            throttle.succeeded(addr.ip());
            Ok((stream, admitted))
        }
        Err(Refusal {
            reason,
            reply,
            kind,
        }) => {
            // Counted at once, not once the peer has read the answer.
            metrics.error(kind.into());
            let c = throttle.failed(addr.ip());
            // Within the way in's deadline (`--read-timeout`, which also
            // bounds the check above), so the peer still hears why.
            let held = c.hold.min(timeout / 4);
            let what = role(port);
            if c.count == 1 {
                tracing::warn!(peer = %addr, "{what} connection refused: {reason}");
            } else if c.count.is_power_of_two() {
                tracing::warn!(peer = %addr,
                    "{what} connection refused: {reason} ({} refusals from {} in a row, each \
                     within {FORGET_AFTER:?} of the last; the answer is held {:?}; the next \
                     logged here at {})", c.count, addr.ip(), held, c.count * 2);
            } else {
                tracing::debug!(peer = %addr, "{what} connection refused: {reason}");
            }
            // A peer that leaves meanwhile frees its place at once: the
            // hold delays an answer, not the close of a connection gone.
            let gone = async {
                let mut b = [0u8; 256];
                while let Ok(1..) = stream.read(&mut b).await {}
            };
            tokio::select! {
                _ = tokio::time::sleep(held) => {}
                _ = gone => {}
            }
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
            Err(kind)
        }
    }
}

/// How long the refusal of an address's `n`th recent authentication
/// failure is held: [`FIRST_DELAY`], doubling, at most [`MAX_DELAY`].
pub(crate) fn hold(n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(16);
    FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
}

/// The first refusal of an address is held this long, the next ones twice
/// as long each: a peer guessing secrets from one address tries a few per
/// second at most, while a mistyped secret costs a person a blink.
pub(crate) const FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest a refusal is held: well within `--read-timeout`'s default
/// (and never more than a quarter of it), so the peer still hears why.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(2);
/// An address without a failure for this long starts afresh.
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(60);
/// Addresses remembered at once; beyond them (after forgetting the quiet
/// ones), a new address is held [`MAX_DELAY`] at once.
const MAX_ADDRESSES: usize = 4096;

/// Recent authentication failures per source address (its IP: a peer
/// picks its source port freely).
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    seen: Mutex<HashMap<IpAddr, Failures>>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

/// One failure as [`Throttle::failed`] counted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    /// Failures from the address within [`FORGET_AFTER`] of each other.
    pub count: u32,
    /// How long its refusal is held.
    pub hold: Duration,
}

impl Throttle {
    /// Counts a failure from `ip`.
    pub fn failed(&self, ip: IpAddr) -> Counted {
        let now = Instant::now();
        let mut seen = self.seen.lock().expect("throttle lock");
        if seen.len() >= MAX_ADDRESSES && !seen.contains_key(&ip) {
            seen.retain(|_, f| now.duration_since(f.last) < FORGET_AFTER);
            if seen.len() >= MAX_ADDRESSES {
                return Counted {
                    count: 1,
                    hold: MAX_DELAY,
                };
            }
        }
        let f = seen.entry(ip).or_insert(Failures {
            count: 0,
            last: now,
        });
        if now.duration_since(f.last) >= FORGET_AFTER {
            f.count = 0;
        }
        f.count = f.count.saturating_add(1);
        f.last = now;
        Counted {
            count: f.count,
            hold: hold(f.count),
        }
    }

    /// `ip` proved its secret: its failures are forgotten.
    pub fn succeeded(&self, ip: IpAddr) {
        self.seen.lock().expect("throttle lock").remove(&ip);
    }
}

async fn check(
    stream: &mut Stream,
    port: Port,
    cfg: &AuthConfig,
    allow_legacy: bool,
    timeout: Duration,
) -> Result<(Admitted, String), Refusal> {
    let io = |e: std::io::Error| Refusal::quiet(format!("read failed: {e}"));
    let mut hb = [0u8; HEADER_LEN];
    if port == Port::Nodes && allow_legacy {
        // A seed-format node never speaks first: silence means legacy. The
        // first byte is read rather than peeked (a TLS stream cannot peek)
        // and becomes part of the header below.
        match tokio::time::timeout(LEGACY_NODE_WAIT, stream.read(&mut hb[..1])).await {
            Err(_) => {
                let how = "seed-format node (silent), without authentication (--allow-legacy)";
                return Ok((Admitted::unnamed(Vec::new()), how.into()));
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
            return Ok((Admitted::unnamed(hb.to_vec()), how));
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
        return Err(Refusal {
            reason,
            reply,
            kind: Refused::Auth,
        });
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
    let tenant = cfg
        .verify(port, &hello, &payload, &nonce, &answer)
        .map_err(|e| Refusal::hello(&hello, e.to_string()))?;
    let how = match &tenant {
        Some(t) if t.name.is_some() => format!(
            "authenticated as user {:?} (name {:?})",
            t.account(),
            bounded(hello.name.as_deref().unwrap_or(""))
        ),
        _ => format!(
            "authenticated with the {want} secret (name {:?})",
            bounded(hello.name.as_deref().unwrap_or(""))
        ),
    };
    let mut prefix = hb.to_vec();
    prefix.extend_from_slice(&payload);
    Ok((Admitted { prefix, tenant }, how))
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

    /// Repeated failures from one address are held longer each time, up to
    /// [`MAX_DELAY`]; another address's are not; a quiet [`FORGET_AFTER`]
    /// or a success starts afresh.
    #[tokio::test(start_paused = true)]
    async fn repeated_failures_from_one_address_are_slowed_down() {
        let t = Throttle::default();
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let ms = Duration::from_millis;
        let held: Vec<Duration> = (0..40).map(|_| t.failed(a).hold).collect();
        assert_eq!(
            held[..6],
            [ms(100), ms(200), ms(400), ms(800), ms(1600), MAX_DELAY]
        );
        assert!(held[6..].iter().all(|&h| h == MAX_DELAY), "{held:?}");
        let first = Counted {
            count: 1,
            hold: FIRST_DELAY,
        };
        assert_eq!(t.failed(b), first);
        tokio::time::advance(FORGET_AFTER - ms(1)).await;
        assert_eq!(t.failed(a).count, 41, "still within a minute of the last");
        tokio::time::advance(FORGET_AFTER).await;
        assert_eq!(t.failed(a), first);
        t.failed(a);
        t.succeeded(a);
        assert_eq!(t.failed(a), first);
    }

    /// The table of addresses is bounded: beyond it, quiet addresses are
    /// forgotten, and while all are recent a new one is held the longest.
    #[tokio::test(start_paused = true)]
    async fn the_table_of_addresses_is_bounded() {
        let t = Throttle::default();
        let ip = |i: usize| IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8]);
        for i in 0..MAX_ADDRESSES {
            t.failed(ip(i));
        }
        let extra = ip(MAX_ADDRESSES);
        assert_eq!(t.failed(extra).hold, MAX_DELAY);
        assert_eq!(t.seen.lock().unwrap().len(), MAX_ADDRESSES);
        tokio::time::advance(FORGET_AFTER).await;
        assert_eq!(t.failed(extra).hold, FIRST_DELAY);
        assert_eq!(t.seen.lock().unwrap().len(), 1);
    }

    #[test]
    fn auth_file_parses_and_refuses_bad_contents() {
        let ok = "[users]\nsecret = \"user-secret-0123456789\"\n[nodes]\nsecret = \"node-secret-0123456789\"\n";
        let c = AuthConfig::parse(ok).unwrap();
        assert_ne!(c.users.as_ref(), Some(&c.nodes));
        let same = "[users]\nsecret = \"same-secret-0123456789\"\n[nodes]\nsecret = \"same-secret-0123456789\"\n";
        assert!(matches!(
            AuthConfig::parse(same),
            Err(AuthFileError::SameSecrets)
        ));
        let short = "[users]\nsecret = \"short\"\n[nodes]\nsecret = \"node-secret-0123456789\"\n";
        assert!(matches!(
            AuthConfig::parse(short),
            Err(AuthFileError::BadSecret { role, .. }) if role == "users"
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

    const NODES: &str = "[nodes]\nsecret = \"node-secret-0123456789\"\n";

    #[test]
    fn named_users_parse_with_their_shares_and_limits() {
        let text = format!(
            "[users]\nsecret = \"user-secret-0123456789\"\n\
             [users.alice]\nsecret = \"alice-secret-0123456789\"\nweight = 3\nmax_nodes = 2\n\
             max_queued_bytes = 4096\n[users.bob]\nsecret = \"bob-secret-0123456789\"\n{NODES}"
        );
        let c = AuthConfig::parse(&text).unwrap();
        let t: Vec<&Tenant> = c.tenants().map(|t| &**t).collect();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].account(), "alice");
        let alice = Limits {
            weight: 3,
            max_nodes: Some(2),
            max_queued_bytes: Some(4096),
        };
        assert_eq!(t[0].limits, alice);
        assert_eq!(t[1].limits, Limits::default());
        // Named users alone: the anonymous secret is optional.
        let named = format!("[users.alice]\nsecret = \"alice-secret-0123456789\"\n{NODES}");
        assert!(AuthConfig::parse(&named).unwrap().users.is_none());
    }

    #[test]
    fn bad_named_users_are_refused_with_what_is_wrong() {
        let parse = |users: &str| AuthConfig::parse(&format!("{users}{NODES}"));
        assert!(matches!(parse("[users]\n"), Err(AuthFileError::NoUsers)));
        assert!(matches!(
            parse("[users.\"a b\"]\nsecret = \"alice-secret-0123456789\"\n"),
            Err(AuthFileError::BadName {
                reason: UserNameError::BadChar(_),
                ..
            })
        ));
        assert!(matches!(
            parse("[users.anonymous]\nsecret = \"alice-secret-0123456789\"\n"),
            Err(AuthFileError::BadName {
                reason: UserNameError::Reserved,
                ..
            })
        ));
        assert!(matches!(
            parse("[users.a]\nsecret = \"alice-secret-0123456789\"\nweight = 0\n"),
            Err(AuthFileError::ZeroWeight(n)) if n == "a"
        ));
        assert!(matches!(
            parse("[users.a]\nsecret = \"node-secret-0123456789\"\n"),
            Err(AuthFileError::SameSecrets)
        ));
        let e = parse("[users.a]\nsecret = \"short\"\n").unwrap_err();
        assert!(
            matches!(&e, AuthFileError::BadSecret { role, .. } if role == "users.a"),
            "{e}"
        );
        assert!(matches!(
            parse("[users.a]\nsecret = \"alice-secret-0123456789\"\nmax_cpus = 3\n"),
            Err(AuthFileError::Toml(_))
        ));
    }

    #[test]
    fn a_named_user_proves_its_own_secret() {
        let s = |t: &str| Secret::new(t).unwrap();
        let mut c =
            AuthConfig::new(s("user-secret-0123456789"), s("node-secret-0123456789")).unwrap();
        let limits = Limits {
            weight: 2,
            ..Limits::default()
        };
        c.add_user("alice", s("alice-secret-0123456789"), limits)
            .unwrap();
        let nonce = [3u8; NONCE_LEN];
        let ch = AuthChallenge { nonce };
        let check = |user: Option<&str>, secret: &str| {
            let mut h = Hello::new("user");
            h.user = user.map(String::from);
            let payload = h.encode();
            let answer = AuthResponse::answer(&s(secret), &ch, "user", &payload);
            c.verify(Port::Users, &h, &payload, &nonce, &answer)
        };
        let alice = check(Some("alice"), "alice-secret-0123456789")
            .unwrap()
            .unwrap();
        assert_eq!((alice.account(), alice.limits.weight), ("alice", 2));
        let anon = check(None, "user-secret-0123456789").unwrap().unwrap();
        assert_eq!(anon.name, None);
        assert_eq!(
            check(Some("bob"), "alice-secret-0123456789"),
            Err(Denied::UnknownUser("bob".into()))
        );
        assert_eq!(
            check(Some("alice"), "user-secret-0123456789"),
            Err(Denied::WrongUserSecret("alice".into()))
        );
        // Alice's secret is not the shared one.
        assert_eq!(
            check(None, "alice-secret-0123456789"),
            Err(Denied::WrongSecret("user"))
        );
        let named_only = {
            let mut c = AuthConfig::named_only(s("node-secret-0123456789"));
            c.add_user("alice", s("alice-secret-0123456789"), Limits::default())
                .unwrap();
            c
        };
        let h = Hello::new("user");
        let payload = h.encode();
        let answer = AuthResponse::answer(&s("alice-secret-0123456789"), &ch, "user", &payload);
        assert_eq!(
            named_only.verify(Port::Users, &h, &payload, &nonce, &answer),
            Err(Denied::NamedOnly)
        );
    }
}

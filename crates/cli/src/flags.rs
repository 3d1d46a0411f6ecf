//! Why a flag's value is refused. clap prints the message after
//! `invalid value 'V' for '--flag <FLAG>': `, so the text is what the user
//! reads (tests/cli_misuse.rs checks it); the parsers live beside their
//! flags.

use std::num::ParseIntError;
use std::path::PathBuf;
use std::time::TryFromFloatSecsError;

use corefarm_smp::stream::CLASSES;
pub use corefarm_smp::stream::MAX_CHUNK_SIZE;

/// The smallest `--max-message`/`--node-max-message`: below it not even the
/// hello exchange fits, and every peer fails with a confusing protocol error.
pub const MIN_MAX_MESSAGE: u32 = 1024;

/// The smallest chunk size: below it a chunk costs more than it saves (the
/// server refuses users asking for less).
pub const MIN_CHUNK_SIZE: u32 = 512;

#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    #[error("{given:?} is not IP:PORT or none: {error}")]
    PeerListen {
        given: String,
        error: std::net::AddrParseError,
    },
    #[error("{given:?} is not a decimal or 0x-hex number: {error}")]
    Number { given: String, error: ParseIntError },
    #[error("{0:?} is not a positive number of seconds")]
    PositiveSeconds(String),
    #[error("empty programmer command")]
    EmptyProgrammer,
    #[error("{0:?}: unbalanced quotes in the programmer command")]
    UnbalancedQuotes(String),
    #[error("{0:?} is not a number of seconds")]
    Seconds(String),
    #[error("{0:?}: a timeout must be more than 0 seconds")]
    ZeroTimeout(String),
    #[error(
        "{given:?} is neither an Ed25519 public key (64 hex digits) nor a readable .pub file{}",
        if *exists { "" } else { " (no such file)" }
    )]
    NotAPublicKey { given: String, exists: bool },
    /// A secret key given where its public half belongs.
    #[error(
        "{given} is a secret signing key ({} beside it is its public half): give --trust {}, \
         and keep {given} off the nodes",
        public.display(),
        public.display()
    )]
    SecretKey { given: String, public: PathBuf },
    /// A public key file that does not hold a key.
    #[error("{0}")]
    PublicKeyFile(String),
    #[error("{0} bytes is too small: at least {MIN_MAX_MESSAGE} bytes, or no peer's hello fits")]
    MaxMessageTooSmall(u32),
    #[error("{0} bytes is not a chunk size: give 0 (no chunks) or {MIN_CHUNK_SIZE} to {MAX_CHUNK_SIZE} bytes")]
    ChunkSize(u32),
    #[error("{given:?} is not a number of bytes: {error}")]
    Bytes { given: String, error: ParseIntError },
    #[error("0 would refuse every connection: give at least 1")]
    NoConnections,
    #[error("{given:?} is not a number of connections: {error}")]
    Connections { given: String, error: ParseIntError },
    #[error("{0:?} is not a period in milliseconds (0.1 or more)")]
    Period(String),
    #[error("{0:?}: expected class=messages, class 0 to 7, e.g. 6=40")]
    ClassDepth(String),
    #[error("{0:?}: expected class=rate, e.g. 0=30")]
    RatePair(String),
    #[error("{0:?} is not a rate in messages per second")]
    Rate(String),
    #[error("{0:?}: a rate is a finite number ≥ 0")]
    NegativeRate(String),
    #[error("{0:?} is not a class (0 to {max}, 0 most urgent)", max = CLASSES - 1)]
    Class(String),
    #[error("{0:?} is not a relative change (a number of 0 or more, e.g. 0.05 for 5 %)")]
    Threshold(String),
    #[error("{0:?} is not a size")]
    Size(String),
    #[error("{0:?}: at most 1 GiB")]
    SizeTooLarge(String),
    #[error("not a duration: {0:?}")]
    Duration(String),
    #[error("unknown unit {unit:?} in {given:?} (ms, s, m, h)")]
    DurationUnit { unit: String, given: String },
    #[error("{given:?}: {error}")]
    DurationRange {
        given: String,
        error: TryFromFloatSecsError,
    },
}

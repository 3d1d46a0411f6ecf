//! The optional hello exchange (corefarm extension, type 0x10).
//!
//! A peer that opens with `Hello` gets the extensions; a peer that opens with
//! a seed message (a configuration) gets exactly the seed's behaviour. The
//! payload is a UTF-8 JSON object so that fields can be added without a new
//! version; unknown fields are ignored.

use serde::{Deserialize, Serialize};

use crate::error::ProtocolError;

/// Extension features a peer can announce. The server answers with the
/// subset it will use on this connection.
pub mod features {
    /// The peer understands `Error` messages (type 0x11) carrying a reason.
    pub const ERROR: &str = "error";
    /// The user takes part in credit-based flow control (type 0x12):
    /// it sends a data message only while it holds a credit.
    pub const CREDIT: &str = "credit";
    /// The user may ask the server what it is doing: `StatusRequest` (0x13,
    /// empty) is answered by `Status` (0x14, a JSON [`crate::ClusterStatus`]).
    pub const STATUS: &str = "status";
    /// The node has a peer port for the node fabric: its hello's
    /// `peer` field is where other nodes of a group reach it with peer
    /// messages (type 0x15, [`crate::peer`]); only nodes ever connect there.
    pub const PEER: &str = "peer";
    /// The peer holds a secret and answers an `AuthChallenge` (0x16) with
    /// an `AuthResponse` (0x17) before the server's hello ([`crate::auth`]).
    pub const AUTH: &str = "auth";
    /// Shared mode: a data message that finds its function's
    /// queue full is answered with an `Error` (code `QueueFull`) instead of
    /// the server pausing reads from the user's socket.
    pub const QUEUE_FULL: &str = "queue-full";
    /// The user drives a group of gang-allocated nodes: group
    /// control (0x18), commands (0x19) and replies (0x1A), see [`crate::group`].
    pub const GROUP: &str = "group";
    /// Group commands may carry a priority class: the high
    /// nibble of a command's byte 8 (docs/protocol.md "0x19 — group
    /// command"). Agreed user ↔ server and server ↔ node; the server
    /// clears the class of a command it relays to a node without it, and
    /// a client whose server did not agree sends every command in the
    /// default class.
    pub const GROUP_PRIORITY: &str = "group-priority";
    /// Messages as streams: on this link a data message (and a
    /// result) may travel as chunks (type 0x1D, [`crate::stream`]) of at
    /// most the negotiated `chunk_size` bytes, each carrying a priority
    /// class 0–7 (0 is the most urgent); chunks of different messages
    /// interleave. A data message sent whole is class
    /// [`crate::stream::chunk::DEFAULT_CLASS`]. Seed-format peers never see a chunk.
    pub const CHUNKS: &str = "chunks";
    /// Streaming handlers: a data message's result may have any
    /// length up to the frame limit, not only inputs × output size (a
    /// reducing or filtering handler emits what it emits). Agreed server ↔
    /// node (the node then sends handler output unpadded) and server ↔ user
    /// (the user then gets it as is); a peer without it keeps the fixed size.
    pub const ANY_LENGTH: &str = "any-length";
    /// Streaming handlers' notifications: on this link the
    /// peer takes `Notification` messages (type 0x1C,
    /// [`crate::notify`]); those of a data message come before its result
    /// or error. Node → server and server → user only.
    pub const SPIN_NOTIFY: &str = "spin-notify";
    /// The user has other servers in its address list and moves to the
    /// next one when this server cannot serve it: a first configuration
    /// that arrives while no node at all is connected is refused at once
    /// (an `Error` with code `NoNodes`, then a failed configuration
    /// response) rather than held for the server's `--node-wait`. After a
    /// failover, a server restarted without nodes would otherwise hold every
    /// new session that reaches it first. User ↔ server only.
    pub const MOVES_ON: &str = "moves-on";
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Hello {
    /// Extension version, `PROTOCOL_VERSION` for this crate.
    pub version: u32,
    /// "user", "node" or "server".
    pub role: String,
    /// Free-form identity: a node's name, a user's program name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Features the sender supports (see [`features`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// User: how many nodes it asks for (absent = every free node; 0 = none:
    /// an observer that only asks for status).
    /// Server: how many nodes it assigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// Node: configuration targets it can run (see the image format), each
    /// qualified by family (`rtl-x86_64-linux:amd`) where the node runs some
    /// FPGA families' cores only ([`crate::targets`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
    /// Server: the largest payload it accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message: Option<u32>,
    /// Node: its peer port, `IP:PORT` (with the `peer` feature).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// With the `chunks` feature: the largest chunk data the sender will
    /// send and accept. The answering side replies with the size in force
    /// on the link, the smaller of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<u32>,
    /// User: the tenant it acts for, a `[users.<name>]` of the server's
    /// auth file ([`crate::auth`]); absent = the anonymous tenant. Part of
    /// the hello, so an answer to the challenge covers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl Hello {
    pub fn new(role: &str) -> Self {
        Hello {
            version: crate::PROTOCOL_VERSION,
            role: role.to_string(),
            ..Default::default()
        }
    }

    pub fn has(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("hello serialises")
    }

    pub fn decode(payload: &[u8]) -> Result<Self, ProtocolError> {
        if !is_json_object(payload) {
            return Err(ProtocolError::BadHello("not a JSON object".into()));
        }
        let h: Hello = serde_json::from_slice(payload).map_err(|e| bad(e.to_string()))?;
        if !matches!(h.role.as_str(), "user" | "node" | "server") {
            return Err(bad(format!("unknown role {:?}", h.role)));
        }
        Ok(h)
    }
}

/// Longest reason a refused hello gets, in characters: the reason quotes
/// the peer's input (a role, a value of the wrong type), and goes to logs.
const MAX_REASON_CHARS: usize = 200;

fn bad(mut reason: String) -> ProtocolError {
    if let Some((at, _)) = reason.char_indices().nth(MAX_REASON_CHARS) {
        reason.truncate(at);
        reason.push('…');
    }
    ProtocolError::BadHello(reason)
}

/// Whether a JSON payload is an object (`{`, after any JSON whitespace):
/// the hello, group control and status payloads are objects, and serde's
/// derived decoders would otherwise also take an array of the fields in
/// declaration order (`[1,"user"]` as a hello), which no document allows
/// and an independent decoder refuses.
pub(crate) fn is_json_object(payload: &[u8]) -> bool {
    payload
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .is_some_and(|&b| b == b'{')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_ignores_unknown_fields() {
        let mut h = Hello::new("user");
        h.features = vec![features::CREDIT.into()];
        h.nodes = Some(2);
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let extra = br#"{"version":1,"role":"node","future":42}"#;
        assert_eq!(Hello::decode(extra).unwrap().role, "node");
    }

    #[test]
    fn version_and_role_are_required_and_known_fields_typed() {
        // docs/protocol.md, "Type 0x10": any version, but one must be given.
        assert_eq!(
            Hello::decode(br#"{"version":7,"role":"node"}"#)
                .unwrap()
                .version,
            7
        );
        for bad in [
            &br#"{"role":"user"}"#[..],
            br#"{"version":1}"#,
            br#"{"version":-1,"role":"user"}"#,
            br#"{"version":1,"role":"user","nodes":-1}"#,
            br#"{"version":1,"role":"user","features":"error"}"#,
            br#"[1,"user"]"#,
            br#" [1,"user",null,[],2]"#,
        ] {
            let e = Hello::decode(bad).unwrap_err();
            assert_eq!(e.kind(), "bad_hello", "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn rejects_bad_json_and_role() {
        assert!(Hello::decode(b"not json").is_err());
        assert!(Hello::decode(br#"{"version":1,"role":"admin"}"#).is_err());
    }

    /// The reason quotes the peer's input, but only so much of it.
    #[test]
    fn reasons_are_bounded() {
        let long = "x".repeat(1 << 20);
        for bad in [
            format!(r#"{{"version":1,"role":"{long}"}}"#),
            format!(r#"{{"version":"{long}","role":"user"}}"#),
        ] {
            let e = Hello::decode(bad.as_bytes()).unwrap_err();
            assert_eq!(e.kind(), "bad_hello");
            assert!(e.to_string().len() < 300, "{} bytes", e.to_string().len());
        }
    }
}

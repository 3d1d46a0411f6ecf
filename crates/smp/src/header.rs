//! The 8-byte header of seed 000 §3.2.1: `u8 type`, three reserved bytes,
//! `u32` little-endian payload size.

use crate::error::ProtocolError;

pub const HEADER_LEN: usize = 8;

/// Message types. 1–3 are the seed's; 0x10 and up are corefarm extensions,
/// only ever sent to a peer that announced itself with `Hello`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgType {
    Configuration = 1,
    ConfigurationResponse = 2,
    Data = 3,
    Hello = 0x10,
    Error = 0x11,
    Credit = 0x12,
    StatusRequest = 0x13,
    Status = 0x14,
    /// Node-to-node message on a peer port ([`crate::peer`]).
    Peer = 0x15,
    /// Server's nonce to a hello peer that must authenticate ([`crate::auth`]).
    AuthChallenge = 0x16,
    /// The peer's HMAC over the nonce ([`crate::auth`]).
    AuthResponse = 0x17,
    /// Group control, JSON ([`crate::group::GroupCtl`]): user ↔ server ↔ node.
    GroupCtl = 0x18,
    /// A command for a group's nodes ([`crate::group::GroupCmd`]).
    GroupCmd = 0x19,
    /// A node's answer to a group command ([`crate::group::GroupReply`]).
    GroupReply = 0x1A,
    /// A streaming handler's notification ([`crate::notify::Notification`]).
    Notification = 0x1C,
    /// One chunk of a data message ([`crate::stream::Chunk`]).
    Chunk = 0x1D,
}

impl MsgType {
    pub fn from_u8(v: u8) -> Result<Self, ProtocolError> {
        Ok(match v {
            1 => MsgType::Configuration,
            2 => MsgType::ConfigurationResponse,
            3 => MsgType::Data,
            0x10 => MsgType::Hello,
            0x11 => MsgType::Error,
            0x12 => MsgType::Credit,
            0x13 => MsgType::StatusRequest,
            0x14 => MsgType::Status,
            0x15 => MsgType::Peer,
            0x16 => MsgType::AuthChallenge,
            0x17 => MsgType::AuthResponse,
            0x18 => MsgType::GroupCtl,
            0x19 => MsgType::GroupCmd,
            0x1A => MsgType::GroupReply,
            0x1C => MsgType::Notification,
            0x1D => MsgType::Chunk,
            other => return Err(ProtocolError::UnknownType(other)),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            MsgType::Configuration => "configuration",
            MsgType::ConfigurationResponse => "configuration-response",
            MsgType::Data => "data",
            MsgType::Hello => "hello",
            MsgType::Error => "error",
            MsgType::Credit => "credit",
            MsgType::StatusRequest => "status-request",
            MsgType::Status => "status",
            MsgType::Peer => "peer",
            MsgType::AuthChallenge => "auth-challenge",
            MsgType::AuthResponse => "auth-response",
            MsgType::GroupCtl => "group-control",
            MsgType::GroupCmd => "group-command",
            MsgType::GroupReply => "group-reply",
            MsgType::Notification => "notification",
            MsgType::Chunk => "chunk",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub ty: MsgType,
    pub size: u32,
}

impl Header {
    pub fn new(ty: MsgType, size: u32) -> Self {
        Header { ty, size }
    }

    /// Encodes the header; the reserved bytes are always written as zero.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let s = self.size.to_le_bytes();
        [self.ty as u8, 0, 0, 0, s[0], s[1], s[2], s[3]]
    }

    /// Decodes and validates a header. Reserved bytes are ignored on input
    /// (the seed reserves them "for future use"), the type must be known and
    /// the size must not exceed `max_payload`.
    pub fn decode(b: &[u8; HEADER_LEN], max_payload: u32) -> Result<Self, ProtocolError> {
        // A TLS record header (handshake 0x16, version 3.x) where an SMP
        // header should be: a TLS client on a plain port. Said at once,
        // rather than read as an auth challenge whose payload never comes.
        // SMP writes zero reserved bytes, and 0x16 only ever comes from a
        // server, so no SMP peer sends this.
        if b[0] == 0x16 && b[1] == 0x03 && b[2] <= 0x04 {
            return Err(ProtocolError::TlsOnPlainPort);
        }
        let ty = MsgType::from_u8(b[0])?;
        let size = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        if size > max_payload {
            return Err(ProtocolError::TooLarge {
                size,
                max: max_payload,
            });
        }
        Ok(Header { ty, size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_little_endian() {
        let h = Header::new(MsgType::Data, 0x0102_0304);
        let b = h.encode();
        assert_eq!(b, [3, 0, 0, 0, 4, 3, 2, 1]);
        assert_eq!(Header::decode(&b, u32::MAX).unwrap(), h);
    }

    #[test]
    fn rejects_unknown_type_and_oversize() {
        assert_eq!(
            Header::decode(&[9, 0, 0, 0, 0, 0, 0, 0], 10),
            Err(ProtocolError::UnknownType(9))
        );
        assert_eq!(
            Header::decode(&[3, 0, 0, 0, 11, 0, 0, 0], 10),
            Err(ProtocolError::TooLarge { size: 11, max: 10 })
        );
    }

    #[test]
    fn a_tls_client_hello_is_named() {
        // The first bytes of a TLS 1.2/1.3 ClientHello record.
        let hello = [0x16, 0x03, 0x01, 0x00, 0xf5, 0x01, 0x00, 0x00];
        assert_eq!(
            Header::decode(&hello, u32::MAX),
            Err(ProtocolError::TlsOnPlainPort)
        );
        // An auth challenge as SMP writes it is not mistaken for one.
        let challenge = Header::new(MsgType::AuthChallenge, 0x0316).encode();
        assert!(Header::decode(&challenge, u32::MAX).is_ok());
    }

    #[test]
    fn reserved_bytes_are_ignored() {
        let h = Header::decode(&[1, 0xAA, 0xBB, 0xCC, 12, 0, 0, 0], 100).unwrap();
        assert_eq!(h, Header::new(MsgType::Configuration, 12));
    }
}

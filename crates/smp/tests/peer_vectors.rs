//! Checks tests/vectors/peer.json (peer messages, type 0x15) against this
//! crate, in the same way vectors.rs checks smp.json: valid vectors decode to
//! their documented fields and re-encode byte for byte; invalid ones are
//! rejected with the documented kind.

use crate::common;

use bytes::Bytes;
use common::{check_invalid, check_valid, one_frame, vectors};
use corefarm_smp::{MsgType, PeerBody, PeerMsg, ProtocolError};
use serde_json::{json, Value};

fn decode(wire: &[u8]) -> Result<(PeerMsg, Value), ProtocolError> {
    let f = one_frame(wire)?;
    assert_eq!(f.ty, MsgType::Peer);
    let m = PeerMsg::parse(f.payload)?;
    let h = &m.header;
    let header = json!({"kind": h.kind.name(), "ttl": h.ttl, "group": h.group, "src": h.src, "dst": h.dst, "seq": h.seq});
    let v = match &m.body {
        PeerBody::Hello { token, name } => {
            json!({"header": header, "token": format!("{token:016x}"), "name": name})
        }
        PeerBody::Collective { coll: c, data } => json!({
            "header": header,
            "coll": {
                "seq": c.seq, "op": c.op.name(), "phase": c.phase, "algo": c.algo.name(),
                "dtype": c.dtype.name(), "reduce": c.reduce.name(), "root": c.root,
                "block": c.block, "offset": c.offset, "total": c.total, "class": c.class,
            },
            "data_hex": hex::encode(data),
        }),
        PeerBody::Abort {
            culprit,
            coll_seq,
            reason,
        } => {
            json!({"header": header, "culprit": culprit, "coll_seq": coll_seq, "reason": reason})
        }
    };
    Ok((m, v))
}

/// The decoded fields and the re-encoded bytes.
fn decode_again(wire: &[u8]) -> Result<(Value, Option<Vec<u8>>), ProtocolError> {
    let (m, v) = decode(wire)?;
    Ok((v, Some(m.to_frame().unwrap().to_vec())))
}

#[test]
fn valid_peer_vectors_decode_and_reencode_byte_exact() {
    let doc = vectors("peer.json");
    assert_eq!(doc["type"], MsgType::Peer as u8);
    check_valid(&doc, 5, decode_again);
}

#[test]
fn invalid_peer_vectors_are_rejected_with_the_documented_kind() {
    check_invalid(&vectors("peer.json"), decode);
}

#[test]
fn a_peer_frame_parses_from_its_own_bytes() {
    let wire = hex::decode(vectors("peer.json")["valid"][1]["hex"].as_str().unwrap()).unwrap();
    let m = PeerMsg::parse(Bytes::copy_from_slice(&wire[8..])).unwrap();
    assert_eq!(m.to_frame().unwrap().wire_len(), wire.len());
}

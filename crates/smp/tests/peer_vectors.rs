//! Checks tests/vectors/peer.json (peer messages, type 0x15) against this
//! crate, in the same way vectors.rs checks smp.json: valid vectors decode to
//! their documented fields and re-encode byte for byte; invalid ones are
//! rejected with the documented kind.

use bytes::Bytes;
use corefarm_smp::blocking::FrameReader;
use corefarm_smp::codec::ReadError;
use corefarm_smp::{MsgType, PeerBody, PeerMsg, ProtocolError};
use serde_json::{json, Value};

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/peer.json");
    let text = std::fs::read_to_string(path).expect("tests/vectors/peer.json is readable");
    serde_json::from_str(&text).expect("peer.json is JSON")
}

fn decode(wire: &[u8]) -> Result<(PeerMsg, Value), ProtocolError> {
    let mut r = FrameReader::new(wire, 1 << 20);
    let f = match r.read_frame() {
        Ok(Some(f)) => f,
        Ok(None) => panic!("empty vector"),
        Err(ReadError::Protocol(e)) => return Err(e),
        Err(ReadError::Io(e)) => panic!("i/o error reading a slice: {e}"),
    };
    assert!(matches!(r.read_frame(), Ok(None)), "more than one message");
    assert_eq!(f.ty, MsgType::Peer);
    let m = PeerMsg::parse(f.payload)?;
    let h = &m.header;
    let header = json!({"kind": h.kind.name(), "ttl": h.ttl, "group": h.group, "src": h.src, "dst": h.dst, "seq": h.seq});
    let v = match &m.body {
        PeerBody::Hello { name } => json!({"header": header, "name": name}),
        PeerBody::Collective { coll: c, data } => json!({
            "header": header,
            "coll": {
                "seq": c.seq, "op": c.op.name(), "phase": c.phase, "algo": c.algo.name(),
                "dtype": c.dtype.name(), "reduce": c.reduce.name(), "root": c.root,
                "block": c.block, "offset": c.offset, "total": c.total,
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

#[test]
fn valid_peer_vectors_decode_and_reencode_byte_exact() {
    let doc = vectors();
    assert_eq!(doc["type"], MsgType::Peer as u8);
    let valid = doc["valid"].as_array().unwrap();
    assert!(valid.len() >= 4);
    for v in valid {
        let name = v["name"].as_str().unwrap();
        let wire = hex::decode(v["hex"].as_str().unwrap()).unwrap();
        let (m, decoded) = decode(&wire).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded, v["decoded"], "{name}");
        assert_eq!(m.to_frame().unwrap().to_vec(), wire, "{name}: re-encoding");
    }
}

#[test]
fn invalid_peer_vectors_are_rejected_with_the_documented_kind() {
    let doc = vectors();
    for v in doc["invalid"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let wire = hex::decode(v["hex"].as_str().unwrap()).unwrap();
        let e = decode(&wire)
            .err()
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert_eq!(e.kind(), v["error"].as_str().unwrap(), "{name}: {e}");
    }
}

#[test]
fn a_peer_frame_parses_from_its_own_bytes() {
    let wire = hex::decode(vectors()["valid"][1]["hex"].as_str().unwrap()).unwrap();
    let m = PeerMsg::parse(Bytes::copy_from_slice(&wire[8..])).unwrap();
    assert_eq!(m.to_frame().unwrap().wire_len(), wire.len());
}

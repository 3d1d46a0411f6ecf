//! Checks tests/vectors/group.json (group messages, types 0x18-0x1A)
//! against this crate: valid vectors decode to their documented fields
//! (commands and replies also re-encode byte for byte); invalid ones are
//! rejected with the documented kind.

use bytes::Bytes;
use corefarm_smp::blocking::FrameReader;
use corefarm_smp::codec::ReadError;
use corefarm_smp::group::{GroupCmd, GroupCtl, GroupReply};
use corefarm_smp::{MsgType, ProtocolError};
use serde_json::{json, Value};

fn vectors() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/vectors/group.json"
    );
    let text = std::fs::read_to_string(path).expect("tests/vectors/group.json is readable");
    serde_json::from_str(&text).expect("group.json is JSON")
}

/// The decoded fields, and the re-encoded wire form (`None` for control,
/// whose JSON field order is free).
fn decode(wire: &[u8]) -> Result<(Value, Option<Vec<u8>>), ProtocolError> {
    let mut r = FrameReader::new(wire, 1 << 20);
    let f = match r.read_frame() {
        Ok(Some(f)) => f,
        Ok(None) => panic!("empty vector"),
        Err(ReadError::Protocol(e)) => return Err(e),
        Err(ReadError::Io(e)) => panic!("i/o error reading a slice: {e}"),
    };
    assert!(matches!(r.read_frame(), Ok(None)), "more than one message");
    Ok(match f.ty {
        MsgType::GroupCtl => {
            let c = GroupCtl::decode(&f.payload)?;
            (serde_json::to_value(&c).unwrap(), None)
        }
        MsgType::GroupCmd => {
            let c = GroupCmd::parse(f.payload)?;
            let v = json!({
                "seq": c.seq, "target": c.target, "cmd": c.cmd.name(),
                "algo": c.algo.map(|a| a.name()), "dtype": c.dtype.name(),
                "reduce": c.reduce.name(), "root": c.root, "timeout_ms": c.timeout_ms,
                "a": c.a, "b": c.b, "data_hex": hex::encode(&c.data),
            });
            (v, Some(c.to_frame().unwrap().to_vec()))
        }
        MsgType::GroupReply => {
            let r = GroupReply::parse(f.payload)?;
            let v = json!({
                "seq": r.seq, "rank": r.rank, "status": r.status, "culprit": r.culprit,
                "data_hex": hex::encode(&r.data),
            });
            (v, Some(r.to_frame().unwrap().to_vec()))
        }
        other => panic!("not a group message: {}", other.name()),
    })
}

#[test]
fn valid_group_vectors_decode_and_reencode() {
    let doc = vectors();
    let valid = doc["valid"].as_array().unwrap();
    assert!(valid.len() >= 6);
    for v in valid {
        let name = v["name"].as_str().unwrap();
        let wire = hex::decode(v["hex"].as_str().unwrap()).unwrap();
        let (decoded, again) = decode(&wire).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded, v["decoded"], "{name}");
        if let Some(again) = again {
            assert_eq!(again, wire, "{name}: re-encoding");
        }
    }
}

#[test]
fn invalid_group_vectors_are_rejected_with_the_documented_kind() {
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
fn control_messages_round_trip_through_bytes() {
    let c = GroupCtl::Open {
        nodes: 2,
        topology: None,
    };
    let w = c.to_frame().to_vec();
    assert_eq!(
        GroupCtl::decode(&Bytes::copy_from_slice(&w[8..])).unwrap(),
        c
    );
}

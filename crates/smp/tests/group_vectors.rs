//! Checks tests/vectors/group.json (group messages, types 0x18-0x1A)
//! against this crate: valid vectors decode to their documented fields
//! (commands and replies also re-encode byte for byte); invalid ones are
//! rejected with the documented kind.

use crate::common;

use bytes::Bytes;
use common::{check_invalid, check_valid, one_frame, vectors};
use corefarm_smp::group::{GroupCmd, GroupCtl, GroupReply};
use corefarm_smp::{MsgType, ProtocolError};
use serde_json::{json, Value};

/// The decoded fields, and the re-encoded wire form (`None` for control,
/// whose JSON field order is free).
fn decode(wire: &[u8]) -> Result<(Value, Option<Vec<u8>>), ProtocolError> {
    let f = one_frame(wire)?;
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
                "reduce": c.reduce.name(), "root": c.root, "timeout_ms": c.timeout_ms, "class": c.class,
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
    check_valid(&vectors("group.json"), 7, decode);
}

#[test]
fn invalid_group_vectors_are_rejected_with_the_documented_kind() {
    check_invalid(&vectors("group.json"), decode);
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

//! Checks tests/vectors/notify.json (handler notifications, type 0x1C)
//! against this crate: valid vectors decode to their documented fields and
//! re-encode byte for byte; invalid ones are rejected with the documented kind.

use crate::common;

use common::{check_invalid, check_valid, one_frame, vectors};
use corefarm_smp::{MsgType, Notification, ProtocolError};
use serde_json::{json, Value};

fn decode(wire: &[u8]) -> Result<(Value, Option<Vec<u8>>), ProtocolError> {
    let f = one_frame(wire)?;
    assert_eq!(f.ty, MsgType::Notification);
    let n = Notification::parse(f.payload)?;
    let v = json!({"id": n.id, "set": n.set, "data_hex": hex::encode(&n.data)});
    Ok((v, Some(n.to_frame().unwrap().to_vec())))
}

#[test]
fn valid_notification_vectors_decode_and_reencode_byte_exact() {
    let doc = vectors("notify.json");
    assert_eq!(doc["type"], MsgType::Notification as u8);
    check_valid(&doc, 4, decode);
}

#[test]
fn invalid_notification_vectors_are_rejected_with_the_documented_kind() {
    check_invalid(&vectors("notify.json"), decode);
}

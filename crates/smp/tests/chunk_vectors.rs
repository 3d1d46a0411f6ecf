//! Checks tests/vectors/chunk.json (chunk messages, type 0x1D) against this
//! crate: valid vectors decode to their documented fields and re-encode byte
//! for byte; invalid ones are rejected with the documented kind.

use crate::common;

use common::{check_invalid, check_valid, one_frame, vectors};
use corefarm_smp::stream::Chunk;
use corefarm_smp::{MsgType, ProtocolError};
use serde_json::{json, Value};

fn decode(wire: &[u8]) -> Result<(Value, Option<Vec<u8>>), ProtocolError> {
    let f = one_frame(wire)?;
    assert_eq!(f.ty, MsgType::Chunk);
    let c = Chunk::parse(f.payload)?;
    let v = json!({
        "id": c.head.id, "class": c.head.class, "first": c.head.first, "last": c.head.last,
        "offset": c.head.offset, "total": c.head.total, "data_hex": hex::encode(&c.data),
    });
    Ok((v, Some(c.to_frame().unwrap().to_vec())))
}

#[test]
fn valid_chunk_vectors_decode_and_reencode_byte_exact() {
    let doc = vectors("chunk.json");
    assert_eq!(doc["type"], MsgType::Chunk as u8);
    check_valid(&doc, 4, decode);
}

#[test]
fn invalid_chunk_vectors_are_rejected_with_the_documented_kind() {
    check_invalid(&vectors("chunk.json"), decode);
}

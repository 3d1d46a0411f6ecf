//! Checks the shared byte-exact vectors in tests/vectors/smp.json against this
//! crate: every valid vector decodes to its documented meaning and re-encodes
//! to the same bytes; every invalid one is rejected with the documented kind.
//! The same file is checked from Python (python/tests/test_vectors.py).

use bytes::Bytes;
use corefarm_smp::auth::{AuthChallenge, AuthResponse, Secret};
use corefarm_smp::blocking::FrameReader;
use corefarm_smp::codec::ReadError;
use corefarm_smp::{
    Configuration, ConfigurationResponse, CoreInfo, Credit, Data, ErrorMsg, Frame, Hello, MsgType,
    ProtocolError,
};
use serde_json::Value;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/smp.json");
    let text = std::fs::read_to_string(path).expect("tests/vectors/smp.json is readable");
    serde_json::from_str(&text).expect("smp.json is JSON")
}

fn u32_of(v: &Value) -> u32 {
    u32::try_from(v.as_u64().expect("integer")).expect("fits u32")
}

/// Reads exactly one frame from the whole byte string; any trailing byte is an error.
fn read_one(wire: &[u8], max: u32) -> Result<Frame, ProtocolError> {
    let mut r = FrameReader::new(wire, max);
    let f = match r.read_frame() {
        Ok(Some(f)) => f,
        Ok(None) => panic!("empty vector"),
        Err(ReadError::Protocol(e)) => return Err(e),
        Err(ReadError::Io(e)) => panic!("i/o error reading a slice: {e}"),
    };
    assert!(
        matches!(r.read_frame(), Ok(None)),
        "vector holds more than one message"
    );
    Ok(f)
}

/// Decodes a frame the way a peer would; returns the re-encoded message and
/// the decoded fields as JSON in the vector file's shape.
fn decode(f: &Frame, unit: Option<u32>) -> Result<(Vec<u8>, Value), ProtocolError> {
    Ok(match f.ty {
        MsgType::Configuration => {
            let c = Configuration::parse(f.payload.clone())?;
            let bench = c.benchmark().map(|b| {
                serde_json::json!({"input_size": b.input_size, "output_size": b.output_size, "delay_us": b.delay_us})
            });
            let v = serde_json::json!({
                "input_size": c.input_size,
                "output_size": c.output_size,
                "cores": c.cores,
                "bitstream_hex": hex::encode(&c.bitstream),
                "benchmark": bench,
            });
            (c.to_frame()?.to_vec(), v)
        }
        MsgType::ConfigurationResponse => {
            let r = ConfigurationResponse::parse(&f.payload)?;
            let v = serde_json::json!({"status": r.status, "ok": r.ok()});
            (r.to_frame().to_vec(), v)
        }
        MsgType::Data => {
            let d = Data::parse(f.payload.clone())?;
            let unit = unit.expect("data vectors give their unit");
            let count = corefarm_smp::BenchmarkConfig {
                input_size: unit,
                output_size: unit,
                delay_us: 0,
            }
            .to_configuration()
            .count_inputs(d.data.len())?;
            let v = serde_json::json!({"id": d.id, "data_hex": hex::encode(&d.data), "unit": unit, "count": count});
            (d.to_frame()?.to_vec(), v)
        }
        MsgType::Hello => {
            let h = Hello::decode(&f.payload)?;
            let v = serde_json::to_value(&h).expect("hello to JSON");
            (h.to_frame().to_vec(), v)
        }
        MsgType::Error => {
            let e = ErrorMsg::parse(&f.payload)?;
            let v = serde_json::json!({"id": e.id, "code": e.code, "reason": e.reason});
            (e.to_frame().to_vec(), v)
        }
        MsgType::Credit => {
            let c = Credit::parse(&f.payload)?;
            let v = serde_json::json!({"messages": c.messages});
            (c.to_frame().to_vec(), v)
        }
        MsgType::StatusRequest => (
            corefarm_smp::ClusterStatus::request_frame().to_vec(),
            serde_json::json!({}),
        ),
        MsgType::Status => {
            let s = corefarm_smp::ClusterStatus::decode(&f.payload)?;
            let v = serde_json::to_value(&s).expect("status to JSON");
            (s.to_frame().to_vec(), v)
        }
        MsgType::AuthChallenge => {
            let c = AuthChallenge::parse(&f.payload)?;
            let v = serde_json::json!({"nonce_hex": hex::encode(c.nonce)});
            (c.to_frame().to_vec(), v)
        }
        MsgType::AuthResponse => {
            let r = AuthResponse::parse(&f.payload)?;
            let v = serde_json::json!({"mac_hex": hex::encode(r.mac)});
            (r.to_frame().to_vec(), v)
        }
        // Peer messages have their own vectors (tests/vectors/peer.json, peer_vectors.rs).
        MsgType::Peer => panic!("smp.json holds no peer message"),
        MsgType::Chunk => panic!("smp.json holds no chunk (chunk.json does)"),
        MsgType::Notification => panic!("smp.json holds no notification (notify.json does)"),
        // Group messages have their own vectors (tests/vectors/group.json, group_vectors.rs).
        MsgType::GroupCtl | MsgType::GroupCmd | MsgType::GroupReply => {
            panic!("smp.json holds no group message")
        }
    })
}

fn kind(e: &ProtocolError) -> &'static str {
    e.kind()
}

#[test]
fn valid_vectors_decode_and_reencode_byte_exact() {
    let doc = vectors();
    let max = u32_of(&doc["max_payload"]);
    let valid = doc["valid"].as_array().expect("valid list");
    assert!(valid.len() >= 10);
    for v in valid {
        let name = v["name"].as_str().unwrap();
        let wire = hex::decode(v["hex"].as_str().unwrap()).unwrap();
        let f = read_one(&wire, max).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            f.ty as u8,
            u32_of(&doc["types"][v["type"].as_str().unwrap()]) as u8,
            "{name}: type"
        );
        let unit = v["decoded"].get("unit").map(u32_of);
        let (again, decoded) = decode(&f, unit).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded, v["decoded"], "{name}: decoded fields");
        assert_eq!(
            hex::encode(&again),
            v["hex"].as_str().unwrap(),
            "{name}: re-encoding"
        );
    }
}

#[test]
fn invalid_vectors_are_rejected_with_the_documented_kind() {
    let doc = vectors();
    let max = u32_of(&doc["max_payload"]);
    let invalid = doc["invalid"].as_array().expect("invalid list");
    let kinds: std::collections::HashSet<_> = invalid
        .iter()
        .map(|v| v["error"].as_str().unwrap())
        .collect();
    for k in [
        "unknown_type",
        "core_table_too_long",
        "truncated",
        "truncated_stream",
        "benchmark_too_small",
        "too_large",
    ] {
        assert!(kinds.contains(k), "no invalid vector of kind {k}");
    }
    for v in invalid {
        let name = v["name"].as_str().unwrap();
        let wire = hex::decode(v["hex"].as_str().unwrap()).unwrap();
        let err = match read_one(&wire, max) {
            Err(e) => e,
            Ok(f) => match decode(&f, Some(16)) {
                Err(e) => e,
                Ok(_) => panic!("{name}: accepted an invalid message"),
            },
        };
        assert_eq!(kind(&err), v["error"].as_str().unwrap(), "{name}: {err}");
    }
}

#[test]
fn documented_core_table_matches_core_info() {
    // The vector's 2-core table names the fields the way CoreInfo serialises.
    let doc = vectors();
    let cfg = &doc["valid"][0]["decoded"];
    let cores: Vec<CoreInfo> = serde_json::from_value(cfg["cores"].clone()).unwrap();
    assert_eq!(cores.len(), 2);
    let c = Configuration {
        input_size: u32_of(&cfg["input_size"]),
        output_size: u32_of(&cfg["output_size"]),
        cores,
        bitstream: Bytes::from(hex::decode(cfg["bitstream_hex"].as_str().unwrap()).unwrap()),
    };
    assert_eq!(
        hex::encode(c.to_frame().unwrap().to_vec()),
        doc["valid"][0]["hex"].as_str().unwrap()
    );
}

#[test]
fn auth_mac_example_matches_the_documented_inputs() {
    // The MAC was computed by generate.py with Python's hmac module.
    let doc = vectors();
    let ex = &doc["auth_mac"];
    let secret = Secret::new(ex["secret"].as_str().unwrap()).unwrap();
    let nonce: [u8; 32] = hex::decode(ex["nonce_hex"].as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    let hello = ex["hello"].as_str().unwrap().as_bytes();
    let role = ex["role"].as_str().unwrap();
    let r = AuthResponse::answer(&secret, &AuthChallenge { nonce }, role, hello);
    assert_eq!(hex::encode(r.mac), ex["mac_hex"].as_str().unwrap());
    assert!(r.verify(&secret, &nonce, role, hello));
}

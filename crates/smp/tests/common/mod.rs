//! What the byte-exact vector checks share: reading a vector file, taking
//! the one frame a vector holds, and the valid/invalid loops (valid
//! vectors decode to their documented fields and, where the format fixes
//! the bytes, re-encode to them; invalid ones fail with the documented kind).

use corefarm_smp::blocking::FrameReader;
use corefarm_smp::codec::ReadError;
use corefarm_smp::{Frame, ProtocolError};
use serde_json::Value;

/// tests/vectors/`file`, parsed.
pub fn vectors(file: &str) -> Value {
    let path = format!("{}/../../tests/vectors/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file} is not JSON: {e}"))
}

/// The single frame `wire` holds, or the framing error.
pub fn one_frame(wire: &[u8]) -> Result<Frame, ProtocolError> {
    let mut r = FrameReader::new(wire, 1 << 20);
    let f = match r.read_frame() {
        Ok(Some(f)) => f,
        Ok(None) => panic!("empty vector"),
        Err(ReadError::Protocol(e)) => return Err(e),
        Err(ReadError::Io(e)) => panic!("i/o error reading a slice: {e}"),
    };
    assert!(matches!(r.read_frame(), Ok(None)), "more than one message");
    Ok(f)
}

/// Every valid vector (at least `min`) decodes to its `decoded` fields and,
/// when `decode` gives the re-encoding, to the same bytes.
pub fn check_valid(
    doc: &Value,
    min: usize,
    decode: impl Fn(&[u8]) -> Result<(Value, Option<Vec<u8>>), ProtocolError>,
) {
    let valid = doc["valid"].as_array().unwrap();
    assert!(valid.len() >= min);
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

/// Every invalid vector is refused with its documented error kind.
pub fn check_invalid<T>(doc: &Value, decode: impl Fn(&[u8]) -> Result<T, ProtocolError>) {
    for v in doc["invalid"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let wire = hex::decode(v["hex"].as_str().unwrap()).unwrap();
        let e = decode(&wire)
            .err()
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert_eq!(e.kind(), v["error"].as_str().unwrap(), "{name}: {e}");
    }
}

//! SMP message decoding/encoding exposed to Python, so that the shared test
//! vectors can be checked against the Rust codec from pytest.

use bytes::Bytes;
use corefarm_smp::blocking::FrameReader;
use corefarm_smp::codec::ReadError;
use corefarm_smp::{
    Configuration, ConfigurationResponse, CoreInfo, Credit, Data, ErrorMsg, Hello, MsgType,
    OutFrame, ProtocolError,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::{json, Value};

fn kind(e: &ProtocolError) -> &'static str {
    e.kind()
}

fn protocol_error(py: Python<'_>, e: ProtocolError) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let cls = py.import("corefarm.errors")?.getattr("ProtocolError")?;
        Ok(PyErr::from_value(cls.call1((e.to_string(), kind(&e)))?))
    })();
    made.unwrap_or_else(|import_failed| import_failed)
}

fn type_name(t: MsgType) -> &'static str {
    match t {
        MsgType::Configuration => "configuration",
        MsgType::ConfigurationResponse => "configuration_response",
        MsgType::Data => "data",
        MsgType::Hello => "hello",
        MsgType::Error => "error",
        MsgType::Credit => "credit",
        MsgType::StatusRequest => "status_request",
        MsgType::Status => "status",
        MsgType::Peer => "peer",
        MsgType::AuthChallenge => "auth_challenge",
        MsgType::AuthResponse => "auth_response",
        MsgType::GroupCtl => "group_control",
        MsgType::GroupCmd => "group_command",
        MsgType::GroupReply => "group_reply",
        MsgType::Chunk => "chunk",
        MsgType::Notification => "notification",
    }
}

fn decode_inner(
    wire: &[u8],
    max_payload: u32,
    unit: Option<u32>,
) -> Result<(&'static str, Value), ProtocolError> {
    let mut r = FrameReader::new(wire, max_payload);
    let f = match r.read_frame() {
        Ok(Some(f)) => f,
        Ok(None) => return Err(ProtocolError::TruncatedStream(0)),
        Err(ReadError::Protocol(e)) => return Err(e),
        Err(ReadError::Io(e)) => return Err(ProtocolError::BadHello(e.to_string())),
    };
    let v = match f.ty {
        MsgType::Configuration => {
            let c = Configuration::parse(f.payload)?;
            let bench = c.benchmark().map(|b| {
                json!({"input_size": b.input_size, "output_size": b.output_size, "delay_us": b.delay_us})
            });
            json!({"input_size": c.input_size, "output_size": c.output_size, "cores": c.cores,
                   "bitstream_hex": hex::encode(&c.bitstream), "benchmark": bench})
        }
        MsgType::ConfigurationResponse => {
            let r = ConfigurationResponse::parse(&f.payload)?;
            json!({"status": r.status, "ok": r.ok()})
        }
        MsgType::Data => {
            let d = Data::parse(f.payload)?;
            match unit {
                None => json!({"id": d.id, "data_hex": hex::encode(&d.data)}),
                Some(u) => {
                    let cfg = Configuration {
                        input_size: u,
                        output_size: u,
                        cores: vec![],
                        bitstream: Bytes::new(),
                    };
                    let count = cfg.count_inputs(d.data.len())?;
                    json!({"id": d.id, "data_hex": hex::encode(&d.data), "unit": u, "count": count})
                }
            }
        }
        MsgType::Hello => serde_json::to_value(Hello::decode(&f.payload)?).unwrap_or(Value::Null),
        MsgType::Error => {
            let e = ErrorMsg::parse(&f.payload)?;
            json!({"id": e.id, "code": e.code, "reason": e.reason})
        }
        MsgType::Credit => json!({"messages": Credit::parse(&f.payload)?.messages}),
        MsgType::StatusRequest => json!({}),
        MsgType::Status => serde_json::to_value(corefarm_smp::ClusterStatus::decode(&f.payload)?)
            .unwrap_or(Value::Null),
        // Node-to-node only (docs/protocol.md, type 0x15): the routing header.
        MsgType::Peer => {
            let h = corefarm_smp::PeerMsg::parse(f.payload)?.header;
            json!({"kind": h.kind.name(), "ttl": h.ttl, "group": h.group,
                   "src": h.src, "dst": h.dst, "seq": h.seq})
        }
        MsgType::Chunk => {
            let c = corefarm_smp::stream::Chunk::parse(f.payload)?;
            json!({"id": c.head.id, "class": c.head.class, "first": c.head.first, "last": c.head.last,
                   "offset": c.head.offset, "total": c.head.total, "data_hex": hex::encode(&c.data)})
        }
        MsgType::Notification => {
            let n = corefarm_smp::Notification::parse(f.payload)?;
            json!({"id": n.id, "set": n.set, "data_hex": hex::encode(&n.data)})
        }
        MsgType::AuthChallenge => json!({"nonce_hex": hex::encode(
            corefarm_smp::auth::AuthChallenge::parse(&f.payload)?.nonce)}),
        MsgType::AuthResponse => json!({"mac_hex": hex::encode(
            corefarm_smp::auth::AuthResponse::parse(&f.payload)?.mac)}),
        MsgType::GroupCtl => {
            serde_json::to_value(corefarm_smp::group::GroupCtl::decode(&f.payload)?)
                .unwrap_or(Value::Null)
        }
        MsgType::GroupCmd => {
            let c = corefarm_smp::group::GroupCmd::parse(f.payload)?;
            json!({"seq": c.seq, "target": c.target, "cmd": c.cmd.name(),
                   "algo": c.algo.map(|a| a.name()), "dtype": c.dtype.name(),
                   "reduce": c.reduce.name(), "root": c.root, "timeout_ms": c.timeout_ms,
                   "a": c.a, "b": c.b, "data_len": c.data.len()})
        }
        MsgType::GroupReply => {
            let r = corefarm_smp::group::GroupReply::parse(f.payload)?;
            json!({"seq": r.seq, "rank": r.rank, "status": r.status, "culprit": r.culprit,
                   "data_len": r.data.len(), "reason": r.reason()})
        }
    };
    Ok((type_name(f.ty), v))
}

/// decode(wire, max_payload, unit=None) -> (type, JSON of the fields).
/// Raises corefarm.errors.ProtocolError with `.kind` on invalid input.
#[pyfunction]
#[pyo3(signature = (wire, max_payload=corefarm_smp::DEFAULT_MAX_MESSAGE, unit=None))]
pub fn decode(
    py: Python<'_>,
    wire: &[u8],
    max_payload: u32,
    unit: Option<u32>,
) -> PyResult<(String, String)> {
    let (t, v) = decode_inner(wire, max_payload, unit).map_err(|e| protocol_error(py, e))?;
    Ok((t.to_string(), v.to_string()))
}

fn u32_field(v: &Value, k: &str) -> PyResult<u32> {
    v.get(k)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| PyValueError::new_err(format!("field {k:?} missing or not a u32")))
}

fn hex_field(v: &Value, k: &str) -> PyResult<Bytes> {
    let s = v
        .get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| PyValueError::new_err(format!("field {k:?} missing")))?;
    hex::decode(s)
        .map(Bytes::from)
        .map_err(|e| PyValueError::new_err(format!("{k}: {e}")))
}

fn fixed_hex<const N: usize>(v: &Value, k: &str) -> PyResult<[u8; N]> {
    let b = hex_field(v, k)?;
    b.as_ref()
        .try_into()
        .map_err(|_| PyValueError::new_err(format!("{k}: need {N} bytes, got {}", b.len())))
}

/// encode(type, fields_json) -> bytes: the whole message, as the Rust codec writes it.
#[pyfunction]
pub fn encode<'py>(py: Python<'py>, ty: &str, fields: &str) -> PyResult<Bound<'py, PyBytes>> {
    let v: Value =
        serde_json::from_str(fields).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let f: OutFrame = match ty {
        "configuration" => {
            let cores: Vec<CoreInfo> =
                serde_json::from_value(v.get("cores").cloned().unwrap_or(Value::Null))
                    .map_err(|e| PyValueError::new_err(format!("cores: {e}")))?;
            Configuration {
                input_size: u32_field(&v, "input_size")?,
                output_size: u32_field(&v, "output_size")?,
                cores,
                bitstream: hex_field(&v, "bitstream_hex")?,
            }
            .to_frame()
            .map_err(|e| protocol_error(py, e))?
        }
        "configuration_response" => {
            let s = u8::try_from(u32_field(&v, "status")?)
                .map_err(|_| PyValueError::new_err("status > 255"))?;
            ConfigurationResponse { status: s }.to_frame()
        }
        "data" => Data {
            id: u32_field(&v, "id")?,
            data: hex_field(&v, "data_hex")?,
        }
        .to_frame()
        .map_err(|e| protocol_error(py, e))?,
        "hello" => serde_json::from_value::<Hello>(v)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .to_frame(),
        "error" => ErrorMsg {
            id: u32_field(&v, "id")?,
            code: u32_field(&v, "code")?,
            reason: v
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        }
        .to_frame(),
        "credit" => Credit {
            messages: u32_field(&v, "messages")?,
        }
        .to_frame(),
        "notification" => corefarm_smp::Notification {
            id: u32_field(&v, "id")?,
            set: u8::try_from(u32_field(&v, "set")?)
                .map_err(|_| PyValueError::new_err("set > 255"))?,
            data: hex_field(&v, "data_hex")?,
        }
        .to_frame()
        .map_err(|e| protocol_error(py, e))?,
        "auth_challenge" => corefarm_smp::auth::AuthChallenge {
            nonce: fixed_hex(&v, "nonce_hex")?,
        }
        .to_frame(),
        "auth_response" => corefarm_smp::auth::AuthResponse {
            mac: fixed_hex(&v, "mac_hex")?,
        }
        .to_frame(),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown message type {other:?}"
            )))
        }
    };
    Ok(PyBytes::new(py, &f.to_vec()))
}

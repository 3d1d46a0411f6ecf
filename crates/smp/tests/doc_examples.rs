//! Every byte-exact example in docs/protocol.md is a message this crate
//! reads, whose header announces exactly the bytes shown, and which encodes
//! back to the bytes shown: a second implementation written from the
//! document alone gets the same bytes as this one.
//!
//! An example is a fenced block (not `python`) of lines that start with hex
//! bytes, optionally after a one-word label (`request`, `challenge`…); the
//! rest of a line is commentary. A line whose hex bytes are followed by a
//! `{` continues with JSON text, which runs to the end of the block (the
//! status example).

use bytes::Bytes;
use corefarm_smp::auth::{AuthChallenge, AuthResponse};
use corefarm_smp::group::{GroupCmd, GroupCtl, GroupReply};
use corefarm_smp::stream::Chunk;
use corefarm_smp::{
    ClusterStatus, Configuration, ConfigurationResponse, Credit, Data, ErrorMsg, Hello, MsgType,
    Notification, PeerMsg, HEADER_LEN,
};

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/protocol.md");
    std::fs::read_to_string(path).expect("docs/protocol.md is readable")
}

fn is_hex_byte(t: &str) -> bool {
    t.len() == 2 && t.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The bytes a line shows, and the text after them if it is JSON.
fn line_bytes(line: &str) -> (Vec<u8>, Option<String>) {
    let mut toks = line.split_whitespace().peekable();
    // An optional label before the bytes.
    if toks.peek().is_some_and(|t| !is_hex_byte(t)) {
        let mut ahead = toks.clone();
        ahead.next();
        if !ahead.peek().is_some_and(|t| is_hex_byte(t)) {
            return (Vec::new(), None);
        }
        toks.next();
    }
    let mut out = Vec::new();
    while let Some(t) = toks.peek() {
        if !is_hex_byte(t) {
            break;
        }
        out.push(u8::from_str_radix(t, 16).unwrap());
        toks.next();
    }
    let rest: Vec<&str> = toks.collect();
    let json = rest
        .first()
        .is_some_and(|t| t.starts_with('{'))
        .then(|| line[line.find('{').unwrap()..].trim().to_string());
    (out, json)
}

/// The examples of one fenced block: its bytes split into whole frames by
/// their headers. `what` names the block in failures.
fn frames_of(block: &[&str], what: &str) -> Vec<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut json: Option<String> = None;
    for line in block {
        if let Some(j) = json.as_mut() {
            j.push_str(line.trim());
            continue;
        }
        let (b, j) = line_bytes(line);
        bytes.extend(b);
        json = j;
    }
    if let Some(j) = json {
        bytes.extend(j.into_bytes());
    }
    let mut frames = Vec::new();
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        assert!(
            rest.len() >= HEADER_LEN,
            "{what}: {} bytes left, not a header",
            rest.len()
        );
        let size = u32::from_le_bytes(rest[4..8].try_into().unwrap()) as usize;
        assert!(
            rest.len() >= HEADER_LEN + size,
            "{what}: the header announces {size} bytes of payload, the example shows {}",
            rest.len() - HEADER_LEN
        );
        frames.push(rest[..HEADER_LEN + size].to_vec());
        rest = &rest[HEADER_LEN + size..];
    }
    frames
}

/// Every example frame in the document, with the line its block starts at.
fn examples() -> Vec<(usize, Vec<u8>)> {
    let text = doc();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        if let Some(lang) = l.strip_prefix("```") {
            let start = i + 1;
            let mut end = start;
            while !lines[end].trim_start().starts_with("```") {
                end += 1;
            }
            if lang.trim().is_empty() {
                let what = format!("docs/protocol.md:{start}");
                for f in frames_of(&lines[start..end], &what) {
                    out.push((start, f));
                }
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// Decodes one whole frame with the crate's parser for its type and
/// returns it encoded again.
fn reencode(wire: &[u8]) -> Result<Vec<u8>, String> {
    let ty = MsgType::from_u8(wire[0]).map_err(|e| e.to_string())?;
    let p = Bytes::copy_from_slice(&wire[HEADER_LEN..]);
    let e = |e: corefarm_smp::ProtocolError| e.to_string();
    Ok(match ty {
        MsgType::Configuration => Configuration::parse(p)
            .map_err(e)?
            .to_frame()
            .map_err(e)?
            .to_vec(),
        MsgType::ConfigurationResponse => ConfigurationResponse::parse(&p)
            .map_err(e)?
            .to_frame()
            .to_vec(),
        MsgType::Data => Data::parse(p).map_err(e)?.to_frame().map_err(e)?.to_vec(),
        MsgType::Hello => Hello::decode(&p).map_err(e)?.to_frame().to_vec(),
        MsgType::Error => ErrorMsg::parse(&p).map_err(e)?.to_frame().to_vec(),
        MsgType::Credit => Credit::parse(&p).map_err(e)?.to_frame().to_vec(),
        MsgType::StatusRequest if p.is_empty() => ClusterStatus::request_frame().to_vec(),
        MsgType::StatusRequest => return Err("a status request has an empty payload".into()),
        MsgType::Status => {
            // JSON: the example's field order is not the encoder's, so
            // what is compared is what it means.
            let st = ClusterStatus::decode(&p).map_err(e)?;
            assert_eq!(ClusterStatus::decode(&st.encode()).unwrap(), st);
            wire.to_vec()
        }
        MsgType::Peer => PeerMsg::parse(p)
            .map_err(e)?
            .to_frame()
            .map_err(e)?
            .to_vec(),
        MsgType::AuthChallenge => AuthChallenge::parse(&p).map_err(e)?.to_frame().to_vec(),
        MsgType::AuthResponse => AuthResponse::parse(&p).map_err(e)?.to_frame().to_vec(),
        MsgType::GroupCtl => {
            let mut out = wire[..HEADER_LEN].to_vec();
            out.extend(GroupCtl::decode(&p).map_err(e)?.encode());
            out
        }
        MsgType::GroupCmd => GroupCmd::parse(p)
            .map_err(e)?
            .to_frame()
            .map_err(e)?
            .to_vec(),
        MsgType::GroupReply => GroupReply::parse(p)
            .map_err(e)?
            .to_frame()
            .map_err(e)?
            .to_vec(),
        MsgType::Notification => Notification::parse(p)
            .map_err(e)?
            .to_frame()
            .map_err(e)?
            .to_vec(),
        MsgType::Chunk => Chunk::parse(p).map_err(e)?.to_frame().map_err(e)?.to_vec(),
    })
}

#[test]
fn every_example_in_the_protocol_document_decodes_and_encodes_to_its_bytes() {
    let all = examples();
    // Status request and answer, auth challenge and response, a peer
    // hello and two collective chunks, two group commands and a reply, a
    // notification and a chunk.
    assert!(
        all.len() >= 12,
        "found only {} examples: {:?}",
        all.len(),
        all.iter().map(|(l, w)| (*l, w[0])).collect::<Vec<_>>()
    );
    let mut failures = Vec::new();
    for (line, wire) in &all {
        match reencode(wire) {
            Ok(again) if &again == wire => {}
            Ok(again) => failures.push(format!(
                "docs/protocol.md:{line}: type {:#x} encodes as\n  {}\nnot\n  {}",
                wire[0],
                hex::encode(&again),
                hex::encode(wire)
            )),
            Err(why) => failures.push(format!(
                "docs/protocol.md:{line}: type {:#x} does not decode: {why}",
                wire[0]
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_example_reader_reads_labels_commentary_and_json() {
    let (b, j) = line_bytes("request  13 00 00 00  00 00 00 00");
    assert_eq!((b, j), (vec![0x13, 0, 0, 0, 0, 0, 0, 0], None));
    let (b, _) = line_bytes("07 00 00 00  03 00 00 00      id 7; first and last; class 0");
    assert_eq!(b, [7, 0, 0, 0, 3, 0, 0, 0]);
    let (b, _) = line_bytes("i32 sum allreduce of x into s on every rank, binomial");
    assert!(b.is_empty());
    let (b, j) = line_bytes("status   14 00 00 00  2c 01 00 00  {\"you\":3,");
    assert_eq!(b.len(), 8);
    assert_eq!(j.as_deref(), Some("{\"you\":3,"));
}

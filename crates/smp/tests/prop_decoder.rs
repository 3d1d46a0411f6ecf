//! Property tests of the SMP decoder: whatever bytes arrive, in whatever
//! pieces, decoding never panics, never buffers more than one maximal message,
//! and re-encoding what it accepted gives back the same bytes.

use bytes::{BufMut, Bytes};
use corefarm_smp::codec::Decoder;
use corefarm_smp::{
    Configuration, ConfigurationResponse, Credit, Data, ErrorMsg, Frame, Hello, MsgType, OutFrame,
};
use proptest::prelude::*;

const MAX: u32 = 4096;

/// Feeds `bytes` in chunks of the given sizes; returns the frames decoded
/// before the first error (if any), checking the buffer bound on the way.
fn feed(bytes: &[u8], chunks: &[usize]) -> (Vec<Frame>, bool) {
    let mut dec = Decoder::new(MAX);
    let mut frames = Vec::new();
    let mut rest = bytes;
    let mut sizes = chunks.iter().cycle();
    while !rest.is_empty() {
        let n = (*sizes.next().unwrap()).clamp(1, rest.len());
        dec.buffer().put_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            match dec.decode() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(_) => return (frames, true),
            }
            // The decoder never reserves beyond one maximal message plus read slack.
            assert!(dec.buffer().capacity() <= 8 + MAX as usize + 64 * 1024);
        }
        assert!(dec.buffer().capacity() <= 8 + MAX as usize + 64 * 1024);
    }
    (frames, false)
}

/// Parses a frame with the typed parser for its type; must never panic.
fn parse_typed(f: &Frame) {
    match f.ty {
        MsgType::Configuration => {
            if let Ok(c) = Configuration::parse(f.payload.clone()) {
                assert_eq!(Bytes::from(c.encode_payload()), f.payload);
            }
        }
        MsgType::ConfigurationResponse => {
            let _ = ConfigurationResponse::parse(&f.payload);
        }
        MsgType::Data => {
            if let Ok(d) = Data::parse(f.payload.clone()) {
                assert_eq!(&d.to_frame().unwrap().to_vec()[8..], &f.payload[..]);
            }
        }
        MsgType::Hello => {
            let _ = Hello::decode(&f.payload);
        }
        MsgType::Error => {
            if let Ok(e) = ErrorMsg::parse(&f.payload) {
                assert_eq!(&e.to_frame().to_vec()[8..], &f.payload[..]);
            }
        }
        MsgType::Credit => {
            let _ = Credit::parse(&f.payload);
        }
        MsgType::StatusRequest => {}
        MsgType::Status => {
            let _ = corefarm_smp::ClusterStatus::decode(&f.payload);
        }
        MsgType::AuthChallenge => {
            if let Ok(c) = corefarm_smp::auth::AuthChallenge::parse(&f.payload) {
                assert_eq!(&c.to_frame().to_vec()[8..], &f.payload[..]);
            }
        }
        MsgType::AuthResponse => {
            if let Ok(r) = corefarm_smp::auth::AuthResponse::parse(&f.payload) {
                assert_eq!(&r.to_frame().to_vec()[8..], &f.payload[..]);
            }
        }
        MsgType::Chunk => {
            let _ = corefarm_smp::stream::Chunk::parse(f.payload.clone());
        }
        MsgType::Notification => {
            if let Ok(n) = corefarm_smp::Notification::parse(f.payload.clone()) {
                assert_eq!(&n.to_frame().unwrap().to_vec()[8..], &f.payload[..]);
            }
        }
        MsgType::Peer => {
            if let Ok(m) = corefarm_smp::PeerMsg::parse(f.payload.clone()) {
                // A collective header has bytes a receiver ignores (reserved,
                // and a class value no sender writes: docs/protocol.md), so
                // its encoding is canonical, not the input's bytes: parsed
                // again it is the same message with the same bytes.
                let once = m.to_frame().unwrap().to_vec();
                let again = corefarm_smp::PeerMsg::parse(Bytes::copy_from_slice(&once[8..]))
                    .expect("an encoded peer message parses");
                assert_eq!(again, m);
                assert_eq!(again.to_frame().unwrap().to_vec(), once);
                assert_eq!(once.len() - 8, f.payload.len());
            }
        }
        MsgType::GroupCtl => {
            let _ = corefarm_smp::group::GroupCtl::decode(&f.payload);
        }
        MsgType::GroupCmd => {
            if let Ok(c) = corefarm_smp::group::GroupCmd::parse(f.payload.clone()) {
                assert_eq!(&c.to_frame().unwrap().to_vec()[8..], &f.payload[..]);
            }
        }
        MsgType::GroupReply => {
            if let Ok(r) = corefarm_smp::group::GroupReply::parse(f.payload.clone()) {
                assert_eq!(&r.to_frame().unwrap().to_vec()[8..], &f.payload[..]);
            }
        }
    }
}

/// A collective chunk whose ignored header bytes are not zero: accepted,
/// and checked as canonical, not byte for byte (a random input of this
/// shape once made the byte-for-byte check fail).
#[test]
fn a_peer_message_with_set_reserved_bytes_is_accepted_and_canonical() {
    use corefarm_smp::peer::PEER_HEADER_LEN;
    use corefarm_smp::{CollHeader, PeerBody, PeerHeader, PeerKind, PeerMsg};
    let m = PeerMsg {
        header: PeerHeader {
            kind: PeerKind::Collective,
            ttl: 3,
            group: 7,
            src: 1,
            dst: 0,
            seq: 9,
        },
        body: PeerBody::Collective {
            coll: CollHeader::bcast(4),
            data: Bytes::from_static(b"abcd"),
        },
    };
    let mut wire = m.to_frame().unwrap().to_vec();
    let coll = 8 + PEER_HEADER_LEN;
    for (at, v) in [(9, 0xf1), (10, 0xff), (11, 1), (20, 0xaa), (23, 5)] {
        wire[coll + at] = v;
    }
    let (frames, failed) = feed(&wire, &[wire.len()]);
    assert!(!failed);
    parse_typed(&frames[0]);
    let parsed = PeerMsg::parse(frames[0].payload.clone()).unwrap();
    assert_eq!(parsed, m, "the ignored bytes change nothing");
}

fn valid_frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (any::<u32>(), prop::collection::vec(any::<u8>(), 0..300))
            .prop_map(|(id, d)| OutFrame::data(id, Bytes::from(d)).unwrap().to_vec()),
        (
            1u32..100,
            any::<u32>(),
            prop::collection::vec((any::<u32>(), any::<u32>(), any::<u32>()), 0..5),
            prop::collection::vec(any::<u8>(), 0..100)
        )
            .prop_map(|(i, o, cores, bit)| Configuration {
                input_size: i,
                output_size: o,
                cores: cores
                    .into_iter()
                    .map(|(control, input, output)| corefarm_smp::CoreInfo {
                        control,
                        input,
                        output
                    })
                    .collect(),
                bitstream: Bytes::from(bit),
            }
            .to_frame()
            .unwrap()
            .to_vec()),
        any::<u8>().prop_map(|s| ConfigurationResponse { status: s }.to_frame().to_vec()),
        any::<u32>().prop_map(|n| Credit { messages: n }.to_frame().to_vec()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..20_000),
                                   chunks in prop::collection::vec(1usize..5000, 1..8)) {
        let (frames, _) = feed(&bytes, &chunks);
        for f in &frames {
            prop_assert!(f.payload.len() <= MAX as usize);
            parse_typed(f);
        }
    }

    #[test]
    fn valid_streams_decode_exactly(msgs in prop::collection::vec(valid_frame(), 1..20),
                                    chunks in prop::collection::vec(1usize..700, 1..8)) {
        let wire: Vec<u8> = msgs.concat();
        let (frames, failed) = feed(&wire, &chunks);
        prop_assert!(!failed);
        prop_assert_eq!(frames.len(), msgs.len());
        for (f, m) in frames.iter().zip(&msgs) {
            let mut again = vec![f.ty as u8, 0, 0, 0];
            again.extend_from_slice(&(f.payload.len() as u32).to_le_bytes());
            again.extend_from_slice(&f.payload);
            prop_assert_eq!(&again, m);
            parse_typed(f);
        }
    }

    #[test]
    fn oversize_headers_are_refused_before_buffering(size in (MAX + 1)..=u32::MAX, ty in 1u8..4) {
        let mut h = vec![ty, 0, 0, 0];
        h.extend_from_slice(&size.to_le_bytes());
        let (frames, failed) = feed(&h, &[8]);
        prop_assert!(frames.is_empty());
        prop_assert!(failed);
    }
}

/// Every message type, by its wire value.
const TYPES: [u8; 17] = [
    1, 2, 3, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1C, 0x1D, 0x1D,
];

/// A valid payload of the message type at `TYPES[pick % TYPES.len()]`
/// (the structure random bytes almost never have), for mutating.
fn valid_payload(pick: usize, n: u32, body: &[u8]) -> (MsgType, Vec<u8>) {
    use corefarm_smp::group::{Cmd, GroupCmd, GroupCtl, GroupReply, ALL_RANKS};
    use corefarm_smp::stream::Chunk;
    use corefarm_smp::{CollHeader, Notification, PeerBody, PeerHeader, PeerKind, PeerMsg};
    let ty = MsgType::from_u8(TYPES[pick % TYPES.len()]).unwrap();
    let text = String::from_utf8_lossy(body).into_owned();
    let peer = |kind, body| PeerMsg {
        header: PeerHeader {
            kind,
            ttl: 1,
            group: 7,
            src: 0,
            dst: 1,
            seq: u64::from(n),
        },
        body,
    };
    let frame: Vec<u8> = match ty {
        MsgType::Configuration => Configuration {
            input_size: 16 + n % 64,
            output_size: 16,
            cores: vec![corefarm_smp::CoreInfo {
                control: n,
                input: n,
                output: n,
            }],
            bitstream: Bytes::copy_from_slice(body),
        }
        .to_frame()
        .unwrap()
        .to_vec(),
        MsgType::ConfigurationResponse => ConfigurationResponse { status: n as u8 }
            .to_frame()
            .to_vec(),
        MsgType::Data => OutFrame::data(n, Bytes::copy_from_slice(body))
            .unwrap()
            .to_vec(),
        MsgType::Hello => {
            let mut h = Hello::new("user");
            h.name = Some(text);
            h.nodes = Some(n);
            h.chunk_size = Some(n);
            h.features = vec!["chunks".into(), "error".into()];
            h.to_frame().to_vec()
        }
        MsgType::Error => ErrorMsg::new(n, corefarm_smp::ErrorCode::Timeout, text)
            .to_frame()
            .to_vec(),
        MsgType::Credit => Credit { messages: n }.to_frame().to_vec(),
        MsgType::StatusRequest | MsgType::Status => {
            corefarm_smp::ClusterStatus::default().to_frame().to_vec()
        }
        MsgType::Peer => match n % 3 {
            0 => peer(
                PeerKind::Hello,
                PeerBody::Hello {
                    token: u64::from(n),
                    name: text,
                },
            ),
            1 => peer(
                PeerKind::Collective,
                PeerBody::Collective {
                    coll: CollHeader::bcast(body.len() as u64),
                    data: Bytes::copy_from_slice(body),
                },
            ),
            _ => peer(
                PeerKind::Abort,
                PeerBody::Abort {
                    culprit: n,
                    coll_seq: n,
                    reason: text,
                },
            ),
        }
        .to_frame()
        .unwrap()
        .to_vec(),
        MsgType::AuthChallenge | MsgType::AuthResponse => {
            let mut v = vec![ty as u8, 0, 0, 0, 32, 0, 0, 0];
            v.extend([n as u8; 32]);
            v
        }
        MsgType::GroupCtl => GroupCtl::Open {
            nodes: n % 8 + 1,
            topology: Some(text),
        }
        .to_frame()
        .to_vec(),
        MsgType::GroupCmd => {
            let mut c = GroupCmd::new(n, ALL_RANKS, Cmd::Allreduce);
            c.class = (n % 8) as u8;
            c.a = "x".into();
            c.b = "sum".into();
            c.data = Bytes::copy_from_slice(body);
            c.to_frame().unwrap().to_vec()
        }
        MsgType::GroupReply => GroupReply::failed(n, 1, corefarm_smp::ErrorCode::Timeout, 2, &text)
            .to_frame()
            .unwrap()
            .to_vec(),
        MsgType::Notification => Notification {
            id: n,
            set: n as u8,
            data: Bytes::copy_from_slice(body),
        }
        .to_frame()
        .unwrap()
        .to_vec(),
        MsgType::Chunk => Chunk::new(
            n,
            (n % 8) as u8,
            0,
            body.len() as u64,
            Bytes::copy_from_slice(body),
        )
        .to_frame()
        .unwrap()
        .to_vec(),
    };
    (ty, frame[8..].to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Every typed parser, fed a valid payload of its type with bytes
    /// flipped, cut short or appended: an error or a message, never a
    /// panic (random bytes alone seldom reach past the first length check).
    #[test]
    fn mutated_payloads_never_panic_a_parser(
        pick in any::<usize>(),
        n in any::<u32>(),
        body in prop::collection::vec(any::<u8>(), 0..64),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in any::<usize>(),
        tail in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let (ty, mut p) = valid_payload(pick, n, &body);
        for (at, v) in flips {
            if !p.is_empty() {
                let i = at % p.len();
                p[i] = v;
            }
        }
        p.truncate(cut % (p.len() + 1) + usize::from(cut % 2 == 0) * p.len());
        p.extend(tail);
        p.truncate(MAX as usize);
        parse_typed(&Frame { ty, payload: Bytes::from(p) });
    }
}

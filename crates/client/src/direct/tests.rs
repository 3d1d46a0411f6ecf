//! The direct path against a scripted member.

use super::*;
use crate::group::tests::server;
use crate::group::GroupOptions;
use std::net::TcpListener;

/// What a scripted member received: each frame's type, message id and
/// data length.
type Received = Vec<(MsgType, u32, usize)>;

/// A member that predates chunks (rank 0 of group 1, token 0): answers the
/// direct hello with a plain name, then answers every whole data message
/// with its bytes reversed. Any other frame is recorded and ends the
/// connection, as such a member cannot read it.
fn old_member() -> (String, std::thread::JoinHandle<Received>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = FrameReader::new(s, 1 << 21);
        let f = r.read_frame().unwrap().unwrap();
        assert_eq!(f.ty, MsgType::Peer);
        let hello = PeerMsg::parse(f.payload).unwrap();
        let PeerBody::Hello { token, name } = hello.body else {
            panic!("not a hello: {hello:?}")
        };
        assert_eq!((hello.header.group, hello.header.dst, token), (1, 0, 0));
        assert_eq!(
            name,
            hello_name("user", DEFAULT_CHUNK_SIZE),
            "a new client offers chunks"
        );
        let answer = PeerMsg {
            header: PeerHeader {
                kind: PeerKind::Hello,
                ttl: 0,
                group: 1,
                src: 0,
                dst: DIRECT_USER,
                seq: 0,
            },
            body: PeerBody::Hello {
                token,
                name: "rank 0".into(),
            },
        };
        w.write_all(&answer.to_frame().unwrap().to_vec()).unwrap();
        let mut received = Vec::new();
        while let Ok(Some(f)) = r.read_frame() {
            let len = f.payload.len();
            if f.ty != MsgType::Data {
                received.push((f.ty, u32::MAX, len));
                break;
            }
            let d = Data::parse(f.payload).unwrap();
            received.push((f.ty, d.id, d.data.len()));
            let reversed: Vec<u8> = d.data.iter().rev().copied().collect();
            let out = OutFrame::data(d.id, Bytes::from(reversed)).unwrap();
            if write_frame(&mut w, out).is_err() {
                break;
            }
        }
        received
    });
    (addr, t)
}

#[test]
fn a_new_client_sends_an_old_member_whole_frames_in_order() {
    let (peer, member) = old_member();
    let (addr, srv) = server(true, &[&peer]);
    let mut opts = GroupOptions::new(1);
    opts.model = None;
    let g = Group::open(&addr, opts).unwrap();
    let mut d = g.direct(2).unwrap();
    assert_eq!(
        (d.live(), d.chunked()),
        (1, 0),
        "the member offered no chunks"
    );
    // Larger than a chunk, and one that fits one: in class 0, a member that
    // agreed chunks would get both as chunk frames.
    let chunk = DEFAULT_CHUNK_SIZE as usize;
    let sizes = [chunk + 1, 3 * chunk, 100, 2 * chunk + 7, chunk];
    let inputs: Vec<Bytes> = (0..sizes.len())
        .map(|i| {
            let data = (0..sizes[i]).map(|b| (b * 7 + i) as u8).collect::<Vec<_>>();
            Bytes::from(data)
        })
        .collect();
    let out = d.map_with(&inputs, 0);
    let chunked = d.chunked();
    drop(d);
    let received = member.join().unwrap();
    let expected: Received = (0..)
        .zip(sizes)
        .map(|(id, len)| (MsgType::Data, id, len))
        .collect();
    assert_eq!(received, expected, "whole data frames, in input order");
    assert_eq!(chunked, 0);
    let out = out.unwrap();
    assert_eq!(out.len(), inputs.len());
    for (i, (o, d)) in out.iter().zip(&inputs).enumerate() {
        let reversed: Vec<u8> = d.iter().rev().copied().collect();
        assert_eq!(o[..], reversed[..], "result {i}");
    }
    drop(g);
    assert!(srv.join().unwrap().is_empty(), "no group command was sent");
}

//! The direct path against a scripted member.

use super::*;
use crate::group::tests::server;
use crate::group::GroupOptions;
use std::net::TcpListener;

/// What a scripted member received: each frame's type, message id and
/// data length.
type Received = Vec<(MsgType, u32, usize)>;

/// Accepts the client's direct connection as rank 0 of group 1 (token 0)
/// and answers its hello as a member that predates chunks. Returns the
/// connection's two halves.
fn accept_member(l: &TcpListener) -> (TcpStream, FrameReader<TcpStream>) {
    let (s, _) = l.accept().unwrap();
    let w = s.try_clone().unwrap();
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
    let mut w2 = &w;
    w2.write_all(&answer.to_frame().unwrap().to_vec()).unwrap();
    (w, r)
}

/// A member that predates chunks (rank 0 of group 1, token 0): answers the
/// direct hello with a plain name, then answers every whole data message
/// with its bytes reversed. Any other frame is recorded and ends the
/// connection, as such a member cannot read it.
fn old_member() -> (String, std::thread::JoinHandle<Received>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (mut w, mut r) = accept_member(&l);
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

/// A member that fails message A, holds message B, and answers B (late)
/// only once a third message C has come, before answering C.
fn late_member() -> (String, std::thread::JoinHandle<Received>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = std::thread::spawn(move || {
        let (mut w, mut r) = accept_member(&l);
        let mut received = Vec::new();
        let mut held = None;
        while let Ok(Some(f)) = r.read_frame() {
            let d = Data::parse(f.payload).unwrap();
            received.push((MsgType::Data, d.id, d.data.len()));
            match received.len() {
                1 => {
                    let e = ErrorMsg::new(d.id, corefarm_smp::ErrorCode::CoreFailure, "scripted");
                    write_frame(&mut w, e.to_frame()).unwrap();
                }
                2 => held = Some(d.id),
                _ => {
                    if let Some(b) = held.take() {
                        let stale = OutFrame::data(b, Bytes::from_static(b"stale")).unwrap();
                        write_frame(&mut w, stale).unwrap();
                    }
                    write_frame(&mut w, OutFrame::data(d.id, d.data).unwrap()).unwrap();
                }
            }
        }
        received
    });
    (addr, t)
}

#[test]
fn a_call_that_failed_early_leaves_nothing_for_the_next() {
    let (peer, member) = late_member();
    let (addr, srv) = server(true, &[&peer]);
    let mut opts = GroupOptions::new(1);
    opts.model = None;
    let g = Group::open(&addr, opts).unwrap();
    let mut d = g.direct(2).unwrap();
    let first = [Bytes::from_static(b"a"), Bytes::from_static(b"b")];
    let e = d.map(&first).unwrap_err();
    assert!(e.to_string().contains("scripted"), "{e}");
    // B's answer comes during this call, under an id of the last one.
    let out = d.map(&[Bytes::from_static(b"c")]).unwrap();
    assert_eq!(out, [Bytes::from_static(b"c")]);
    drop(d);
    let ids: Vec<u32> = member.join().unwrap().iter().map(|r| r.1).collect();
    assert_eq!(ids, [0, 1, 2], "each call's ids follow the last call's");
    drop(g);
    assert!(srv.join().unwrap().is_empty());
}

#[test]
fn members_linked_before_one_that_fails_are_let_go() {
    let (peer, member) = old_member();
    // Rank 1's port takes no connection.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = closed.local_addr().unwrap().to_string();
    drop(closed);
    let (addr, srv) = server(true, &[&peer, &nobody]);
    let mut opts = GroupOptions::new(2);
    opts.model = None;
    let g = Group::open(&addr, opts).unwrap();
    assert!(g.direct(2).is_err());
    // Rank 0's member sees its connection end: nothing holds it open.
    assert!(member.join().unwrap().is_empty());
    drop(g);
    srv.join().unwrap();
}

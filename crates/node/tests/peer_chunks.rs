//! Chunks and priority classes on node↔node links: control
//! traffic passes collective data queued before it on the same link, and a
//! peer that breaks the chunk rules is cut off with the reason.

use crate::fabric_common;

use bytes::Bytes;
use corefarm_node::peer::{Event, Fabric, GroupSpec, Member, PeerListener, Topology};
use corefarm_smp::codec::FrameReader;
use corefarm_smp::stream::{Chunk, Chunks};
use corefarm_smp::{
    Algo, CollHeader, DType, MsgType, PeerBody, PeerHeader, PeerKind, PeerMsg, ReduceOp,
};
use fabric_common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn coll(total: usize) -> CollHeader {
    CollHeader::bcast(total as u64)
}

#[tokio::test]
async fn an_abort_overtakes_a_large_chunk_queued_before_it_on_the_same_link() {
    let mut c = cluster(21, 2, Topology::FullMesh).await;
    let big: Bytes = (0..512 * 1024u32).map(|i| (i * 7) as u8).collect();
    // Both are queued before the link's writer runs (this runtime has one
    // thread and nothing yields in between): it picks by class.
    c.fabrics[0]
        .send(1, coll(big.len()), big.clone())
        .await
        .unwrap();
    c.fabrics[0].abort(0, 1, "stop");
    let first = within("the first message", c.fabrics[1].recv()).await;
    match first {
        Some(Event::Abort { reason, .. }) => assert_eq!(reason, "stop"),
        Some(Event::Chunk { data, .. }) => panic!("the {} bytes came first", data.len()),
        other => panic!("expected the abort, got {other:?}"),
    }
    match within("the large message", c.fabrics[1].recv()).await {
        Some(Event::Chunk { src: 0, data, .. }) => assert_eq!(data, big, "intact"),
        other => panic!("expected the large chunk, got {other:?}"),
    }
    assert_eq!(c.fabrics[1].stats().delivered, 2);
}

const GROUP: u32 = 22;
const TOKEN: u64 = 0x5eed;

fn hello(name: &str) -> Vec<u8> {
    PeerMsg {
        header: PeerHeader {
            kind: PeerKind::Hello,
            ttl: 0,
            group: GROUP,
            src: 0,
            dst: 1,
            seq: 0,
        },
        body: PeerBody::Hello {
            token: TOKEN,
            name: name.into(),
        },
    }
    .to_frame()
    .unwrap()
    .to_vec()
}

/// A payload the fabric would accept as a message from rank 0.
fn payload(len: usize) -> Bytes {
    let m = PeerMsg {
        header: PeerHeader {
            kind: PeerKind::Collective,
            ttl: 1,
            group: GROUP,
            src: 0,
            dst: 1,
            seq: 1,
        },
        body: PeerBody::Collective {
            coll: coll(len),
            data: Bytes::from(vec![1; len]),
        },
    };
    Bytes::copy_from_slice(&m.to_frame().unwrap().to_vec()[8..])
}

fn chunk(id: u32, offset: u64, total: u64, data: Bytes) -> Vec<u8> {
    Chunk::new(id, 4, offset, total, data)
        .to_frame()
        .unwrap()
        .to_vec()
}

/// Rank 1 joins; the test plays rank 0 with `name` in its hello, sends
/// `frames`, and returns why rank 1 dropped the link (and the chunk size
/// rank 1 offered in its answer).
async fn cut_off(name: &str, frames: Vec<Vec<u8>>) -> (String, String) {
    let l = PeerListener::bind_with("127.0.0.1:0".parse().unwrap(), 64 * 1024)
        .await
        .unwrap();
    let members = vec![
        Member {
            name: "raw".into(),
            addr: "127.0.0.1:9".parse().unwrap(),
        },
        Member {
            name: "n1".into(),
            addr: l.local_addr(),
        },
    ];
    let spec = GroupSpec::new(GROUP, 1, members, Topology::FullMesh).with_token(TOKEN);
    let join = Fabric::join(&l, spec);
    let raw = async {
        let s = TcpStream::connect(l.local_addr()).await.unwrap();
        let (rd, mut wr) = s.into_split();
        wr.write_all(&hello(name)).await.unwrap();
        let mut r = FrameReader::new(rd, 1 << 20);
        let f = r.read_frame().await.unwrap().unwrap();
        assert_eq!(f.ty, MsgType::Peer);
        let answer = match PeerMsg::parse(f.payload).unwrap().body {
            PeerBody::Hello { name, .. } => name,
            other => panic!("expected a hello, got {other:?}"),
        };
        (r, wr, answer)
    };
    let (fabric, (_r, mut wr, answer)) =
        within("the link", async { tokio::join!(join, raw) }).await;
    let mut fabric = fabric.unwrap();
    for f in frames {
        wr.write_all(&f).await.unwrap();
    }
    match within("the link to be dropped", fabric.recv()).await {
        Some(Event::Lost { rank: 0, reason }) => (reason, answer),
        other => panic!("expected the link lost, got {other:?}"),
    }
}

#[tokio::test]
async fn a_peer_that_breaks_the_chunk_rules_is_cut_off_with_the_reason() {
    let p = payload(3000);
    let total = p.len() as u64;
    let cases: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        (
            "raw\0chunks=1024",
            vec![chunk(1, 0, total, p.slice(..2000))],
            "message 1: a chunk of 2000 bytes, over the 1024 agreed",
        ),
        (
            "raw\0chunks=1024",
            vec![chunk(1, 0, 1 << 20, p.slice(..1000))],
            "exceeds the limit of 65536 bytes",
        ),
        (
            "raw\0chunks=1024",
            vec![
                chunk(1, 0, total, p.slice(..1000)),
                chunk(1, 2000, total, p.slice(2000..3000)),
            ],
            "chunk at offset 2000, expected 1000",
        ),
        (
            "raw\0chunks=1024",
            vec![chunk(5, 1000, total, p.slice(1000..2000))],
            "which was not begun",
        ),
        (
            "raw\0chunks=1024",
            Chunks::new(3, 4, Bytes::from(vec![0xFF; 2500]), 1024)
                .unwrap()
                .map(|c| c.to_frame().unwrap().to_vec())
                .collect(),
            "sent an invalid peer message",
        ),
        (
            "raw",
            vec![chunk(1, 0, 10, Bytes::from_static(&[0; 10]))],
            "did not agree to chunks",
        ),
    ];
    for (name, frames, why) in cases {
        let (reason, answer) = cut_off(name, frames).await;
        assert!(reason.contains(why), "{why}: {reason}");
        // Rank 1 offers the chunk size that fits its 64 KiB frames.
        assert_eq!(answer, format!("n1\0chunks={}", 64 * 1024 - 24), "{name:?}");
    }
}

#[tokio::test]
async fn collectives_agree_over_links_with_and_without_chunks() {
    // Chunks of 1 KiB on every link, collective chunks of 4 KiB: every
    // collective message crosses the links as chunks.
    // Rank 2 offers no chunks: its links carry whole messages.
    let cluster = cluster_with(23, 3, Topology::Ring, |rank, spec| {
        spec.with_chunk_size(if rank == 2 { 0 } else { 1024 })
    })
    .await;
    let (_l, groups) = groups(
        cluster,
        corefarm_node::collective::CollOptions {
            chunk: 4096,
            ..Default::default()
        },
    );
    let ops = [
        Op::Bcast(Algo::Linear, 0, 20_000),
        Op::Allreduce(Algo::Binomial, DType::I32, ReduceOp::Sum, 30_000),
        Op::Allgather(Algo::Linear, 10_000),
        Op::Barrier(Algo::Binomial),
    ];
    run_and_check(groups, 11, &ops).await;
}

//! The group part of a node session: sessions over in-memory pipes (this
//! test plays the server), real peer ports on loopback. Join, resident
//! buffers, collectives checked against local results, errors, and leave.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corefarm_node::peer::PeerListener;
use corefarm_node::{session, NodeOptions};
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::group::{
    Cmd, GroupCmd, GroupCtl, GroupMember, GroupReply, ALL_RANKS, NO_CULPRIT,
};
use corefarm_smp::{Algo, DType, Hello, MsgType, OutFrame, ReduceOp};
use tokio::io::{duplex, DuplexStream};
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(20);

/// One node session as the server sees it.
struct Node {
    name: String,
    peer: Option<String>,
    rd: FrameReader<DuplexStream>,
    wr: DuplexStream,
    stop: CancellationToken,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Node {
    async fn start(name: &str, peer: bool, memory: usize) -> Node {
        Node::start_with(name, peer, memory, corefarm_node::CoreLoader::default()).await
    }

    async fn start_with(
        name: &str,
        peer: bool,
        memory: usize,
        loader: corefarm_node::CoreLoader,
    ) -> Node {
        let listener = match peer {
            true => Some(Arc::new(
                PeerListener::bind("127.0.0.1:0".parse().unwrap())
                    .await
                    .unwrap(),
            )),
            false => None,
        };
        let opts = NodeOptions {
            name: name.into(),
            memory_limit: memory,
            peer_listen: None,
            loader,
            ..NodeOptions::default()
        };
        let (node_rd, wr) = duplex(1 << 20);
        let (rd, node_wr) = duplex(1 << 20);
        let stop = CancellationToken::new();
        tokio::spawn({
            let stop = stop.clone();
            async move { session::run_io_with(node_rd, node_wr, &opts, stop, listener).await }
        });
        let mut n = Node {
            name: name.into(),
            peer: None,
            rd: FrameReader::new(rd, 1 << 30),
            wr,
            stop,
        };
        let h = n.recv().await;
        assert_eq!(h.0, MsgType::Hello);
        n.peer = Hello::decode(&h.1).unwrap().peer;
        n
    }

    async fn send(&mut self, f: OutFrame) {
        write_frame(&mut self.wr, f).await.unwrap();
    }

    async fn recv(&mut self) -> (MsgType, Bytes) {
        let f = tokio::time::timeout(LIMIT, self.rd.read_frame())
            .await
            .expect("the node answers")
            .unwrap()
            .expect("a frame");
        (f.ty, f.payload)
    }

    async fn reply(&mut self) -> GroupReply {
        let (ty, p) = self.recv().await;
        assert_eq!(ty, MsgType::GroupReply);
        GroupReply::parse(p).unwrap()
    }
}

async fn group(n: usize, memory: usize) -> Vec<Node> {
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(Node::start(&format!("g{i}"), true, memory).await);
    }
    let members: Vec<GroupMember> = nodes
        .iter()
        .enumerate()
        .map(|(r, n)| GroupMember {
            rank: r as u32,
            name: n.name.clone(),
            peer: n
                .peer
                .clone()
                .expect("a node with a peer port advertises it"),
        })
        .collect();
    for (r, n) in nodes.iter_mut().enumerate() {
        let join = GroupCtl::Join {
            group: 77,
            rank: r as u32,
            members: members.clone(),
            topology: "ring".into(),
            token: 1,
        };
        n.send(join.to_frame()).await;
    }
    for n in nodes.iter_mut() {
        let (ty, p) = n.recv().await;
        assert_eq!(ty, MsgType::GroupCtl);
        assert_eq!(
            GroupCtl::decode(&p).unwrap(),
            GroupCtl::Joined {
                group: 77,
                error: None
            }
        );
    }
    nodes
}

fn i32s(v: &[i32]) -> Bytes {
    Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

/// Sends the same command to every node and returns their replies.
async fn all(nodes: &mut [Node], c: &GroupCmd) -> Vec<GroupReply> {
    for n in nodes.iter_mut() {
        n.send(c.to_frame().unwrap()).await;
    }
    let mut out = Vec::new();
    for n in nodes.iter_mut() {
        out.push(n.reply().await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_buffers_and_collectives() {
    let mut nodes = group(4, 1 << 20).await;
    for (r, n) in nodes.iter_mut().enumerate() {
        let mut c = GroupCmd::new(1, r as u32, Cmd::Put);
        (c.a, c.dtype, c.data) = ("x".into(), DType::I32, i32s(&[r as i32 - 1; 300]));
        n.send(c.to_frame().unwrap()).await;
        assert_eq!(n.reply().await, GroupReply::ok(1, r as u32, Bytes::new()));
    }
    // allreduce min over a ring (forwarded through neighbours), then allgather.
    let mut c = GroupCmd::new(2, ALL_RANKS, Cmd::Allreduce);
    (c.algo, c.dtype, c.reduce, c.a, c.b) = (
        Some(Algo::Star),
        DType::I32,
        ReduceOp::Min,
        "x".into(),
        "m".into(),
    );
    assert!(all(&mut nodes, &c).await.iter().all(|r| r.status == 0));
    let mut c = GroupCmd::new(3, ALL_RANKS, Cmd::Allgather);
    (c.algo, c.a, c.b) = (Some(Algo::Linear), "x".into(), "g".into());
    assert!(all(&mut nodes, &c).await.iter().all(|r| r.status == 0));
    for (k, name, want) in [
        (4, "m", vec![-1; 300]),
        (5, "g", (0..4).flat_map(|r| vec![r - 1; 300]).collect()),
    ] {
        let mut c = GroupCmd::new(k, 3, Cmd::Get);
        c.a = name.into();
        nodes[3].send(c.to_frame().unwrap()).await;
        let r = nodes[3].reply().await;
        assert_eq!(r.data, i32s(&want), "{name}");
    }
    // Freed buffers are gone; a duplicate name is refused.
    let mut c = GroupCmd::new(6, ALL_RANKS, Cmd::Free);
    c.a = "m".into();
    assert!(all(&mut nodes, &c).await.iter().all(|r| r.status == 0));
    let mut c = GroupCmd::new(7, 0, Cmd::Get);
    c.a = "m".into();
    nodes[0].send(c.to_frame().unwrap()).await;
    let r = nodes[0].reply().await;
    assert!(
        r.reason().contains("no buffer named \"m\""),
        "{}",
        r.reason()
    );
    let mut c = GroupCmd::new(8, 1, Cmd::Put);
    c.a = "x".into();
    nodes[1].send(c.to_frame().unwrap()).await;
    assert!(nodes[1].reply().await.reason().contains("already exists"));

    // A member whose source buffer is missing fails the collective; the
    // others name it as the culprit instead of waiting.
    let mut c = GroupCmd::new(9, ALL_RANKS, Cmd::Allreduce);
    (c.algo, c.dtype, c.reduce, c.a, c.b) = (
        Some(Algo::Binomial),
        DType::I32,
        ReduceOp::Sum,
        "x".into(),
        "s".into(),
    );
    for (r, n) in nodes.iter_mut().enumerate() {
        let mut c = c.clone();
        if r == 2 {
            c.a = "missing".into();
        }
        n.send(c.to_frame().unwrap()).await;
    }
    for (r, n) in nodes.iter_mut().enumerate() {
        let rep = n.reply().await;
        assert_ne!(rep.status, 0, "rank {r}");
        if r == 2 {
            assert!(
                rep.reason().contains("no buffer named \"missing\""),
                "{}",
                rep.reason()
            );
        } else {
            assert_eq!(rep.culprit, 2, "rank {r}: {}", rep.reason());
        }
    }
    // The failed group refuses further collectives at once.
    let mut c = GroupCmd::new(10, ALL_RANKS, Cmd::Barrier);
    c.algo = Some(Algo::Binomial);
    for r in all(&mut nodes, &c).await {
        assert!(r.reason().contains("failed earlier"), "{}", r.reason());
    }
    // Leaving ends the membership.
    nodes[0]
        .send(GroupCtl::Leave { group: 77 }.to_frame())
        .await;
    let mut c = GroupCmd::new(11, 0, Cmd::Get);
    c.a = "x".into();
    nodes[0].send(c.to_frame().unwrap()).await;
    let r = nodes[0].reply().await;
    assert!(r.reason().contains("not in a group"), "{}", r.reason());
    assert_eq!(r.culprit, NO_CULPRIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_guard_bounds_buffers_and_a_node_without_peer_port_cannot_join() {
    let mut nodes = group(1, 64 * 1024).await;
    let mut c = GroupCmd::new(1, 0, Cmd::Put);
    (c.a, c.data) = ("a".into(), Bytes::from(vec![0u8; 40 * 1024]));
    nodes[0].send(c.to_frame().unwrap()).await;
    assert_eq!(nodes[0].reply().await.status, 0);
    c.seq = 2;
    c.a = "b".into();
    nodes[0].send(c.to_frame().unwrap()).await;
    let r = nodes[0].reply().await;
    assert!(r.reason().contains("does not fit"), "{}", r.reason());

    let mut lone = Node::start("nopeer", false, 1 << 20).await;
    assert_eq!(lone.peer, None);
    let join = GroupCtl::Join {
        group: 5,
        rank: 0,
        members: vec![GroupMember {
            rank: 0,
            name: "nopeer".into(),
            peer: "127.0.0.1:1".into(),
        }],
        topology: "mesh".into(),
        token: 1,
    };
    lone.send(join.to_frame()).await;
    let (ty, p) = lone.recv().await;
    assert_eq!(ty, MsgType::GroupCtl);
    match GroupCtl::decode(&p).unwrap() {
        GroupCtl::Joined { error: Some(e), .. } => assert!(e.contains("no peer port"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_part_fails_leaves_nothing_for_the_next_run() {
    // Two cores: part 1 fails at once while part 0 still computes. The
    // failed run must wait for part 0, or its result is taken by the next.
    let gate = Arc::new(common::Gate::default());
    let tc = common::TestCores {
        gate: Some(gate.clone()),
        ..Default::default()
    };
    let mut n = solo_with_cores(&tc).await;
    let mut seq = 1;
    let mut cmd = |cmd: Cmd| {
        seq += 1;
        GroupCmd::new(seq, 0, cmd)
    };
    let mut bad = common::inputs(1, 2, 8);
    bad[8] = 0xEE;
    let good = common::inputs(2, 2, 8);
    for (name, data) in [("bad", bad), ("good", good.clone())] {
        let mut c = cmd(Cmd::Put);
        (c.a, c.data) = (name.into(), Bytes::from(data));
        n.send(c.to_frame().unwrap()).await;
        assert_eq!(n.reply().await.status, 0, "put {name}");
    }
    let mut c = cmd(Cmd::Run);
    (c.a, c.b) = ("bad".into(), "bad-out".into());
    n.send(c.to_frame().unwrap()).await;
    gate.until_blocked(1).await;
    gate.open_all();
    let r = n.reply().await;
    assert!(r.reason().contains("scripted failure"), "{}", r.reason());
    let mut c = cmd(Cmd::Run);
    (c.a, c.b) = ("good".into(), "good-out".into());
    n.send(c.to_frame().unwrap()).await;
    assert_eq!(n.reply().await.status, 0, "the second run");
    let mut c = cmd(Cmd::Get);
    c.a = "good-out".into();
    n.send(c.to_frame().unwrap()).await;
    let want: Vec<u8> = good
        .chunks(8)
        .flat_map(|i| common::TestCores::expected(i, 8))
        .collect();
    assert_eq!(&n.reply().await.data[..], &want[..]);
}

/// A group of one node on two scripted cores, configured (command 1).
async fn solo_with_cores(tc: &common::TestCores) -> Node {
    let mut n = Node::start_with("solo", true, 1 << 20, tc.loader()).await;
    let join = GroupCtl::Join {
        group: 78,
        rank: 0,
        members: vec![GroupMember {
            rank: 0,
            name: n.name.clone(),
            peer: n.peer.clone().expect("a peer port"),
        }],
        topology: "ring".into(),
        token: 1,
    };
    n.send(join.to_frame()).await;
    assert_eq!(n.recv().await.0, MsgType::GroupCtl, "joined");
    let mut c = GroupCmd::new(1, 0, Cmd::Configure);
    c.data = Bytes::from(common::cores(2, 8, 8).encode_payload());
    n.send(c.to_frame().unwrap()).await;
    let r = n.reply().await;
    assert_eq!(r.status, 0, "configured: {}", r.reason());
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_a_group_ends_its_cores() {
    let tc = common::TestCores::default();
    let mut n = solo_with_cores(&tc).await;
    n.send(GroupCtl::Leave { group: 78 }.to_frame()).await;
    tc.until_dropped(2).await;
    // The session goes on: a command for the group that ended is refused.
    n.send(GroupCmd::new(2, 0, Cmd::Barrier).to_frame().unwrap())
        .await;
    let r = n.reply().await;
    assert_ne!(r.status, 0, "no group any more");
}

//! A group command's class reaches the node's collective, so priority
//! holds past the server on the group's links: a real node session (this test plays its server over an
//! in-memory pipe) runs a broadcast from its buffer, and the test, playing
//! the other member with a fabric of its own, sees the class of every
//! chunk it receives.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use corefarm_node::peer::{Event, Fabric, GroupSpec, Member, PeerListener, Topology};
use corefarm_node::{session, NodeOptions};
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::group::{Cmd, GroupCmd, GroupCtl, GroupMember, GroupReply};
use corefarm_smp::hello::features;
use corefarm_smp::{Algo, Hello, MsgType, OutFrame};
use tokio::io::{duplex, DuplexStream};
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(20);
const GROUP: u32 = 78;
const TOKEN: u64 = 7;

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .unwrap_or_else(|_| panic!("stalled: {what}"))
}

struct Server {
    rd: FrameReader<DuplexStream>,
    wr: DuplexStream,
}

impl Server {
    async fn send(&mut self, f: OutFrame) {
        write_frame(&mut self.wr, f).await.unwrap();
    }

    async fn recv(&mut self) -> (MsgType, Bytes) {
        let f = within("the node", self.rd.read_frame())
            .await
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commands_class_is_the_class_of_its_collectives_chunks() {
    // Rank 1: a real node session with a peer port.
    let listener = Arc::new(
        PeerListener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap(),
    );
    let peer1 = listener.local_addr();
    let opts = NodeOptions {
        name: "n1".into(),
        memory_limit: 1 << 20,
        ..NodeOptions::default()
    };
    let (node_rd, wr) = duplex(1 << 20);
    let (rd, node_wr) = duplex(1 << 20);
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(async move {
        session::run_io_with(node_rd, node_wr, &opts, stop, Some(listener)).await
    });
    let mut s = Server {
        rd: FrameReader::new(rd, 1 << 30),
        wr,
    };
    let (ty, h) = s.recv().await;
    assert_eq!(ty, MsgType::Hello);
    let h = Hello::decode(&h).unwrap();
    assert!(h.has(features::GROUP_PRIORITY), "{:?}", h.features);

    // Rank 0: this test, with a fabric of its own.
    let mine = PeerListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let members = [("n0", mine.local_addr()), ("n1", peer1)];
    let join = GroupCtl::Join {
        group: GROUP,
        rank: 1,
        members: members
            .iter()
            .enumerate()
            .map(|(r, (name, addr))| GroupMember {
                rank: r as u32,
                name: name.to_string(),
                peer: addr.to_string(),
            })
            .collect(),
        topology: "mesh".into(),
        token: TOKEN,
    };
    s.send(join.to_frame()).await;
    let spec = GroupSpec::new(
        GROUP,
        0,
        members
            .iter()
            .map(|(name, addr)| Member {
                name: name.to_string(),
                addr: *addr,
            })
            .collect(),
        Topology::FullMesh,
    )
    .with_token(TOKEN);
    let mut fab = within("the link", Fabric::join(&mine, spec)).await.unwrap();
    let (ty, p) = s.recv().await;
    assert_eq!(ty, MsgType::GroupCtl);
    assert!(matches!(
        GroupCtl::decode(&p).unwrap(),
        GroupCtl::Joined { error: None, .. }
    ));

    let mut put = GroupCmd::new(1, 1, Cmd::Put);
    (put.a, put.data) = ("x".into(), Bytes::from_static(b"urgent"));
    s.send(put.to_frame().unwrap()).await;
    assert_eq!(s.reply().await.status, 0);
    // Broadcasts from rank 1, one per class and one without any: the
    // node is the root, so it sends and this test only receives.
    for (seq, class) in [(2, 0u8), (3, 4), (4, 7)] {
        let mut c = GroupCmd::new(seq, 1, Cmd::Bcast);
        (c.algo, c.root, c.class, c.a, c.b) =
            (Some(Algo::Binomial), 1, class, "x".into(), "x".into());
        s.send(c.to_frame().unwrap()).await;
        match within("the chunk", fab.recv()).await {
            Some(Event::Chunk { src: 1, coll, data }) => {
                assert_eq!((coll.seq, coll.class), (seq - 1, class));
                assert_eq!(data, "urgent");
            }
            other => panic!("expected rank 1's chunk, got {other:?}"),
        }
        assert_eq!(s.reply().await, GroupReply::ok(seq, 1, Bytes::new()));
    }
}

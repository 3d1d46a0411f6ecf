//! The node manager's peer port: bound on the interface it reaches the
//! server from, announced in its hello, and closed to anything that is not
//! a peer hello of a group this node is joining.

use crate::common;

use common::*;
use corefarm_node::peer::{Fabric, GroupSpec, Member, PeerListener, Topology};
use corefarm_smp::codec::FrameReader;
use corefarm_smp::hello::features;
use corefarm_smp::{Hello, OutFrame};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test]
async fn hello_announces_the_peer_port() {
    let (mut srv, node) = start(options()).await;
    let h: Hello = srv.handshake(None).await;
    assert!(h.has(features::PEER), "{h:?}");
    let addr: std::net::SocketAddr = h.peer.expect("peer address").parse().unwrap();
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    assert_ne!(addr.port(), 0);
    // Something that is not a peer hello is closed without an answer.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&Hello::new("user").to_frame().to_vec())
        .await
        .unwrap();
    let mut r = FrameReader::new(s, 1 << 16);
    assert!(within("close", r.read_frame()).await.unwrap().is_none());
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn no_peer_port_when_disabled() {
    let (mut srv, node) = start(corefarm_node::NodeOptions {
        peer_listen: None,
        ..options()
    })
    .await;
    let h = srv.handshake(None).await;
    assert!(!h.has(features::PEER) && h.peer.is_none());
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn joining_fails_in_time_naming_a_member_that_never_links() {
    let l = PeerListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    // Rank 1's address accepts connections but never joins the group.
    let silent = PeerListener::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let members = vec![
        Member {
            name: "a".into(),
            addr: l.local_addr(),
        },
        Member {
            name: "b".into(),
            addr: silent.local_addr(),
        },
    ];
    let mut spec = GroupSpec::new(9, 0, members, Topology::FullMesh);
    spec.connect_timeout = std::time::Duration::from_millis(300);
    let e = within("join to fail", Fabric::join(&l, spec))
        .await
        .err()
        .expect("no link");
    let text = e.to_string();
    assert!(text.contains("rank 1 (b@127.0.0.1"), "{text}");
    // A non-SMP stranger on the peer port gets nothing either.
    let mut s = TcpStream::connect(l.local_addr()).await.unwrap();
    s.write_all(&OutFrame::data(1, bytes::Bytes::new()).unwrap().to_vec())
        .await
        .unwrap();
    let mut r = FrameReader::new(s, 1 << 16);
    assert!(within("close", r.read_frame()).await.unwrap().is_none());
}

#[tokio::test]
async fn a_link_without_the_group_token_is_refused_and_the_members_still_link() {
    let (a, b) = (
        PeerListener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap(),
        PeerListener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap(),
    );
    let members = vec![
        Member {
            name: "a".into(),
            addr: a.local_addr(),
        },
        Member {
            name: "b".into(),
            addr: b.local_addr(),
        },
    ];
    let spec = |r| GroupSpec::new(5, r, members.clone(), Topology::FullMesh).with_token(0xFEED);
    let b_addr = b.local_addr();
    // Rank 1 is joining (its first poll registers the group) when a
    // stranger who knows the group id, but not its token, claims rank 0.
    let (one, zero) = tokio::join!(Fabric::join(&b, spec(1)), async {
        let mut s = TcpStream::connect(b_addr).await.unwrap();
        let fake = corefarm_smp::PeerMsg {
            header: corefarm_smp::PeerHeader {
                kind: corefarm_smp::PeerKind::Hello,
                ttl: 0,
                group: 5,
                src: 0,
                dst: 1,
                seq: 0,
            },
            body: corefarm_smp::PeerBody::Hello {
                token: 0xBAD,
                name: "a".into(),
            },
        };
        s.write_all(&fake.to_frame().unwrap().to_vec())
            .await
            .unwrap();
        let mut r = FrameReader::new(s, 1 << 16);
        let answer = within("the stranger's link to close", r.read_frame()).await;
        assert!(answer.unwrap().is_none(), "no hello for a stranger");
        within("rank 0 to join", Fabric::join(&a, spec(0))).await
    });
    let (one, zero) = (one.expect("rank 1 joined"), zero.expect("rank 0 joined"));
    assert_eq!((one.rank(), zero.rank()), (1, 0));
}

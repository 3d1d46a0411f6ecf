//! Misbehaving nodes are dropped and their work goes to the others: every
//! result reaches the user exactly once.

use crate::common;

use common::{bench, by_tag, opts, start, Behaviour, FakeNode, FakeUser};

#[tokio::test]
async fn garbage_or_unknown_ids_drop_the_node_and_its_work_is_redispatched() {
    for bad in [Behaviour::GarbageAfter(2), Behaviour::UnknownId] {
        let srv = start(opts()).await;
        let liar = FakeNode::spawn(srv.nodes, "liar", 9, bad).await;
        let _good = FakeNode::spawn(srv.nodes, "good", 1, Behaviour::Echo).await;
        srv.wait_free_nodes(2).await;
        let (mut u, reply) = FakeUser::hello(srv.users, Some(2)).await;
        assert_eq!(reply.nodes, Some(2), "{bad:?}");
        assert_eq!(u.configure(&bench(16, 16)).await.0, 0, "{bad:?}");
        // `stream` fails on a duplicate or an unknown id, and returns once
        // every id has its result.
        let results = u.stream(0..60, 16, true).await;
        assert_eq!(results.len(), 60, "{bad:?}");
        let tags = by_tag(&results);
        let from_liar = tags.get(&9).copied().unwrap_or(0);
        let expect = if bad == Behaviour::GarbageAfter(2) {
            2
        } else {
            0
        };
        assert_eq!(from_liar, expect, "{bad:?}: only its valid results count");
        liar.closed().await;
        let s = srv
            .wait_status("the liar gone", |s| s.nodes.len() == 1)
            .await;
        assert_eq!(s.nodes[0].name.as_deref(), Some("good"), "{bad:?}");
        assert_eq!(s.users[0].nodes, vec![s.nodes[0].id]);
    }
}

mod raw {
    //! Nodes played by hand, to answer configurations when the test says.
    use std::net::SocketAddr;

    use corefarm_smp::codec::{write_frame, FrameReader};
    use corefarm_smp::{hello::features, Frame, Hello, MsgType};
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
    use tokio::net::TcpStream;

    pub struct Node {
        pub r: FrameReader<OwnedReadHalf>,
        pub w: OwnedWriteHalf,
    }

    impl Node {
        pub async fn join(addr: SocketAddr, name: &str) -> Node {
            let (rd, mut w) = TcpStream::connect(addr).await.unwrap().into_split();
            let mut h = Hello::new("node");
            h.name = Some(name.into());
            h.features = vec![features::ERROR.into()];
            write_frame(&mut w, h.to_frame()).await.unwrap();
            let mut n = Node {
                r: FrameReader::new(rd, 1 << 20),
                w,
            };
            assert_eq!(n.next().await.ty, MsgType::Hello);
            n
        }

        pub async fn next(&mut self) -> Frame {
            tokio::time::timeout(super::common::LIMIT, self.r.read_frame())
                .await
                .expect("a frame for the node in time")
                .unwrap()
                .expect("open")
        }
    }
}

#[tokio::test]
async fn a_routing_user_whose_last_node_refuses_hears_about_its_waiting_data() {
    use corefarm_smp::codec::write_frame;
    use corefarm_smp::{ConfigurationResponse, ErrorCode, MsgType, OutFrame};
    let srv = start(opts()).await;
    let mut a = raw::Node::join(srv.nodes, "a").await;
    srv.wait_free_nodes(1).await;
    let (mut u, _) = FakeUser::hello(srv.users, None).await;
    let cfg = bench(16, 16);
    let configured = tokio::spawn(async move {
        let st = u.configure(&cfg).await;
        (u, st)
    });
    assert_eq!(a.next().await.ty, MsgType::Configuration);
    write_frame(&mut a.w, ConfigurationResponse { status: 0 }.to_frame())
        .await
        .unwrap();
    let (mut u, st) = configured.await.unwrap();
    assert_eq!(st.0, 0);
    // B joins and the user adopts it: it is sent the configuration and
    // does not answer yet.
    let mut b = raw::Node::join(srv.nodes, "b").await;
    assert_eq!(b.next().await.ty, MsgType::Configuration);
    // Data 7 goes to A, the only ready node; A dies with it.
    u.send(OutFrame::data(7, bytes::Bytes::from(vec![0u8; 16])).unwrap())
        .await;
    assert_eq!(a.next().await.ty, MsgType::Data);
    drop(a);
    srv.wait_status("node a gone", |s| s.nodes.len() == 1).await;
    // B refuses: no node is left for data 7.
    write_frame(&mut b.w, ConfigurationResponse { status: 1 }.to_frame())
        .await
        .unwrap();
    let e = u.expect_error().await.expect("an error for data 7");
    assert_eq!((e.id, e.code()), (7, Some(ErrorCode::NoNodes)), "{e}");
    assert!(e.reason.contains("refused"), "{e}");
}

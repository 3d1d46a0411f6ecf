//! `--max-users` and `--max-nodes`: connections beyond the limit are
//! refused with a reason naming the limit and the flag, then closed.

use crate::common;

use common::{bench, opts, start, Behaviour, FakeNode, FakeUser};
use corefarm_server::ServerOptions;
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::{hello::features, ErrorMsg, Hello, MsgType};
use tokio::net::TcpStream;

#[tokio::test]
async fn users_beyond_max_users_are_refused_with_a_reason() {
    let srv = start(ServerOptions {
        max_users: 1,
        ..opts()
    })
    .await;
    let _n = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    // Configured: its place is never taken back (an unconfigured user's
    // would go to the next connection).
    let (mut first, _) = FakeUser::hello(srv.users, None).await;
    assert_eq!(first.configure(&bench(16, 16)).await.0, 0);

    // A hello user hears why, instead of a hello reply, then the server closes.
    let (mut second, f) = FakeUser::hello_with(srv.users, "late", None, &[features::ERROR]).await;
    assert_eq!(f.ty, MsgType::Error);
    let e = ErrorMsg::parse(&f.payload).unwrap();
    assert!(
        e.reason.contains("limit of 1 user") && e.reason.contains("--max-users"),
        "{e}"
    );
    second.closed().await;

    // A seed user whose first message is a configuration gets a negative response.
    let mut seed = FakeUser::connect(srv.users).await;
    let (status, errors) = seed.configure(&bench(16, 16)).await;
    assert!(status != 0 && errors.is_empty());
    seed.closed().await;

    // Only the first user ever held a slot; once it leaves, a new one is served.
    assert_eq!(srv.status.get().users.len(), 1);
    drop(first);
    srv.wait_status("the first user gone", |s| s.users.is_empty())
        .await;
    let (mut third, reply) = FakeUser::hello(srv.users, None).await;
    assert_eq!(reply.nodes, Some(1));
    assert_eq!(third.configure(&bench(16, 16)).await.0, 0);
}

#[tokio::test]
async fn nodes_beyond_max_nodes_are_refused_with_a_reason() {
    let srv = start(ServerOptions {
        max_nodes: 1,
        ..opts()
    })
    .await;
    let _n = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;

    let s = TcpStream::connect(srv.nodes).await.unwrap();
    let (rd, mut w) = s.into_split();
    let mut h = Hello::new("node");
    h.name = Some("extra".into());
    h.features = vec![features::ERROR.into()];
    write_frame(&mut w, h.to_frame()).await.unwrap();
    let mut r = FrameReader::new(rd, 1 << 20);
    let f = r.read_frame().await.unwrap().expect("an answer");
    assert_eq!(f.ty, MsgType::Error);
    let e = ErrorMsg::parse(&f.payload).unwrap();
    assert!(
        e.reason.contains("limit of 1 node") && e.reason.contains("--max-nodes"),
        "{e}"
    );
    assert!(r.read_frame().await.unwrap().is_none(), "then closed");
    let st = srv.status.get();
    assert_eq!(st.nodes.len(), 1, "{st:#?}");
    assert_eq!(st.nodes[0].name.as_deref(), Some("a"));
    // The one node still serves.
    let (mut u, _) = FakeUser::hello(srv.users, None).await;
    assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
    assert_eq!(u.stream(0..5, 16, true).await.len(), 5);
}

/// A node given the user port by mistake sent its hello and got a negative
/// configuration response (a seed user's only refusal), which it took for
/// an unexpected message: it is told in an error, as a node hello offers
/// them, which port it wants. In both sharing modes (each has its own
/// user session).
#[tokio::test]
async fn a_node_at_the_user_port_is_told_to_use_the_node_port() {
    for sharing in [
        corefarm_server::Sharing::Exclusive,
        corefarm_server::Sharing::Shared,
    ] {
        let srv = start(ServerOptions { sharing, ..opts() }).await;
        let s = TcpStream::connect(srv.users).await.unwrap();
        let (rd, mut w) = s.into_split();
        let mut h = Hello::new("node");
        h.features = vec![features::ERROR.into()];
        write_frame(&mut w, h.to_frame()).await.unwrap();
        let mut r = FrameReader::new(rd, 1 << 20);
        let f = r.read_frame().await.unwrap().expect("an answer");
        assert_eq!(f.ty, MsgType::Error, "{sharing:?}");
        let e = ErrorMsg::parse(&f.payload).unwrap();
        assert!(
            e.reason.contains("on the user port") && e.reason.contains("--nodes-listen"),
            "{sharing:?}: {e}"
        );
        assert!(r.read_frame().await.unwrap().is_none(), "then closed");
    }
}

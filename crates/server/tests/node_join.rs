//! When a new node joins the pool: a node that says hello only once it has
//! been answered (so nothing overtakes the answer that tells it its
//! features), a seed-format node, which never says hello, after the grace
//! period.

use crate::common;

use std::time::Duration;

use common::{bench, opts, start, FakeUser, LIMIT};
use corefarm_server::ServerOptions;
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::{hello::features, Frame, Hello, MsgType};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;

async fn next(r: &mut FrameReader<OwnedReadHalf>) -> Frame {
    tokio::time::timeout(LIMIT, r.read_frame())
        .await
        .expect("a frame from the server in time")
        .expect("a readable frame")
        .expect("the connection open")
}

#[tokio::test]
async fn a_node_gets_nothing_before_its_hello_is_answered() {
    // A grace as long as the test's limit: the node can only join by its hello.
    let srv = start(ServerOptions {
        node_hello_grace: LIMIT,
        node_wait: LIMIT,
        ..opts()
    })
    .await;
    let (rd, mut w) = TcpStream::connect(srv.nodes).await.unwrap().into_split();
    let mut r = FrameReader::new(rd, 1 << 20);

    // A user waits for a node (its hello is answered once it has one),
    // then configures.
    let users = srv.users;
    let user = tokio::spawn(async move {
        let (mut u, _) = FakeUser::hello(users, Some(1)).await;
        u.send(bench(16, 16).to_frame().unwrap()).await;
        u
    });
    srv.wait_status("the user, and no node yet", |s| {
        s.users.len() == 1 && s.nodes.is_empty()
    })
    .await;

    let mut h = Hello::new("node");
    h.name = Some("late".into());
    h.features = vec![features::ERROR.into()];
    write_frame(&mut w, h.to_frame()).await.unwrap();
    let first = next(&mut r).await;
    assert_eq!(first.ty, MsgType::Hello, "the answer comes first");
    let answer = Hello::decode(&first.payload).unwrap();
    assert!(answer.has(features::ERROR));
    let second = next(&mut r).await;
    assert_eq!(
        second.ty,
        MsgType::Configuration,
        "then the waiting user's configuration"
    );
    srv.wait_status("the node, assigned", |s| s.nodes.len() == 1)
        .await;
    drop(user.await.unwrap());
}

#[tokio::test]
async fn a_seed_format_node_joins_after_the_grace_period() {
    let srv = start(ServerOptions {
        node_hello_grace: Duration::from_millis(50),
        node_wait: LIMIT,
        ..opts()
    })
    .await;
    let (rd, _w) = TcpStream::connect(srv.nodes).await.unwrap().into_split();
    let mut r = FrameReader::new(rd, 1 << 20);
    let (mut u, _) = FakeUser::hello(srv.users, Some(1)).await;
    u.send(bench(16, 16).to_frame().unwrap()).await;
    let first = next(&mut r).await;
    assert_eq!(
        first.ty,
        MsgType::Configuration,
        "no hello to a node that sent none"
    );
    let s = srv.status.get();
    assert_eq!(
        s.nodes.len(),
        1,
        "the node is in the status once it has work"
    );
    assert!(
        s.nodes[0].name.is_none(),
        "a seed-format node has no name: {s:?}"
    );
}

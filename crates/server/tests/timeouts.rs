//! No resource is held by a peer that does nothing: idle users give their
//! nodes back, peers that stall inside a message are cut off. Real sockets,
//! so the timeouts are short and every wait is on a signal (an error frame,
//! a closed connection, a status condition).

use crate::common;

use std::time::Duration;

use common::{bench, by_tag, opts, start, Behaviour, FakeNode, FakeUser};
use corefarm_server::ServerOptions;
use corefarm_smp::{ErrorCode, MsgType, OutFrame};

fn short() -> ServerOptions {
    ServerOptions {
        user_idle_timeout: Duration::from_millis(300),
        read_timeout: Duration::from_millis(300),
        ..opts()
    }
}

/// Read timeout only: the idle timeout must not be what ends the session.
fn read_only() -> ServerOptions {
    ServerOptions {
        user_idle_timeout: Duration::from_secs(600),
        ..short()
    }
}

#[tokio::test]
async fn an_idle_user_releases_its_nodes_and_a_waiting_user_is_served() {
    let srv = start(ServerOptions {
        node_wait: Duration::from_secs(10),
        user_idle_timeout: Duration::from_secs(1),
        ..short()
    })
    .await;
    let _a = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    let _b = FakeNode::spawn(srv.nodes, "b", 2, Behaviour::Echo).await;
    srv.wait_free_nodes(2).await;
    let (mut idle, reply) = FakeUser::hello(srv.users, None).await;
    assert_eq!(reply.nodes, Some(2));
    assert_eq!(idle.configure(&bench(16, 16)).await.0, 0);
    // Says nothing more. A second user waits for nodes (--node-wait) and
    // gets them when the idle one times out.
    let (mut busy, reply) = FakeUser::hello(srv.users, None).await;
    assert!(reply.nodes >= Some(1), "{reply:?}");
    let e = idle.expect_error().await.expect("a timeout error");
    assert_eq!(e.code(), Some(ErrorCode::Timeout), "{e}");
    assert!(e.reason.contains("--user-idle-timeout"), "{e}");
    idle.closed().await;
    let you = srv
        .wait_status("both nodes with the second user", |s| {
            s.users.len() == 1 && s.users[0].nodes.len() == 2
        })
        .await
        .users[0]
        .id;
    assert_eq!(busy.configure(&bench(16, 16)).await.0, 0);
    let tags = by_tag(&busy.stream(0..40, 16, true).await);
    assert_eq!(tags.len(), 2, "both released nodes serve: {tags:?}");
    assert_eq!(srv.status.get().user(you).unwrap().results, 40);
}

#[tokio::test]
async fn a_user_waiting_for_results_is_not_idle() {
    let srv = start(ServerOptions {
        node_wait: Duration::ZERO,
        ..short()
    })
    .await;
    let mut slow = FakeNode::spawn(srv.nodes, "slow", 1, Behaviour::Hold).await;
    srv.wait_free_nodes(1).await;
    let (mut waiting, _) = FakeUser::hello(srv.users, Some(1)).await;
    assert_eq!(waiting.configure(&bench(16, 16)).await.0, 0);
    waiting.recv().await.expect("credit");
    waiting
        .send(OutFrame::data(7, bytes::Bytes::from(vec![0u8; 16])).unwrap())
        .await;
    srv.wait_status("the input in flight", |s| {
        s.nodes.first().is_some_and(|n| n.in_flight == 1)
    })
    .await;
    // The clock: a second user holds the other node and goes idle while a
    // third waits with none. Once the idle one has been ended, the idle
    // timeout has passed for the first one too.
    let _other = FakeNode::spawn(srv.nodes, "other", 2, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let (mut clock, reply) = FakeUser::hello(srv.users, Some(1)).await;
    assert_eq!(reply.nodes, Some(1));
    assert_eq!(clock.configure(&bench(16, 16)).await.0, 0);
    let (_starved, reply) = FakeUser::hello(srv.users, Some(1)).await;
    assert_eq!(reply.nodes, Some(0));
    let e = clock.expect_error().await.unwrap();
    assert_eq!(e.code(), Some(ErrorCode::Timeout));
    slow.release();
    let f = waiting
        .recv()
        .await
        .expect("the result, session still open");
    assert_eq!(f.ty, MsgType::Data);
}

#[tokio::test]
async fn a_trickled_header_is_cut_off_with_a_reason() {
    let srv = start(read_only()).await;
    let (mut u, _) = FakeUser::hello(srv.users, None).await;
    u.send_raw(&[3, 0, 0]).await;
    let e = u.expect_error().await.expect("a timeout error");
    assert_eq!(e.code(), Some(ErrorCode::Timeout), "{e}");
    assert!(e.reason.contains("header"), "{e}");
    u.closed().await;
    // A seed-format peer that never completes its first header is closed too.
    let mut seed = FakeUser::connect(srv.users).await;
    seed.send_raw(&[1, 0]).await;
    seed.closed().await;
}

#[tokio::test]
async fn a_stalled_payload_is_cut_off() {
    let srv = start(read_only()).await;
    let (mut u, _) = FakeUser::hello(srv.users, None).await;
    // A configuration header announcing 100 bytes, and only 10 of them.
    let mut bytes = vec![1u8, 0, 0, 0, 100, 0, 0, 0];
    bytes.extend_from_slice(&[0; 10]);
    u.send_raw(&bytes).await;
    let e = u.expect_error().await.expect("a timeout error");
    assert_eq!(e.code(), Some(ErrorCode::Timeout), "{e}");
    assert!(e.reason.contains("no progress"), "{e}");
}

#[tokio::test]
async fn a_node_trickling_a_header_is_dropped() {
    let srv = start(read_only()).await;
    let node = FakeNode::spawn(srv.nodes, "trickle", 1, Behaviour::TrickleHeader).await;
    node.closed().await;
    srv.wait_status("the node gone", |s| s.nodes.is_empty())
        .await;
}

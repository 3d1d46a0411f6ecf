//! The status extension: hello users that negotiated "status" ask with a
//! StatusRequest (0x13) and get a ClusterStatus (0x14); tests and embedding
//! programs read the same picture through `Server::status_handle`.

use crate::common;

use common::{bench, opts, start, Behaviour, FakeNode, FakeUser};
use corefarm_smp::{hello::features, ClusterStatus, ErrorCode, NodeState, UserPhase};

#[tokio::test]
async fn status_reflects_nodes_and_users() {
    let srv = start(opts()).await;
    let _a = FakeNode::spawn(srv.nodes, "n-a", 1, Behaviour::Echo).await;
    let _b = FakeNode::spawn(srv.nodes, "n-b", 2, Behaviour::Echo).await;
    // Listed from the moment they connect; named once their hello is read.
    let s = srv
        .wait_status("two free named nodes", |s| {
            s.count_nodes(NodeState::Free) == 2 && s.nodes.iter().all(|n| n.name.is_some())
        })
        .await;
    assert!(s.users.is_empty());
    let mut names: Vec<_> = s.nodes.iter().map(|n| n.name.clone().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["n-a", "n-b"]);

    let (mut u, reply) = FakeUser::hello(srv.users, None).await;
    assert!(reply.has(features::STATUS), "the server agrees to status");
    // A seed-format user is listed too, without hello.
    let seed = FakeUser::connect(srv.users).await;

    let before = u.status().await;
    let you = before.you.expect("the asker's id");
    let me = before.user(you).unwrap();
    assert_eq!(me.name.as_deref(), Some("test-user"));
    assert!(me.hello);
    assert_eq!(me.phase, UserPhase::Initial);
    assert_eq!(me.nodes.len(), 2);
    assert_eq!(before.count_nodes(NodeState::Assigned), 2);
    assert_eq!(before.policy, "credit");
    assert_eq!(before.max_message, srv.status.get().max_message);

    assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
    assert_eq!(u.stream(0..30, 16, true).await.len(), 30);
    let after = u.status().await;
    let me = after.user(you).unwrap();
    assert_eq!(me.phase, UserPhase::Routing);
    assert_eq!((me.results, me.outstanding, me.queued), (30, 0, 0));
    assert_eq!(after.count_nodes(NodeState::Ready), 2);
    let per_node: u64 = after.nodes.iter().map(|n| n.results).sum();
    assert_eq!(per_node, 30);
    assert!(after
        .nodes
        .iter()
        .all(|n| n.user == Some(you) && n.in_flight == 0));

    let s = srv
        .wait_status("the seed user listed", |s| s.users.len() == 2)
        .await;
    assert!(s.users.iter().any(|x| x.id != you && !x.hello));
    drop(u);
    drop(seed);
    let s = srv
        .wait_status("nodes back in the pool", |s| {
            s.users.is_empty() && s.count_nodes(NodeState::Free) == 2
        })
        .await;
    assert!(s.nodes.iter().all(|n| n.user.is_none() && n.results == 0));
}

#[tokio::test]
async fn a_status_request_without_the_feature_is_refused() {
    let srv = start(opts()).await;
    let (mut u, _) = FakeUser::hello_with(srv.users, "x", None, &[features::ERROR]).await;
    u.send(ClusterStatus::request_frame()).await;
    let e = u.expect_error().await.expect("an error");
    assert_eq!(e.code(), Some(ErrorCode::UnexpectedMessage), "{e}");
    u.closed().await;
}

#[tokio::test]
async fn an_observer_asking_for_zero_nodes_takes_none() {
    let srv = start(opts()).await;
    let _a = FakeNode::spawn(srv.nodes, "n-a", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let (mut watcher, reply) = FakeUser::hello(srv.users, Some(0)).await;
    assert_eq!(reply.nodes, Some(0));
    let s = watcher.status().await;
    assert_eq!(
        s.count_nodes(NodeState::Free),
        1,
        "the observer holds no node"
    );
    // A computing user still gets the node while the observer is connected.
    let (mut u, reply) = FakeUser::hello(srv.users, None).await;
    assert_eq!(reply.nodes, Some(1));
    assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
    assert_eq!(u.stream(0..5, 16, true).await.len(), 5);
}

/// In shared mode the server reads a user's first message to choose its
/// session (group or scheduler); a user that has not sent it yet is listed
/// all the same, and leaves the list when it goes.
#[tokio::test]
async fn a_silent_user_is_listed_in_shared_mode_too() {
    let srv = start(corefarm_server::ServerOptions {
        sharing: corefarm_server::Sharing::Shared,
        ..opts()
    })
    .await;
    let silent = tokio::net::TcpStream::connect(srv.users).await.unwrap();
    srv.wait_status("the silent user listed", |s| s.users.len() == 1)
        .await;
    drop(silent);
    srv.wait_status("the silent user gone", |s| s.users.is_empty())
        .await;
}

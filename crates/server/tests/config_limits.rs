//! Configurations that cannot fit `--max-message` (or have no outputs) are
//! refused with a reason before any node sees them, and the session stays
//! usable: a corrected configuration on the same connection works.

use crate::common;

use common::{bench, by_tag, opts, start, Behaviour, FakeNode, FakeUser};
use corefarm_smp::{Configuration, CoreInfo, ErrorCode, NodeState, UserPhase};

const MAX: u32 = 1 << 20;

fn limited() -> corefarm_server::ServerOptions {
    corefarm_server::ServerOptions {
        max_message: MAX,
        ..opts()
    }
}

/// Configurations the server must refuse, with the code it must give.
fn bad_configurations() -> Vec<(&'static str, Configuration, ErrorCode)> {
    let zero_output = Configuration {
        input_size: 16,
        output_size: 0,
        cores: vec![CoreInfo {
            control: 0xC000_0000,
            input: 0xC000_1000,
            output: 0xC000_2000,
        }],
        bitstream: bytes::Bytes::from_static(b"raw bitstream"),
    };
    vec![
        ("output", bench(32, 0xFFFF_FFF0), ErrorCode::TooLarge),
        ("input", bench(MAX - 3, 32), ErrorCode::TooLarge),
        ("output size 0", zero_output, ErrorCode::ConfigurationFailed),
    ]
}

#[tokio::test]
async fn refused_configurations_never_reach_nodes_and_a_corrected_one_is_served_by_every_node() {
    let srv = start(limited()).await;
    let mut a = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    let mut b = FakeNode::spawn(srv.nodes, "b", 2, Behaviour::Echo).await;
    srv.wait_free_nodes(2).await;
    let (mut u, reply) = FakeUser::hello(srv.users, None).await;
    assert_eq!(reply.nodes, Some(2));
    for (what, cfg, code) in bad_configurations() {
        let (status, errors) = u.configure(&cfg).await;
        assert_ne!(status, 0, "{what}: refused");
        assert_eq!(errors.len(), 1, "{what}: one reason, before the response");
        assert_eq!(errors[0].code(), Some(code), "{what}: {}", errors[0]);
        assert!(errors[0].reason.contains(what), "{what}: {}", errors[0]);
    }
    // Nothing was forwarded, and both nodes are still this user's.
    assert!(a.configs.try_recv().is_err() && b.configs.try_recv().is_err());
    let s = srv.status.get();
    assert_eq!(s.count_nodes(NodeState::Assigned), 2, "{s:#?}");
    assert_eq!(s.users[0].phase, UserPhase::Initial);

    let good = bench(32, 32);
    let (status, errors) = u.configure(&good).await;
    assert_eq!((status, errors.len()), (0, 0), "{errors:?}");
    // The first configuration any node saw is the corrected one.
    assert_eq!(a.configs.recv().await.unwrap(), good);
    assert_eq!(b.configs.recv().await.unwrap(), good);
    let results = u.stream(0..40, 32, true).await;
    let tags = by_tag(&results);
    assert!(tags[&1] > 0 && tags[&2] > 0, "every node served: {tags:?}");
}

#[tokio::test]
async fn a_seed_user_gets_a_negative_response_and_can_correct_it() {
    let srv = start(limited()).await;
    let _a = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let mut u = FakeUser::connect(srv.users).await;
    let (status, errors) = u.configure(&bench(32, 0xFFFF_FFF0)).await;
    assert_ne!(status, 0);
    assert!(
        errors.is_empty(),
        "a seed user never receives error messages"
    );
    let (status, _) = u.configure(&bench(32, 32)).await;
    assert_eq!(status, 0, "the corrected configuration works");
    let results = u.stream(0..10, 32, false).await;
    assert_eq!(results.len(), 10);
}

#[tokio::test]
async fn a_second_user_is_served_normally_after_a_refusal() {
    let srv = start(limited()).await;
    let _a = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    let _b = FakeNode::spawn(srv.nodes, "b", 2, Behaviour::Echo).await;
    srv.wait_free_nodes(2).await;
    let (mut first, _) = FakeUser::hello(srv.users, None).await;
    let (status, _) = first.configure(&bench(32, 0xFFFF_FFF0)).await;
    assert_ne!(status, 0);
    drop(first);
    // Both nodes come back to the pool, healthy.
    srv.wait_free_nodes(2).await;
    let (mut second, reply) = FakeUser::hello(srv.users, None).await;
    assert_eq!(reply.nodes, Some(2));
    assert_eq!(second.configure(&bench(32, 32)).await.0, 0);
    let tags = by_tag(&second.stream(0..40, 32, true).await);
    assert_eq!(tags.values().sum::<usize>(), 40);
    assert_eq!(tags.len(), 2, "both nodes were kept: {tags:?}");
}

#[tokio::test]
async fn a_refused_reconfiguration_keeps_the_previous_one() {
    let srv = start(limited()).await;
    let mut a = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let (mut u, _) = FakeUser::hello(srv.users, None).await;
    assert_eq!(u.configure(&bench(32, 32)).await.0, 0);
    assert_eq!(u.stream(0..10, 32, true).await.len(), 10);
    let (status, errors) = u.configure(&bench(32, 0xFFFF_FFF0)).await;
    assert_ne!(status, 0);
    assert_eq!(errors[0].code(), Some(ErrorCode::TooLarge));
    // Still routing with the first configuration, on the same node.
    assert_eq!(u.stream(10..20, 32, true).await.len(), 10);
    assert_eq!(a.configs.recv().await.unwrap(), bench(32, 32));
    assert!(
        a.configs.try_recv().is_err(),
        "the node saw one configuration"
    );
    let s = srv.status.get();
    assert_eq!(s.users[0].phase, UserPhase::Routing);
}

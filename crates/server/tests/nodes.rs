//! Misbehaving nodes are dropped and their work goes to the others: every
//! result reaches the user exactly once.

mod common;

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

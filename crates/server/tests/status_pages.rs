//! A large cluster's status and metrics: a status request may ask for one
//! page of node rows (or none: the counts by state alone), and `/metrics`
//! has a series per node only up to `--metrics-nodes`.

use crate::common;

use common::{bench, opts, start, Behaviour, FakeNode, FakeUser};
use corefarm_server::ServerOptions;
use corefarm_smp::{ClusterStatus, MsgType, NodePage, NodeState, StatusQuery};

async fn ask(u: &mut FakeUser, q: &StatusQuery) -> ClusterStatus {
    u.send(q.to_frame()).await;
    loop {
        let f = u.recv_skip_credit().await.expect("status answer");
        if f.ty == MsgType::Status {
            return ClusterStatus::decode(&f.payload).unwrap();
        }
    }
}

fn page(offset: u64, limit: u64, state: Option<NodeState>) -> StatusQuery {
    StatusQuery {
        nodes: Some(NodePage {
            offset,
            limit,
            state,
        }),
    }
}

#[tokio::test]
async fn a_status_request_lists_one_page_of_nodes_and_counts_them_all() {
    let srv = start(opts()).await;
    let mut nodes = Vec::new();
    for i in 0..5u8 {
        nodes.push(FakeNode::spawn(srv.nodes, &format!("n{i}"), i, Behaviour::Echo).await);
    }
    srv.wait_free_nodes(5).await;
    // A user on two nodes: three stay free.
    let (mut user, _) = FakeUser::hello(srv.users, Some(2)).await;
    assert_eq!(user.configure(&bench(16, 16)).await.0, 0);
    let (mut observer, _) = FakeUser::hello(srv.users, Some(0)).await;

    let all = ask(&mut observer, &StatusQuery::all()).await;
    assert_eq!(all.nodes.len(), 5);
    let ids: Vec<u64> = all.nodes.iter().map(|n| n.id).collect();
    let counts = all.node_counts.expect("counts by state");
    assert_eq!((counts.total, counts.free, counts.ready), (5, 3, 2));

    // The summary: no rows, every count, each user's nodes still named.
    let summary = ask(&mut observer, &StatusQuery::summary()).await;
    assert!(summary.nodes.is_empty());
    assert_eq!(summary.node_counts, all.node_counts);
    assert_eq!(summary.count_nodes(NodeState::Free), 3);
    let me = summary.users.iter().find(|u| u.nodes.len() == 2);
    assert!(me.is_some(), "the user's two nodes: {summary:#?}");

    // Pages in id order, past the end empty.
    let p = ask(&mut observer, &page(1, 2, None)).await;
    assert_eq!(p.nodes.iter().map(|n| n.id).collect::<Vec<_>>(), ids[1..3]);
    assert!(ask(&mut observer, &page(5, 2, None)).await.nodes.is_empty());
    // Filtered by state: the offset counts within the state.
    let free = ask(&mut observer, &page(0, 10, Some(NodeState::Free))).await;
    assert_eq!(free.nodes.len(), 3);
    assert!(free.nodes.iter().all(|n| n.state == NodeState::Free));
    let ready = ask(&mut observer, &page(1, 10, Some(NodeState::Ready))).await;
    assert_eq!(ready.nodes.len(), 1);
    assert_eq!(ready.nodes[0].state, NodeState::Ready);
    drop(nodes);
}

#[tokio::test]
async fn metrics_have_per_node_series_only_up_to_the_cap() {
    for (cap, per_node) in [(3, true), (2, false)] {
        let srv = start(ServerOptions {
            metrics_nodes: cap,
            ..opts()
        })
        .await;
        let mut nodes = Vec::new();
        for i in 0..3u8 {
            nodes.push(FakeNode::spawn(srv.nodes, &format!("m{i}"), i, Behaviour::Echo).await);
        }
        srv.wait_free_nodes(3).await;
        let text = corefarm_telemetry::Endpoints::metrics(&srv.status);
        let series = text
            .lines()
            .filter(|l| l.starts_with("corefarm_node_results_total{"))
            .count();
        assert_eq!(series, if per_node { 3 } else { 0 }, "{text}");
        let want_series = format!("corefarm_node_series{{}} {}", if per_node { 3 } else { 0 });
        assert!(text.lines().any(|l| l == want_series), "{text}");
        // Idle node links hold no read buffer, and so none of the budget.
        assert!(
            text.lines().any(|l| l == "corefarm_memory_held_bytes{} 0"),
            "{text}"
        );
        // The counts by state are there either way.
        assert!(
            text.lines()
                .any(|l| l == r#"corefarm_nodes_connected{state="free"} 3"#),
            "{text}"
        );
        drop(nodes);
    }
}

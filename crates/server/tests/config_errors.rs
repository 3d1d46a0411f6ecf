//! What the server says when a configuration cannot go where the user
//! wanted: one line per distinct refusal reason naming its
//! nodes, who holds the nodes when the user has none, how many nodes it got
//! when it asked for more — and a refused configuration leaves the session
//! usable for a corrected one.

use crate::common;

use bytes::Bytes;
use common::{bench, opts, start, Behaviour, FakeNode, FakeUser, TestServer};
use corefarm_server::ServerOptions;
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::{
    hello::features, ClusterStatus, Configuration, ConfigurationResponse, CoreInfo, Data,
    ErrorCode, ErrorMsg, Hello, MsgType, NodeState, OutFrame,
};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

const NO_ARTIFACT: &str = "image has no artifact for native-x86_64-linux";

/// A configuration carrying an image (one core): the refusing nodes below
/// cannot load it.
fn image_config() -> Configuration {
    let mut bitstream = b"CFIMAGE\0".to_vec();
    bitstream.extend_from_slice(&[0u8; 56]);
    Configuration {
        input_size: 16,
        output_size: 16,
        cores: vec![CoreInfo {
            control: 0,
            input: 0x100,
            output: 0x200,
        }],
        bitstream: Bytes::from(bitstream),
    }
}

/// A node that refuses every configuration with cores (with `reason` in an
/// error message first when it has a name, i.e. speaks the hello; a seed
/// node just answers negatively) and runs benchmarking configurations,
/// answering each one-input data message with `output_size` zero bytes.
async fn picky_node(addr: std::net::SocketAddr, name: Option<&str>) -> JoinHandle<()> {
    let s = TcpStream::connect(addr).await.expect("connect node port");
    let (rd, mut w) = s.into_split();
    if let Some(name) = name {
        let mut hello = Hello::new("node");
        hello.name = Some(name.into());
        hello.features = vec![features::ERROR.into()];
        write_frame(&mut w, hello.to_frame()).await.unwrap();
    }
    let explains = name.is_some();
    tokio::spawn(async move {
        let mut r = FrameReader::new(rd, 1 << 20);
        let mut output = 0;
        while let Ok(Some(f)) = r.read_frame().await {
            let reply = match f.ty {
                MsgType::Configuration => {
                    let c = Configuration::parse(f.payload).unwrap();
                    if c.cores.is_empty() {
                        output = c.output_size;
                        ConfigurationResponse::OK
                    } else {
                        if explains {
                            let e = ErrorMsg::new(
                                ErrorMsg::NO_ID,
                                ErrorCode::ConfigurationFailed,
                                NO_ARTIFACT,
                            );
                            write_frame(&mut w, e.to_frame()).await.unwrap();
                        }
                        ConfigurationResponse::FAILED
                    }
                }
                MsgType::Data => {
                    let d = Data::parse(f.payload).unwrap();
                    let out = Bytes::from(vec![0u8; output as usize]);
                    let _ = write_frame(&mut w, OutFrame::data(d.id, out).unwrap()).await;
                    continue;
                }
                _ => continue,
            };
            let _ = write_frame(&mut w, ConfigurationResponse { status: reply }.to_frame()).await;
        }
    })
}

/// `name@address` of each named node, as the server's messages write it.
fn label(s: &ClusterStatus, name: &str) -> String {
    let n = s
        .nodes
        .iter()
        .find(|n| n.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no node {name} in {s:#?}"));
    format!("{name}@{}", n.addr)
}

async fn free_named(srv: &TestServer, total: usize, named: usize) -> ClusterStatus {
    srv.wait_status("the nodes free, the named ones named", |s| {
        s.count_nodes(NodeState::Free) == total
            && s.nodes.iter().filter(|n| n.name.is_some()).count() == named
    })
    .await
}

fn reasons(errors: &[ErrorMsg]) -> Vec<&str> {
    errors.iter().map(|e| e.reason.as_str()).collect()
}

#[tokio::test]
async fn refusals_come_one_line_per_reason_and_a_corrected_configuration_works() {
    let srv = start(opts()).await;
    let _a = picky_node(srv.nodes, Some("n-0")).await;
    let _b = picky_node(srv.nodes, Some("n-1")).await;
    let _seed = picky_node(srv.nodes, None).await;
    let s = free_named(&srv, 3, 2).await;
    let seed = s.nodes.iter().find(|n| n.name.is_none()).unwrap();
    let seed_label = format!("node-{}@{}", seed.id, seed.addr);

    let (mut u, reply) = FakeUser::hello(srv.users, Some(3)).await;
    assert_eq!(reply.nodes, Some(3));
    let (status, errors) = u.configure(&image_config()).await;
    assert_ne!(status, 0, "no node can load the image");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].code(), Some(ErrorCode::ConfigurationFailed));
    // The pair's order is the order their refusals arrived.
    let (l0, l1) = (label(&s, "n-0"), label(&s, "n-1"));
    let pair = [format!("{l0}, {l1}"), format!("{l1}, {l0}")];
    let lines: Vec<String> = pair
        .iter()
        .map(|p| format!("2 nodes ({p}): {NO_ARTIFACT}"))
        .collect();
    let seed_line = format!("{seed_label}: refused the configuration without a reason");
    let expected: Vec<String> = lines
        .iter()
        .flat_map(|l| {
            [
                format!("no node could be configured: {l}; {seed_line}"),
                format!("no node could be configured: {seed_line}; {l}"),
            ]
        })
        .collect();
    assert!(
        expected.contains(&errors[0].reason),
        "got {:?}, expected one of {expected:#?}",
        errors[0].reason
    );
    // Counted once for the user's configuration, not once per node.
    let failed = srv.status.get().errors.get("configuration_failed").copied();
    assert_eq!(failed, Some(1), "three nodes refused one configuration");

    // The same connection, a configuration the nodes can run: all three
    // come back from the pool and take data.
    let (status, errors) = u.configure(&bench(16, 16)).await;
    assert_eq!((status, reasons(&errors)), (0, vec![]));
    assert_eq!(u.stream(0..20, 16, true).await.len(), 20);
    let s = u.status().await;
    assert_eq!(s.count_nodes(NodeState::Ready), 3);
}

#[tokio::test]
async fn nodes_dropped_from_a_configuration_are_one_warning_per_reason() {
    let srv = start(opts()).await;
    let _good = FakeNode::spawn(srv.nodes, "good", 1, Behaviour::Echo).await;
    let _a = picky_node(srv.nodes, Some("n-0")).await;
    let _b = picky_node(srv.nodes, Some("n-1")).await;
    let s = free_named(&srv, 3, 3).await;
    let (mut u, _) = FakeUser::hello(srv.users, None).await;
    let (status, errors) = u.configure(&image_config()).await;
    assert_eq!(status, 0, "one node took it");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].code(), Some(ErrorCode::ConfigurationFailed));
    let (l0, l1) = (label(&s, "n-0"), label(&s, "n-1"));
    assert!(
        [format!("{l0}, {l1}"), format!("{l1}, {l0}")]
            .iter()
            .any(|p| errors[0].reason == format!("2 nodes ({p}) dropped: {NO_ARTIFACT}")),
        "{}",
        errors[0].reason
    );
}

#[tokio::test]
async fn a_user_without_nodes_hears_that_others_hold_them() {
    let srv = start(opts()).await;
    let _a = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    let _b = FakeNode::spawn(srv.nodes, "b", 2, Behaviour::Echo).await;
    free_named(&srv, 2, 2).await;
    let (mut first, reply) = FakeUser::hello(srv.users, None).await;
    assert_eq!(reply.nodes, Some(2));
    assert_eq!(first.configure(&bench(16, 16)).await.0, 0);

    let (mut second, reply) = FakeUser::hello(srv.users, None).await;
    assert_eq!(reply.nodes, Some(0));
    let (status, errors) = second.configure(&bench(16, 16)).await;
    assert_ne!(status, 0);
    assert_eq!(
        reasons(&errors),
        [
            "no node for this user: 2 nodes connected, all assigned to other users \
          (waited 200ms for one, --node-wait); configure again once another user \
          leaves, ask for fewer nodes (hello nodes), or ask the operator for \
          --sharing shared, where users share nodes"
        ]
    );
    // The refusal left the session usable: once the first user leaves, the
    // same connection configures its nodes.
    drop(first);
    srv.wait_status("both nodes handed to the waiting user", |s| {
        s.users.len() == 1 && s.users[0].nodes.len() == 2
    })
    .await;
    let (status, errors) = second.configure(&bench(16, 16)).await;
    assert_eq!((status, reasons(&errors)), (0, vec![]));
    assert_eq!(second.stream(0..10, 16, true).await.len(), 10);
}

#[tokio::test]
async fn a_user_on_an_empty_cluster_hears_no_node_is_connected() {
    let srv = start(opts()).await;
    let (mut u, reply) = FakeUser::hello(srv.users, Some(2)).await;
    assert_eq!(reply.nodes, Some(0));
    let (status, errors) = u.configure(&bench(16, 16)).await;
    assert_ne!(status, 0);
    assert_eq!(
        reasons(&errors),
        ["no node for this user: no node is connected to the server \
          (waited 200ms for one, --node-wait); start node managers (corefarm node \
          --server …) and configure again"]
    );
    // A node connects: the same session now works.
    let _n = FakeNode::spawn(srv.nodes, "late", 1, Behaviour::Echo).await;
    srv.wait_status("the late node handed to the waiting user", |s| {
        s.users.len() == 1 && s.users[0].nodes.len() == 1
    })
    .await;
    let (status, errors) = u.configure(&bench(16, 16)).await;
    assert_eq!(status, 0);
    assert_eq!(
        reasons(&errors),
        ["asked for 2 nodes, 1 assigned (1 connected)"]
    );
}

#[tokio::test]
async fn a_user_that_asks_for_more_nodes_than_exist_is_told_what_it_got() {
    let srv = start(opts()).await;
    let mut nodes = Vec::new();
    for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
        nodes.push(FakeNode::spawn(srv.nodes, name, i as u8, Behaviour::Echo).await);
    }
    free_named(&srv, 4, 4).await;
    let (mut holder, reply) = FakeUser::hello(srv.users, Some(1)).await;
    assert_eq!(reply.nodes, Some(1));
    assert_eq!(holder.configure(&bench(16, 16)).await.0, 0);

    let (mut u, reply) = FakeUser::hello(srv.users, Some(8)).await;
    assert_eq!(reply.nodes, Some(3), "the hello reply carries the count");
    let (status, errors) = u.configure(&bench(16, 16)).await;
    assert_eq!(status, 0);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].code(), Some(ErrorCode::NoNodes));
    assert_eq!(errors[0].id, ErrorMsg::NO_ID);
    assert_eq!(
        errors[0].reason,
        "asked for 8 nodes, 3 assigned (4 connected, 1 assigned to other users)"
    );
    // A warning, not an error: the session routes data.
    assert_eq!(u.stream(0..12, 16, true).await.len(), 12);

    // Exactly what it asked for: no warning.
    drop(u);
    srv.wait_status("three nodes back", |s| s.count_nodes(NodeState::Free) == 3)
        .await;
    let (mut v, reply) = FakeUser::hello(srv.users, Some(3)).await;
    assert_eq!(reply.nodes, Some(3));
    assert_eq!(v.configure(&bench(16, 16)).await, (0, vec![]));
}

#[tokio::test]
async fn an_observer_that_configures_hears_it_asked_for_no_nodes() {
    let srv = start(opts()).await;
    let _n = FakeNode::spawn(srv.nodes, "n", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let (mut u, reply) = FakeUser::hello(srv.users, Some(0)).await;
    assert_eq!(reply.nodes, Some(0));
    let (status, errors) = u.configure(&bench(16, 16)).await;
    assert_ne!(status, 0);
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].reason.contains("asked for no nodes"),
        "{}",
        errors[0].reason
    );
    // It took nothing: the node is still free.
    assert_eq!(srv.status.get().count_nodes(NodeState::Free), 1);
}

/// A user given no node at hello (every node held by another user) is told
/// so at its configuration at once: it does not wait `--node-wait` a second
/// time for the same answer. On a paused clock, so the wait is measured in
/// the server's own time, not the machine's.
#[tokio::test(start_paused = true)]
async fn a_user_without_nodes_waits_once_not_twice() {
    let wait = std::time::Duration::from_secs(10);
    let srv = start(ServerOptions {
        node_wait: wait,
        ..opts()
    })
    .await;
    let _a = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    free_named(&srv, 1, 1).await;
    let (mut first, _) = FakeUser::hello(srv.users, None).await;
    assert_eq!(first.configure(&bench(16, 16)).await.0, 0);
    let asked = tokio::time::Instant::now();
    let (mut second, reply) = FakeUser::hello(srv.users, None).await;
    assert_eq!(reply.nodes, Some(0));
    assert!(asked.elapsed() >= wait, "the hello waited --node-wait");
    let asked = tokio::time::Instant::now();
    let (status, errors) = second.configure(&bench(16, 16)).await;
    assert_ne!(status, 0);
    assert!(
        asked.elapsed() < wait,
        "waited again: {:?}",
        asked.elapsed()
    );
    assert!(
        reasons(&errors)[0].contains("--sharing shared"),
        "{errors:?}"
    );
}

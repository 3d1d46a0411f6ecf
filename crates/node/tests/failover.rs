//! A node whose server goes away: what it drops, what it keeps, and where
//! it connects next (a list of server addresses).

use std::sync::Arc;

use corefarm_node::metrics::NodeTelemetry;
use corefarm_node::NodeOptions;
use corefarm_smp::codec::FrameReader;
use corefarm_smp::MsgType;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::*;

/// Starts a reconnecting node manager on `server` (one address or a list).
fn spawn(opts: NodeOptions, server: String) -> Node {
    let stop = CancellationToken::new();
    let opts = NodeOptions {
        server,
        reconnect: true,
        peer_listen: None,
        ..opts
    };
    let task = tokio::spawn(corefarm_node::run(opts, stop.clone()));
    Node { task, stop }
}

/// The next connection to `l`, as a fake server.
async fn accept(l: &TcpListener) -> TcpServer {
    let (s, _) = within("the node to connect", l.accept()).await.unwrap();
    let (rd, wr) = s.into_split();
    FakeServer {
        reader: FrameReader::new(rd, 1 << 30),
        writer: wr,
    }
}

fn counters(t: &NodeTelemetry) -> (u64, u64) {
    let s = &t.status()[0];
    (s.configurations, s.configurations_reused)
}

/// The server goes away with one input running and two queued: the queued
/// ones never run, the running one finishes and its result is not sent on
/// the next connection, and the same configuration from the next server
/// is answered without loading the cores again.
#[tokio::test]
async fn a_lost_server_costs_the_queue_not_the_loaded_function() {
    let gate = Arc::new(Gate::default());
    let tc = TestCores {
        gate: Some(gate.clone()),
        ..Default::default()
    };
    let telemetry = Arc::new(NodeTelemetry::default());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let opts = NodeOptions {
        loader: tc.loader(),
        telemetry: Some(telemetry.clone()),
        ..options()
    };
    let node = spawn(opts, l.local_addr().unwrap().to_string());

    let mut srv = accept(&l).await;
    srv.handshake(None).await;
    srv.configure(&cores(1, 8, 8)).await;
    for id in 1..=3u32 {
        srv.data(id, inputs(id, 1, 8)).await;
    }
    // Input 1 runs on the only core; 2 and 3 wait in the queue.
    gate.until_blocked(1).await;
    // The server's side closes; the node's closes in answer once it has
    // dropped its queue and stopped writing.
    srv.writer.shutdown().await.unwrap();
    srv.closed().await;
    drop(srv);
    // The node reconnects only once the running input is done.
    gate.open_all();

    let mut srv = accept(&l).await;
    srv.handshake(None).await;
    srv.configure(&cores(1, 8, 8)).await;
    assert_eq!(counters(&telemetry), (1, 1), "(loaded, reused)");
    let d = inputs(4, 1, 8);
    srv.data(4, d.clone()).await;
    // The first data message on the new connection is input 4's result:
    // nothing of the old session's came through.
    let (id, out) = srv.expect_data().await;
    assert_eq!(id, 4);
    assert_eq!(out.as_ref(), TestCores::expected(&d, 8).as_slice());
    let log = tc.log.lock().unwrap().clone();
    assert_eq!(
        log,
        ["load", "done 1", "done 4"],
        "queued inputs dropped, one load"
    );
    drop(srv);
    node.stop.cancel();
    node.ended().await.unwrap();
}

/// A different configuration after the reconnection is loaded as usual
/// (the kept cores are dropped first).
#[tokio::test]
async fn a_different_configuration_after_a_reconnection_loads() {
    let tc = TestCores::default();
    let telemetry = Arc::new(NodeTelemetry::default());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let opts = NodeOptions {
        loader: tc.loader(),
        telemetry: Some(telemetry.clone()),
        ..options()
    };
    let node = spawn(opts, l.local_addr().unwrap().to_string());
    let mut srv = accept(&l).await;
    srv.handshake(None).await;
    srv.configure(&cores(1, 8, 8)).await;
    drop(srv);
    let mut srv = accept(&l).await;
    srv.handshake(None).await;
    srv.configure(&cores(2, 8, 8)).await;
    tc.until_dropped(1).await;
    assert_eq!(counters(&telemetry), (2, 0), "(loaded, reused)");
    assert_eq!(*tc.log.lock().unwrap(), ["load", "load"]);
    drop(srv);
    node.stop.cancel();
    node.ended().await.unwrap();
}

/// Within one session too, the same configuration again finishes the
/// queued work first and then runs on the same cores, without loading.
#[tokio::test]
async fn an_identical_configuration_reuses_the_cores_after_the_queue() {
    let gate = Arc::new(Gate::default());
    let tc = TestCores {
        gate: Some(gate.clone()),
        ..Default::default()
    };
    let telemetry = Arc::new(NodeTelemetry::default());
    let (mut srv, node) = start(NodeOptions {
        loader: tc.loader(),
        telemetry: Some(telemetry.clone()),
        ..options()
    })
    .await;
    srv.handshake(None).await;
    srv.configure(&cores(1, 8, 8)).await;
    for id in 1..=2u32 {
        srv.data(id, inputs(id, 1, 8)).await;
    }
    srv.send(cores(1, 8, 8).to_frame().unwrap()).await;
    gate.open_all();
    assert_eq!(srv.expect_data().await.0, 1);
    assert_eq!(srv.expect_data().await.0, 2);
    assert!(srv.expect_response().await);
    srv.data(3, inputs(3, 1, 8)).await;
    assert_eq!(srv.expect_data().await.0, 3);
    assert_eq!(counters(&telemetry), (1, 1), "(loaded, reused)");
    let log = tc.log.lock().unwrap().clone();
    assert_eq!(log, ["load", "done 1", "done 2", "done 3"]);
    drop(srv);
    node.ended().await.unwrap();
}

/// `a,b`: the first address that answers; after its connection ends, the
/// next one (round-robin), not the same one again.
#[tokio::test]
async fn a_node_given_two_servers_moves_to_the_next_when_its_server_goes() {
    let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = TcpListener::bind("127.0.0.1:0").await.unwrap();
    // A port nobody listens on, first in the list: skipped.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let list = format!(
        "{dead}, {},{}",
        a.local_addr().unwrap(),
        b.local_addr().unwrap()
    );
    let node = spawn(options(), list);
    let mut on_a = accept(&a).await;
    on_a.handshake(None).await;
    on_a.configure(&bench(16, 16, 0)).await;
    drop(on_a);
    // Both listen; the node goes to b.
    let mut on_b = tokio::select! {
        biased;
        s = accept(&b) => s,
        _ = a.accept() => panic!("the node went back to the server it lost"),
    };
    assert_eq!(on_b.recv().await.ty, MsgType::Hello);
    drop(on_b);
    // After b: the dead address, then a again.
    let mut again = tokio::select! {
        s = accept(&a) => s,
        _ = b.accept() => panic!("the node stayed on b"),
    };
    assert_eq!(again.recv().await.ty, MsgType::Hello);
    drop(again);
    node.stop.cancel();
    node.ended().await.unwrap();
}

#[test]
fn server_lists_split_on_commas() {
    use corefarm_node::servers;
    assert_eq!(servers("h:1"), ["h:1"]);
    assert_eq!(servers("h:1, g:2,"), ["h:1", "g:2"]);
    assert_eq!(servers(""), [""]);
}

/// Without reconnecting (`--once`), the node still tries each address
/// once until one answers, and ends with that one session.
#[tokio::test]
async fn a_node_that_does_not_reconnect_tries_each_address_once() {
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = CancellationToken::new();
    let opts = NodeOptions {
        server: format!("{dead},{}", a.local_addr().unwrap()),
        peer_listen: None,
        ..options()
    };
    let node = Node {
        task: tokio::spawn(corefarm_node::run(opts, stop.clone())),
        stop,
    };
    let mut on_a = accept(&a).await;
    on_a.handshake(None).await;
    drop(on_a);
    node.ended().await.unwrap();

    // Nobody answers: the error names the last address tried.
    let stop = CancellationToken::new();
    let opts = NodeOptions {
        server: format!("{dead},{dead}"),
        peer_listen: None,
        ..options()
    };
    let e = corefarm_node::run(opts, stop).await.unwrap_err();
    assert!(matches!(e, corefarm_node::NodeError::Connect { .. }), "{e}");
}

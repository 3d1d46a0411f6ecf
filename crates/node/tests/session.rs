//! The node manager against a fake server over TCP: hello, configurations,
//! data, refusals and malformed input.

use crate::common;

use common::*;
use corefarm_node::NodeOptions;
use corefarm_smp::hello::features;
use corefarm_smp::{ErrorCode, ErrorMsg, MsgType, OutFrame};

#[tokio::test]
async fn hello_exchange_announces_the_node() {
    let (mut srv, node) = start(NodeOptions {
        max_message: 1 << 20,
        ..options()
    })
    .await;
    let h = srv.handshake(None).await;
    assert_eq!(h.role, "node");
    assert_eq!(h.name.as_deref(), Some("test-node"));
    assert!(h.has(features::ERROR));
    assert_eq!(h.max_message, Some(1 << 20));
    srv.configure(&bench(16, 16, 0)).await;
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn benchmarking_round_trip_keeps_ids_sizes_and_echo() {
    let (mut srv, node) = start(options()).await;
    srv.handshake(None).await;
    // Zero delay (answered by the receiving task) and a real delay (a
    // handler thread): the same results.
    for delay_us in [0, 50] {
        srv.configure(&bench(32, 48, delay_us)).await;
        let sent: Vec<(u32, Vec<u8>)> = (0..6u32)
            .map(|k| (k * 1000 + delay_us, inputs(k, 1 + k as usize, 32)))
            .collect();
        for (id, d) in &sent {
            srv.data(*id, d.clone()).await;
        }
        // One benchmarking core: results come back in order.
        for (id, d) in &sent {
            let (got, out) = srv.expect_data().await;
            assert_eq!(got, *id);
            assert_eq!(out.len(), d.len() / 32 * 48);
            check_echo(d, &out, 32, 48);
        }
    }
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn impossible_configurations_are_refused_then_a_good_one_works() {
    let (mut srv, node) = start(NodeOptions {
        max_message: 1 << 20,
        ..options()
    })
    .await;
    srv.handshake(None).await;
    let why = srv.refused(&bench(32, 0xFFFF_FFF0, 0)).await;
    assert!(
        why.contains("output size") && why.contains("1048576"),
        "{why}"
    );
    let why = srv.refused(&bench(1 << 20, 16, 0)).await;
    assert!(why.contains("input size"), "{why}");
    let why = srv.refused(&cores(1, 64, 0)).await;
    assert!(why.contains("output size 0"), "{why}");
    // Exactly at the limit: one input plus its id fills a message.
    srv.configure(&bench((1 << 20) - 4, 16, 0)).await;
    srv.configure(&bench(64, 32, 0)).await;
    let d = inputs(1, 2, 64);
    srv.data(5, d.clone()).await;
    let (id, out) = srv.expect_data().await;
    assert_eq!(id, 5);
    check_echo(&d, &out, 64, 32);
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn the_servers_smaller_limit_applies() {
    let (mut srv, node) = start(options()).await;
    srv.handshake(Some(4096)).await;
    let why = srv.refused(&bench(8192, 16, 0)).await;
    assert!(why.contains("4096"), "{why}");
    srv.configure(&bench(4092, 16, 0)).await;
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn a_result_too_large_for_a_message_fails_that_input_only() {
    let (mut srv, node) = start(NodeOptions {
        max_message: 64 * 1024,
        ..options()
    })
    .await;
    srv.handshake(None).await;
    srv.configure(&bench(16, 1024, 0)).await;
    // 100 small inputs would need 100 KiB of output.
    srv.data(1, inputs(1, 100, 16)).await;
    let e = srv.expect_error().await;
    assert_eq!((e.id, e.code()), (1, Some(ErrorCode::TooLarge)), "{e}");
    assert!(e.reason.contains("message limit"), "{e}");
    let d = inputs(2, 3, 16);
    srv.data(2, d.clone()).await;
    let (id, out) = srv.expect_data().await;
    assert_eq!(id, 2);
    check_echo(&d, &out, 16, 1024);
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn a_seed_server_gets_only_the_negative_response() {
    let (mut srv, node) = start(options()).await;
    let f = srv.recv().await;
    assert_eq!(f.ty, MsgType::Hello);
    // No server hello: the node must not send error messages.
    srv.send(bench(32, 0, 0).to_frame().unwrap()).await;
    srv.send(cores(1, 64, 0).to_frame().unwrap()).await;
    assert!(!srv.expect_response().await);
    assert!(!srv.expect_response().await);
    srv.configure(&bench(32, 32, 0)).await;
    drop(srv);
    node.ended().await.unwrap();
}

/// A server that answers the hello with an error (a node pointed at the
/// user port gets one) ends the session with the server's reason, not
/// with a closed connection or an "unexpected message".
#[tokio::test]
async fn an_error_in_place_of_the_servers_hello_is_the_sessions_end() {
    let (mut srv, node) = start(options()).await;
    assert_eq!(srv.recv().await.ty, MsgType::Hello);
    let why = "hello with role \"node\" on the user port";
    srv.send(ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Malformed, why).to_frame())
        .await;
    match node.ended().await.unwrap_err() {
        corefarm_node::NodeError::Refused { code, reason } => {
            assert_eq!(code, ErrorCode::Malformed);
            assert_eq!(reason, why);
        }
        e => panic!("expected the server's refusal, got {e}"),
    }
}

/// A node that reconnects answers the server's hello (or its challenge)
/// from a fresh listener: what `refuse` sends in place of the hello ends
/// the first session; returns the listener for the next attempt.
async fn refused_once(
    refuse: impl FnOnce() -> OutFrame,
    secret: bool,
) -> (tokio::net::TcpListener, Node) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let opts = NodeOptions {
        server: l.local_addr().unwrap().to_string(),
        reconnect: true,
        secret: secret.then(|| corefarm_smp::auth::Secret::new("node-secret-0123456789").unwrap()),
        ..options()
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(corefarm_node::run(opts, stop.clone()));
    let (s, _) = within("the node to connect", l.accept()).await.unwrap();
    let (rd, wr) = s.into_split();
    let mut srv = FakeServer {
        reader: corefarm_smp::codec::FrameReader::new(rd, 1 << 20),
        writer: wr,
    };
    assert_eq!(srv.recv().await.ty, MsgType::Hello);
    srv.send(refuse()).await;
    (l, Node { task, stop })
}

/// A wrong secret, or none where the server asks for one, cannot be mended
/// by reconnecting: a node that would reconnect exits with the reason.
#[tokio::test]
async fn a_node_refused_for_its_secret_exits_instead_of_retrying() {
    let unauthorized = || {
        let why = "wrong answer to the authentication challenge";
        ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Unauthorized, why).to_frame()
    };
    let (_l, node) = refused_once(unauthorized, true).await;
    let e = node.ended().await.unwrap_err();
    assert!(
        matches!(
            &e,
            corefarm_node::NodeError::Refused {
                code: ErrorCode::Unauthorized,
                ..
            }
        ),
        "{e}"
    );
    let challenge = || {
        corefarm_smp::auth::AuthChallenge {
            nonce: [7; corefarm_smp::auth::NONCE_LEN],
        }
        .to_frame()
    };
    let (_l, node) = refused_once(challenge, false).await;
    let e = node.ended().await.unwrap_err();
    assert!(matches!(e, corefarm_node::NodeError::NoSecret), "{e}");
}

/// Any other refusal may pass (a server restarting, a port briefly
/// wrong): the node connects again.
#[tokio::test]
async fn a_node_refused_for_another_reason_connects_again() {
    let busy = || {
        let why = "the server is at its limit of 1 node connection(s) (--max-nodes)";
        ErrorMsg::new(ErrorMsg::NO_ID, ErrorCode::Internal, why).to_frame()
    };
    let (l, node) = refused_once(busy, false).await;
    let (_again, _) = within("the node to connect again", l.accept())
        .await
        .unwrap();
    assert!(!node.task.is_finished());
}

#[tokio::test]
async fn data_before_configuration_ends_the_session_with_a_reason() {
    let (mut srv, node) = start(options()).await;
    srv.handshake(None).await;
    srv.data(1, vec![0; 32]).await;
    let e = srv.expect_error().await;
    assert_eq!(e.code(), Some(ErrorCode::NotConfigured), "{e}");
    srv.closed().await;
    assert!(node.ended().await.is_err());
}

#[tokio::test]
async fn malformed_frames_get_a_reason_and_end_the_session() {
    let data = |payload: &[u8]| {
        let mut v = vec![3, 0, 0, 0];
        v.extend((payload.len() as u32).to_le_bytes());
        v.extend(payload);
        v
    };
    let cases: Vec<(&str, Vec<u8>, ErrorCode, u32)> = vec![
        (
            "unknown type",
            vec![0x7F, 0, 0, 0, 0, 0, 0, 0],
            ErrorCode::Malformed,
            ErrorMsg::NO_ID,
        ),
        (
            "oversized header",
            vec![3, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF],
            ErrorCode::TooLarge,
            ErrorMsg::NO_ID,
        ),
        (
            "data without an id",
            data(&[1, 2]),
            ErrorCode::Malformed,
            ErrorMsg::NO_ID,
        ),
        (
            "partial input",
            data(&[9, 0, 0, 0, 1, 2, 3]),
            ErrorCode::BadDataSize,
            9,
        ),
        ("empty data", data(&[4, 0, 0, 0]), ErrorCode::BadDataSize, 4),
        (
            "unexpected credit",
            OutFrame::new(MsgType::Credit, vec![1, 0, 0, 0].into())
                .unwrap()
                .to_vec(),
            ErrorCode::UnexpectedMessage,
            ErrorMsg::NO_ID,
        ),
        (
            "bad error message",
            vec![0x11, 0, 0, 0, 2, 0, 0, 0, 1, 2],
            ErrorCode::Malformed,
            ErrorMsg::NO_ID,
        ),
        (
            "bad server hello",
            OutFrame::new(MsgType::Hello, b"{not json".to_vec().into())
                .unwrap()
                .to_vec(),
            ErrorCode::Malformed,
            ErrorMsg::NO_ID,
        ),
    ];
    for (what, wire, code, id) in cases {
        let (mut srv, node) = start(NodeOptions {
            max_message: 1 << 20,
            ..options()
        })
        .await;
        srv.handshake(None).await;
        srv.configure(&bench(16, 16, 0)).await;
        srv.send_raw(&wire).await;
        let e = srv.expect_error().await;
        assert_eq!((e.code(), e.id), (Some(code), id), "{what}: {e}");
        srv.closed().await;
        assert!(node.ended().await.is_err(), "{what}");
    }
}

#[tokio::test]
async fn a_failing_core_fails_its_input_and_the_session_goes_on() {
    let tc = TestCores::default();
    let (mut srv, node) = start(NodeOptions {
        loader: tc.loader(),
        ..options()
    })
    .await;
    srv.handshake(None).await;
    srv.configure(&cores(1, 8, 12)).await;
    let mut bad = inputs(1, 2, 8);
    bad[8] = 0xEE; // the second input fails
    srv.data(1, bad).await;
    let e = srv.expect_error().await;
    assert_eq!((e.id, e.code()), (1, Some(ErrorCode::CoreFailure)), "{e}");
    assert!(
        e.reason.contains("input 1 of 2") && e.reason.contains("scripted failure"),
        "{e}"
    );
    let good = inputs(2, 3, 8);
    srv.data(2, good.clone()).await;
    let (id, out) = srv.expect_data().await;
    assert_eq!(id, 2);
    let want: Vec<u8> = good
        .chunks(8)
        .flat_map(|i| TestCores::expected(i, 12))
        .collect();
    assert_eq!(&out[..], &want[..]);
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn a_failing_core_closes_the_connection_to_a_seed_server() {
    let tc = TestCores::default();
    let (mut srv, node) = start(NodeOptions {
        loader: tc.loader(),
        ..options()
    })
    .await;
    assert_eq!(srv.recv().await.ty, MsgType::Hello);
    srv.configure(&cores(1, 8, 8)).await;
    srv.data(1, vec![0xEE; 8]).await;
    srv.closed().await;
    let e = node.ended().await.unwrap_err().to_string();
    assert!(e.contains("data id 1"), "{e}");
}

/// A node on test cores whose jobs wait at `gate`, past its handshake.
async fn gated_node() -> (std::sync::Arc<Gate>, TestCores, TcpServer, Node) {
    let gate = std::sync::Arc::new(Gate::default());
    let tc = TestCores {
        gate: Some(gate.clone()),
        ..Default::default()
    };
    let (mut srv, node) = start(NodeOptions {
        loader: tc.loader(),
        ..options()
    })
    .await;
    srv.handshake(None).await;
    (gate, tc, srv, node)
}

#[tokio::test]
async fn reconfiguration_finishes_the_old_configurations_queue_first() {
    let (gate, tc, mut srv, node) = gated_node().await;
    srv.configure(&cores(2, 8, 8)).await;
    for id in 1..=4u32 {
        srv.data(id, inputs(id, 1, 8)).await;
    }
    srv.send(bench(16, 16, 0).to_frame().unwrap()).await;
    gate.open_all();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(srv.expect_data().await.0);
    }
    ids.sort();
    assert_eq!(ids, [1, 2, 3, 4], "old results before the response");
    assert!(srv.expect_response().await);
    let log = tc.log.lock().unwrap().clone();
    assert_eq!(log.iter().filter(|l| l.starts_with("done")).count(), 4);
    // The benchmarking configuration replaced the cores: data is echoed.
    let d = inputs(9, 1, 16);
    srv.data(9, d.clone()).await;
    let (id, out) = srv.expect_data().await;
    assert_eq!(id, 9);
    check_echo(&d, &out, 16, 16);
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn loading_waits_for_the_old_cores() {
    let (gate, tc, mut srv, node) = gated_node().await;
    srv.configure(&cores(1, 8, 8)).await;
    for id in 1..=3u32 {
        srv.data(id, inputs(id, 1, 8)).await;
    }
    // Another image of the same shape (the same one again would be reused,
    // not loaded).
    let other = corefarm_smp::Configuration {
        bitstream: bytes::Bytes::from_static(b"other scripted cores"),
        ..cores(1, 8, 8)
    };
    srv.send(other.to_frame().unwrap()).await;
    // Let the three old inputs through one by one; the new cores load only
    // after the last one.
    for id in 1..=3u32 {
        gate.open(1);
        assert_eq!(srv.expect_data().await.0, id);
    }
    assert!(srv.expect_response().await);
    gate.open_all();
    let log = tc.log.lock().unwrap().clone();
    assert_eq!(log, ["load", "done 1", "done 2", "done 3", "load"]);
    drop(srv);
    node.ended().await.unwrap();
}

//! Chunked data messages (type 0x1D) between a fake server and the node
//! manager: negotiation, interleaved messages in and chunked results out,
//! per-class results, bad sequences, and the memory guard bounding what
//! messages still arriving may hold.

use crate::common;

use common::*;
use corefarm_node::NodeOptions;
use corefarm_smp::hello::features;
use corefarm_smp::stream::{Chunk, Reassembler};
use corefarm_smp::ErrorCode;

fn expected(data: &[u8], input: usize, output: usize) -> Vec<u8> {
    data.chunks(input)
        .flat_map(|i| TestCores::expected(i, output))
        .collect()
}

#[tokio::test]
async fn interleaved_chunked_messages_come_back_whole_in_their_class() {
    let tc = TestCores::default();
    let (mut srv, node) = start(NodeOptions {
        loader: tc.loader(),
        ..options()
    })
    .await;
    let h = handshake_chunks(&mut srv, 256).await;
    assert!(h.has(features::CHUNKS));
    assert_eq!(h.chunk_size, Some(corefarm_smp::stream::DEFAULT_CHUNK_SIZE));
    srv.configure(&cores(2, 64, 64)).await;
    let (a, b) = (inputs(1, 20, 64), inputs(2, 10, 64));
    let (ca, cb) = (cut(1, 5, &a, 256), cut(2, 0, &b, 256));
    assert_eq!((ca.len(), cb.len()), (5, 3));
    for c in [
        &ca[0], &cb[0], &ca[1], &cb[1], &ca[2], &cb[2], &ca[3], &ca[4],
    ] {
        send_chunk(&mut srv, c).await;
    }
    // A plain data message on the same link still works (class 4).
    let small = inputs(3, 1, 64);
    srv.data(3, small.clone()).await;
    let mut r = Reassembler::new(1 << 20, 8, 1 << 20);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(result(&mut srv, &mut r).await);
    }
    got.sort_by_key(|g| g.0);
    assert_eq!((got[0].0, got[0].1), (1, 5), "the result keeps its class");
    assert_eq!(&got[0].2[..], &expected(&a, 64, 64)[..]);
    assert_eq!((got[1].0, got[1].1), (2, 0));
    assert_eq!(&got[1].2[..], &expected(&b, 64, 64)[..]);
    assert_eq!((got[2].0, got[2].1), (3, 4));
    assert_eq!(&got[2].2[..], &expected(&small, 64, 64)[..]);
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn chunks_out_of_sequence_end_the_session_with_the_reason() {
    type Case = (&'static str, fn(&[Chunk]) -> Vec<Chunk>);
    let cases: [Case; 3] = [
        ("not begun", |c| vec![c[1].clone()]),
        ("offset 200, expected 100", |c| {
            vec![c[0].clone(), c[2].clone()]
        }),
        ("begun again", |c| vec![c[0].clone(), c[0].clone()]),
    ];
    for (why, script) in cases {
        let (mut srv, node) = start(NodeOptions {
            loader: TestCores::default().loader(),
            ..options()
        })
        .await;
        handshake_chunks(&mut srv, 100).await;
        srv.configure(&cores(1, 50, 50)).await;
        for c in script(&cut(7, 2, &inputs(7, 6, 50), 100)) {
            send_chunk(&mut srv, &c).await;
        }
        let e = srv.expect_error().await;
        assert_eq!(e.code(), Some(ErrorCode::Malformed), "{e}");
        assert!(e.reason.contains(why), "{why}: {e}");
        srv.closed().await;
        assert!(node.ended().await.is_err());
    }
}

#[tokio::test]
async fn a_chunk_without_negotiation_is_an_unexpected_message() {
    let (mut srv, node) = start(options()).await;
    srv.handshake(None).await; // no chunks in the server's answer
    srv.configure(&bench(16, 16, 0)).await;
    send_chunk(&mut srv, &cut(1, 4, &[0; 32], 16)[0]).await;
    let e = srv.expect_error().await;
    assert_eq!(e.code(), Some(ErrorCode::UnexpectedMessage), "{e}");
    srv.closed().await;
    assert!(node.ended().await.is_err());
}

#[tokio::test]
async fn a_node_that_does_not_offer_chunks_never_gets_them_in_its_hello() {
    let (mut srv, node) = start(NodeOptions {
        chunk_size: 0,
        ..options()
    })
    .await;
    let h = srv.handshake(None).await;
    assert!(!h.has(features::CHUNKS) && h.chunk_size.is_none());
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn a_message_that_could_never_get_memory_fails_alone() {
    let tc = TestCores::default();
    let (mut srv, node) = start(NodeOptions {
        loader: tc.loader(),
        memory_limit: 64 * 1024,
        ..options()
    })
    .await;
    handshake_chunks(&mut srv, 1024).await;
    srv.configure(&cores(1, 1024, 1024)).await;
    // A holds 2 × 24 KiB of the 64 KiB guard until its last chunk; B would
    // need 2 × 20 KiB more: it fails at once instead of waiting for A.
    let (a, b) = (inputs(1, 24, 1024), inputs(2, 20, 1024));
    let (ca, cb) = (cut(1, 4, &a, 1024), cut(2, 4, &b, 1024));
    send_chunk(&mut srv, &ca[0]).await;
    for c in &cb {
        send_chunk(&mut srv, c).await;
    }
    let e = srv.expect_error().await;
    assert_eq!((e.id, e.code()), (2, Some(ErrorCode::TooLarge)), "{e}");
    assert!(e.reason.contains("memory guard"), "{e}");
    for c in &ca[1..] {
        send_chunk(&mut srv, c).await;
    }
    let mut r = Reassembler::new(1 << 20, 8, 1 << 20);
    let (id, _, data) = result(&mut srv, &mut r).await;
    assert_eq!(id, 1);
    assert_eq!(&data[..], &expected(&a, 1024, 1024)[..]);
    // B again, alone: it gets its memory now.
    for c in &cb {
        send_chunk(&mut srv, c).await;
    }
    let (id, _, data) = result(&mut srv, &mut r).await;
    assert_eq!(id, 2);
    assert_eq!(&data[..], &expected(&b, 1024, 1024)[..]);
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn a_configuration_between_the_chunks_of_a_message_fails_that_message_only() {
    // Accepted and refused alike: the message begun under the old
    // configuration is failed before the response, its remaining chunks are
    // dropped, and the node serves the next message.
    for accept in [true, false] {
        let tc = TestCores::default();
        let (mut srv, node) = start(NodeOptions {
            loader: tc.loader(),
            ..options()
        })
        .await;
        handshake_chunks(&mut srv, 100).await;
        srv.configure(&cores(1, 50, 50)).await;
        let begun = cut(7, 2, &inputs(7, 6, 50), 100);
        send_chunk(&mut srv, &begun[0]).await;
        srv.send(
            cores(1, 64, if accept { 64 } else { 0 })
                .to_frame()
                .unwrap(),
        )
        .await;
        let e = srv.expect_error().await;
        assert_eq!(
            (e.id, e.code()),
            (7, Some(ErrorCode::UnexpectedMessage)),
            "{e}"
        );
        assert!(e.reason.contains("still arriving"), "{e}");
        if !accept {
            let e = srv.expect_error().await;
            assert_eq!(e.code(), Some(ErrorCode::ConfigurationFailed), "{e}");
        }
        assert_eq!(srv.expect_response().await, accept);
        for c in &begun[1..] {
            send_chunk(&mut srv, c).await;
        }
        if !accept {
            srv.configure(&cores(1, 64, 64)).await;
        }
        let next = inputs(8, 3, 64);
        for c in cut(8, 2, &next, 100) {
            send_chunk(&mut srv, &c).await;
        }
        let mut r = Reassembler::new(1 << 20, 8, 1 << 20);
        let (id, _, data) = result(&mut srv, &mut r).await;
        assert_eq!(id, 8, "nothing came back for message 7");
        assert_eq!(&data[..], &expected(&next, 64, 64)[..]);
        drop(srv);
        node.ended().await.unwrap();
    }
}

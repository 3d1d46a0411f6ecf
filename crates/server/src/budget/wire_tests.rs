//! What peers can make a running server hold, against its memory budget
//! and the deadline of unfinished messages: raw bytes over loopback, in the
//! style of `hostile_tests`. Waiting is on frames, closes and the budget's
//! count, never on a sleep standing in for a signal.

use std::time::Duration;

use bytes::Bytes;
use corefarm_smp::stream::Chunk;
use corefarm_smp::{hello::features, BenchmarkConfig, ErrorCode, Hello, MsgType, OutFrame};
use tokio::io::AsyncWriteExt;

use crate::hostile_tests::{notifying_node, opts, start, Peer, Running};
use crate::ServerOptions;

const MIB: u64 = 1 << 20;

/// Bytes held against the running server's budget.
fn used(srv: &Running) -> u64 {
    srv.status.0.budget.used()
}

/// Waits until the budget's count meets `cond` (the server read what was
/// sent); a poll interval, not a synchronisation: the condition is.
async fn until(srv: &Running, what: &str, cond: impl Fn(u64) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !cond(used(srv)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {} bytes held",
            used(srv)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A user that agreed `error` (and `chunks` of 512 bytes if `chunks`),
/// asking for `nodes`.
async fn user(srv: &Running, nodes: u32, chunks: bool) -> Peer {
    let mut p = Peer::connect(srv.users).await;
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into()];
    if chunks {
        h.features.push(features::CHUNKS.into());
        h.chunk_size = Some(512);
    }
    h.nodes = Some(nodes);
    p.send(h.to_frame()).await;
    assert_eq!(p.recv().await.unwrap().ty, MsgType::Hello);
    p
}

/// A configuration of 16-byte inputs and outputs whose frame is about
/// `bytes` long (its bitstream fills it), as bytes.
fn configuration(bytes: usize) -> Vec<u8> {
    let mut cfg = BenchmarkConfig {
        input_size: 16,
        output_size: 16,
        delay_us: 0,
    }
    .to_configuration();
    cfg.bitstream = Bytes::from(vec![0u8; bytes]);
    cfg.to_frame().unwrap().to_vec()
}

async fn configured(p: &mut Peer) {
    loop {
        let f = p.recv().await.expect("a configuration response");
        if f.ty == MsgType::ConfigurationResponse {
            assert_eq!(f.payload[0], 0, "configured");
            return;
        }
    }
}

/// The first chunk of message `id`, announcing `total` bytes.
fn first_chunk(id: u32, total: u64) -> Vec<u8> {
    let c = Chunk::new(id, 3, 0, total, Bytes::from(vec![1u8; 512]));
    c.to_frame().unwrap().to_vec()
}

/// A user that begins two large chunked messages and goes silent is ended
/// after `--message-timeout` with a timeout naming the message begun first,
/// and what the messages held goes back to the budget. Before, nothing
/// ended it: the server held both buffers for as long as the socket lived.
#[tokio::test(start_paused = true)]
async fn a_user_leaving_messages_unfinished_is_ended_and_its_memory_released() {
    let srv = start(ServerOptions {
        message_timeout: Duration::from_secs(5),
        ..opts()
    })
    .await;
    let _node = notifying_node(srv.nodes, 0).await;
    let mut p = user(&srv, 1, true).await;
    p.raw(&configuration(16)).await;
    configured(&mut p).await;
    let before = used(&srv);
    let begun = tokio::time::Instant::now();
    // In one write: the user's socket has a receive buffer of a few chunks,
    // and a second segment could wait for the kernel's window probe, which
    // runs on real time, not the test's paused clock.
    p.raw(&[first_chunk(7, 8 * MIB), first_chunk(8, 8 * MIB)].concat())
        .await;
    // Each is held at its whole length from its first chunk.
    until(&srv, "both messages held", |u| u >= before + 16 * MIB).await;
    let e = p.error_then_close().await;
    assert_eq!((e.id, e.code()), (7, Some(ErrorCode::Timeout)), "{e}");
    assert!(e.reason.contains("--message-timeout"), "{e}");
    assert!(
        begun.elapsed() >= Duration::from_secs(5),
        "{:?}",
        begun.elapsed()
    );
    until(&srv, "the messages released", |u| u <= before).await;
    assert_eq!(srv.status.get().errors["unfinished_message"], 1);
}

/// Users that each announce a configuration and send part of it are
/// charged what they sent; the one whose bytes would take the total over
/// `--memory-budget` is refused (`too-large`) and closed, and the others
/// finish theirs and are configured as if nothing happened. Before, the
/// server took every one of them, whatever they held together.
#[tokio::test]
async fn connections_together_cannot_exceed_the_budget() {
    let srv = start(ServerOptions {
        memory_budget: Some(9 * MIB / 2),
        ..opts()
    })
    .await;
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(notifying_node(srv.nodes, 0).await);
    }
    let big = configuration(2 * MIB as usize);
    let half = MIB as usize;
    let mut users = Vec::new();
    for _ in 0..3 {
        let mut p = user(&srv, 1, false).await;
        p.raw(&big[..half]).await;
        users.push(p);
    }
    until(&srv, "three halves held", |u| u >= 3 * MIB).await;
    // The fourth is refused once its bytes would pass the budget. Its
    // write may fail once the server closes: what it is told is read.
    let Peer { r, mut w } = user(&srv, 0, false).await;
    let bytes = configuration(3 * MIB as usize)[..2 * MIB as usize].to_vec();
    let writer = tokio::spawn(async move {
        let _ = w.write_all(&bytes).await;
        w
    });
    let mut over = Peer {
        r,
        w: writer.await.unwrap(),
    };
    let e = over.error_then_close().await;
    assert_eq!(e.code(), Some(ErrorCode::TooLarge), "{e}");
    assert!(e.reason.contains("--memory-budget"), "{e}");
    assert!(used(&srv) <= 9 * MIB / 2);
    // The others finish theirs, one after the other, and are configured.
    for p in &mut users {
        p.raw(&big[half..]).await;
        configured(p).await;
        p.send(OutFrame::data(1, Bytes::from(vec![1u8; 16])).unwrap())
            .await;
        let f = p.recv().await.expect("a result");
        assert_eq!(f.ty, MsgType::Data);
    }
    let errors = srv.status.get().errors;
    assert_eq!(errors["over_budget"], 1, "{errors:?}");
}

/// A configuration announced at 60 MB and trickled in is charged what has
/// arrived, not what was announced, at every step.
#[tokio::test]
async fn a_trickled_configuration_is_charged_as_it_arrives() {
    let srv = start(opts()).await;
    let mut p = user(&srv, 0, false).await;
    let before = used(&srv);
    let mut head = vec![MsgType::Configuration as u8, 0, 0, 0];
    head.extend_from_slice(&60_000_000u32.to_le_bytes());
    p.raw(&head).await;
    let piece = vec![0u8; 256 << 10];
    for sent in 1..=4u64 {
        p.raw(&piece).await;
        let arrived = sent * piece.len() as u64;
        until(&srv, "the piece charged", |u| u >= before + arrived).await;
        let held = used(&srv) - before;
        assert!(
            held < arrived + (64 << 10),
            "{held} bytes charged for {arrived} arrived"
        );
    }
}

/// A hello trickled past the budget is refused as a hello that cannot be
/// read is: a `too-large` error saying why, then the close.
#[tokio::test]
async fn a_hello_over_the_budget_gets_the_documented_error() {
    let srv = start(ServerOptions {
        memory_budget: Some(MIB / 4),
        ..opts()
    })
    .await;
    let Peer { r, mut w } = Peer::connect(srv.users).await;
    let mut bytes = vec![MsgType::Hello as u8, 0, 0, 0];
    bytes.extend_from_slice(&(MIB as u32).to_le_bytes());
    bytes.extend_from_slice(&vec![b' '; MIB as usize / 2]);
    let writer = tokio::spawn(async move {
        let _ = w.write_all(&bytes).await;
        w
    });
    let mut p = Peer {
        r,
        w: writer.await.unwrap(),
    };
    let e = p.error_then_close().await;
    assert_eq!(e.code(), Some(ErrorCode::TooLarge), "{e}");
    assert!(e.reason.contains("--memory-budget"), "{e}");
    assert!(used(&srv) <= MIB / 4);
}

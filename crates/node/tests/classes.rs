//! Priority classes in the node's input queue to its cores: with
//! the one core held on a gate, messages queue up; each permit then lets
//! exactly one through, so the order results come back is the order the
//! queue served them.

use crate::common;

use std::sync::Arc;

use common::*;
use corefarm_node::NodeOptions;
use corefarm_smp::group::{Cmd, GroupCmd};
use corefarm_smp::stream::{Reassembler, MESSAGE_GUARD};
use corefarm_smp::MsgType;

const SIZE: usize = 64;

/// A node with one gated core on a link with chunks of 1 KiB.
async fn gated() -> (TcpServer, Node, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let tc = TestCores {
        gate: Some(gate.clone()),
        ..TestCores::default()
    };
    let (mut srv, node) = start(NodeOptions {
        loader: tc.loader(),
        ..options()
    })
    .await;
    handshake_chunks(&mut srv, 1024).await;
    srv.configure(&cores(1, SIZE as u32, SIZE as u32)).await;
    (srv, node, gate)
}

/// One input tagged `id`, as a single chunk of `class`, or as a plain data
/// frame (no class: the default one) for `None`.
async fn send(srv: &mut TcpServer, id: u32, class: Option<u8>) {
    let data = inputs(id, 1, SIZE);
    match class {
        Some(c) => send_chunk(srv, &cut(id, c, &data, 1024)[0]).await,
        None => srv.data(id, data).await,
    }
}

/// The node answers a group command outside a group at once, from the
/// receiving task: once its reply is here, everything sent before it is in
/// the queue.
async fn everything_queued(srv: &mut TcpServer) {
    srv.send(GroupCmd::new(77, 0, Cmd::Barrier).to_frame().unwrap())
        .await;
    let f = srv.recv().await;
    assert_eq!(f.ty, MsgType::GroupReply, "got {f:?}");
}

/// Lets the held core run one input at a time: the ids and classes of the
/// results, in order.
async fn one_by_one(srv: &mut TcpServer, gate: &Gate, n: usize) -> Vec<(u32, u8)> {
    let mut r = Reassembler::new(1 << 20, 8, 1 << 20);
    let mut order = Vec::new();
    for _ in 0..n {
        gate.open(1);
        let (id, class, data) = result(srv, &mut r).await;
        assert_eq!(
            &data[..],
            &TestCores::expected(&inputs(id, 1, SIZE), SIZE)[..]
        );
        order.push((id, class));
    }
    order
}

#[tokio::test]
async fn an_urgent_message_runs_next_past_the_queued_bulk_ones_fifo_within_a_class() {
    let (mut srv, node, gate) = gated().await;
    send(&mut srv, 1, Some(6)).await;
    gate.until_blocked(1).await;
    // Bulk (6), default (4, whole data frames), then urgent (0).
    let queued = [
        (2, Some(6)),
        (3, None),
        (4, Some(6)),
        (5, None),
        (6, Some(6)),
        (9, Some(0)),
        (7, Some(0)),
    ];
    for (id, class) in queued {
        send(&mut srv, id, class).await;
    }
    everything_queued(&mut srv).await;
    let order = one_by_one(&mut srv, &gate, 8).await;
    assert_eq!(
        order,
        [
            (1, 6),
            (9, 0),
            (7, 0),
            (3, 4),
            (5, 4),
            (2, 6),
            (4, 6),
            (6, 6)
        ]
    );
    gate.open_all();
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn a_stream_of_urgent_messages_lets_a_bulk_one_through_within_the_guard() {
    let (mut srv, node, gate) = gated().await;
    send(&mut srv, 1000, Some(0)).await;
    gate.until_blocked(1).await;
    send(&mut srv, 1, Some(7)).await;
    let urgent = MESSAGE_GUARD + 4;
    for i in 0..urgent {
        send(&mut srv, 2000 + i, Some(0)).await;
    }
    everything_queued(&mut srv).await;
    let order = one_by_one(&mut srv, &gate, urgent as usize + 2).await;
    let bulk = order.iter().position(|&(id, _)| id == 1);
    // The one in the core, `MESSAGE_GUARD` urgent ones that passed the bulk
    // message, then the bulk message.
    assert_eq!(bulk, Some(1 + MESSAGE_GUARD as usize), "{order:?}");
    let urgent_order: Vec<u32> = order
        .iter()
        .filter(|&&(_, c)| c == 0)
        .map(|&(id, _)| id)
        .collect();
    let mut sorted = urgent_order.clone();
    sorted.sort();
    assert_eq!(urgent_order, sorted, "FIFO among the urgent ones");
    gate.open_all();
    drop(srv);
    node.ended().await.unwrap();
}

#[tokio::test]
async fn without_chunks_the_queue_is_the_fifo_it_was() {
    let gate = Arc::new(Gate::default());
    let tc = TestCores {
        gate: Some(gate.clone()),
        ..TestCores::default()
    };
    let (mut srv, node) = start(NodeOptions {
        loader: tc.loader(),
        ..options()
    })
    .await;
    srv.handshake(None).await;
    srv.configure(&cores(1, SIZE as u32, SIZE as u32)).await;
    for id in 1..=6 {
        send(&mut srv, id, None).await;
    }
    everything_queued(&mut srv).await;
    let mut order = Vec::new();
    for _ in 1..=6 {
        gate.open(1);
        order.push(srv.expect_data().await.0);
    }
    assert_eq!(order, [1, 2, 3, 4, 5, 6]);
    gate.open_all();
    drop(srv);
    node.ended().await.unwrap();
}

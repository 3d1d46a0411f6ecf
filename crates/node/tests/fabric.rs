//! Groups of node fabrics in one runtime: collectives checked against local
//! computations, forwarding over ring and torus, duplicate rejection, and
//! members that die or misbehave mid-collective.

use crate::fabric_common;

use bytes::Bytes;
use corefarm_node::collective::{CollError, CollOptions};
use corefarm_node::peer::Topology;
use corefarm_smp::{Algo, CollHeader, DType, ReduceOp};
use fabric_common::*;

fn opts(chunk: usize) -> CollOptions {
    CollOptions {
        chunk,
        ..CollOptions::default()
    }
}

const ALGOS: [Algo; 3] = [Algo::Linear, Algo::Binomial, Algo::Star];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_collective_and_algorithm_on_a_full_mesh() {
    let (_l, gs) = groups(cluster(1, 5, Topology::FullMesh).await, opts(1000));
    let mut ops = Vec::new();
    for a in ALGOS {
        ops.extend([
            Op::Barrier(a),
            Op::Bcast(a, 2, 5000),
            Op::Bcast(a, 0, 0),
            Op::Reduce(a, 4, DType::I32, ReduceOp::Sum, 4004),
            Op::Allreduce(a, DType::F64, ReduceOp::Prod, 800),
            Op::Gather(a, 1, 2500),
            Op::Scatter(a, 3, 1999),
            Op::Allgather(a, 700),
        ]);
    }
    run_and_check(gs, 11, &ops).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_hop_on_a_ring_with_two_links_per_node() {
    let (_l, gs) = groups(cluster(2, 8, Topology::Ring).await, opts(4096));
    let ops = [
        Op::Bcast(Algo::Star, 0, 20_000),
        Op::Gather(Algo::Star, 3, 3000),
        Op::Allreduce(Algo::Binomial, DType::U16, ReduceOp::Max, 10_000),
    ];
    let gs = run_and_check(gs, 5, &ops).await;
    for g in &gs {
        assert_eq!(g.fabric().links().len(), 2, "rank {}", g.rank());
    }
    // Rank 4 is three hops from rank 0 either way: someone forwarded.
    let forwarded: u64 = gs.iter().map(|g| g.fabric().stats().forwarded).sum();
    assert!(forwarded > 0);
    assert!(gs.iter().all(|g| g.fabric().stats().dropped == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_hop_on_a_torus_with_four_links_per_node() {
    let (_l, gs) = groups(
        cluster(3, 16, Topology::Torus { cols: 4 }).await,
        opts(8192),
    );
    let ops = [
        Op::Scatter(Algo::Star, 5, 3000),
        Op::Allreduce(Algo::Star, DType::I64, ReduceOp::Sum, 16_000),
        Op::Bcast(Algo::Linear, 15, 50_000),
        Op::Barrier(Algo::Binomial),
    ];
    let gs = run_and_check(gs, 6, &ops).await;
    for g in &gs {
        assert_eq!(g.fabric().links().len(), 4, "rank {}", g.rank());
        assert_eq!(g.fabric().stats().dropped, 0);
    }
    assert!(gs.iter().map(|g| g.fabric().stats().forwarded).sum::<u64>() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_message_is_delivered_once() {
    let mut c = cluster(4, 2, Topology::FullMesh).await;
    let sender = c.fabrics.remove(0);
    let (_l, mut gs) = groups(c, opts(1024));
    let mut g = gs.remove(0);
    // Rank 0 plays its part of bcast #1 by hand and sends its only chunk twice.
    let coll = CollHeader::bcast(5);
    let m = sender.next_message(1, coll, Bytes::from_static(b"hello"));
    sender.send_raw(1, &m).unwrap();
    sender.send_raw(1, &m).unwrap();
    // A second message with the next sequence number: had the duplicate been
    // delivered, the bcast would have seen "hello" twice and failed.
    let mut again = sender.next_message(
        1,
        CollHeader { seq: 2, ..coll },
        Bytes::from_static(b"world"),
    );
    again.header.seq = m.header.seq + 1;
    sender.send_raw(1, &again).unwrap();
    let got = within("bcast", g.bcast(Algo::Linear, 0, Bytes::new()))
        .await
        .unwrap();
    assert_eq!(&got[..], b"hello");
    let got = within("bcast", g.bcast(Algo::Linear, 0, Bytes::new()))
        .await
        .unwrap();
    assert_eq!(&got[..], b"world");
    let s = g.fabric().stats();
    assert_eq!((s.delivered, s.duplicates), (2, 1));
}

fn assert_blames(results: Vec<(u32, Result<Outcome, CollError>)>, culprit: u32, op: &str) {
    for (rank, r) in results {
        let e = r.expect_err("the collective must fail");
        assert_eq!(e.rank(), Some(culprit), "rank {rank}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(op) && text.contains(&format!("n{culprit}@127.0.0.1")),
            "rank {rank}: {text}"
        );
    }
}

async fn run_without(
    topology: Topology,
    n: u32,
    victim: u32,
    op: Op,
) -> Vec<(u32, Result<Outcome, CollError>)> {
    let (_l, gs) = groups(
        cluster(5, n, topology).await,
        CollOptions {
            timeout: std::time::Duration::from_secs(20),
            chunk: 4096,
            ..CollOptions::default()
        },
    );
    let mut tasks = Vec::new();
    let mut dead = None;
    for mut g in gs {
        if g.rank() == victim {
            dead = Some(g);
            continue;
        }
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let r = exec(&mut g, 9, 0, &op).await;
            (g, r)
        }));
    }
    // The others have started (their sends may already be queued); now the victim dies.
    drop(dead);
    let mut out = Vec::new();
    let mut alive = Vec::new();
    for t in tasks {
        let (g, r) = within("survivors to fail", t).await.unwrap();
        out.push((g.rank(), r));
        // Survivors stay up until all have failed: a member leaving is itself a failure.
        alive.push(g);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_mid_collective_is_named_by_everyone_on_a_mesh() {
    let r = run_without(
        Topology::FullMesh,
        4,
        2,
        Op::Allreduce(Algo::Binomial, DType::F32, ReduceOp::Sum, 200_000),
    )
    .await;
    assert_blames(r, 2, "allreduce #1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_mid_collective_is_named_by_everyone_on_a_ring() {
    // (A broadcast's root may legitimately finish before the loss: every
    // member of an allreduce must receive, so every survivor must fail.)
    let op = Op::Allreduce(Algo::Linear, DType::U32, ReduceOp::Min, 300_000);
    let r = run_without(Topology::Ring, 6, 3, op).await;
    assert_blames(r, 3, "allreduce #1 (linear");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_a_mismatched_contribution_is_named_by_everyone() {
    let (_l, gs) = groups(cluster(6, 4, Topology::FullMesh).await, opts(4096));
    let tasks: Vec<_> = gs
        .into_iter()
        .map(|mut g| {
            tokio::spawn(async move {
                let len = if g.rank() == 2 { 12 } else { 16 };
                let r = g
                    .allreduce(
                        Algo::Star,
                        DType::I32,
                        ReduceOp::Sum,
                        Bytes::from(vec![1u8; len]),
                    )
                    .await;
                let after = g.barrier(Algo::Star).await;
                (g, r.map(Outcome::One), after)
            })
        })
        .collect();
    let mut results = Vec::new();
    let mut alive = Vec::new();
    for t in tasks {
        let (g, r, after) = within("members", t).await.unwrap();
        let rank = g.rank();
        alive.push(g);
        // The group stays failed, and says why.
        let after = after.unwrap_err();
        assert!(
            matches!(after, CollError::Failed { .. }) && after.rank() == Some(2),
            "{after}"
        );
        results.push((rank, r));
    }
    assert_blames(results, 2, "allreduce #1 (star, root 0, i32 sum)");
}

/// Rank 0 of a pair sends, by hand, `header`'s chunk of `len` bytes every
/// few milliseconds until rank 1's broadcast (root 0) has ended; returns
/// how rank 1's broadcast ended.
async fn bcast_under_traffic(
    group: u32,
    opts: CollOptions,
    header: CollHeader,
    len: usize,
) -> CollError {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut c = cluster(group, 2, Topology::FullMesh).await;
    let sender = c.fabrics.remove(0);
    let (_l, mut gs) = groups(c, opts);
    let mut g = gs.remove(0);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let traffic = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let m = sender.next_message(1, header, Bytes::from(vec![7u8; len]));
                if sender.send_raw(1, &m).is_err() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            sender
        })
    };
    let r = within(
        "the broadcast to fail",
        g.bcast(Algo::Linear, 0, Bytes::new()),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let _ = traffic.await;
    r.expect_err("rank 0 never takes part")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_of_other_calls_do_not_hold_off_the_timeout() {
    // Chunks of an earlier call are dropped as they come; they must not
    // restart the wait for the chunk this call needs.
    let stale = CollHeader {
        seq: 0,
        ..CollHeader::bcast(1)
    };
    let opts = CollOptions {
        timeout: std::time::Duration::from_millis(300),
        ..opts(1024)
    };
    let e = bcast_under_traffic(8, opts, stale, 1).await;
    assert_eq!(e.rank(), Some(0), "{e}");
    assert!(e.to_string().contains("sent nothing of this call"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_chunks_of_later_calls_count_against_the_stash() {
    let early = CollHeader {
        seq: 5,
        ..CollHeader::bcast(0)
    };
    let opts = CollOptions {
        max_stash: 4096,
        ..opts(1024)
    };
    let e = bcast_under_traffic(9, opts, early, 0).await;
    assert_eq!(e.rank(), Some(0), "{e}");
    assert!(e.to_string().contains("ahead of this rank"), "{e}");
}

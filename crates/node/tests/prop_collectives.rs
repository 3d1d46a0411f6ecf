//! Random sequences of collectives — every operation, algorithm, reduction
//! and element type, sizes from 0 to a few hundred KiB, groups of 1 to 16 on
//! every topology — each result checked against a local computation.

use crate::fabric_common;

use corefarm_node::collective::CollOptions;
use corefarm_node::peer::Topology;
use corefarm_smp::{Algo, DType, ReduceOp};
use fabric_common::*;
use proptest::prelude::*;

fn algo() -> impl Strategy<Value = Algo> {
    prop::sample::select(Algo::ALL.to_vec())
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL[1..].to_vec())
}

fn reduction() -> impl Strategy<Value = ReduceOp> {
    prop::sample::select(ReduceOp::ALL[1..].to_vec())
}

/// Mostly small sizes, sometimes a few hundred KiB.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0usize..2000, 1 => 2000usize..300_000]
}

fn op(n: u32) -> impl Strategy<Value = Op> {
    let root = 0..n;
    prop_oneof![
        algo().prop_map(Op::Barrier),
        (algo(), root.clone(), size()).prop_map(|(a, r, s)| Op::Bcast(a, r, s)),
        (algo(), root.clone(), dtype(), reduction(), size())
            .prop_map(|(a, r, t, o, s)| Op::Reduce(a, r, t, o, s)),
        (algo(), dtype(), reduction(), size()).prop_map(|(a, t, o, s)| Op::Allreduce(a, t, o, s)),
        // Per-member blocks: keep the group's total at the same scale.
        (algo(), root.clone(), size()).prop_map(move |(a, r, s)| Op::Gather(a, r, s / n as usize)),
        (algo(), root, size()).prop_map(move |(a, r, s)| Op::Scatter(a, r, s / n as usize)),
        (algo(), size()).prop_map(move |(a, s)| Op::Allgather(a, s / n as usize)),
    ]
}

fn topology(n: u32) -> impl Strategy<Value = Topology> {
    let mut t = vec![Topology::FullMesh, Topology::Ring, Topology::BinomialTree];
    for cols in [4, 3, 2] {
        if n.is_multiple_of(cols) && n > cols {
            t.push(Topology::Torus { cols });
            break;
        }
    }
    prop::sample::select(t)
}

fn case() -> impl Strategy<Value = (u32, Topology, usize, Vec<Op>, u64)> {
    (1u32..=16).prop_flat_map(|n| {
        (
            Just(n),
            topology(n),
            prop::sample::select(vec![1000usize, 4096, 65536]),
            prop::collection::vec(op(n), 1..8),
            any::<u64>(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_collective_sequences_match_local_computation((n, topo, chunk, ops, seed) in case()) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (_l, gs) = groups(cluster(100, n, topo).await, CollOptions { chunk, ..CollOptions::default() });
            let gs = run_and_check(gs, seed, &ops).await;
            assert!(gs.iter().all(|g| g.fabric().stats().dropped == 0 && g.fabric().stats().duplicates == 0));
        });
    }
}

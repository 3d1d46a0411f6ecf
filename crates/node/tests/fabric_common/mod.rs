//! In-process groups of node fabrics on 127.0.0.1, and a description of
//! collectives that every member runs and the tests check locally.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use corefarm_node::collective::reduce::reduce_all;
use corefarm_node::collective::{CollError, CollOptions, Group};
use corefarm_node::peer::{Fabric, GroupSpec, Member, PeerListener, Topology};
use corefarm_smp::{Algo, DType, ReduceOp};

pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .unwrap_or_else(|_| panic!("stalled: {what}"))
}

/// A group of `n` fabrics, each with its own peer port (kept alive here).
pub struct Cluster {
    pub listeners: Vec<PeerListener>,
    pub fabrics: Vec<Fabric>,
}

pub async fn cluster(group: u32, n: u32, topology: Topology) -> Cluster {
    cluster_with(group, n, topology, |_, spec| spec).await
}

/// [`cluster`] with each rank's spec adjusted by `adjust(rank, spec)`.
pub async fn cluster_with(
    group: u32,
    n: u32,
    topology: Topology,
    adjust: impl Fn(u32, GroupSpec) -> GroupSpec,
) -> Cluster {
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(
            PeerListener::bind("127.0.0.1:0".parse().unwrap())
                .await
                .unwrap(),
        );
    }
    let members: Vec<Member> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| Member {
            name: format!("n{i}"),
            addr: l.local_addr(),
        })
        .collect();
    let joins = listeners.iter().enumerate().map(|(i, l)| {
        Fabric::join(
            l,
            adjust(
                i as u32,
                GroupSpec::new(group, i as u32, members.clone(), topology),
            ),
        )
    });
    let fabrics = within("group to link", futures_join_all(joins.collect())).await;
    Cluster {
        listeners,
        fabrics: fabrics.into_iter().map(|r| r.unwrap()).collect(),
    }
}

/// Polls every future to completion on this task (no spawn needed: they borrow the listeners).
pub async fn futures_join_all<F: Future>(fs: Vec<F>) -> Vec<F::Output> {
    let mut fs: Vec<_> = fs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = fs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in fs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.unwrap()).collect()
}

pub fn groups(c: Cluster, opts: CollOptions) -> (Vec<PeerListener>, Vec<Group>) {
    let gs = c
        .fabrics
        .into_iter()
        .map(|f| Group::new(f, opts.clone()))
        .collect();
    (c.listeners, gs)
}

/// One collective, as every member calls it.
#[derive(Debug, Clone)]
pub enum Op {
    Barrier(Algo),
    Bcast(Algo, u32, usize),
    Reduce(Algo, u32, DType, ReduceOp, usize),
    Allreduce(Algo, DType, ReduceOp, usize),
    Gather(Algo, u32, usize),
    Scatter(Algo, u32, usize),
    Allgather(Algo, usize),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Done,
    One(Bytes),
    Maybe(Option<Bytes>),
    Many(Option<Vec<Bytes>>),
}

/// Deterministic data of member `rank` for the `i`-th collective: raw bytes,
/// or for floats small powers of two so that sums and products are exact in
/// any order.
pub fn data(seed: u64, i: usize, rank: u32, len: usize, dtype: DType) -> Bytes {
    let mut x =
        seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (u64::from(rank) << 40) ^ 0x5555;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    const VALS: [f64; 7] = [0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0];
    let mut v = Vec::with_capacity(len);
    match dtype {
        DType::F32 => (0..len / 4)
            .for_each(|_| v.extend_from_slice(&(VALS[(next() % 7) as usize] as f32).to_le_bytes())),
        DType::F64 => (0..len / 8)
            .for_each(|_| v.extend_from_slice(&VALS[(next() % 7) as usize].to_le_bytes())),
        _ => (0..len).for_each(|_| v.push(next() as u8)),
    }
    Bytes::from(v)
}

fn elems(len: usize, dtype: DType) -> usize {
    len / dtype.size() * dtype.size()
}

/// Runs `op` (the `i`-th of a sequence) on one member.
pub async fn exec(g: &mut Group, seed: u64, i: usize, op: &Op) -> Result<Outcome, CollError> {
    let (r, n) = (g.rank(), g.size());
    Ok(match *op {
        Op::Barrier(a) => g.barrier(a).await.map(|_| Outcome::Done)?,
        Op::Bcast(a, root, len) => Outcome::One(
            g.bcast(
                a,
                root,
                if r == root {
                    data(seed, i, r, len, DType::U8)
                } else {
                    Bytes::new()
                },
            )
            .await?,
        ),
        Op::Reduce(a, root, t, o, len) => Outcome::Maybe(
            g.reduce(a, root, t, o, data(seed, i, r, elems(len, t), t))
                .await?,
        ),
        Op::Allreduce(a, t, o, len) => Outcome::One(
            g.allreduce(a, t, o, data(seed, i, r, elems(len, t), t))
                .await?,
        ),
        Op::Gather(a, root, len) => Outcome::Many(
            g.gather(a, root, data(seed, i, r, len + r as usize, DType::U8))
                .await?,
        ),
        Op::Scatter(a, root, len) => {
            let parts = if r == root {
                (0..n)
                    .map(|d| data(seed, i, d, len + d as usize, DType::U8))
                    .collect()
            } else {
                Vec::new()
            };
            Outcome::One(g.scatter(a, root, parts).await?)
        }
        Op::Allgather(a, len) => Outcome::Many(Some(
            g.allgather(a, data(seed, i, r, len + r as usize, DType::U8))
                .await?,
        )),
    })
}

/// What member `rank` must get from `op`, computed locally.
pub fn expected(seed: u64, i: usize, op: &Op, rank: u32, n: u32) -> Outcome {
    let all = |len: usize| -> Vec<Bytes> {
        (0..n)
            .map(|d| data(seed, i, d, len + d as usize, DType::U8))
            .collect()
    };
    let reduced = |t: DType, o: ReduceOp, len: usize| {
        let parts: Vec<Bytes> = (0..n).map(|d| data(seed, i, d, elems(len, t), t)).collect();
        let refs: Vec<&[u8]> = parts.iter().map(|b| &b[..]).collect();
        Bytes::from(reduce_all(t, o, &refs).unwrap())
    };
    match *op {
        Op::Barrier(_) => Outcome::Done,
        Op::Bcast(_, root, len) => Outcome::One(data(seed, i, root, len, DType::U8)),
        Op::Reduce(_, root, t, o, len) => {
            Outcome::Maybe((rank == root).then(|| reduced(t, o, len)))
        }
        Op::Allreduce(_, t, o, len) => Outcome::One(reduced(t, o, len)),
        Op::Gather(_, root, len) => Outcome::Many((rank == root).then(|| all(len))),
        Op::Scatter(_, _, len) => Outcome::One(data(seed, i, rank, len + rank as usize, DType::U8)),
        Op::Allgather(_, len) => Outcome::Many(Some(all(len))),
    }
}

/// Runs the sequence on every member concurrently and checks every result.
pub async fn run_and_check(groups: Vec<Group>, seed: u64, ops: &[Op]) -> Vec<Group> {
    let n = groups.len() as u32;
    let tasks: Vec<_> = groups
        .into_iter()
        .map(|mut g| {
            let ops = ops.to_vec();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for (i, op) in ops.iter().enumerate() {
                    got.push(exec(&mut g, seed, i, op).await);
                }
                (g, got)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        let (g, got) = within("members to finish", t).await.unwrap();
        for (i, (op, r)) in ops.iter().zip(got).enumerate() {
            let r = r.unwrap_or_else(|e| panic!("rank {} op {i} {op:?}: {e}", g.rank()));
            assert!(
                r == expected(seed, i, op, g.rank(), n),
                "rank {} op {i} {op:?}: wrong result",
                g.rank()
            );
        }
        out.push(g);
    }
    out
}

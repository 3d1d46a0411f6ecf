//! Groups end to end in one process: the real server, real node managers
//! (peer ports on loopback) and the blocking group client. Covers gang
//! allocation, resident buffers and their errors, every collective checked
//! against a local computation, `run` with an operand (a matrix-vector
//! product), and a member killed mid-command.

use crate::common;

use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{opts, start, TestServer, LIMIT};
use corefarm_client::group::{Algorithm, Group, GroupError, GroupOptions};
use corefarm_client::{Client, ClientOptions};
use corefarm_cores::{Core, CoreError, Loaded};
use corefarm_node::{CoreLoader, NodeOptions};
use corefarm_server::{ServerOptions, Sharing};
use corefarm_smp::{default_core_table, Configuration, DType, ReduceOp};
use tokio_util::sync::CancellationToken;

/// Elements of a matrix row and of the vector.
const K: usize = 8;

/// Reports that the core started, and is waited on before it goes on.
type Gate = (std_mpsc::Sender<()>, Arc<Mutex<std_mpsc::Receiver<()>>>);

/// out = row · vec over i32 (wrapping): the input is a row then the vector.
struct Dot {
    /// Set on the core that stalls: it reports that it started, then waits.
    gate: Option<Gate>,
}

impl Core for Dot {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        if let Some((started, release)) = &self.gate {
            let _ = started.send(());
            let _ = release.lock().unwrap().recv_timeout(LIMIT);
        }
        let v: Vec<i32> = input
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let dot = (0..K).fold(0i32, |acc, i| acc.wrapping_add(v[i].wrapping_mul(v[K + i])));
        output.copy_from_slice(&dot.to_le_bytes());
        Ok(())
    }
}

fn dot_loader(gate: Option<Gate>) -> CoreLoader {
    CoreLoader::new(move |cfg, _| {
        Ok(Loaded {
            cores: (0..cfg.cores.len())
                .map(|_| Box::new(Dot { gate: gate.clone() }) as Box<dyn Core>)
                .collect(),
            description: "dot".into(),
        })
    })
}

fn dot_cfg(cores: u32) -> Configuration {
    let (i, o) = (2 * K as u32 * 4, 4);
    Configuration {
        input_size: i,
        output_size: o,
        cores: default_core_table(cores, i, o).unwrap(),
        bitstream: Bytes::from_static(b"dot"),
    }
}

struct Nodes {
    stops: Vec<CancellationToken>,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        self.stops.iter().for_each(CancellationToken::cancel);
    }
}

/// `n` node managers named n0.. with peer ports; `loader(i)` gives node i's cores.
async fn nodes(
    s: &TestServer,
    n: usize,
    memory: usize,
    loader: impl Fn(usize) -> CoreLoader,
) -> Nodes {
    let mut stops = Vec::new();
    for i in 0..n {
        let o = NodeOptions {
            server: s.nodes.to_string(),
            name: format!("n{i}"),
            memory_limit: memory,
            loader: loader(i),
            ..NodeOptions::default()
        };
        let stop = CancellationToken::new();
        tokio::spawn(corefarm_node::run(o, stop.clone()));
        stops.push(stop);
    }
    free_named(s, n).await;
    Nodes { stops }
}

/// Waits until `n` nodes that said hello are free.
async fn free_named(s: &TestServer, n: usize) {
    s.wait_status(&format!("{n} free nodes with a hello"), |st| {
        st.nodes
            .iter()
            .filter(|x| x.name.is_some() && x.user.is_none())
            .count()
            == n
    })
    .await;
}

fn i32s(v: &[i32]) -> Bytes {
    Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

fn from_i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::time::timeout(LIMIT * 2, tokio::task::spawn_blocking(f))
        .await
        .expect("the client call returned within the limit")
        .expect("client thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collectives_buffers_and_matvec() {
    let s = start(opts()).await;
    let _n = nodes(&s, 4, 1 << 20, |_| dot_loader(None)).await;
    let users = s.users.to_string();
    blocking(move || {
        let mut g = Group::open(&users, GroupOptions::new(4)).unwrap();
        assert_eq!(g.size(), 4);
        let names: Vec<&str> = g.members().iter().map(|m| m.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, ["n0", "n1", "n2", "n3"]);

        // Matrix-vector product: 10 rows over 4 ranks (3, 3, 2, 2).
        let m = 10;
        let a: Vec<i32> = (0..m * K as i32).map(|x| x * 7 - 100).collect();
        let v: Vec<i32> = (0..K as i32).map(|x| 3 - x).collect();
        let counts = g.scatter_rows("A", DType::I32, &i32s(&a), K * 4).unwrap();
        assert_eq!(counts, [3, 3, 2, 2]);
        g.bcast_from_user("v", DType::I32, i32s(&v), Algorithm::Auto)
            .unwrap();
        g.configure(&dot_cfg(2)).unwrap();
        g.run_with("A", Some("v"), "y").unwrap();
        let y: Vec<i32> = g
            .gather("y")
            .unwrap()
            .iter()
            .flat_map(|b| from_i32s(b))
            .collect();
        let want: Vec<i32> = a
            .chunks(K)
            .map(|row| row.iter().zip(&v).map(|(x, y)| x * y).sum())
            .collect();
        assert_eq!(y, want, "gathered in rank order");

        // Every rank r holds x = [r + 1; 1000] (i32) and f = [r as f64 - 1.5; 3].
        for r in 0..4u32 {
            g.put(r, "x", DType::I32, i32s(&[r as i32 + 1; 1000]))
                .unwrap();
            let f: Vec<u8> = (0..3)
                .flat_map(|_| (r as f64 - 1.5).to_le_bytes())
                .collect();
            g.put(r, "f", DType::F64, Bytes::from(f)).unwrap();
        }
        for (i, algo) in [
            Algorithm::Linear,
            Algorithm::Binomial,
            Algorithm::Star,
            Algorithm::Auto,
        ]
        .into_iter()
        .enumerate()
        {
            let sum = format!("sum{i}");
            g.allreduce("x", &sum, DType::I32, ReduceOp::Sum, algo)
                .unwrap();
            for b in g.gather(&sum).unwrap() {
                assert_eq!(from_i32s(&b), vec![10; 1000], "{algo:?}");
            }
            let all = format!("all{i}");
            g.allgather("x", &all, algo).unwrap();
            let want: Vec<i32> = (1..=4).flat_map(|r| vec![r; 1000]).collect();
            assert_eq!(from_i32s(&g.get(3, &all).unwrap()), want);
            g.barrier(algo).unwrap();
        }
        g.allreduce("f", "fmax", DType::F64, ReduceOp::Max, Algorithm::Binomial)
            .unwrap();
        assert_eq!(&g.get(1, "fmax").unwrap()[..8], &1.5f64.to_le_bytes());
        g.reduce(2, "x", "prod", DType::I32, ReduceOp::Prod, Algorithm::Star)
            .unwrap();
        assert_eq!(from_i32s(&g.get(2, "prod").unwrap()), vec![24; 1000]);
        g.bcast(1, "x", "fromone", DType::I32, Algorithm::Linear)
            .unwrap();
        assert_eq!(from_i32s(&g.get(3, "fromone").unwrap()), vec![2; 1000]);

        // Buffer errors are the caller's, named, and leave the group usable.
        let e = g.put(0, "x", DType::I32, i32s(&[1])).unwrap_err();
        assert!(e.to_string().contains("\"x\" already exists"), "{e}");
        let e = g.get(2, "nope").unwrap_err();
        assert!(e.to_string().contains("no buffer named \"nope\""), "{e}");
        assert_eq!(e.rank(), Some(2));
        let e = g
            .put(1, "odd", DType::I32, Bytes::from_static(&[1, 2, 3]))
            .unwrap_err();
        assert!(e.to_string().contains("not a whole number of i32"), "{e}");
        let e = g
            .put(3, "huge", DType::U8, Bytes::from(vec![0u8; 2 << 20]))
            .unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        g.free("x").unwrap();
        let e = g.get(0, "x").unwrap_err();
        assert!(e.to_string().contains("no buffer named"), "{e}");
        g.barrier(Algorithm::Auto).unwrap();
        g.close().unwrap();
    })
    .await;
    // A cleanly closed group's nodes go back to the pool.
    free_named(&s, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_allocation_is_all_or_nothing() {
    let s = start(opts()).await;
    let _n = nodes(&s, 4, 1 << 20, |_| dot_loader(None)).await;
    let (u, srv) = (s.users.to_string(), &s);
    let e = blocking({
        let u = u.clone();
        move || Group::open(&u, GroupOptions::new(5)).unwrap_err()
    })
    .await;
    assert!(e.to_string().contains("a group of 5 nodes"), "{e}");
    free_named(srv, 4).await;

    let (tx, rx) = std_mpsc::channel::<()>();
    let holder = tokio::task::spawn_blocking({
        let u = u.clone();
        move || {
            let g = Group::open(&u, GroupOptions::new(3)).unwrap();
            rx.recv().unwrap(); // hold the group until told
            g.close().unwrap();
        }
    });
    free_named(srv, 1).await;
    let e = blocking({
        let u = u.clone();
        move || Group::open(&u, GroupOptions::new(2)).unwrap_err()
    })
    .await;
    assert!(e.to_string().contains("a group of 2 nodes"), "{e}");
    tx.send(()).unwrap();
    holder.await.unwrap();
    free_named(srv, 4).await;
    let g = blocking(move || open_addr(&u, 2).map(|g| g.size())).await;
    assert_eq!(g.unwrap(), 2);
}

fn open_addr(users: &str, n: u32) -> Result<Group, GroupError> {
    Group::open(users, GroupOptions::new(n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_killed_mid_collective_is_named_and_the_group_torn_down() {
    let s = start(opts()).await;
    let (started_tx, started_rx) = std_mpsc::channel::<()>();
    let (release_tx, release_rx) = std_mpsc::channel::<()>();
    let release_rx = Arc::new(Mutex::new(release_rx));
    let n = nodes(&s, 4, 1 << 20, |i| {
        dot_loader((i == 2).then(|| (started_tx.clone(), release_rx.clone())))
    })
    .await;
    let users = s.users.to_string();
    let (g_tx, g_rx) = std_mpsc::channel();
    let (sent_tx, sent_rx) = std_mpsc::channel::<()>();
    let call = tokio::task::spawn_blocking(move || {
        let mut g = open_addr(&users, 4).unwrap();
        // Ranks follow the pool's order, not the names: find node n2's rank.
        let victim = g.members().iter().position(|m| m.name == "n2").unwrap() as u32;
        g_tx.send(victim).unwrap();
        g.configure(&dot_cfg(1)).unwrap();
        for r in 0..4 {
            g.put(r, "A", DType::I32, i32s(&[1; K])).unwrap();
        }
        g.put(0, "v", DType::I32, i32s(&[1; K])).unwrap();
        g.bcast(0, "v", "v", DType::I32, Algorithm::Binomial)
            .unwrap();
        // n2 stalls in its core; the others finish the run and enter the
        // allreduce, where they wait for n2.
        let run = g.begin_run("A", Some("v"), "y").unwrap();
        let all = g
            .begin_allreduce("A", "s", DType::I32, ReduceOp::Sum, Algorithm::Linear)
            .unwrap();
        sent_tx.send(()).unwrap();
        let e = g.finish(run).unwrap_err();
        let e2 = g.finish(all).unwrap_err();
        let after = g.barrier(Algorithm::Auto).unwrap_err();
        (victim, e, e2, after)
    });
    let victim = tokio::task::spawn_blocking(move || g_rx.recv_timeout(LIMIT).unwrap())
        .await
        .unwrap();
    // Node n2 is inside its core and both commands are sent: kill it there.
    tokio::task::spawn_blocking(move || {
        started_rx.recv_timeout(LIMIT).unwrap();
        sent_rx.recv_timeout(LIMIT).unwrap();
    })
    .await
    .unwrap();
    n.stops[2].cancel();
    let (v, e, e2, after) = tokio::time::timeout(LIMIT, call).await.unwrap().unwrap();
    assert_eq!(v, victim);
    let _ = release_tx.send(());
    let text = e.to_string();
    assert_eq!(e.rank(), Some(victim), "{text}");
    assert!(text.contains("run #"), "names the operation: {text}");
    assert!(text.contains("n2@"), "names the node: {text}");
    let text = e2.to_string();
    assert!(text.contains("allreduce #"), "names the operation: {text}");
    assert!(text.contains("n2@"), "names the node: {text}");
    assert!(matches!(after, GroupError::Closed(_)), "{after}");
    // The other members were disconnected and come back to the pool clean.
    free_named(&s, 3).await;
}

/// `count` data messages of 3 dot inputs each (row ‖ vector) and their
/// expected outputs.
fn dot_messages(count: usize) -> (Vec<Bytes>, Vec<Vec<i32>>) {
    (0..count)
        .map(|m| {
            let mut input = Vec::new();
            let mut want = Vec::new();
            for k in 0..3 {
                let row: Vec<i32> = (0..K as i32).map(|i| i * (m as i32 + 1) - k).collect();
                let vec: Vec<i32> = (0..K as i32).map(|i| 5 - i + k).collect();
                want.push(row.iter().zip(&vec).map(|(a, b)| a * b).sum());
                input.extend(row);
                input.extend(vec);
            }
            (i32s(&input), want)
        })
        .unzip()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_path_computes_past_the_server() {
    let s = start(opts()).await;
    let _n = nodes(&s, 4, 8 << 20, |_| dot_loader(None)).await;
    let users = s.users.to_string();
    blocking(move || {
        let mut g = open_addr(&users, 4).unwrap();
        g.configure(&dot_cfg(2)).unwrap();
        let (inputs, want) = dot_messages(200);
        let mut d = g.direct(4).unwrap();
        assert_eq!((d.live(), d.chunked()), (4, 4));
        let out = d.map(&inputs).unwrap();
        let got: Vec<Vec<i32>> = out.iter().map(|b| from_i32s(b)).collect();
        assert_eq!(got, want);
        // A message that is not whole inputs is refused by the member, by id.
        let e = d.map(&[Bytes::from_static(&[1, 2, 3])]).unwrap_err();
        assert!(e.to_string().contains("direct data message 0"), "{e}");
        // The group's commands still work beside the direct path.
        g.barrier(Algorithm::Auto).unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_path_redispatches_a_killed_members_inputs_exactly_once() {
    let s = start(opts()).await;
    let (started_tx, started_rx) = std_mpsc::channel::<()>();
    let (release_tx, release_rx) = std_mpsc::channel::<()>();
    let release_rx = Arc::new(Mutex::new(release_rx));
    let n = nodes(&s, 4, 8 << 20, |i| {
        dot_loader((i == 2).then(|| (started_tx.clone(), release_rx.clone())))
    })
    .await;
    let users = s.users.to_string();
    let call = tokio::task::spawn_blocking(move || {
        let mut g = open_addr(&users, 4).unwrap();
        let victim = g.members().iter().position(|m| m.name == "n2").unwrap() as u32;
        g.configure(&dot_cfg(1)).unwrap();
        let (inputs, want) = dot_messages(120);
        let mut d = g.direct(3).unwrap();
        let out = d.map(&inputs);
        let live = d.live();
        let after = g.barrier(Algorithm::Auto).unwrap_err();
        (victim, out, want, live, after)
    });
    // n2 is inside its core with a window of messages: kill it there.
    tokio::task::spawn_blocking(move || started_rx.recv_timeout(LIMIT).unwrap())
        .await
        .unwrap();
    n.stops[2].cancel();
    let (victim, out, want, live, after) = tokio::time::timeout(LIMIT * 2, call)
        .await
        .unwrap()
        .unwrap();
    let _ = release_tx.send(());
    let got: Vec<Vec<i32>> = out.unwrap().iter().map(|b| from_i32s(b)).collect();
    assert_eq!(got, want, "every input answered once, by the survivors");
    assert_eq!(live, 3);
    // The server noticed too: the group's next command fails naming n2.
    assert_eq!(after.rank(), Some(victim), "{after}");
    assert!(after.to_string().contains("n2@"), "{after}");
}

/// A shared user's dot products, checked.
fn shared_user_round(c: &Client) {
    let (inputs, want) = dot_messages(30);
    let got: Vec<Vec<i32>> = c
        .map(inputs, 4)
        .map(|r| from_i32s(&r.expect("a result")))
        .collect();
    assert_eq!(got, want);
}

/// Shared mode: the scheduler holds every node and lends a group its
/// members; a shared user goes on being served by the rest, and members
/// return to the scheduler when their group closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_mode_lends_a_group_its_nodes_beside_a_shared_user() {
    let s = start(ServerOptions {
        sharing: Sharing::Shared,
        monitor_period: std::time::Duration::from_millis(10),
        ..opts()
    })
    .await;
    let _n = nodes(&s, 3, 1 << 20, |_| dot_loader(None)).await;
    let users = s.users.to_string();
    let (c, users) = blocking(move || {
        let c = Client::connect(&users, ClientOptions::default()).unwrap();
        c.configure(&dot_cfg(1)).unwrap();
        shared_user_round(&c);
        let mut g = open_addr(&users, 2).unwrap();
        assert_eq!(g.size(), 2);
        for r in 0..2 {
            g.put(r, "x", DType::I32, i32s(&[r as i32 + 1; 100]))
                .unwrap();
        }
        g.allreduce("x", "s", DType::I32, ReduceOp::Sum, Algorithm::Auto)
            .unwrap();
        assert_eq!(from_i32s(&g.get(1, "s").unwrap()), vec![3; 100]);
        // The node left to the scheduler serves the shared user meanwhile.
        shared_user_round(&c);
        let e = open_addr(&users, 2).unwrap_err();
        assert!(e.to_string().contains("a group of 2 nodes"), "{e}");
        g.close().unwrap();
        (c, users)
    })
    .await;
    free_named(&s, 3).await;
    blocking(move || {
        let g = open_addr(&users, 3).unwrap();
        assert_eq!(g.size(), 3);
        g.close().unwrap();
    })
    .await;
    free_named(&s, 3).await;
    blocking(move || shared_user_round(&c)).await;
}

/// xorshift64: a reproducible random sequence without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Element-wise `op` over little-endian u32 (wrapping), the local reference.
fn reduce_u32(parts: &[Vec<u32>], op: ReduceOp) -> Vec<u32> {
    let mut acc = parts[0].clone();
    for p in &parts[1..] {
        for (a, b) in acc.iter_mut().zip(p) {
            *a = match op {
                ReduceOp::Sum => a.wrapping_add(*b),
                ReduceOp::Prod => a.wrapping_mul(*b),
                ReduceOp::Min => (*a).min(*b),
                _ => (*a).max(*b),
            };
        }
    }
    acc
}

fn u32s(v: &[u32]) -> Bytes {
    Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sequences_of_collectives_match_local_results() {
    let s = start(opts()).await;
    let _n = nodes(&s, 6, 256 << 20, |_| dot_loader(None)).await;
    let users = s.users.to_string();
    blocking(move || {
        let mut g = open_addr(&users, 6).unwrap();
        let n = g.size() as usize;
        let mut rng = Rng(0x5eed_1234_abcd);
        let algos = [
            Algorithm::Linear,
            Algorithm::Binomial,
            Algorithm::Star,
            Algorithm::Auto,
        ];
        let ops = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];
        for step in 0..24 {
            // 0 to ~1.5 MiB per member: empty, small and multi-chunk blocks.
            let len = match rng.below(3) {
                0 => rng.below(4) as usize,
                1 => rng.below(5000) as usize,
                _ => rng.below(400_000) as usize,
            };
            let parts: Vec<Vec<u32>> = (0..n)
                .map(|_| (0..len).map(|_| rng.next() as u32).collect())
                .collect();
            let src = format!("x{step}");
            for (r, p) in parts.iter().enumerate() {
                g.put(r as u32, &src, DType::U32, u32s(p)).unwrap();
            }
            let algo = algos[rng.below(4) as usize];
            let dst = format!("y{step}");
            let what = format!("step {step}: {len} elements, {algo:?}");
            match rng.below(4) {
                0 => {
                    let op = ops[rng.below(4) as usize];
                    g.allreduce(&src, &dst, DType::U32, op, algo).unwrap();
                    let want = u32s(&reduce_u32(&parts, op));
                    let r = rng.below(n as u64) as u32;
                    assert_eq!(g.get(r, &dst).unwrap(), want, "{what} allreduce {op:?}");
                }
                1 => {
                    let (op, root) = (ops[rng.below(4) as usize], rng.below(n as u64) as u32);
                    g.reduce(root, &src, &dst, DType::U32, op, algo).unwrap();
                    assert_eq!(
                        g.get(root, &dst).unwrap(),
                        u32s(&reduce_u32(&parts, op)),
                        "{what} reduce"
                    );
                }
                2 => {
                    g.allgather(&src, &dst, algo).unwrap();
                    let want: Vec<u32> = parts.concat();
                    let r = rng.below(n as u64) as u32;
                    assert_eq!(g.get(r, &dst).unwrap(), u32s(&want), "{what} allgather");
                }
                _ => {
                    let root = rng.below(n as u64) as u32;
                    g.bcast(root, &src, &dst, DType::U32, algo).unwrap();
                    let r = rng.below(n as u64) as u32;
                    assert_eq!(
                        g.get(r, &dst).unwrap(),
                        u32s(&parts[root as usize]),
                        "{what} bcast"
                    );
                }
            }
            g.free(&src).unwrap();
            if step % 3 == 0 {
                g.barrier(algo).unwrap();
            }
        }
    })
    .await;
}

/// A collective the user sends to one rank only: the rank that got it waits
/// for the other, which was never asked. The user is told it was at fault;
/// no member is blamed, and every member comes back to the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collective_sent_to_one_rank_only_is_blamed_on_the_user() {
    use common::FakeUser;
    use corefarm_smp::group::{Cmd, GroupCmd, GroupCtl, GroupReply, NO_CULPRIT};
    use corefarm_smp::{hello::features, ErrorCode, MsgType};

    let s = start(opts()).await;
    let _n = nodes(&s, 2, 1 << 20, |_| dot_loader(None)).await;
    let feats = [features::ERROR, features::GROUP];
    let (mut u, f) = FakeUser::hello_with(s.users, "half-caller", Some(0), &feats).await;
    assert_eq!(f.ty, MsgType::Hello);
    let open = GroupCtl::Open {
        nodes: 2,
        topology: None,
    };
    u.send(open.to_frame()).await;
    let f = u.recv().await.expect("the group opens");
    assert!(
        matches!(GroupCtl::decode(&f.payload), Ok(GroupCtl::Opened { .. })),
        "{f:?}"
    );
    let mut barrier = GroupCmd::new(7, 0, Cmd::Barrier);
    barrier.algo = Some(corefarm_smp::Algo::Linear);
    barrier.timeout_ms = 300;
    u.send(barrier.to_frame().unwrap()).await;
    let f = u.recv().await.expect("the barrier's reply");
    assert_eq!(f.ty, MsgType::GroupReply);
    let r = GroupReply::parse(f.payload).unwrap();
    assert_eq!((r.seq, r.rank), (7, 0));
    assert_eq!(r.status, ErrorCode::Malformed as u32, "{}", r.reason());
    assert_eq!(r.culprit, NO_CULPRIT, "no member is blamed: {}", r.reason());
    assert!(r.reason().contains("not to rank 1"), "{}", r.reason());
    let f = u.recv().await.expect("the group closes");
    match GroupCtl::decode(&f.payload) {
        Ok(GroupCtl::Closed {
            reason: Some(why), ..
        }) => {
            assert!(why.contains("every rank"), "{why}")
        }
        other => panic!("expected closed with a reason, got {other:?}"),
    }
    free_named(&s, 2).await;
}

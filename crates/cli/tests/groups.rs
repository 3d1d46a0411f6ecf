//! Groups with real processes: `corefarm server` and four `corefarm node`
//! processes (each with its peer port), driven by the group client:
//! scatter, broadcast, allreduce and gather checked against local results,
//! then a node process killed while the others wait for it in a collective;
//! and the direct data path surviving a killed node process.

use std::process::{Command, Stdio};

use bytes::Bytes;
use corefarm_client::group::{Algorithm, Group, GroupOptions};
use corefarm_smp::{BenchmarkConfig, DType, ReduceOp};

use crate::support;
use support::{Proc, BIN};

fn server() -> (Proc, String, String) {
    let (p, nodes, users) = support::server(&["--node-wait", "20"]);
    (p, nodes.to_string(), users.to_string())
}

fn node(nodes: &str, name: &str) -> Proc {
    Proc(
        Command::new(BIN)
            .args(["node", "--server", nodes, "--name", name])
            .args(["--peer-listen", "127.0.0.1:0"])
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm node"),
    )
}

fn i64s(v: &[i64]) -> Bytes {
    Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

fn from_i64s(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn four_node_processes_collectives_and_a_killed_member() {
    let (_srv, nodes, users) = server();
    let mut procs: Vec<Proc> = (0..4).map(|i| node(&nodes, &format!("p{i}"))).collect();
    // `open` waits (--node-wait) until four nodes with a peer port are free.
    let mut g = Group::open(&users, GroupOptions::new(4)).expect("a group of 4 node processes");
    assert_eq!(g.size(), 4);

    // scatter: 4 × 1000 rows of one i64 each; rank r gets rows r·1000…
    let rows: Vec<i64> = (0..4000).map(|x| x * 3 - 7).collect();
    let counts = g.scatter_rows("x", DType::I64, &i64s(&rows), 8).unwrap();
    assert_eq!(counts, [1000; 4]);
    // bcast from the user, through rank 0 and then among the nodes.
    let w: Vec<i64> = (0..1000).map(|x| 1000 - x).collect();
    g.bcast_from_user("w", DType::I64, i64s(&w), Algorithm::Binomial)
        .unwrap();
    for r in 0..4 {
        assert_eq!(from_i64s(&g.get(r, "w").unwrap()), w);
    }
    // allreduce of the scattered blocks, each algorithm.
    let want: Vec<i64> = (0..1000)
        .map(|i| (0..4).map(|r| rows[r * 1000 + i]).sum())
        .collect();
    for (k, algo) in [
        Algorithm::Linear,
        Algorithm::Binomial,
        Algorithm::Star,
        Algorithm::Auto,
    ]
    .into_iter()
    .enumerate()
    {
        let dst = format!("s{k}");
        g.allreduce("x", &dst, DType::I64, ReduceOp::Sum, algo)
            .unwrap();
        for b in g.gather(&dst).unwrap() {
            assert_eq!(from_i64s(&b), want, "{algo:?}");
        }
    }
    // gather in rank order gives the scattered rows back.
    let back: Vec<i64> = g
        .gather("x")
        .unwrap()
        .iter()
        .flat_map(|b| from_i64s(b))
        .collect();
    assert_eq!(back, rows);

    // The victim's run takes 40 × 100 ms on the benchmarking core, the
    // others' one input; the others then wait for it in the allreduce.
    let victim = g.members().iter().position(|m| m.name == "p2").unwrap() as u32;
    let cfg = BenchmarkConfig {
        input_size: 16,
        output_size: 16,
        delay_us: 100_000,
    };
    g.configure(&cfg.to_configuration()).unwrap();
    for r in 0..4 {
        let inputs = if r == victim { 40 } else { 1 };
        g.put(r, "in", DType::U8, Bytes::from(vec![r as u8; 16 * inputs]))
            .unwrap();
    }
    let run = g.begin_run("in", None, "out").unwrap();
    let all = g
        .begin_allreduce("x", "late", DType::I64, ReduceOp::Max, Algorithm::Linear)
        .unwrap();
    let _ = procs[2].0.kill();
    let e = g.finish(run).unwrap_err();
    assert_eq!(e.rank(), Some(victim), "{e}");
    assert!(e.to_string().contains("p2@"), "names the node: {e}");
    assert!(e.to_string().contains("run #"), "names the operation: {e}");
    let e = g.finish(all).unwrap_err();
    assert!(e.to_string().contains("p2@"), "names the node: {e}");
    assert!(
        e.to_string().contains("allreduce #"),
        "names the operation: {e}"
    );
    let e = g.barrier(Algorithm::Auto).unwrap_err();
    assert!(
        e.to_string().contains("closed"),
        "the group was torn down: {e}"
    );
    drop(g);

    // The survivors are back: a new group of 3 forms from them.
    let g = Group::open(&users, GroupOptions::new(3)).expect("a group of the 3 survivors");
    let mut names: Vec<String> = g.members().iter().map(|m| m.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["p0", "p1", "p3"]);
    g.close().unwrap();
    procs.clear();
}

#[test]
fn direct_path_with_four_node_processes_survives_a_killed_one() {
    let (_srv, nodes, users) = server();
    let mut procs: Vec<Proc> = (0..4).map(|i| node(&nodes, &format!("d{i}"))).collect();
    let mut g = Group::open(&users, GroupOptions::new(4)).expect("a group of 4 node processes");
    let victim = g.members().iter().position(|m| m.name == "d1").unwrap();
    // The benchmarking core echoes each input's first 16 bytes.
    let cfg = BenchmarkConfig {
        input_size: 32,
        output_size: 16,
        delay_us: 1000,
    };
    g.configure(&cfg.to_configuration()).unwrap();
    let inputs: Vec<Bytes> = (0..300u32)
        .map(|i| {
            let mut v = vec![0u8; 64]; // two inputs
            v[..4].copy_from_slice(&i.to_le_bytes());
            v[32..36].copy_from_slice(&(i + 1_000_000).to_le_bytes());
            Bytes::from(v)
        })
        .collect();
    let mut d = g.direct(4).unwrap();
    assert_eq!(d.live(), 4);
    // Killed once its connection is open: what was sent to it goes to the others.
    let _ = procs[1].0.kill();
    let out = d.map(&inputs).unwrap();
    assert_eq!(out.len(), 300);
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.len(), 32, "two outputs for message {i}");
        assert_eq!(&o[..4], &(i as u32).to_le_bytes());
        assert_eq!(&o[16..20], &(i as u32 + 1_000_000).to_le_bytes());
    }
    assert_eq!(d.live(), 3, "rank {victim} is lost");
    let e = g.barrier(Algorithm::Auto).unwrap_err();
    assert!(e.to_string().contains("d1@"), "names the node: {e}");
    procs.clear();
}

/// A named user's group: its node limit bounds the group before any node
/// is taken (refused with the limit named), and the node time the group
/// held its members is charged to the user's account.
#[test]
fn a_named_users_group_is_bounded_by_its_limit_and_charged_to_its_account() {
    use corefarm_client::group::GroupError;
    use corefarm_client::ClientError;
    use corefarm_smp::auth::Secret;
    use corefarm_smp::ErrorCode;

    const CAROL: &str = "carol-secret-for-the-group-test";
    const NODES: &str = "node-secret-for-the-group-test";
    let dir = tempfile::tempdir().unwrap();
    let private = |name: &str, text: &str| support::private(dir.path(), name, text);
    let auth = private(
        "auth.toml",
        &format!(
            "[users.carol]\nsecret = \"{CAROL}\"\nmax_nodes = 1\n[nodes]\nsecret = \"{NODES}\"\n"
        ),
    );
    let node_secret = private("node.secret", NODES);
    let (_server, nodes, users) =
        support::server(&["--node-wait", "20", "--auth-file", auth.to_str().unwrap()]);
    let _members: Vec<Proc> = ["a", "b"]
        .iter()
        .map(|name| {
            Proc(
                Command::new(BIN)
                    .args(["node", "--server", &nodes.to_string(), "--name", name])
                    .args(["--peer-listen", "127.0.0.1:0", "--secret-file"])
                    .arg(&node_secret)
                    .env_remove("COREFARM_SECRET")
                    .env_remove("COREFARM_SECRET_FILE")
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start corefarm node"),
            )
        })
        .collect();
    let users = users.to_string();
    let opts = |n: u32| {
        let mut o = GroupOptions::new(n);
        o.model = None;
        o.secret = Some(Secret::new(CAROL).unwrap());
        o.user = Some("carol".into());
        o
    };
    match Group::open(&users, opts(2)) {
        Err(GroupError::Client(ClientError::Server(e))) => {
            assert_eq!(e.code(), Some(ErrorCode::NoNodes), "{e:?}");
            assert!(e.reason.contains("max_nodes = 1"), "{}", e.reason);
        }
        other => panic!("a group beyond the limit: {:?}", other.map(|g| g.size())),
    }
    let mut g = Group::open(&users, opts(1)).expect("a group within the limit");
    assert_eq!(g.size(), 1);
    // A command answered by the member: the group has held it a while.
    g.barrier(Algorithm::Auto).expect("barrier");
    g.close().expect("close");
    let (_, accounts) = support::accounting(&users, "carol", &private("carol.secret", CAROL));
    let carol = accounts
        .iter()
        .find(|a| a.user == "carol")
        .expect("carol's account");
    assert!(carol.node_seconds > 0.0, "{carol:?}");
}

//! Named users (tenants) with the real binaries: `corefarm server
//! --auth-file` with `[users.<name>]`, `corefarm bench user --user`, and
//! per-user accounting read with `corefarm status --accounting --json`.
//! Waits are on process exit and the server's status, never on sleeps.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use corefarm_smp::ClusterStatus;

use crate::support;
use support::{accounting, private, Proc, BIN};

const LIMIT: Duration = Duration::from_secs(60);
const ALICE: &str = "alice-secret-for-the-binary-test";
const BOB: &str = "bob-secret-for-the-binary-test";
const NODE: &str = "node-secret-for-the-binary-test";

fn node(nodes: &str, name: &str, secret: &Path) -> Proc {
    Proc(
        Command::new(BIN)
            .args(["node", "--server", nodes, "--name", name, "--secret-file"])
            .arg(secret)
            .env_remove("COREFARM_SECRET")
            .env_remove("COREFARM_SECRET_FILE")
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm node"),
    )
}

/// `corefarm status --json` as `user`.
fn status(users: &str, user: &str, secret: &Path) -> ClusterStatus {
    serde_json::from_value(support::status_json(users, user, secret, &[])).unwrap()
}

/// `corefarm bench user` as `user` for a short run, one node's worth.
fn bench(users: &str, user: &str, secret: &Path) -> std::process::Child {
    Command::new(BIN)
        .args(["bench", "user", "--server", users, "--user", user])
        .args(["--input-size", "64", "--output-size", "64", "--nodes", "1"])
        .args(["--delay-us", "500", "--duration", "0.6", "--warmup", "0.1"])
        .args(["--reconnect-timeout", "0", "--json", "--secret-file"])
        .arg(secret)
        .env_remove("COREFARM_USER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn ok(out: Output) {
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["ok"], true, "{report}");
}

/// Two named users compute side by side, each with its own secret; an
/// unknown name is refused with the reason; and the node-seconds charged
/// to all users add up to the nodes' busy time (time with at least one
/// message in flight, as the server measures it per node) within 2 %,
/// in either sharing mode.
#[test]
fn named_users_compute_and_their_accounts_add_up_to_the_nodes_busy_time() {
    let dir = tempfile::tempdir().unwrap();
    let auth = private(
        dir.path(),
        "auth.toml",
        &format!(
            "[users.alice]\nsecret = \"{ALICE}\"\nweight = 3\n\
             [users.bob]\nsecret = \"{BOB}\"\nmax_nodes = 1\n\
             [nodes]\nsecret = \"{NODE}\"\n"
        ),
    );
    let alice = private(dir.path(), "alice.secret", ALICE);
    let bob = private(dir.path(), "bob.secret", BOB);
    let node_secret = private(dir.path(), "node.secret", NODE);
    for sharing in ["exclusive", "shared"] {
        let (_srv, nodes, users) =
            support::server(&["--auth-file", auth.to_str().unwrap(), "--sharing", sharing]);
        let (nodes, users) = (nodes.to_string(), users.to_string());
        let _n = [
            node(&nodes, "n1", &node_secret),
            node(&nodes, "n2", &node_secret),
        ];
        support::poll_until(
            "two nodes",
            LIMIT,
            || status(&users, "bob", &bob),
            |s| s.nodes.len() == 2,
        );
        // Alice's name with Bob's secret, and a name the file lacks, are refused.
        for (user, secret, why) in [
            ("mallory", &alice, "unknown user \"mallory\""),
            ("alice", &bob, "secret of user \"alice\""),
        ] {
            let out = bench(&users, user, secret).wait_with_output().unwrap();
            assert!(!out.status.success());
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(why), "{sharing}: {err}");
        }
        let runs = [bench(&users, "alice", &alice), bench(&users, "bob", &bob)];
        for r in runs {
            ok(r.wait_with_output().unwrap());
        }
        let (_, accounts) = accounting(&users, "alice", &alice);
        let get = |u: &str| accounts.iter().find(|a| a.user == u).unwrap().clone();
        let (a, b) = (get("alice"), get("bob"));
        assert_eq!((a.weight, b.max_nodes), (3, Some(1)));
        for x in [&a, &b] {
            assert!(x.node_seconds > 0.0 && x.inputs > 0, "{sharing}: {x:?}");
            assert!(x.bytes_in > 0 && x.bytes_out > 0, "{sharing}: {x:?}");
        }
        // The status sessions are alice's too; bob's bench and status calls.
        assert!(a.sessions >= 2 && b.sessions >= 1, "{a:?} {b:?}");
        let s = status(&users, "alice", &alice);
        let busy: f64 = s.nodes.iter().map(|n| n.busy_seconds).sum();
        let charged: f64 = s.accounts.iter().map(|a| a.node_seconds).sum();
        assert!(busy > 0.2, "{sharing}: the nodes worked {busy} s");
        assert!(
            (charged - busy).abs() <= 0.02 * busy,
            "{sharing}: {charged} node-seconds charged, {busy} busy"
        );
        // Every programming is charged to someone (in shared mode split
        // among the users of the function loaded: both run the same one).
        let programmed: u64 = s.nodes.iter().map(|n| n.reconfigurations).sum();
        let charged: f64 = s.accounts.iter().map(|a| a.reconfigurations).sum();
        assert!(programmed > 0, "{sharing}");
        assert!(
            (charged - programmed as f64).abs() < 0.01 * programmed as f64,
            "{sharing}: {charged} programmings charged, {programmed} made"
        );
    }
}

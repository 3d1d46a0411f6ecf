//! Groups over TLS against the real binaries: `corefarm server` with TLS on
//! its user port (`--tls-ports users`, certificates made here with rcgen)
//! and two `corefarm node` processes with peer ports. A group opened with
//! the CA runs a scatter, an allreduce among the nodes and a gather through
//! TLS; a wrong CA, a wrong name and a plain group are refused with the
//! cause, and the direct path (plain TCP to the members) is refused on a
//! TLS group.
//!
//! The binary is looked up as in real_server.rs; without one the tests are
//! skipped with a notice, and fail under `COREFARM_REQUIRE_TOOLS=1` (CI).

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use corefarm_client::group::{Algorithm, Group, GroupError, GroupOptions};
use corefarm_client::tls::HandshakeError;
use corefarm_client::ClientError;
use corefarm_smp::tls::ClientTls;
use corefarm_smp::{DType, ReduceOp};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// A child process killed (and reaped) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ca.pem` (signed the server's certificate, for localhost and
/// 127.0.0.1), `other-ca.pem`, `server.pem`, `server.key`.
fn pki(dir: &Path) {
    let ca = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        (p.self_signed(&key).unwrap(), key)
    };
    let (ca_cert, ca_key) = ca("corefarm test CA");
    let (other, _) = ca("some other CA");
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .unwrap()
        .signed_by(&key, &ca_cert, &ca_key)
        .unwrap();
    let w = |name: &str, pem: String| std::fs::write(dir.join(name), pem).unwrap();
    w("ca.pem", ca_cert.pem());
    w("other-ca.pem", other.pem());
    w("server.pem", cert.pem());
    w("server.key", key.serialize_pem());
}

/// A server with TLS on its user port and `nodes` node processes (plain
/// node port, each with a peer port): the processes and the user address.
/// `Group::open` waits for the nodes (`--node-wait`), so nothing here does.
fn cluster(bin: &Path, dir: &Path, nodes: usize) -> (Vec<Proc>, String) {
    let pem = dir.join("server.pem");
    let key = dir.join("server.key");
    let mut child = Command::new(bin)
        .args(["server", "--nodes-listen", "127.0.0.1:0"])
        .args(["--users-listen", "127.0.0.1:0", "--node-wait", "30"])
        .arg("--tls-cert")
        .arg(&pem)
        .arg("--tls-key")
        .arg(&key)
        .args(["--tls-ports", "users"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start corefarm server");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut procs = vec![Proc(child)];
    // "listening nodes=IP:PORT users=IP:PORT"
    let line = lines
        .next()
        .and_then(Result::ok)
        .expect("corefarm server prints its addresses");
    std::thread::spawn(move || lines.for_each(drop));
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
            .to_string()
    };
    let (node_port, users) = (field("nodes="), field("users="));
    for i in 0..nodes {
        procs.push(Proc(
            Command::new(bin)
                .args(["node", "--server", &node_port, "--name", &format!("t{i}")])
                .args(["--peer-listen", "127.0.0.1:0"])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start corefarm node"),
        ));
    }
    (procs, users)
}

fn opts(nodes: u32, tls: Option<ClientTls>) -> GroupOptions {
    let mut o = GroupOptions::new(nodes);
    o.tls = tls;
    o.timeout = Duration::from_secs(30);
    o.connect_timeout = Duration::from_secs(30);
    o.model = None;
    o
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
fn a_group_runs_collectives_over_tls_and_refusals_name_the_cause() {
    let Some(bin) = support::binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let (_procs, users) = cluster(&bin, dir.path(), 2);
    let ca = |file: &str, name: Option<&str>| {
        Some(ClientTls::from_ca_file(&dir.path().join(file), name).unwrap())
    };

    // Plain TCP to the TLS port: the server's own words, which say to give the CA.
    let e = Group::open(&users, opts(2, None)).unwrap_err();
    match &e {
        GroupError::Client(ClientError::Server(m)) => {
            assert!(
                m.reason.contains("requires TLS: connect with --tls-ca"),
                "{e}"
            )
        }
        other => panic!("expected the server's refusal, got {other:?}"),
    }

    // A CA that did not sign the server's certificate.
    let e = Group::open(&users, opts(2, ca("other-ca.pem", None))).unwrap_err();
    let GroupError::Client(ClientError::Tls { cause, .. }) = &e else {
        panic!("expected a TLS failure, got {e:?}")
    };
    assert!(matches!(**cause, HandshakeError::Failed(_)), "{cause:?}");
    assert!(
        e.to_string()
            .contains("the server's certificate is not signed by a CA in --tls-ca"),
        "{e}"
    );

    // A name the certificate does not carry: told in words, with the names it does.
    let e = Group::open(&users, opts(2, ca("ca.pem", Some("farm.example")))).unwrap_err();
    let GroupError::Client(ClientError::Tls { cause, .. }) = &e else {
        panic!("expected a TLS failure, got {e:?}")
    };
    assert!(matches!(**cause, HandshakeError::Failed(_)), "{cause:?}");
    let text = e.to_string();
    assert!(
        text.contains("not valid for the name connected to, \"farm.example\"")
            && text.contains("localhost, 127.0.0.1")
            && text.contains("--tls-server-name"),
        "{text}"
    );
    assert!(!text.contains("NotValidForNameContext"), "{text}");

    // With the CA (the address's host, 127.0.0.1, is the name checked).
    let mut g = Group::open(&users, opts(2, ca("ca.pem", None))).expect("a group over TLS");
    assert_eq!(g.size(), 2);
    // 2 × 64 Ki rows of one i64: 1 MiB through TLS to the nodes and back.
    let rows: Vec<i64> = (0..2 * 65536).map(|x| x * 3 - 7).collect();
    let counts = g.scatter_rows("x", DType::I64, &i64s(&rows), 8).unwrap();
    assert_eq!(counts, [65536; 2]);
    g.allreduce("x", "sum", DType::I64, ReduceOp::Sum, Algorithm::Binomial)
        .unwrap();
    let want: Vec<i64> = (0..65536).map(|i| rows[i] + rows[65536 + i]).collect();
    for (r, b) in g.gather("sum").unwrap().iter().enumerate() {
        assert_eq!(from_i64s(b), want, "rank {r}");
    }
    g.barrier(Algorithm::Auto).unwrap();

    // The members' peer ports are plain TCP: no direct path on a TLS group.
    assert!(
        matches!(g.direct(4), Err(GroupError::DirectOverTls)),
        "the direct path must be refused over TLS"
    );
    // The group goes on after the refusal.
    g.barrier(Algorithm::Auto).unwrap();
    g.close().unwrap();

    // The certificate carries "localhost" too: --tls-server-name.
    let g = Group::open(&users, opts(2, ca("ca.pem", Some("localhost"))))
        .expect("a group over TLS with the server name given");
    g.close().unwrap();
}

/// `corefarm` run to completion, without a secret from the environment.
fn run(bin: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin)
        .args(args)
        .env_remove("COREFARM_SECRET")
        .env_remove("COREFARM_SECRET_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("run corefarm")
}

/// The subcommands that open groups take `--tls-ca` as the others do:
/// `bench collectives` (and `model calibrate`, on the same grid) measures
/// through TLS; `bench direct` opens its group and is then refused the
/// direct path with the reason.
#[test]
fn the_commands_that_open_groups_take_tls_ca() {
    let Some(bin) = support::binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let (_procs, users) = cluster(&bin, dir.path(), 2);
    let ca = dir.path().join("ca.pem");
    let ca = ca.to_str().unwrap();

    let out = run(
        &bin,
        &[
            "bench",
            "collectives",
            "--server",
            &users,
            "--tls-ca",
            ca,
            "--nodes",
            "2",
            "--sizes",
            "8,64K",
            "--ops",
            "allreduce,scatter",
            "--algos",
            "binomial",
            "--warmup",
            "0",
            "--min-iters",
            "1",
            "--iters",
            "2",
            "--quiet",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench collectives over TLS failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One point per op and size, each measured through the TLS group.
    assert!(
        text.contains("\"points\"") && text.matches("\"median_us\"").count() == 4,
        "{text}"
    );

    let out = run(
        &bin,
        &[
            "bench", "direct", "--server", &users, "--tls-ca", ca, "--nodes", "2",
        ],
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "bench direct over TLS succeeded");
    assert!(
        e.contains("the direct data path is not available on a group opened over TLS"),
        "{e}"
    );

    // The embedded cluster (no --server) is plain TCP: said before anything starts.
    let out = run(
        &bin,
        &["bench", "collectives", "--tls-ca", ca, "--nodes", "2"],
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("--tls-ca is for --server's cluster"),
        "{e}"
    );
}

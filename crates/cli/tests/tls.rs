//! TLS with the real binaries: `corefarm server --tls-cert/--tls-key`,
//! `corefarm node --tls-ca`, `corefarm bench user --tls-ca` and `corefarm
//! status --tls-ca`, with certificates made by the openssl commands of
//! docs/operations.md. Waits are on the server's status, never on sleeps.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use support::{Proc, BIN};

const LIMIT: Duration = Duration::from_secs(60);

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the TLS test needs the openssl command (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ca.pem` (signed the server's certificate), `other-ca.pem`, `server.pem`, `server.key`.
fn pki(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    for ca in ["ca", "other-ca"] {
        let (subj, key, pem) = (
            format!("/CN={ca}"),
            format!("{ca}.key"),
            format!("{ca}.pem"),
        );
        let args = [&["req", "-x509"][..], &ec, &["-days", "30", "-subj", &subj]]
            .concat()
            .into_iter()
            .chain(["-keyout", &key, "-out", &pem])
            .collect::<Vec<_>>();
        openssl(dir, &args);
    }
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let req = [&["req"][..], &ec, &["-subj", "/CN=corefarm server"]].concat();
    openssl(
        dir,
        &[&req[..], &["-keyout", "server.key", "-out", "server.csr"]].concat(),
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
    );
}

fn run(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env_remove("COREFARM_SECRET")
        .env_remove("COREFARM_SECRET_FILE")
        .output()
        .expect("run corefarm")
}

/// `corefarm status --json` over TLS, until `nodes` nodes are listed.
fn wait_nodes(users: &str, ca: &str, nodes: usize) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let out = run(&["status", "--server", users, "--tls-ca", ca, "--json"]);
        let text = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_str(&text).expect("status JSON");
            if v["nodes"].as_array().map_or(0, |n| n.len()) == nodes {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {nodes} nodes: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn server_nodes_and_users_over_tls_with_the_binaries() {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let (_srv, nodes, users) = support::server(&[
        "--tls-cert",
        &p("server.pem"),
        "--tls-key",
        &p("server.key"),
    ]);
    let (nodes, users) = (nodes.to_string(), users.to_string());
    let _node = Proc(
        Command::new(BIN)
            .args([
                "node",
                "--server",
                &nodes,
                "--count",
                "2",
                "--tls-ca",
                &p("ca.pem"),
            ])
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm node"),
    );
    wait_nodes(&users, &p("ca.pem"), 2);

    let out = run(&[
        "bench",
        "user",
        "--server",
        &users,
        "--tls-ca",
        &p("ca.pem"),
        "--nodes",
        "2",
        "--input-size",
        "65536",
        "--output-size",
        "65536",
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--json",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench user over TLS failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rep: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(rep["ok"], true, "{rep}");
    assert!(
        rep["counts"]["received_messages"].as_u64().unwrap_or(0) > 0,
        "{rep}"
    );

    // Without --tls-ca, with the wrong CA, with the wrong name: each says why.
    let err = |args: &[&str]| {
        let out = run(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = err(&["status", "--server", &users]);
    assert!(e.contains("requires TLS"), "{e}");
    let e = err(&["status", "--server", &users, "--tls-ca", &p("other-ca.pem")]);
    assert!(e.contains("not signed by a CA"), "{e}");
    let e = err(&[
        "status",
        "--server",
        &users,
        "--tls-ca",
        &p("ca.pem"),
        "--tls-server-name",
        "farm.example",
    ]);
    assert!(e.contains("not valid for the name"), "{e}");
    // A --tls-cert without its key is a usage error.
    let e = err(&["server", "--tls-cert", &p("server.pem")]);
    assert!(e.contains("--tls-key"), "{e}");
}

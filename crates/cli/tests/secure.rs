//! Authentication and signed images with the real binaries: `corefarm
//! server --auth-file`, `corefarm node --secret-file / --trust`, `corefarm
//! image keygen / sign / inspect`, and the Rust client with a secret.
//! Waits are on the server's status or on process exit, never on sleeps.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use corefarm_client::{Client, ClientOptions};
use corefarm_smp::auth::Secret;
use corefarm_smp::ClusterStatus;

use crate::support;
use support::{Proc, BIN};

const LIMIT: Duration = Duration::from_secs(60);
const USER: &str = "user-secret-for-the-binary-test";
const NODE: &str = "node-secret-for-the-binary-test";

fn private(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// `corefarm server` on 127.0.0.1 port 0 with `extra`; returns its addresses.
fn server(extra: &[&str]) -> (Proc, String, String) {
    let (p, nodes, users) = support::server(extra);
    (p, nodes.to_string(), users.to_string())
}

fn node(nodes: &str, args: &[&str]) -> Proc {
    Proc(
        Command::new(BIN)
            .args(["node", "--server", nodes])
            .args(args)
            .env_remove("COREFARM_SECRET")
            .env_remove("COREFARM_SECRET_FILE")
            .stderr(Stdio::null())
            .spawn()
            .expect("start corefarm node"),
    )
}

fn opts(secret: Option<&str>, nodes: Option<u32>) -> ClientOptions {
    ClientOptions {
        secret: secret.map(|s| Secret::new(s).unwrap()),
        nodes,
        io_timeout: Some(LIMIT),
        ..ClientOptions::default()
    }
}

/// Polls the server's status (as an observer) until `cond` holds.
fn wait(users: &str, secret: &str, what: &str, cond: impl Fn(&ClusterStatus) -> bool) {
    let c = Client::connect(users, opts(Some(secret), Some(0))).unwrap();
    support::poll_until(what, LIMIT, || c.status().unwrap(), cond);
}

/// Waits for a process to exit (on a thread: `Child::wait` has no timeout).
fn exits(mut p: Proc) -> std::process::ExitStatus {
    let (tx, rx) = mpsc::channel();
    let child_wait = std::thread::spawn(move || {
        let st = p.0.wait().unwrap();
        let _ = tx.send(st);
        p
    });
    let st = rx.recv_timeout(LIMIT).expect("the process exits");
    drop(child_wait.join());
    st
}

#[test]
fn an_auth_file_admits_only_peers_with_their_roles_secret() {
    let dir = tempfile::tempdir().unwrap();
    let auth = private(
        dir.path(),
        "auth.toml",
        &format!("[users]\nsecret = \"{USER}\"\n[nodes]\nsecret = \"{NODE}\"\n"),
    );
    let user_file = private(dir.path(), "user.secret", &format!("{USER}\n"));
    let node_file = private(dir.path(), "node.secret", &format!("{NODE}\n"));

    // A world-readable auth file is refused outright.
    let open = dir.path().join("open.toml");
    std::fs::copy(&auth, &open).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(BIN)
        .args(["server", "--auth-file"])
        .arg(&open)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 600"));

    let (_srv, nodes, users) = server(&["--auth-file", auth.to_str().unwrap()]);
    let _good = node(
        &nodes,
        &[
            "--name",
            "good",
            "--secret-file",
            node_file.to_str().unwrap(),
        ],
    );
    wait(&users, USER, "the node with the node secret", |s| {
        s.nodes.iter().any(|n| n.name.as_deref() == Some("good"))
    });

    // A node holding the user secret, or none, is refused; with --once it exits.
    let as_user = node(
        &nodes,
        &[
            "--once",
            "--name",
            "thief",
            "--secret-file",
            user_file.to_str().unwrap(),
        ],
    );
    exits(as_user);
    let none = node(&nodes, &["--once", "--name", "nosecret"]);
    exits(none);

    // A user with the right secret computes; wrong or no secret hear why.
    let c = Client::connect(&users, opts(Some(USER), None)).unwrap();
    assert_eq!(c.nodes(), Some(1), "only the good node joined");
    c.configure_benchmark(16, 16, 0).unwrap();
    let id = c.submit(Bytes::from(vec![3u8; 16])).unwrap();
    let r = c.recv(Some(LIMIT)).unwrap();
    assert_eq!((r.id, &r.data[..]), (id, &[3u8; 16][..]));
    c.close();

    let e = Client::connect(&users, opts(Some(NODE), None))
        .unwrap_err()
        .to_string();
    assert!(e.contains("user secret"), "{e}");
    let e = Client::connect(&users, opts(None, None))
        .unwrap_err()
        .to_string();
    assert!(e.contains("requires authentication"), "{e}");
    // `corefarm status` takes the secret from a file.
    let out = Command::new(BIN)
        .args(["status", "--json", "--server", &users, "--secret-file"])
        .arg(&user_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: ClusterStatus = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s.nodes.len(), 1);
    assert_eq!(s.nodes[0].name.as_deref(), Some("good"));
    // So does the benchmarking user.
    let out = Command::new(BIN)
        .args(["bench", "user", "--server", &users, "--input-size", "64"])
        .args([
            "--output-size",
            "64",
            "--duration",
            "0.3",
            "--warmup",
            "0.1",
        ])
        .args(["--json", "--secret-file"])
        .arg(&user_file)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["ok"], true, "{report}");
}

fn cli(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "corefarm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_trusting_node_runs_only_images_signed_by_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let image = support::hls_image(dir.path(), "vadd/vadd.cpp", &["--entry", "vadd"]);
    let unsigned = d("unsigned.cfimg");
    std::fs::write(&unsigned, &image).unwrap();
    let ops_pub = cli(&["image", "keygen", "-o", &d("ops.key")]);
    cli(&["image", "keygen", "-o", &d("other.key")]);
    let signed = d("signed.cfimg");
    cli(&[
        "image",
        "sign",
        &unsigned,
        "--key",
        &d("ops.key"),
        "-o",
        &signed,
    ]);
    let other = d("other.cfimg");
    cli(&[
        "image",
        "sign",
        &unsigned,
        "--key",
        &d("other.key"),
        "-o",
        &other,
    ]);
    let shown = cli(&["image", "inspect", &signed]);
    assert!(
        shown.contains(&format!("ed25519 key {} (valid)", ops_pub.trim())),
        "{shown}"
    );
    assert!(cli(&["image", "inspect", &unsigned]).contains("unsigned"));
    // One artifact byte changed after signing.
    let mut bytes = std::fs::read(&signed).unwrap();
    let at = image.len() - 10;
    bytes[at] ^= 0x40;
    let tampered = d("tampered.cfimg");
    std::fs::write(&tampered, &bytes).unwrap();

    let (_srv, nodes, users) = server(&[]);
    let _n = node(&nodes, &["--name", "strict", "--trust", &d("ops.key.pub")]);
    let observer = Client::connect(&users, opts(None, Some(0))).unwrap();
    let deadline = Instant::now() + LIMIT;
    // Named once its hello is through: from then on it can explain refusals.
    let named = |s: ClusterStatus| s.nodes.iter().any(|n| n.name.as_deref() == Some("strict"));
    while !named(observer.status().unwrap()) {
        assert!(Instant::now() < deadline, "the node never said hello");
        std::thread::sleep(Duration::from_millis(20));
    }

    let configure = |file: &str| -> Result<Client, String> {
        let c = Client::connect(&users, opts(None, Some(1))).unwrap();
        let img = Bytes::from(std::fs::read(file).unwrap());
        let cfg = corefarm_cores::image::configuration(img).map_err(|e| e.to_string())?;
        c.configure(&cfg).map_err(|e| e.to_string())?;
        Ok(c)
    };
    for (file, why) in [
        (&unsigned, "unsigned"),
        (&other, "does not trust"),
        (&tampered, "tampered artifact"),
    ] {
        let e = configure(file)
            .err()
            .unwrap_or_else(|| panic!("{file} was accepted"));
        assert!(e.contains(why), "{file}: {e}");
    }
    let c = configure(&signed).expect("the signed image loads");
    let mut input = vec![1u8; 1024];
    input.extend(vec![2u8; 1024]);
    let id = c.submit(Bytes::from(input)).unwrap();
    let r = c.recv(Some(LIMIT)).unwrap();
    assert_eq!((r.id, &r.data[..]), (id, &[3u8; 1024][..]));
}

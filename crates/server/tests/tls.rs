//! TLS on the server's ports (`--tls-cert`, `--tls-key`): real node
//! managers and real clients compute over it (with the auth challenge on
//! top), and every way of getting it wrong fails with a reason.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{bench, opts, start, TestServer, LIMIT};
use corefarm_client::{Client, ClientError, ClientOptions};
use corefarm_server::auth::AuthConfig;
use corefarm_server::tls::{ServerTls, TlsPorts};
use corefarm_server::ServerOptions;
use corefarm_smp::auth::Secret;
use corefarm_smp::tls::ClientTls;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const USER: &str = "user-secret-for-tls-tests-01";
const NODE: &str = "node-secret-for-tls-tests-02";

/// A CA, a server certificate it signed (for `localhost` and 127.0.0.1),
/// and an unrelated CA, as PEM files.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
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
        let p = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
        let cert = p.signed_by(&key, &ca_cert, &ca_key).unwrap();
        let w = |name: &str, pem: String| std::fs::write(dir.path().join(name), pem).unwrap();
        w("ca.pem", ca_cert.pem());
        w("other-ca.pem", other.pem());
        w("server.pem", cert.pem());
        w("server.key", key.serialize_pem());
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn server(&self, ports: TlsPorts) -> ServerTls {
        ServerTls::load(&self.path("server.pem"), &self.path("server.key"), ports).unwrap()
    }

    fn client(&self, ca: &str, name: Option<&str>) -> ClientTls {
        ClientTls::from_ca_file(&self.path(ca), name).unwrap()
    }
}

fn secret(s: &str) -> Secret {
    Secret::new(s).unwrap()
}

fn tls_opts(pki: &Pki, ports: TlsPorts) -> ServerOptions {
    ServerOptions {
        tls: Some(pki.server(ports)),
        auth: Some(Arc::new(
            AuthConfig::new(secret(USER), secret(NODE)).unwrap(),
        )),
        read_timeout: Duration::from_millis(500),
        ..opts()
    }
}

/// A real node manager; `Err` is how its single session ended.
fn node(
    srv: &TestServer,
    tls: Option<ClientTls>,
) -> (
    tokio::task::JoinHandle<Result<(), corefarm_node::NodeError>>,
    tokio_util::sync::DropGuard,
) {
    let stop = CancellationToken::new();
    let o = corefarm_node::NodeOptions {
        server: srv.nodes.to_string(),
        name: "tls-node".into(),
        secret: Some(secret(NODE)),
        reconnect: false,
        peer_listen: None,
        tls,
        ..Default::default()
    };
    (
        tokio::spawn(corefarm_node::run(o, stop.clone())),
        stop.drop_guard(),
    )
}

fn user_opts(tls: Option<ClientTls>) -> ClientOptions {
    ClientOptions {
        secret: Some(secret(USER)),
        connect_timeout: Some(LIMIT),
        io_timeout: Some(LIMIT),
        tls,
        ..Default::default()
    }
}

/// Connects a blocking client off the runtime's threads.
async fn connect(addr: String, o: ClientOptions) -> Result<Client, ClientError> {
    tokio::task::spawn_blocking(move || Client::connect(&addr, o))
        .await
        .unwrap()
}

const INPUT: usize = 256 << 10;

/// `inputs` inputs per message, each starting with its own 16 bytes.
fn message(k: u32, inputs: usize) -> Bytes {
    let mut b = vec![0xA5u8; inputs * INPUT];
    for (i, chunk) in b.chunks_mut(INPUT).enumerate() {
        chunk[..4].copy_from_slice(&k.to_le_bytes());
        chunk[4..8].copy_from_slice(&(i as u32).to_le_bytes());
        chunk[8..16].copy_from_slice(b"corefarm");
    }
    b.into()
}

/// Submits messages of 1 to 4 inputs (up to 1 MiB) and checks every
/// echoed input header, in both directions through TLS.
fn compute(c: &Client) {
    c.configure(&bench(INPUT as u32, INPUT as u32)).unwrap();
    let mut sent = std::collections::HashMap::new();
    for k in 0..12u32 {
        let inputs = 1 + (k as usize % 4);
        let id = c.submit(message(k, inputs)).unwrap();
        sent.insert(id, (k, inputs));
    }
    for _ in 0..sent.len() {
        let out = c.recv(Some(LIMIT)).unwrap();
        let (k, inputs) = sent
            .remove(&out.id)
            .expect("a result for a message sent once");
        assert_eq!(out.data.len(), inputs * INPUT);
        for (i, chunk) in out.data.chunks(INPUT).enumerate() {
            let want = message(k, inputs);
            assert_eq!(
                &chunk[..16],
                &want[i * INPUT..i * INPUT + 16],
                "message {k} input {i}"
            );
            assert!(chunk[16..].iter().all(|&b| b == 0));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_and_users_compute_over_tls_with_authentication() {
    let pki = Pki::new();
    let srv = start(tls_opts(&pki, TlsPorts::Both)).await;
    let (_task, _n) = node(&srv, Some(pki.client("ca.pem", None)));
    srv.wait_free_nodes(1).await;
    // The address's host (127.0.0.1) is the name checked by default.
    let c = connect(
        srv.users.to_string(),
        user_opts(Some(pki.client("ca.pem", None))),
    )
    .await
    .unwrap();
    // "localhost" is in the certificate too: --tls-server-name.
    let c2 = connect(
        srv.users.to_string(),
        user_opts(Some(pki.client("ca.pem", Some("localhost")))),
    )
    .await
    .unwrap();
    drop(c2);
    tokio::task::spawn_blocking(move || compute(&c))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_the_user_port_only_leaves_nodes_plain() {
    let pki = Pki::new();
    let srv = start(tls_opts(&pki, TlsPorts::Users)).await;
    let (_task, _n) = node(&srv, None);
    srv.wait_free_nodes(1).await;
    let c = connect(
        srv.users.to_string(),
        user_opts(Some(pki.client("ca.pem", None))),
    )
    .await
    .unwrap();
    tokio::task::spawn_blocking(move || compute(&c))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_mode_sessions_compute_over_tls() {
    let pki = Pki::new();
    let srv = start(ServerOptions {
        sharing: corefarm_server::Sharing::Shared,
        ..tls_opts(&pki, TlsPorts::Both)
    })
    .await;
    let (_task, _n) = node(&srv, Some(pki.client("ca.pem", None)));
    srv.wait_status("the node", |s| s.nodes.len() == 1).await;
    let c = connect(
        srv.users.to_string(),
        user_opts(Some(pki.client("ca.pem", None))),
    )
    .await
    .unwrap();
    tokio::task::spawn_blocking(move || compute(&c))
        .await
        .unwrap();
}

fn tls_error(r: Result<Client, ClientError>) -> String {
    match r {
        Err(e @ ClientError::Tls { .. }) => e.to_string(),
        Err(e) => panic!("expected a TLS error, got {e}"),
        Ok(_) => panic!("connected"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mismatch_fails_with_its_reason_and_the_server_carries_on() {
    let pki = Pki::new();
    let srv = start(tls_opts(&pki, TlsPorts::Both)).await;
    let users = srv.users.to_string();

    // A plain client on the TLS port: the server says so in SMP.
    match connect(users.clone(), user_opts(None)).await {
        Err(ClientError::Server(e)) => assert!(e.reason.contains("requires TLS"), "{e}"),
        Err(e) => panic!("expected the server's reason, got {e}"),
        Ok(_) => panic!("a plain client connected to a TLS port"),
    }
    // A CA that did not sign the server's certificate.
    let e = tls_error(
        connect(
            users.clone(),
            user_opts(Some(pki.client("other-ca.pem", None))),
        )
        .await,
    );
    assert!(e.contains("not signed by a CA in --tls-ca"), "{e}");
    // A name the certificate does not carry.
    let wrong_name = pki.client("ca.pem", Some("farm.example"));
    let e = tls_error(connect(users.clone(), user_opts(Some(wrong_name))).await);
    assert!(e.contains("not valid for the name"), "{e}");
    // In words, with the names the certificate carries: no debug text.
    assert!(e.contains("\"farm.example\": it is for "), "{e}");
    assert!(!e.contains("NotValidForNameContext"), "{e}");
    // A node with the wrong CA: its session ends with the reason.
    let (task, _n) = node(&srv, Some(pki.client("other-ca.pem", None)));
    let e = tokio::time::timeout(LIMIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(matches!(e, corefarm_node::NodeError::Tls { .. }), "{e}");
    assert!(e.to_string().contains("not signed by a CA"), "{e}");

    // A peer that starts a handshake and stalls is closed at the deadline.
    let mut stall = tokio::net::TcpStream::connect(srv.users).await.unwrap();
    stall.write_all(&[0x16, 0x03]).await.unwrap();
    let mut b = [0u8; 64];
    let n = tokio::time::timeout(LIMIT, stall.read(&mut b))
        .await
        .unwrap();
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "the stalled handshake got an answer: {n:?}"
    );

    // Still serving: a good node and user compute.
    let (_task, _n) = node(&srv, Some(pki.client("ca.pem", None)));
    srv.wait_free_nodes(1).await;
    let c = connect(users, user_opts(Some(pki.client("ca.pem", None))))
        .await
        .unwrap();
    tokio::task::spawn_blocking(move || compute(&c))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_on_a_plain_port_is_told_to_drop_tls() {
    let pki = Pki::new();
    // The server recognises the ClientHello's record header and ends the
    // connection at once, not at its read deadline (an hour here: only the
    // recognition can end the wait inside LIMIT); the peers name the cause.
    let srv = start(ServerOptions {
        read_timeout: Duration::from_secs(3600),
        ..opts()
    })
    .await;
    let patient = ClientOptions {
        io_timeout: Some(Duration::from_secs(3600)),
        ..user_opts(Some(pki.client("ca.pem", None)))
    };
    let user = connect(srv.users.to_string(), patient);
    let e = tls_error(
        tokio::time::timeout(LIMIT, user)
            .await
            .expect("the plain port answers a TLS client before its read deadline"),
    );
    assert!(e.contains("plain TCP"), "{e}");
    let (task, _n) = node(&srv, Some(pki.client("ca.pem", None)));
    let e = tokio::time::timeout(LIMIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("plain TCP"), "{e}");
}

#[test]
fn bad_certificate_files_are_refused_with_their_path() {
    let pki = Pki::new();
    let e = ServerTls::load(
        &pki.path("missing.pem"),
        &pki.path("server.key"),
        TlsPorts::Both,
    )
    .unwrap_err();
    assert!(
        matches!(&e, corefarm_smp::tls::TlsError::Certificates { path, .. } if path.ends_with("missing.pem")),
        "{e}"
    );
    // The path is in the text the operator reads.
    assert!(e.to_string().contains("missing.pem"), "{e}");
    // A key that does not match the certificate.
    let other = KeyPair::generate().unwrap();
    std::fs::write(pki.path("other.key"), other.serialize_pem()).unwrap();
    let e = ServerTls::load(
        &pki.path("server.pem"),
        &pki.path("other.key"),
        TlsPorts::Both,
    );
    assert!(
        matches!(e, Err(corefarm_smp::tls::TlsError::Unusable { .. })),
        "a mismatched key was accepted or refused for another reason"
    );
    let e = ClientTls::from_ca_file(Path::new("/nonexistent/ca.pem"), None).unwrap_err();
    assert!(
        matches!(&e, corefarm_smp::tls::TlsError::Certificates { path, .. } if path.ends_with("ca.pem")),
        "{e:?}"
    );
}

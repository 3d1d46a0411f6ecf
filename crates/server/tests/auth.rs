//! `--auth-file`: hello peers answer a fresh challenge with their role's
//! secret; wrong secrets, replayed answers, swapped roles and (by default)
//! seed-format peers are refused with a reason.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{bench, opts, start, FakeUser, TestServer, LIMIT};
use corefarm_server::auth::AuthConfig;
use corefarm_server::ServerOptions;
use corefarm_smp::auth::{AuthChallenge, AuthResponse, Secret};
use corefarm_smp::{hello::features, Data, ErrorCode, ErrorMsg, Frame, Hello, MsgType};
use tokio_util::sync::CancellationToken;

const USER: &str = "user-secret-for-tests-0123";
const NODE: &str = "node-secret-for-tests-4567";

fn secret(s: &str) -> Secret {
    Secret::new(s).unwrap()
}

fn with_auth(allow_legacy: bool) -> ServerOptions {
    ServerOptions {
        auth: Some(Arc::new(
            AuthConfig::new(secret(USER), secret(NODE)).unwrap(),
        )),
        allow_legacy,
        ..opts()
    }
}

/// A real node manager holding `key`; stopped when the token is dropped.
fn node(srv: &TestServer, key: Option<&str>) -> tokio_util::sync::DropGuard {
    let stop = CancellationToken::new();
    let o = corefarm_node::NodeOptions {
        server: srv.nodes.to_string(),
        name: "authed".into(),
        secret: key.map(secret),
        reconnect: false,
        peer_listen: None,
        ..Default::default()
    };
    tokio::spawn(corefarm_node::run(o, stop.clone()));
    stop.drop_guard()
}

fn hello(role: &str) -> Hello {
    let mut h = Hello::new(role);
    h.name = Some("test".into());
    h.features = vec![features::ERROR.into(), features::AUTH.into()];
    h
}

/// Sends `h` on `addr`, expects a challenge; returns the connection and the challenge.
async fn challenged(addr: std::net::SocketAddr, h: &Hello) -> (FakeUser, AuthChallenge) {
    let mut c = FakeUser::connect(addr).await;
    c.send(h.to_frame()).await;
    let f = c.recv().await.expect("a challenge");
    assert_eq!(f.ty, MsgType::AuthChallenge, "expected a challenge");
    (c, AuthChallenge::parse(&f.payload).unwrap())
}

/// The refusal a hello peer with the error feature hears, then the close.
async fn refused(c: &mut FakeUser) -> ErrorMsg {
    let f: Frame = c.recv().await.expect("an error");
    assert_eq!(f.ty, MsgType::Error, "expected a refusal, got {:?}", f.ty);
    let e = ErrorMsg::parse(&f.payload).unwrap();
    assert_eq!(e.code, ErrorCode::Unauthorized as u32, "{e}");
    c.closed().await;
    e
}

#[tokio::test]
async fn authenticated_node_and_user_compute() {
    let srv = start(with_auth(false)).await;
    let _n = node(&srv, Some(NODE));
    srv.wait_free_nodes(1).await;

    let h = hello("user");
    let (mut u, ch) = challenged(srv.users, &h).await;
    let answer = AuthResponse::answer(&secret(USER), &ch, "user", &h.encode());
    u.send(answer.to_frame()).await;
    let f = u.recv().await.unwrap();
    assert_eq!(f.ty, MsgType::Hello);
    assert_eq!(Hello::decode(&f.payload).unwrap().nodes, Some(1));
    assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
    let input = Data {
        id: 7,
        data: vec![5u8; 16].into(),
    };
    u.send(input.to_frame().unwrap()).await;
    let r = u.recv_skip_credit().await.unwrap();
    assert_eq!(r.ty, MsgType::Data);
    let d = Data::parse(r.payload).unwrap();
    assert_eq!((d.id, &d.data[..]), (7, &[5u8; 16][..]));
}

#[tokio::test]
async fn wrong_secret_is_refused_for_users_and_nodes() {
    let srv = start(with_auth(false)).await;
    let h = hello("user");
    let (mut u, ch) = challenged(srv.users, &h).await;
    let wrong = secret("not-the-user-secret-000");
    u.send(AuthResponse::answer(&wrong, &ch, "user", &h.encode()).to_frame())
        .await;
    let e = refused(&mut u).await;
    assert!(e.reason.contains("user secret"), "{e}");

    let h = hello("node");
    let (mut n, ch) = challenged(srv.nodes, &h).await;
    n.send(AuthResponse::answer(&wrong, &ch, "node", &h.encode()).to_frame())
        .await;
    refused(&mut n).await;
    // A real node manager with the wrong secret never joins the pool either:
    // its session ends with the server's refusal.
    let stop = CancellationToken::new();
    let o = corefarm_node::NodeOptions {
        server: srv.nodes.to_string(),
        secret: Some(wrong),
        reconnect: false,
        peer_listen: None,
        ..Default::default()
    };
    let _ = tokio::time::timeout(LIMIT, corefarm_node::run(o, stop))
        .await
        .expect("the node's session ends");
    assert!(srv.status.get().nodes.is_empty());
}

#[tokio::test]
async fn a_replayed_response_fails() {
    let srv = start(with_auth(false)).await;
    let h = hello("user");
    let (mut first, ch) = challenged(srv.users, &h).await;
    let recorded = AuthResponse::answer(&secret(USER), &ch, "user", &h.encode());
    first.send(recorded.to_frame()).await;
    assert_eq!(first.recv().await.unwrap().ty, MsgType::Hello);

    // Same hello, same answer, new connection: a new nonce, so it fails.
    let (mut second, ch2) = challenged(srv.users, &h).await;
    assert_ne!(ch.nonce, ch2.nonce);
    second.send(recorded.to_frame()).await;
    refused(&mut second).await;
}

#[tokio::test]
async fn a_secret_only_speaks_for_its_own_role() {
    let srv = start(with_auth(false)).await;
    // A user secret cannot register a node...
    let h = hello("node");
    let (mut n, ch) = challenged(srv.nodes, &h).await;
    n.send(AuthResponse::answer(&secret(USER), &ch, "node", &h.encode()).to_frame())
        .await;
    assert!(refused(&mut n).await.reason.contains("node secret"));
    // ...and a node secret cannot submit work.
    let h = hello("user");
    let (mut u, ch) = challenged(srv.users, &h).await;
    u.send(AuthResponse::answer(&secret(NODE), &ch, "user", &h.encode()).to_frame())
        .await;
    refused(&mut u).await;
    // A node that says it is a user is turned away before any challenge.
    let mut c = FakeUser::connect(srv.users).await;
    c.send(hello("node").to_frame()).await;
    assert!(refused(&mut c).await.reason.contains("role \"node\""));
    assert!(srv.status.get().nodes.is_empty());
}

#[tokio::test]
async fn a_hello_without_a_secret_is_told_what_is_missing() {
    let srv = start(with_auth(false)).await;
    let (mut u, f) = FakeUser::hello_with(srv.users, "nosecret", None, &[features::ERROR]).await;
    assert_eq!(f.ty, MsgType::Error);
    let e = ErrorMsg::parse(&f.payload).unwrap();
    assert!(e.reason.contains("requires authentication"), "{e}");
    u.closed().await;
}

#[tokio::test]
async fn seed_format_peers_are_refused_unless_allowed() {
    let srv = start(ServerOptions {
        read_timeout: Duration::from_millis(300),
        ..with_auth(false)
    })
    .await;
    // A seed user hears "no" the only way it can: a failed configuration.
    let mut seed = FakeUser::connect(srv.users).await;
    let (status, errors) = seed.configure(&bench(16, 16)).await;
    assert!(status != 0 && errors.is_empty());
    seed.closed().await;
    // A seed node (silent until configured) is closed, never pooled.
    let mut silent = FakeUser::connect(srv.nodes).await;
    silent.closed().await;
    assert!(srv.status.get().nodes.is_empty());
    drop(srv);

    let srv = start(with_auth(true)).await;
    let stop = CancellationToken::new();
    let o = corefarm_node::NodeOptions {
        server: srv.nodes.to_string(),
        hello: false,
        reconnect: false,
        peer_listen: None,
        ..Default::default()
    };
    tokio::spawn(corefarm_node::run(o, stop.clone()));
    let _stop = stop.drop_guard();
    srv.wait_free_nodes(1).await;
    let mut seed = FakeUser::connect(srv.users).await;
    assert_eq!(seed.configure(&bench(16, 16)).await.0, 0);
    let input = Data {
        id: 1,
        data: vec![9u8; 16].into(),
    };
    seed.send(input.to_frame().unwrap()).await;
    let r = seed.recv().await.unwrap();
    assert_eq!(Data::parse(r.payload).unwrap().data[..], [9u8; 16]);
}

#[tokio::test]
async fn a_peer_that_never_answers_the_challenge_is_closed() {
    let srv = start(ServerOptions {
        read_timeout: Duration::from_millis(300),
        ..with_auth(false)
    })
    .await;
    let (mut u, _) = challenged(srv.users, &hello("user")).await;
    u.closed().await;
    // An answer of the wrong size is refused with the reason.
    let (mut u, _) = challenged(srv.users, &hello("user")).await;
    u.send_raw(&[0x17, 0, 0, 0, 3, 0, 0, 0, 1, 2, 3]).await;
    assert!(refused(&mut u).await.reason.contains("3 bytes"));
    assert!(srv.status.get().users.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_user_answers_the_challenge_too() {
    use corefarm_client::group::{Algorithm, Group, GroupOptions};
    let srv = start(with_auth(false)).await;
    let stop = CancellationToken::new();
    let o = corefarm_node::NodeOptions {
        server: srv.nodes.to_string(),
        name: "member".into(),
        secret: Some(secret(NODE)),
        reconnect: false,
        peer_listen: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
        ..Default::default()
    };
    tokio::spawn(corefarm_node::run(o, stop.clone()));
    let _stop = stop.drop_guard();
    srv.wait_free_nodes(1).await;
    let users = srv.users.to_string();
    let call = tokio::task::spawn_blocking(move || {
        let e = Group::open(&users, GroupOptions::new(1)).unwrap_err();
        assert!(e.to_string().contains("user secret"), "{e}");
        let mut o = GroupOptions::new(1);
        o.secret = Some(secret(USER));
        let mut g = Group::open(&users, o).expect("a group with the secret");
        g.barrier(Algorithm::Binomial).expect("a barrier");
    });
    tokio::time::timeout(LIMIT, call)
        .await
        .expect("the group calls returned")
        .unwrap();
}

#[tokio::test]
async fn peers_without_a_secret_hold_at_most_a_share_of_the_slots() {
    // 8 user slots: at most 2 connections on their way in at once. Two
    // peers that never answer the challenge hold those; a third is refused
    // with the reason; once they leave, a user with the secret gets in.
    let srv = start(ServerOptions {
        max_users: 8,
        ..with_auth(false)
    })
    .await;
    let h = hello("user");
    // Challenged (so on their way in), and never answering.
    let silent = [
        challenged(srv.users, &h).await.0,
        challenged(srv.users, &h).await.0,
    ];
    let mut third = FakeUser::connect(srv.users).await;
    third.send(h.to_frame()).await;
    let f = third.recv().await.expect("a refusal");
    assert_eq!(f.ty, MsgType::Error);
    let e = ErrorMsg::parse(&f.payload).unwrap();
    assert!(
        e.reason
            .contains("still in their TLS handshake or authentication"),
        "{e}"
    );
    drop(silent);
    // Their ends free the two places (the server sees the close).
    let mut tries = 0;
    let (mut u, ch) = loop {
        let mut c = FakeUser::connect(srv.users).await;
        c.send(h.to_frame()).await;
        let f = c.recv().await.expect("an answer");
        if f.ty == MsgType::AuthChallenge {
            break (c, AuthChallenge::parse(&f.payload).unwrap());
        }
        tries += 1;
        assert!(tries < 200, "the places were never freed");
        tokio::task::yield_now().await;
    };
    let answer = AuthResponse::answer(&secret(USER), &ch, "user", &h.encode());
    u.send(answer.to_frame()).await;
    assert_eq!(u.recv().await.unwrap().ty, MsgType::Hello);
}

const ALICE: &str = "alice-secret-for-tests-89ab";

/// The shared user secret, and a named user `alice` of weight 3.
fn with_alice() -> ServerOptions {
    let mut a = AuthConfig::new(secret(USER), secret(NODE)).unwrap();
    let limits = corefarm_server::auth::Limits {
        weight: 3,
        ..Default::default()
    };
    a.add_user("alice", secret(ALICE), limits).unwrap();
    ServerOptions {
        auth: Some(Arc::new(a)),
        ..opts()
    }
}

fn hello_as(user: &str) -> Hello {
    let mut h = hello("user");
    h.user = Some(user.into());
    h
}

#[tokio::test]
async fn a_named_user_proves_its_own_secret_and_its_session_acts_for_it() {
    let srv = start(with_alice()).await;
    // Alice's account exists before she ever connects.
    assert_eq!(srv.status.get().account("alice").unwrap().sessions, 0);
    let h = hello_as("alice");
    let (mut u, ch) = challenged(srv.users, &h).await;
    u.send(AuthResponse::answer(&secret(ALICE), &ch, "user", &h.encode()).to_frame())
        .await;
    assert_eq!(u.recv().await.unwrap().ty, MsgType::Hello);
    let s = srv.status.get();
    assert_eq!(s.users.len(), 1);
    assert_eq!(s.users[0].account.as_deref(), Some("alice"));
    let a = s.account("alice").unwrap();
    assert_eq!((a.weight, a.sessions, a.active), (3, 1, 1));

    // The shared secret still admits users that name none: the anonymous tenant.
    let h = hello("user");
    let (mut anon, ch) = challenged(srv.users, &h).await;
    anon.send(AuthResponse::answer(&secret(USER), &ch, "user", &h.encode()).to_frame())
        .await;
    assert_eq!(anon.recv().await.unwrap().ty, MsgType::Hello);
    assert_eq!(srv.status.get().account("anonymous").unwrap().active, 1);
}

#[tokio::test]
async fn unknown_users_and_wrong_user_secrets_are_refused_by_name() {
    let srv = start(with_alice()).await;
    let h = hello_as("mallory");
    let (mut m, ch) = challenged(srv.users, &h).await;
    m.send(AuthResponse::answer(&secret(ALICE), &ch, "user", &h.encode()).to_frame())
        .await;
    let e = refused(&mut m).await;
    assert!(e.reason.contains("unknown user \"mallory\""), "{e}");
    // Alice with the shared secret instead of her own.
    let h = hello_as("alice");
    let (mut a, ch) = challenged(srv.users, &h).await;
    a.send(AuthResponse::answer(&secret(USER), &ch, "user", &h.encode()).to_frame())
        .await;
    let e = refused(&mut a).await;
    assert!(e.reason.contains("secret of user \"alice\""), "{e}");
    // An answer made for alice's hello does not pass for another's.
    let h = hello_as("alice");
    let (mut b, ch) = challenged(srv.users, &h).await;
    let forged = hello("user");
    b.send(AuthResponse::answer(&secret(ALICE), &ch, "user", &forged.encode()).to_frame())
        .await;
    refused(&mut b).await;
    let s = srv.status.get();
    assert!(s.users.is_empty());
    assert_eq!(s.account("alice").unwrap().sessions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_names_its_user() {
    use corefarm_client::{Client, ClientError, ClientOptions};
    let srv = start(with_alice()).await;
    let users = srv.users.to_string();
    let status = srv.status.clone();
    let call = tokio::task::spawn_blocking(move || {
        let o = |user: &str, key: &str| ClientOptions {
            user: Some(user.into()),
            secret: Some(secret(key)),
            nodes: Some(0),
            reconnect_timeout: None,
            ..Default::default()
        };
        let c = Client::connect(&users, o("alice", ALICE)).expect("alice with her secret");
        let me = c.status().unwrap();
        let you = me.you.and_then(|id| me.user(id)).unwrap();
        assert_eq!(you.account.as_deref(), Some("alice"));
        c.close();
        for (user, key, why) in [
            ("bob", ALICE, "unknown user \"bob\""),
            ("alice", USER, "secret of user \"alice\""),
        ] {
            match Client::connect(&users, o(user, key)) {
                Err(ClientError::Server(e)) => {
                    assert_eq!(e.code, ErrorCode::Unauthorized as u32, "{e}");
                    assert!(e.reason.contains(why), "{e}");
                }
                Err(e) => panic!("expected the server's refusal, got {e}"),
                Ok(_) => panic!("{user} admitted with the wrong secret"),
            }
        }
        assert_eq!(status.get().account("alice").unwrap().sessions, 1);
    });
    tokio::time::timeout(LIMIT, call)
        .await
        .expect("the client calls returned")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_nodes_caps_the_nodes_a_user_holds_in_exclusive_mode() {
    use corefarm_client::{Client, ClientOptions};
    let mut a = AuthConfig::new(secret(USER), secret(NODE)).unwrap();
    let limits = corefarm_server::auth::Limits {
        max_nodes: Some(1),
        ..Default::default()
    };
    a.add_user("bob", secret(ALICE), limits).unwrap();
    let srv = start(ServerOptions {
        auth: Some(Arc::new(a)),
        ..opts()
    })
    .await;
    let _n = [node(&srv, Some(NODE)), node(&srv, Some(NODE))];
    srv.wait_free_nodes(2).await;
    let users = srv.users.to_string();
    let call = tokio::task::spawn_blocking(move || {
        let o = || ClientOptions {
            user: Some("bob".into()),
            secret: Some(secret(ALICE)),
            reconnect_timeout: None,
            ..Default::default()
        };
        // Every free node asked for, one given.
        let first = Client::connect(&users, o()).unwrap();
        assert_eq!(first.nodes(), Some(1));
        first.configure_benchmark(16, 16, 0).unwrap();
        // A second session of bob's finds the limit reached, and is told so.
        let second = Client::connect(&users, o()).unwrap();
        assert_eq!(second.nodes(), Some(0));
        let e = second
            .configure_benchmark(16, 16, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_nodes = 1"), "{e}");
        // The anonymous user takes the other node.
        let anon = ClientOptions {
            secret: Some(secret(USER)),
            reconnect_timeout: None,
            ..Default::default()
        };
        assert_eq!(Client::connect(&users, anon).unwrap().nodes(), Some(1));
    });
    tokio::time::timeout(LIMIT, call)
        .await
        .expect("the client calls returned")
        .unwrap();
}

/// `max_queued_bytes` (3000 here), in either sharing mode: an input that
/// alone exceeds it is refused by id with the limit named, and the session
/// goes on; one that fits only once earlier inputs are answered is read
/// but not queued, and nothing more is read, until an answer makes room.
/// The runtime has one thread, so once the status shows the input read,
/// the session has decided what to do with it.
#[tokio::test]
async fn max_queued_bytes_holds_a_users_unanswered_inputs_within_the_limit() {
    use common::{Behaviour, FakeNode};
    use corefarm_server::Sharing;
    const MAX: u64 = 3000;
    for sharing in [Sharing::Exclusive, Sharing::Shared] {
        let mut a = AuthConfig::new(secret(USER), secret(NODE)).unwrap();
        let limits = corefarm_server::auth::Limits {
            max_queued_bytes: Some(MAX),
            ..Default::default()
        };
        a.add_user("alice", secret(ALICE), limits).unwrap();
        let srv = start(ServerOptions {
            auth: Some(Arc::new(a)),
            sharing,
            ..opts()
        })
        .await;
        let mut node =
            FakeNode::spawn_with(srv.nodes, "holder", 1, Behaviour::Hold, Some(secret(NODE))).await;
        srv.wait_free_nodes(1).await;
        let h = hello_as("alice");
        let (mut u, ch) = challenged(srv.users, &h).await;
        u.send(AuthResponse::answer(&secret(ALICE), &ch, "user", &h.encode()).to_frame())
            .await;
        assert_eq!(u.recv().await.unwrap().ty, MsgType::Hello);
        assert_eq!(u.configure(&bench(2048, 16)).await.0, 0, "{sharing:?}");
        let data = |id: u32, inputs: usize| {
            let d = Data {
                id,
                data: vec![id as u8; inputs * 2048].into(),
            };
            d.to_frame().unwrap()
        };

        // Two inputs of 2 KiB could never be queued: refused by id.
        u.send(data(1, 2)).await;
        let e = u.expect_error().await.expect("a refusal");
        assert_eq!((e.id, e.code), (1, ErrorCode::TooLarge as u32), "{e}");
        assert!(
            e.reason
                .contains("4096 bytes exceed the max_queued_bytes of user \"alice\" (3000 bytes)"),
            "{e}"
        );
        let alice = |s: &corefarm_smp::ClusterStatus| s.account("alice").unwrap().clone();
        let before = alice(&srv.status.get()).bytes_in;

        // 2 KiB go to the node, which holds them; 2 KiB more would pass
        // the limit: read, and held until the first are answered.
        u.send(data(2, 1)).await;
        u.send(data(3, 1)).await;
        let wire = 2 * (corefarm_smp::HEADER_LEN as u64 + 4 + 2048);
        let s = srv
            .wait_status("both inputs read", |s| alice(s).bytes_in >= before + wire)
            .await;
        assert_eq!(alice(&s).queued_bytes, 2048, "{sharing:?}");
        assert_eq!(s.users[0].outstanding, 1, "{sharing:?}: {s:#?}");

        // The node answers: room for the held input, which follows.
        node.release();
        let mut got = Vec::new();
        while got.len() < 2 {
            let f = u.recv_skip_credit().await.expect("results");
            assert_eq!(f.ty, MsgType::Data, "{sharing:?}: {f:?}");
            got.push(Data::parse(f.payload).unwrap().id);
        }
        assert_eq!(got, [2, 3], "{sharing:?}");
        let s = srv.status.get();
        assert_eq!(alice(&s).queued_bytes, 0, "{sharing:?}");
    }
}

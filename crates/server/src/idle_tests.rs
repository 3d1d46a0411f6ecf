//! User connections that hold a place and nothing else: silent sockets,
//! hellos never followed by a configuration, observers gone quiet, and
//! handshakes that stall. Against a server in this process on a paused
//! clock: deadlines pass by the clock, not by waiting, and waiting is on
//! frames and closes.

use std::net::SocketAddr;
use std::time::Duration;

use corefarm_smp::auth::{AuthChallenge, AuthResponse, Secret};
use corefarm_smp::{
    hello::features, BenchmarkConfig, ConfigurationResponse, ErrorCode, Hello, MsgType, OutFrame,
};
use tokio::time::Instant;

use crate::hostile_tests::{opts, start, with_auth, Peer, USER_SECRET};
use crate::ServerOptions;

const READ: Duration = Duration::from_secs(2);
const IDLE: Duration = Duration::from_secs(3);

fn short() -> ServerOptions {
    ServerOptions {
        read_timeout: READ,
        user_idle_timeout: IDLE,
        ..opts()
    }
}

/// A node that answers every configuration with success and every data
/// message with its input as the result.
async fn echo_node(at: SocketAddr) -> tokio::task::JoinHandle<()> {
    crate::hostile_tests::notifying_node(at, 0).await
}

/// Until the server's status shows `n` free nodes.
async fn nodes_in_pool(srv: &crate::hostile_tests::Running, n: usize) {
    while srv.status.get().nodes.len() < n {
        // A poll interval, not a synchronisation: the condition is.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn bench() -> OutFrame {
    let cfg = BenchmarkConfig {
        input_size: 16,
        output_size: 16,
        delay_us: 0,
    };
    cfg.to_configuration().to_frame().unwrap()
}

/// A seed-format user (no hello): its configuration, answered.
async fn seed_user(at: SocketAddr) -> (Peer, bool) {
    let mut u = Peer::connect(at).await;
    u.send(bench()).await;
    let f = u.recv().await.expect("a configuration response");
    assert_eq!(f.ty, MsgType::ConfigurationResponse, "{}", f.ty.name());
    let ok = f.payload[0] == ConfigurationResponse::OK;
    (u, ok)
}

/// A hello user asking for no nodes, answered.
async fn hello_user(at: SocketAddr, status: bool) -> Peer {
    let mut p = Peer::connect(at).await;
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into()];
    if status {
        h.features.push(features::STATUS.into());
    }
    h.nodes = Some(0);
    p.send(h.to_frame()).await;
    assert_eq!(p.recv().await.unwrap().ty, MsgType::Hello);
    p
}

/// The next frame is an error of code `code`, then the close.
async fn told_then_closed(p: &mut Peer, code: ErrorCode, what: &str) -> String {
    let e = p.error_then_close().await;
    assert_eq!(e.code(), Some(code), "{what}: {e}");
    e.reason
}

const MODES: [crate::Sharing; 2] = [crate::Sharing::Exclusive, crate::Sharing::Shared];

/// Without anyone waiting for nodes: a socket that never sends a byte is
/// closed once `--read-timeout` has passed; a hello that is never followed
/// by a configuration, and an observer that asked for the status once, are
/// told `timeout` and closed once `--user-idle-timeout` has passed without
/// a message; none of them earlier. Each is counted as `idle`. In both
/// sharing modes (shared mode reads the first message before the session).
#[tokio::test(start_paused = true)]
async fn silent_and_unconfigured_sockets_are_closed_after_their_deadline() {
    for sharing in MODES {
        silent_and_unconfigured(ServerOptions { sharing, ..short() }).await;
    }
}

async fn silent_and_unconfigured(o: ServerOptions) {
    let srv = start(o).await;
    let t0 = Instant::now();
    let mut silent = Peer::connect(srv.users).await;
    let mut hello = hello_user(srv.users, false).await;
    let mut observer = hello_user(srv.users, true).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    observer
        .send(corefarm_smp::ClusterStatus::request_frame())
        .await;
    assert_eq!(observer.recv().await.unwrap().ty, MsgType::Status);
    let asked = Instant::now();

    assert!(silent.recv().await.is_none(), "a silent socket is closed");
    let waited = t0.elapsed();
    assert!(waited >= READ && waited < IDLE, "closed after {waited:?}");

    let why = told_then_closed(&mut hello, ErrorCode::Timeout, "hello only").await;
    assert!(why.contains("--user-idle-timeout"), "{why}");
    let waited = t0.elapsed();
    assert!(waited >= IDLE, "closed after {waited:?}");

    told_then_closed(&mut observer, ErrorCode::Timeout, "observer").await;
    let waited = asked.elapsed();
    assert!(waited >= IDLE, "closed {waited:?} after its last message");

    let s = srv.status.get();
    assert!(s.users.is_empty(), "{:?}", s.users);
    assert_eq!(s.errors["idle"], 3, "{:?}", s.errors);
}

/// A seed-format user whose configuration was refused is unconfigured
/// again: it too is closed after `--user-idle-timeout` without a message
/// (a plain close: a seed user cannot be told why).
#[tokio::test(start_paused = true)]
async fn a_seed_user_left_unconfigured_is_closed() {
    let srv = start(short()).await;
    let mut u = Peer::connect(srv.users).await;
    // Larger than --max-message: refused before any node sees it.
    let huge = BenchmarkConfig {
        input_size: u32::MAX - 64,
        output_size: 16,
        delay_us: 0,
    };
    u.send(huge.to_configuration().to_frame().unwrap()).await;
    let f = u.recv().await.unwrap();
    assert_eq!(f.ty, MsgType::ConfigurationResponse);
    assert_ne!(f.payload[0], ConfigurationResponse::OK);
    let t0 = Instant::now();
    assert!(u.recv().await.is_none(), "closed without a word");
    assert!(t0.elapsed() >= IDLE, "closed after {:?}", t0.elapsed());
}

/// With every `--max-users` place taken by connections that are not
/// configured, a new user is served at once: the idlest of them gives its
/// place (a hello user is told `timeout` why, a silent one is closed). In
/// both sharing modes.
#[tokio::test(start_paused = true)]
async fn a_full_user_port_evicts_the_idlest_unconfigured_connection() {
    for sharing in MODES {
        let o = ServerOptions {
            max_users: 4,
            sharing,
            ..short()
        };
        evicts_the_idlest(o).await;
    }
}

async fn evicts_the_idlest(o: ServerOptions) {
    let srv = start(o).await;
    let _node = echo_node(srv.nodes).await;
    nodes_in_pool(&srv, 1).await;
    let step = Duration::from_millis(100);
    // The idlest: a hello user, then three silent sockets, each younger.
    let mut hello = hello_user(srv.users, false).await;
    let mut silent = Vec::new();
    for _ in 0..3 {
        tokio::time::advance(step).await;
        silent.push(Peer::connect(srv.users).await);
    }
    tokio::time::advance(step).await;
    let (mut user, ok) = seed_user(srv.users).await;
    assert!(ok, "a configuring user is served");
    let why = told_then_closed(&mut hello, ErrorCode::Timeout, "evicted hello").await;
    assert!(why.contains("--max-users"), "{why}");
    // The next new connection takes the place of the oldest silent one.
    let observer = hello_user(srv.users, false).await;
    assert!(silent[0].recv().await.is_none(), "the idlest silent socket");
    // The configured user is never the one to go.
    user.send(OutFrame::data(1, bytes::Bytes::from(vec![7; 16])).unwrap())
        .await;
    let f = user.recv().await.unwrap();
    assert_eq!(f.ty, MsgType::Data);
    assert_eq!(srv.status.get().errors["evicted"], 2);
    drop(observer.w);
}

/// A configured user keeps its place however long it is idle while nobody
/// waits for nodes, and is never evicted: with it in the only place, a new
/// connection is refused as before, and the user is still served.
#[tokio::test(start_paused = true)]
async fn a_configured_idle_user_is_not_evicted() {
    let srv = start(ServerOptions {
        max_users: 1,
        ..short()
    })
    .await;
    let _node = echo_node(srv.nodes).await;
    nodes_in_pool(&srv, 1).await;
    let (mut user, ok) = seed_user(srv.users).await;
    assert!(ok);
    tokio::time::advance(IDLE * 10).await;
    let mut late = Peer::connect(srv.users).await;
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into()];
    late.send(h.to_frame()).await;
    let why = told_then_closed(&mut late, ErrorCode::Internal, "refused").await;
    assert!(why.contains("--max-users"), "{why}");
    user.send(OutFrame::data(1, bytes::Bytes::from(vec![7; 16])).unwrap())
        .await;
    assert_eq!(user.recv().await.unwrap().ty, MsgType::Data);
    assert_eq!(srv.status.get().errors["evicted"], 0);
}

/// Behind `--auth-file`, connections that stall their way in hold at most
/// the opening share of the places; a new one is refused while they are
/// young, but takes the place of one stalled for a tenth of
/// `--read-timeout`, which is closed.
#[tokio::test(start_paused = true)]
async fn a_stalled_handshake_yields_to_a_new_one() {
    let srv = start(ServerOptions {
        max_users: 8, // two may be on their way in at once
        read_timeout: READ,
        ..with_auth()
    })
    .await;
    let mut stalled = vec![
        Peer::connect(srv.users).await,
        Peer::connect(srv.users).await,
    ];
    let hello = || {
        let mut h = Hello::new("user");
        h.features = vec![features::ERROR.into(), features::AUTH.into()];
        h.nodes = Some(0);
        h
    };
    // Fresh: refused, as a flood of fresh connections would be.
    let mut early = Peer::connect(srv.users).await;
    early.send(hello().to_frame()).await;
    told_then_closed(&mut early, ErrorCode::Internal, "refused while young").await;
    tokio::time::advance(READ / 10).await;
    let mut p = Peer::connect(srv.users).await;
    let h = hello();
    let encoded = h.encode();
    p.raw(&crate::hostile_tests::frame(0x10, &encoded)).await;
    let f = p.recv().await.expect("a challenge");
    assert_eq!(f.ty, MsgType::AuthChallenge, "{}", f.ty.name());
    let c = AuthChallenge::parse(&f.payload).unwrap();
    let secret = Secret::new(USER_SECRET).unwrap();
    p.send(AuthResponse::answer(&secret, &c, "user", &encoded).to_frame())
        .await;
    assert_eq!(p.recv().await.unwrap().ty, MsgType::Hello);
    assert!(
        stalled[0].recv().await.is_none(),
        "the stalled one is closed"
    );
    drop(stalled.pop());
}

/// A hello that asks for a group hands the connection to the group code,
/// which protects its place; until it opens its group it holds the place
/// and nothing else, so it too is told `timeout` and closed after
/// `--user-idle-timeout` without a message, counted as `idle`.
#[tokio::test(start_paused = true)]
async fn a_group_user_that_never_opens_its_group_is_closed() {
    let srv = start(short()).await;
    let t0 = Instant::now();
    let mut p = Peer::connect(srv.users).await;
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into(), features::GROUP.into()];
    h.nodes = Some(0);
    p.send(h.to_frame()).await;
    assert_eq!(p.recv().await.unwrap().ty, MsgType::Hello);
    let why = told_then_closed(&mut p, ErrorCode::Timeout, "group hello only").await;
    assert!(why.contains("--user-idle-timeout"), "{why}");
    assert!(t0.elapsed() >= IDLE, "closed after {:?}", t0.elapsed());
    assert_eq!(srv.status.get().errors["idle"], 1);
}

/// A server that has had no node for a whole `--node-wait` (its nodes went
/// to a standby server while it was down, say) answers a configuration at
/// once, failed, instead of holding the user for another `--node-wait`;
/// a freshly started one still waits that long for its nodes to connect.
#[tokio::test(start_paused = true)]
async fn a_server_without_nodes_for_a_node_wait_answers_at_once() {
    let wait = Duration::from_secs(5);
    let srv = start(ServerOptions {
        node_wait: wait,
        ..short()
    })
    .await;
    let t0 = Instant::now();
    let (_first, ok) = seed_user(srv.users).await;
    assert!(!ok, "no node to configure");
    assert!(t0.elapsed() >= wait, "waited {:?}", t0.elapsed());
    let t1 = Instant::now();
    let (_second, ok) = seed_user(srv.users).await;
    assert!(!ok, "no node to configure");
    assert!(t1.elapsed() < wait, "waited {:?}", t1.elapsed());
}

/// A user that can go to another server (`moves-on`) is told at once that
/// no node is connected, in both sharing modes, with the session still
/// open and unconfigured; without it, a freshly started server holds the
/// configuration for `--node-wait` (its nodes may still be connecting).
#[tokio::test(start_paused = true)]
async fn a_user_with_other_servers_hears_at_once_that_no_node_is_connected() {
    for sharing in MODES {
        let wait = Duration::from_secs(5);
        let srv = start(ServerOptions {
            node_wait: wait,
            sharing,
            ..short()
        })
        .await;
        let t0 = Instant::now();
        let mut p = Peer::connect(srv.users).await;
        let mut h = Hello::new("user");
        h.features = vec![features::ERROR.into(), features::MOVES_ON.into()];
        p.send(h.to_frame()).await;
        let reply = Hello::decode(&p.recv().await.unwrap().payload).unwrap();
        assert!(
            reply.has(features::MOVES_ON),
            "{sharing:?}: {:?}",
            reply.features
        );
        p.send(bench()).await;
        let f = p.recv().await.unwrap();
        assert_eq!(f.ty, MsgType::Error, "{sharing:?}: {}", f.ty.name());
        let e = corefarm_smp::ErrorMsg::parse(&f.payload).unwrap();
        assert_eq!(e.code(), Some(ErrorCode::NoNodes), "{sharing:?}: {e}");
        let f = p.recv().await.unwrap();
        assert_eq!(f.ty, MsgType::ConfigurationResponse, "{}", f.ty.name());
        assert_eq!(f.payload[0], ConfigurationResponse::FAILED);
        assert_eq!(t0.elapsed(), Duration::ZERO, "{sharing:?}: not held: {e}");

        // Still unconfigured: with a node now, the same session configures.
        let node = echo_node(srv.nodes).await;
        nodes_in_pool(&srv, 1).await;
        p.send(bench()).await;
        let f = p.recv().await.unwrap();
        assert_eq!(f.ty, MsgType::ConfigurationResponse, "{}", f.ty.name());
        assert_eq!(f.payload[0], ConfigurationResponse::OK, "{sharing:?}");
        node.abort();

        let t1 = Instant::now();
        let (_seed, ok) = seed_user(
            start(ServerOptions {
                node_wait: wait,
                sharing,
                ..short()
            })
            .await
            .users,
        )
        .await;
        assert!(!ok, "no node to configure");
        assert!(
            t1.elapsed() >= wait,
            "{sharing:?}: waited {:?}",
            t1.elapsed()
        );
    }
}

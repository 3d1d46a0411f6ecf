//! What a hostile peer sends, against a server in this process: raw bytes
//! over loopback, answers read frame by frame. Waiting is on frames and
//! closes, never on a sleep; `LIMIT` only turns a hang into a failure.

use std::net::SocketAddr;
use std::time::Duration;

use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::{hello::features, ErrorCode, ErrorMsg, Frame, Hello, MsgType};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::{Server, ServerOptions};

const LIMIT: Duration = Duration::from_secs(15);

pub(crate) fn opts() -> ServerOptions {
    ServerOptions {
        nodes_listen: "127.0.0.1:0".into(),
        users_listen: "127.0.0.1:0".into(),
        node_wait: Duration::from_millis(200),
        ..ServerOptions::default()
    }
}

/// A running server, stopped when dropped.
pub(crate) struct Running {
    pub users: SocketAddr,
    pub nodes: SocketAddr,
    pub status: crate::StatusHandle,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub(crate) async fn start(opts: ServerOptions) -> Running {
    let server = Server::bind(opts).await.expect("bind on loopback");
    let stop = CancellationToken::new();
    let r = Running {
        users: server.users_addr(),
        nodes: server.nodes_addr(),
        status: server.status_handle(),
        stop: stop.clone(),
    };
    tokio::spawn(server.run(stop));
    r
}

/// A raw peer: bytes out, frames in.
pub(crate) struct Peer {
    pub r: FrameReader<tokio::net::tcp::OwnedReadHalf>,
    pub w: OwnedWriteHalf,
}

impl Peer {
    pub async fn connect(to: SocketAddr) -> Peer {
        let s = TcpStream::connect(to).await.unwrap();
        // Small frames go out at once: with Nagle, one held back for a
        // real-time ACK would stall a test whose clock is paused.
        s.set_nodelay(true).unwrap();
        let (rd, w) = s.into_split();
        Peer {
            r: FrameReader::new(rd, u32::MAX),
            w,
        }
    }

    pub async fn raw(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).await.unwrap();
    }

    pub async fn send(&mut self, f: corefarm_smp::OutFrame) {
        write_frame(&mut self.w, f).await.unwrap();
    }

    /// The next frame; `None` once the server closed.
    pub async fn recv(&mut self) -> Option<Frame> {
        tokio::time::timeout(LIMIT, self.r.read_frame())
            .await
            .expect("an answer in time")
            .unwrap_or(None)
    }

    /// An error, then the close.
    pub async fn error_then_close(&mut self) -> ErrorMsg {
        let f = self.recv().await.expect("an answer, not a silent close");
        assert_eq!(f.ty, MsgType::Error, "got a {} frame", f.ty.name());
        let e = ErrorMsg::parse(&f.payload).unwrap();
        assert!(self.recv().await.is_none(), "closed after {e}");
        e
    }
}

/// A frame of type `ty` carrying `payload`, as bytes.
pub(crate) fn frame(ty: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![ty, 0, 0, 0];
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Hellos that do not decode, for a peer of `role`, and the code each gets:
/// the documented `bad_hello` (a `malformed` error), or `too-large` for a
/// header over the server's limit.
fn bad_hellos(role: &str) -> Vec<(&'static str, Vec<u8>, ErrorCode)> {
    let json = |s: String| frame(0x10, s.as_bytes());
    let malformed = ErrorCode::Malformed;
    let oversized = [0x10, 0, 0, 0]
        .into_iter()
        .chain(300_000_000u32.to_le_bytes());
    vec![
        (
            "unknown role",
            json(r#"{"version":1,"role":"admin","features":["error"]}"#.into()),
            malformed,
        ),
        (
            "wrong field type",
            json(format!(r#"{{"version":"1","role":"{role}"}}"#)),
            malformed,
        ),
        (
            "features not a list",
            json(format!(
                r#"{{"version":1,"role":"{role}","features":"error"}}"#
            )),
            malformed,
        ),
        ("not JSON", frame(0x10, b"hello, server"), malformed),
        ("empty", frame(0x10, b""), malformed),
        (
            "duplicate keys",
            json(format!(
                r#"{{"version":1,"role":"{role}","role":"{role}","features":["error"]}}"#
            )),
            malformed,
        ),
        ("an array", json(format!(r#"[1,"{role}"]"#)), malformed),
        ("300 MB header", oversized.collect(), ErrorCode::TooLarge),
    ]
}

/// Every hello that does not decode gets the documented error, then the
/// close; never the negative configuration response a seed user (which
/// never sends a hello) gets. At the user port in both sharing modes and
/// behind `--auth-file`, and at the node port.
#[tokio::test]
async fn an_invalid_hello_gets_the_documented_error() {
    let modes = [
        ServerOptions {
            sharing: crate::Sharing::Exclusive,
            ..opts()
        },
        ServerOptions {
            sharing: crate::Sharing::Shared,
            ..opts()
        },
        // Behind `--auth-file` the hello is read by the gate first.
        with_auth(),
    ];
    for o in modes {
        let how = format!("{:?}, auth {}", o.sharing, o.auth.is_some());
        let srv = start(o).await;
        for (what, bytes, code) in bad_hellos("user") {
            let mut p = Peer::connect(srv.users).await;
            p.raw(&bytes).await;
            let e = p.error_then_close().await;
            assert_eq!(e.code(), Some(code), "{how}, {what}: {e}");
        }
    }
    let srv = start(opts()).await;
    for (what, bytes, code) in bad_hellos("node") {
        let mut p = Peer::connect(srv.nodes).await;
        p.raw(&bytes).await;
        let e = p.error_then_close().await;
        assert_eq!(e.code(), Some(code), "node port, {what}: {e}");
    }
}

pub(crate) const USER_SECRET: &str = "user-secret-0123456789";

/// A server that requires authentication (`--auth-file`).
pub(crate) fn with_auth() -> ServerOptions {
    let secret = |s| corefarm_smp::auth::Secret::new(s).unwrap();
    let cfg = crate::auth::AuthConfig::new(secret(USER_SECRET), secret("node-secret-0123456789"));
    ServerOptions {
        auth: Some(std::sync::Arc::new(cfg.unwrap())),
        ..opts()
    }
}

/// A hello that decodes is still answered as before: a valid one gets the
/// server's hello.
#[tokio::test]
async fn a_valid_hello_is_answered_with_the_servers() {
    let srv = start(opts()).await;
    let mut p = Peer::connect(srv.users).await;
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into()];
    h.nodes = Some(0);
    p.send(h.to_frame()).await;
    let f = p.recv().await.unwrap();
    assert_eq!(f.ty, MsgType::Hello);
    assert_eq!(srv.status.get().users.len(), 1);
}

/// Free nodes whose connections end are let go at once, sockets and all:
/// kept in the pool until the next take, 10,000 restarted nodes held
/// 10,000 descriptors and their second join stopped at the file limit.
#[tokio::test]
async fn free_nodes_that_leave_hold_no_socket() {
    let srv = start(opts()).await;
    let mut nodes = Vec::new();
    for i in 0..3 {
        let mut n = Peer::connect(srv.nodes).await;
        let mut h = Hello::new("node");
        h.name = Some(format!("n{i}"));
        n.send(h.to_frame()).await;
        assert_eq!(n.recv().await.unwrap().ty, MsgType::Hello);
        nodes.push(n);
    }
    let pool = &srv.status.0.pool;
    while srv.status.get().nodes.len() < 3 || pool.held() < 3 {
        // A poll interval, not a synchronisation: the condition is.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(nodes);
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !srv.status.get().nodes.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the nodes never left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Out of the pool before out of the registry.
    assert_eq!(pool.held(), 0);
}

/// A node that agreed a chunk size and sends a larger chunk breaks the
/// link's rule: a `malformed` error naming it, then the close, as on the
/// user link (whole or begun, read as a frame).
#[tokio::test]
async fn a_node_chunk_over_the_agreed_size_ends_the_link() {
    use corefarm_smp::stream::{Chunk, ChunkHeader};
    let srv = start(opts()).await;
    for (what, head) in [
        ("whole", ChunkHeader::at(7, 4, 0, 1000, 1000)),
        ("begun", ChunkHeader::at(7, 4, 0, 100_000, 1000)),
    ] {
        let mut node = Peer::connect(srv.nodes).await;
        let mut h = Hello::new("node");
        h.features = vec![features::ERROR.into(), features::CHUNKS.into()];
        h.chunk_size = Some(512);
        node.send(h.to_frame()).await;
        let f = node.recv().await.unwrap();
        assert_eq!(Hello::decode(&f.payload).unwrap().chunk_size, Some(512));
        let c = Chunk {
            head,
            data: bytes::Bytes::from(vec![1; 1000]),
        };
        node.raw(&c.to_frame().unwrap().to_vec()).await;
        let e = node.error_then_close().await;
        assert_eq!(e.code(), Some(ErrorCode::Malformed), "{what}: {e}");
        assert!(e.reason.contains("over the 512 agreed"), "{what}: {e}");
    }
}

/// A node whose hello names it with 16 MiB (with 1000 targets of 4 KiB and
/// a 4 KiB peer address), and a user named with 1 MiB, are shown by at most
/// `MAX_NAME_CHARS` of each name: the status and a scrape stay about as
/// long as for a node named `n0`.
#[tokio::test]
async fn a_huge_node_name_gives_a_bounded_status_and_scrape() {
    use corefarm_telemetry::{Endpoints, MAX_NAME_CHARS};
    let srv = start(opts()).await;
    let mut h = Hello::new("node");
    h.name = Some("n".repeat(16 << 20));
    h.targets = (0..1000)
        .map(|i| format!("{i}{}", "t".repeat(4096)))
        .collect();
    h.peer = Some("p".repeat(4096));
    let mut node = Peer::connect(srv.nodes).await;
    node.send(h.to_frame()).await;
    assert_eq!(node.recv().await.unwrap().ty, MsgType::Hello);
    let mut user = Peer::connect(srv.users).await;
    let mut u = Hello::new("user");
    u.name = Some("u".repeat(1 << 20));
    u.nodes = Some(0);
    user.send(u.to_frame()).await;
    assert_eq!(user.recv().await.unwrap().ty, MsgType::Hello);
    let handle = srv.status.clone();
    let deadline = tokio::time::Instant::now() + LIMIT;
    let s = loop {
        let s = handle.get();
        if s.nodes.len() == 1 && s.users.len() == 1 && s.users[0].name.is_some() {
            break s;
        }
        assert!(tokio::time::Instant::now() < deadline, "{s:?}");
        // A poll interval, not a synchronisation: the condition is.
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let n = &s.nodes[0];
    assert_eq!(
        n.name.as_deref().map(|s| s.chars().count()),
        Some(MAX_NAME_CHARS)
    );
    assert!(
        n.targets.len() <= crate::registry::MAX_TARGETS,
        "{}",
        n.targets.len()
    );
    assert!(n
        .targets
        .iter()
        .all(|t| t.chars().count() <= MAX_NAME_CHARS));
    let name = s.users[0].name.as_deref().unwrap();
    assert_eq!(name.chars().count(), MAX_NAME_CHARS);
    let status = Endpoints::status(&handle);
    assert!(status.len() < 16 << 10, "status of {} bytes", status.len());
    let scrape = Endpoints::metrics(&handle);
    assert!(scrape.len() < 64 << 10, "scrape of {} bytes", scrape.len());
}

/// Refusals are counted by kind in `errors_total` (the status's `errors`):
/// wrong answers to the challenge as `auth_failed`, hellos that do not
/// decode as `bad_hello`; and a second wrong answer from the same address
/// is answered no sooner than its hold (`auth::hold(2)`).
#[tokio::test]
async fn auth_failures_and_bad_hellos_are_counted_and_slowed() {
    use corefarm_smp::auth::{AuthChallenge, AuthResponse, Secret};
    let srv = start(with_auth()).await;
    let wrong = Secret::new("not-the-user-secret-0123").unwrap();
    for attempt in 1..=2u32 {
        let mut p = Peer::connect(srv.users).await;
        let mut h = Hello::new("user");
        h.features = vec![features::ERROR.into(), features::AUTH.into()];
        let hello = h.encode();
        p.raw(&frame(0x10, &hello)).await;
        let f = p.recv().await.expect("a challenge");
        let challenge = AuthChallenge::parse(&f.payload).unwrap();
        let answered = tokio::time::Instant::now();
        p.send(AuthResponse::answer(&wrong, &challenge, "user", &hello).to_frame())
            .await;
        let e = p.error_then_close().await;
        assert_eq!(e.code(), Some(ErrorCode::Unauthorized), "{e}");
        let held = answered.elapsed();
        assert!(
            held >= crate::auth::hold(attempt),
            "attempt {attempt}: {held:?}"
        );
    }
    for (_, bytes, _) in bad_hellos("user").into_iter().take(3) {
        let mut p = Peer::connect(srv.users).await;
        p.raw(&bytes).await;
        p.error_then_close().await;
    }
    let errors = srv.status.get().errors;
    assert_eq!(errors["auth_failed"], 2, "{errors:?}");
    assert_eq!(errors["bad_hello"], 3, "{errors:?}");
    // Without `--auth-file`, a bad hello is counted where it is refused.
    let srv = start(opts()).await;
    for (to, role) in [(srv.users, "user"), (srv.nodes, "node")] {
        let mut p = Peer::connect(to).await;
        p.raw(&bad_hellos(role)[0].1).await;
        p.error_then_close().await;
    }
    assert_eq!(srv.status.get().errors["bad_hello"], 2);
}

/// A fake node that answers every configuration with success and every
/// data message with `notes` notifications, then the input as its result.
pub(crate) async fn notifying_node(at: SocketAddr, notes: u32) -> tokio::task::JoinHandle<()> {
    use corefarm_smp::{ConfigurationResponse, Data, Notification};
    let mut node = Peer::connect(at).await;
    let mut h = Hello::new("node");
    h.name = Some("notifier".into());
    h.features = vec![features::ERROR.into(), features::SPIN_NOTIFY.into()];
    node.send(h.to_frame()).await;
    assert_eq!(node.recv().await.unwrap().ty, MsgType::Hello);
    tokio::spawn(async move {
        while let Ok(Some(f)) = node.r.read_frame().await {
            match f.ty {
                MsgType::Configuration => {
                    let ok = ConfigurationResponse {
                        status: ConfigurationResponse::OK,
                    };
                    node.send(ok.to_frame()).await;
                }
                MsgType::Data => {
                    let d = Data::parse(f.payload).unwrap();
                    for i in 0..notes {
                        let n = Notification {
                            id: d.id,
                            set: 0,
                            data: bytes::Bytes::from(i.to_le_bytes().to_vec()),
                        };
                        node.send(n.to_frame().unwrap()).await;
                    }
                    node.send(corefarm_smp::OutFrame::data(d.id, d.data).unwrap())
                        .await;
                }
                _ => {}
            }
        }
    })
}

/// A node that sends more than the documented 256 notifications for one
/// message: the server relays the first 256 and drops the rest, and the
/// message's result still arrives. In both sharing modes.
#[tokio::test]
async fn the_server_relays_at_most_256_notifications_per_message() {
    use corefarm_smp::{BenchmarkConfig, Data};
    for sharing in [crate::Sharing::Exclusive, crate::Sharing::Shared] {
        let srv = start(ServerOptions { sharing, ..opts() }).await;
        let _node = notifying_node(srv.nodes, 1000).await;
        let mut user = Peer::connect(srv.users).await;
        let mut h = Hello::new("user");
        h.features = vec![features::ERROR.into(), features::SPIN_NOTIFY.into()];
        h.nodes = Some(1);
        user.send(h.to_frame()).await;
        assert_eq!(user.recv().await.unwrap().ty, MsgType::Hello);
        let cfg = BenchmarkConfig {
            input_size: 16,
            output_size: 16,
            delay_us: 0,
        };
        user.send(cfg.to_configuration().to_frame().unwrap()).await;
        loop {
            let f = user.recv().await.expect("a configuration response");
            if f.ty == MsgType::ConfigurationResponse {
                assert_eq!(f.payload[0], 0, "{sharing:?}: configured");
                break;
            }
        }
        for id in [7, 8] {
            user.send(corefarm_smp::OutFrame::data(id, bytes::Bytes::from(vec![1; 16])).unwrap())
                .await;
            let mut notes = 0;
            let result = loop {
                let f = user.recv().await.expect("notifications, then the result");
                match f.ty {
                    MsgType::Notification => notes += 1,
                    MsgType::Data => break Data::parse(f.payload).unwrap(),
                    other => panic!("{sharing:?}: unexpected {}", other.name()),
                }
            };
            assert_eq!(result.id, id, "{sharing:?}");
            assert_eq!(notes, crate::notes::PER_MESSAGE, "{sharing:?}, id {id}");
        }
    }
}

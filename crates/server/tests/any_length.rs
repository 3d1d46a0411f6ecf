//! Results of any length (hello feature `any-length`), in both
//! sharing modes: a node that agreed it answers with what its handlers
//! emitted (shorter, longer, empty, as chunks); a user that agreed it gets
//! exactly those bytes, a hello user that did not gets them padded (or an
//! error for a longer one), a seed user gets them padded (or its session
//! ends); a node that did not agree it is still dropped for a result of
//! another size, and the max message still bounds every result. The Rust
//! client with `chunks` gets a long result as chunks, reassembled whole.

use crate::common;

use bytes::Bytes;
use common::{bench, opts, start, FakeUser, LIMIT};
use corefarm_client::{Client, ClientOptions};
use corefarm_server::{ServerOptions, Sharing};
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::hello::features;
use corefarm_smp::stream::Chunks;
use corefarm_smp::{
    Configuration, ConfigurationResponse, Data, ErrorCode, ErrorMsg, Frame, Hello, MsgType,
    OutFrame,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

const INPUT: u32 = 16;
const OUTPUT: u32 = 16;
const MODES: [Sharing; 2] = [Sharing::Exclusive, Sharing::Shared];

/// The bytes a fake handler emits for a result of `len` bytes.
fn emitted(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 1) as u8).collect()
}

/// A data message of one input asking the fake node for `len` bytes.
fn ask(id: u32, len: u32) -> OutFrame {
    let mut input = vec![0u8; INPUT as usize];
    input[..4].copy_from_slice(&len.to_le_bytes());
    OutFrame::data(id, Bytes::from(input)).unwrap()
}

struct Node {
    /// The server's answer to the node's hello.
    hello: mpsc::UnboundedReceiver<Hello>,
    /// Ends when the server closes the node's connection.
    task: JoinHandle<()>,
}

impl Node {
    async fn server_hello(&mut self) -> Hello {
        tokio::time::timeout(LIMIT, self.hello.recv())
            .await
            .expect("the server answers the node's hello")
            .expect("a hello")
    }

    async fn closed(self) {
        tokio::time::timeout(LIMIT, self.task)
            .await
            .expect("the server should have closed the node")
            .unwrap();
    }
}

/// A node that answers every data message with `emitted(len)`, `len` the
/// message's first word, as chunks of `chunk` bytes once the server agreed
/// chunks and the result is larger than that.
async fn node(addr: std::net::SocketAddr, feats: &[&str], chunk: Option<u32>) -> Node {
    let s = TcpStream::connect(addr).await.unwrap();
    let (rd, mut w) = s.into_split();
    let mut h = Hello::new("node");
    h.name = Some("handlers".into());
    h.features = feats.iter().map(|f| f.to_string()).collect();
    h.chunk_size = chunk;
    write_frame(&mut w, h.to_frame()).await.unwrap();
    let (tx, hello) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut r = FrameReader::new(rd, 1 << 30);
        let mut chunks = None;
        while let Ok(Some(f)) = r.read_frame().await {
            match f.ty {
                MsgType::Hello => {
                    let h = Hello::decode(&f.payload).unwrap();
                    chunks = h.chunk_size.filter(|_| h.has(features::CHUNKS));
                    let _ = tx.send(h);
                }
                MsgType::Configuration => {
                    Configuration::parse(f.payload).unwrap();
                    let ok = ConfigurationResponse { status: 0 };
                    write_frame(&mut w, ok.to_frame()).await.unwrap();
                }
                MsgType::Data => {
                    let d = Data::parse(f.payload).unwrap();
                    let len = u32::from_le_bytes(d.data[..4].try_into().unwrap()) as usize;
                    let out = Bytes::from(emitted(len));
                    let sent = match chunks {
                        Some(size) if len > size as usize => {
                            let mut bytes = Vec::new();
                            for c in Chunks::new(d.id, 4, out, size as usize).unwrap() {
                                bytes.extend(c.to_frame().unwrap().to_vec());
                            }
                            w.write_all(&bytes).await.is_ok()
                        }
                        _ => write_frame(&mut w, OutFrame::data(d.id, out).unwrap())
                            .await
                            .is_ok(),
                    };
                    if !sent {
                        return;
                    }
                }
                _ => {}
            }
        }
    });
    Node { hello, task }
}

fn options(sharing: Sharing) -> ServerOptions {
    ServerOptions {
        sharing,
        node_chunk_size: 1024,
        ..opts()
    }
}

/// Sends `ask(id, len)` and returns the answer (a result or an error).
async fn answer(u: &mut FakeUser, id: u32, len: u32) -> Option<Frame> {
    u.send(ask(id, len)).await;
    u.recv_skip_credit().await
}

fn result_of(f: Option<Frame>, id: u32) -> Bytes {
    let f = f.expect("a result, not a closed connection");
    if f.ty == MsgType::Error {
        panic!("an error: {}", ErrorMsg::parse(&f.payload).unwrap());
    }
    assert_eq!(f.ty, MsgType::Data, "{}", f.ty.name());
    let d = Data::parse(f.payload).unwrap();
    assert_eq!(d.id, id);
    d.data
}

fn padded(len: usize) -> Vec<u8> {
    let mut v = emitted(len);
    v.resize(OUTPUT as usize, 0);
    v
}

#[tokio::test]
async fn a_user_that_agreed_gets_exactly_the_emitted_bytes_in_both_modes() {
    for mode in MODES {
        let srv = start(options(mode)).await;
        let feats = [features::ERROR, features::ANY_LENGTH, features::CHUNKS];
        let mut n = node(srv.nodes, &feats, Some(4096)).await;
        let h = n.server_hello().await;
        assert!(h.has(features::ANY_LENGTH), "{mode:?}: {h:?}");
        assert_eq!(h.chunk_size, Some(1024));
        srv.wait_free_nodes(1).await;
        let want = [features::ERROR, features::ANY_LENGTH];
        let (mut u, f) = FakeUser::hello_with(srv.users, "sum", Some(1), &want).await;
        let agreed = Hello::decode(&f.payload).unwrap();
        assert!(agreed.has(features::ANY_LENGTH), "{mode:?}: {agreed:?}");
        assert_eq!(u.configure(&bench(INPUT, OUTPUT)).await.0, 0);
        // Shorter, empty, the fixed size, longer, and longer than a chunk
        // (the node sends it as 5 chunks, the server reassembles it).
        for (id, len) in [3u32, 0, 16, 100, 5000].into_iter().enumerate() {
            let got = result_of(answer(&mut u, id as u32, len).await, id as u32);
            assert_eq!(
                &got[..],
                &emitted(len as usize)[..],
                "{mode:?}: {len} bytes"
            );
        }
    }
}

#[tokio::test]
async fn a_hello_user_without_the_feature_gets_padding_or_a_core_failure() {
    for mode in MODES {
        let srv = start(options(mode)).await;
        let mut n = node(srv.nodes, &[features::ERROR, features::ANY_LENGTH], None).await;
        n.server_hello().await;
        srv.wait_free_nodes(1).await;
        let (mut u, f) = FakeUser::hello_with(srv.users, "old", Some(1), &[features::ERROR]).await;
        let agreed = Hello::decode(&f.payload).unwrap();
        assert!(!agreed.has(features::ANY_LENGTH), "{mode:?}: not asked for");
        assert_eq!(u.configure(&bench(INPUT, OUTPUT)).await.0, 0);
        assert_eq!(
            &result_of(answer(&mut u, 1, 3).await, 1)[..],
            &padded(3)[..]
        );
        assert_eq!(
            &result_of(answer(&mut u, 2, 0).await, 2)[..],
            &[0u8; 16][..]
        );
        // Longer than count × output size: that message fails like a core.
        let f = answer(&mut u, 3, 100).await.expect("an error");
        assert_eq!(f.ty, MsgType::Error, "{mode:?}: {}", f.ty.name());
        let e = ErrorMsg::parse(&f.payload).unwrap();
        assert_eq!(
            (e.id, e.code),
            (3, ErrorCode::CoreFailure as u32),
            "{mode:?}: {e}"
        );
        assert!(
            e.reason.contains("100 bytes") && e.reason.contains("16 bytes"),
            "{mode:?}: {e}"
        );
        // The session goes on.
        assert_eq!(
            &result_of(answer(&mut u, 4, 16).await, 4)[..],
            &emitted(16)[..]
        );
    }
}

#[tokio::test]
async fn a_seed_user_gets_padding_and_a_longer_result_ends_its_session() {
    for mode in MODES {
        let srv = start(options(mode)).await;
        let mut n = node(srv.nodes, &[features::ERROR, features::ANY_LENGTH], None).await;
        n.server_hello().await;
        srv.wait_free_nodes(1).await;
        let mut u = FakeUser::connect(srv.users).await;
        assert_eq!(u.configure(&bench(INPUT, OUTPUT)).await.0, 0);
        assert_eq!(
            &result_of(answer(&mut u, 1, 5).await, 1)[..],
            &padded(5)[..]
        );
        // What a failed core does to a seed user: no error message it could
        // read, the connection closes.
        u.send(ask(2, 100)).await;
        u.closed().await;
    }
}

#[tokio::test]
async fn a_node_without_the_feature_is_still_dropped_for_another_length() {
    for mode in MODES {
        let srv = start(options(mode)).await;
        let mut n = node(srv.nodes, &[features::ERROR], None).await;
        let h = n.server_hello().await;
        assert!(!h.has(features::ANY_LENGTH), "{mode:?}: not asked for");
        srv.wait_free_nodes(1).await;
        let want = [features::ERROR, features::ANY_LENGTH];
        let (mut u, _) = FakeUser::hello_with(srv.users, "sum", Some(1), &want).await;
        assert_eq!(u.configure(&bench(INPUT, OUTPUT)).await.0, 0);
        assert_eq!(
            &result_of(answer(&mut u, 1, 16).await, 1)[..],
            &emitted(16)[..]
        );
        u.send(ask(2, 3)).await;
        n.closed().await;
    }
}

#[tokio::test]
async fn a_result_beyond_the_max_message_is_refused_even_with_the_feature() {
    for mode in MODES {
        let srv = start(ServerOptions {
            max_message: 64 << 10,
            ..options(mode)
        })
        .await;
        let feats = [features::ERROR, features::ANY_LENGTH, features::CHUNKS];
        let mut n = node(srv.nodes, &feats, Some(4096)).await;
        n.server_hello().await;
        srv.wait_free_nodes(1).await;
        let want = [features::ERROR, features::ANY_LENGTH];
        let (mut u, _) = FakeUser::hello_with(srv.users, "sum", Some(1), &want).await;
        assert_eq!(u.configure(&bench(INPUT, OUTPUT)).await.0, 0);
        // Up to the limit less the id: taken.
        let most = (64 << 10) - 4;
        assert_eq!(
            result_of(answer(&mut u, 1, most).await, 1).len(),
            most as usize
        );
        // One byte more, announced in its first chunk: the node is dropped.
        u.send(ask(2, most + 1)).await;
        n.closed().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_with_chunks_gets_results_of_any_length_whole() {
    for mode in MODES {
        let srv = start(options(mode)).await;
        let feats = [features::ERROR, features::ANY_LENGTH, features::CHUNKS];
        let mut n = node(srv.nodes, &feats, Some(4096)).await;
        n.server_hello().await;
        srv.wait_free_nodes(1).await;
        let users = srv.users.to_string();
        tokio::task::spawn_blocking(move || {
            let opts = ClientOptions {
                chunks: true,
                chunk_size: Some(512),
                io_timeout: Some(LIMIT),
                ..ClientOptions::default()
            };
            let c = Client::connect(&users, opts).unwrap();
            let agreed = c.server_hello().unwrap();
            assert!(agreed.has(features::ANY_LENGTH), "{mode:?}: {agreed:?}");
            c.configure(&bench(INPUT, OUTPUT)).unwrap();
            // 5000 bytes: 5 chunks from the node, 10 to the client.
            for (len, count) in [(5000u32, 312u32), (3, 0), (0, 0)] {
                let mut input = vec![0u8; INPUT as usize];
                input[..4].copy_from_slice(&len.to_le_bytes());
                let id = c.submit(Bytes::from(input)).unwrap();
                let out = c.recv(Some(LIMIT)).unwrap();
                assert_eq!(out.id, id);
                assert_eq!(&out.data[..], &emitted(len as usize)[..], "{mode:?}: {len}");
                assert_eq!(out.count, count, "{mode:?}: whole outputs in {len} bytes");
            }
        })
        .await
        .unwrap();
    }
}

/// A message of `inputs` inputs asking the fake node for `len` bytes.
fn ask_inputs(id: u32, inputs: usize, len: u32) -> OutFrame {
    let mut data = vec![0u8; INPUT as usize * inputs];
    data[..4].copy_from_slice(&len.to_le_bytes());
    OutFrame::data(id, Bytes::from(data)).unwrap()
}

fn error_of(f: Option<Frame>) -> ErrorMsg {
    let f = f.expect("an error, not a closed connection");
    assert_eq!(f.ty, MsgType::Error, "{}", f.ty.name());
    ErrorMsg::parse(&f.payload).unwrap()
}

#[tokio::test]
async fn a_result_beyond_the_users_own_max_message_fails_by_id_in_both_modes() {
    // Four 16-byte outputs and the id: what this user reads at most.
    const USER_MAX: u32 = 4 * OUTPUT + 4;
    for mode in MODES {
        let srv = start(options(mode)).await;
        let feats = [features::ERROR, features::ANY_LENGTH, features::CHUNKS];
        let mut n = node(srv.nodes, &feats, Some(4096)).await;
        n.server_hello().await;
        for any_length in [false, true] {
            // Shared mode keeps the node configured for the next user.
            if mode == Sharing::Exclusive || !any_length {
                srv.wait_free_nodes(1).await;
            }
            let mut u = FakeUser::connect(srv.users).await;
            let mut h = Hello::new("user");
            h.nodes = Some(1);
            h.max_message = Some(USER_MAX);
            h.features = vec![features::ERROR.into()];
            if any_length {
                h.features.push(features::ANY_LENGTH.into());
            }
            u.send(h.to_frame()).await;
            let agreed = u.recv().await.expect("a hello");
            let agreed = Hello::decode(&agreed.payload).unwrap();
            // The server still takes its own limit from the user.
            assert_eq!(agreed.max_message, Some(options(mode).max_message));
            assert_eq!(u.configure(&bench(INPUT, OUTPUT)).await.0, 0);
            let what = format!("{mode:?}, any-length {any_length}");
            if any_length {
                // Known only once the node answers: that message fails.
                u.send(ask(1, 4 * OUTPUT + 1)).await;
                let e = error_of(u.recv_skip_credit().await);
                assert_eq!(e.id, 1, "{what}: {e}");
                assert!(
                    e.reason.contains("65 bytes") && e.reason.contains("68-byte"),
                    "{what}: {e}"
                );
            } else {
                // Five fixed-size outputs cannot fit: refused on arrival.
                u.send(ask_inputs(1, 5, 5 * OUTPUT)).await;
                let e = error_of(u.recv_skip_credit().await);
                assert_eq!(
                    (e.id, e.code),
                    (1, ErrorCode::TooLarge as u32),
                    "{what}: {e}"
                );
                assert!(
                    e.reason.contains("5 × 16 bytes = 80") && e.reason.contains("68-byte"),
                    "{what}: {e}"
                );
            }
            // The session goes on, and a result that fits exactly is taken.
            u.send(ask_inputs(2, 4, 4 * OUTPUT)).await;
            let got = result_of(u.recv_skip_credit().await, 2);
            assert_eq!(&got[..], &emitted(4 * OUTPUT as usize)[..], "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_announces_its_max_message_and_gets_an_error_not_a_broken_connection() {
    let srv = start(options(Sharing::Exclusive)).await;
    let feats = [features::ERROR, features::ANY_LENGTH];
    let mut n = node(srv.nodes, &feats, None).await;
    n.server_hello().await;
    srv.wait_free_nodes(1).await;
    let users = srv.users.to_string();
    tokio::task::spawn_blocking(move || {
        let opts = ClientOptions {
            max_message: 1024,
            io_timeout: Some(LIMIT),
            ..ClientOptions::default()
        };
        let c = Client::connect(&users, opts).unwrap();
        c.configure(&bench(INPUT, OUTPUT)).unwrap();
        let ask = |len: u32| {
            let mut input = vec![0u8; INPUT as usize];
            input[..4].copy_from_slice(&len.to_le_bytes());
            c.submit(Bytes::from(input)).unwrap()
        };
        // 2000 bytes would not pass the client's own reader.
        let id = ask(2000);
        let err = c.recv(Some(LIMIT)).unwrap_err().to_string();
        assert!(
            err.contains("2000 bytes") && err.contains("1024-byte"),
            "{err}"
        );
        assert!(err.contains(&id.to_string()), "{err}");
        let id = ask(1020);
        let out = c.recv(Some(LIMIT)).unwrap();
        assert_eq!((out.id, out.data.len()), (id, 1020));
    })
    .await
    .unwrap();
}

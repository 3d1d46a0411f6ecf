//! Chunks on the user link: a hello user that asks for `chunks`
//! may send data messages as chunks (0x1D) with a priority class, and gets
//! its results back as chunks of the same class, an urgent result
//! overtaking a bulk one between its chunks. Broken chunk sequences end the
//! session with a reason; users without the feature see nothing new.

use crate::common;

use std::collections::HashMap;

use bytes::Bytes;
use common::{bench, opts, start, Behaviour, FakeNode, FakeUser, LIMIT};
use corefarm_server::ServerOptions;
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::stream::{Chunk, ChunkHeader, Chunks, DEFAULT_CLASS};
use corefarm_smp::{
    hello::features, ConfigurationResponse, Data, ErrorCode, ErrorMsg, Frame, Hello, MsgType,
    OutFrame,
};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const ALL: [&str; 4] = [
    features::ERROR,
    features::CREDIT,
    features::STATUS,
    features::CHUNKS,
];

async fn chunk_user(addr: std::net::SocketAddr, chunk_size: Option<u32>) -> (FakeUser, Hello) {
    let mut u = FakeUser::connect(addr).await;
    let mut h = Hello::new("user");
    h.features = ALL.iter().map(|f| f.to_string()).collect();
    h.chunk_size = chunk_size;
    u.send(h.to_frame()).await;
    let f = u.recv().await.expect("hello reply");
    assert_eq!(f.ty, MsgType::Hello);
    (u, Hello::decode(&f.payload).unwrap())
}

async fn send_chunks(u: &mut FakeUser, id: u32, class: u8, data: Bytes, size: usize) {
    for c in Chunks::new(id, class, data, size).unwrap() {
        u.send_raw(&c.to_frame().unwrap().to_vec()).await;
    }
}

fn chunk_of(f: Frame) -> Chunk {
    assert_eq!(
        f.ty,
        MsgType::Chunk,
        "expected a chunk, got {}",
        f.ty.name()
    );
    Chunk::parse(f.payload).unwrap()
}

/// Reads chunks (skipping credits) until `n` messages are whole; returns
/// them by id with their class, and the order in which they completed.
async fn recv_messages(u: &mut FakeUser, n: usize) -> (HashMap<u32, (u8, Vec<u8>)>, Vec<u32>) {
    let (mut open, mut done, mut order) = (HashMap::new(), HashMap::new(), Vec::new());
    while done.len() < n {
        let f = u.recv_skip_credit().await.expect("a result chunk");
        if f.ty == MsgType::Error {
            panic!("server error: {}", ErrorMsg::parse(&f.payload).unwrap());
        }
        let c = chunk_of(f);
        let buf: &mut Vec<u8> = open.entry(c.head.id).or_default();
        assert_eq!(
            buf.len() as u64,
            c.head.offset,
            "chunks of {} in order",
            c.head.id
        );
        buf.extend_from_slice(&c.data);
        if c.head.last {
            order.push(c.head.id);
            done.insert(c.head.id, (c.head.class, open.remove(&c.head.id).unwrap()));
        }
    }
    (done, order)
}

#[tokio::test]
async fn the_hello_agrees_chunks_at_the_smaller_size_and_only_when_asked() {
    let srv = start(opts()).await;
    let (_u, h) = chunk_user(srv.users, None).await;
    assert!(h.has(features::CHUNKS));
    assert_eq!(h.chunk_size, Some(corefarm_smp::stream::DEFAULT_CHUNK_SIZE));
    let (_u, h) = chunk_user(srv.users, Some(4096)).await;
    assert_eq!(h.chunk_size, Some(4096));
    let (_u, h) = chunk_user(srv.users, Some(256 << 10)).await;
    assert_eq!(h.chunk_size, Some(256 << 10));
    let (_u, h) = chunk_user(srv.users, Some(u32::MAX)).await;
    assert_eq!(h.chunk_size, Some(corefarm_smp::stream::MAX_CHUNK_SIZE));
    // Too small to be worth it: not agreed, and the reply says so.
    let (_u, h) = chunk_user(srv.users, Some(16)).await;
    assert!(!h.has(features::CHUNKS) && h.chunk_size.is_none());
    // A user that does not ask never hears of chunks.
    let (_u, h) = FakeUser::hello(srv.users, None).await;
    assert!(!h.has(features::CHUNKS) && h.chunk_size.is_none());
}

#[tokio::test]
async fn chunked_and_whole_messages_come_back_as_chunks_of_their_class() {
    let srv = start(opts()).await;
    let _n = FakeNode::spawn(srv.nodes, "a", 9, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let (mut u, h) = chunk_user(srv.users, Some(512)).await;
    assert_eq!(h.chunk_size, Some(512));
    assert_eq!(u.configure(&bench(2000, 1500)).await.0, 0);
    let data = Bytes::from((0..2000u32).map(|i| i as u8).collect::<Vec<u8>>());
    send_chunks(&mut u, 7, 2, data.clone(), 512).await;
    // Sent whole: the default class.
    u.send(OutFrame::data(8, data).unwrap()).await;
    let (got, _) = recv_messages(&mut u, 2).await;
    for (id, class) in [(7, 2), (8, DEFAULT_CLASS)] {
        let (c, bytes) = &got[&id];
        assert_eq!(*c, class, "result {id} in its message's class");
        assert_eq!(bytes.len(), 1500);
        assert_eq!(bytes[0], 9, "the node's tag");
    }
}

/// A node that answers every data message with `count × output` bytes
/// (first byte: the count's low byte), each answer when the test says so.
async fn stepped_node(
    addr: std::net::SocketAddr,
    output: usize,
    input: usize,
) -> (mpsc::UnboundedSender<()>, mpsc::UnboundedReceiver<usize>) {
    let s = TcpStream::connect(addr).await.unwrap();
    let (rd, mut w) = s.into_split();
    let mut h = Hello::new("node");
    h.name = Some("stepped".into());
    write_frame(&mut w, h.to_frame()).await.unwrap();
    let (go_tx, mut go) = mpsc::unbounded_channel::<()>();
    let (seen_tx, seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut r = FrameReader::new(rd, 1 << 30);
        let mut held = std::collections::VecDeque::new();
        loop {
            tokio::select! {
                f = r.read_frame() => {
                    let Ok(Some(f)) = f else { return };
                    match f.ty {
                        MsgType::Configuration => {
                            let ok = ConfigurationResponse { status: ConfigurationResponse::OK };
                            write_frame(&mut w, ok.to_frame()).await.unwrap();
                        }
                        MsgType::Data => {
                            let d = Data::parse(f.payload).unwrap();
                            held.push_back(d);
                            let _ = seen_tx.send(held.len());
                        }
                        _ => {}
                    }
                }
                Some(()) = go.recv() => {
                    let d = held.pop_front().expect("a message to answer");
                    let count = d.data.len() / input;
                    let mut out = vec![0u8; count * output];
                    out[0] = count as u8;
                    if write_frame(&mut w, OutFrame::data(d.id, Bytes::from(out)).unwrap()).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    (go_tx, seen)
}

#[tokio::test]
async fn an_urgent_result_overtakes_a_bulk_result_being_written() {
    let srv = start(opts()).await;
    let (input, output) = (16usize, 4096usize);
    let (go, mut seen) = stepped_node(srv.nodes, output, input).await;
    srv.wait_free_nodes(1).await;
    let (mut u, _) = chunk_user(srv.users, None).await;
    assert_eq!(u.configure(&bench(input as u32, output as u32)).await.0, 0);
    // 32 MiB of results: far more than the socket buffers hold.
    let bulk_inputs = 8192;
    send_chunks(
        &mut u,
        1,
        7,
        Bytes::from(vec![1u8; bulk_inputs * input]),
        1 << 16,
    )
    .await;
    send_chunks(&mut u, 2, 0, Bytes::from(vec![2u8; input]), 1 << 16).await;
    let mut n = 0;
    while n < 2 {
        n = tokio::time::timeout(LIMIT, seen.recv())
            .await
            .unwrap()
            .unwrap();
    }
    go.send(()).unwrap();
    // The bulk result is being written...
    let first = chunk_of(u.recv_skip_credit().await.unwrap());
    assert_eq!(
        (first.head.id, first.head.class, first.head.offset),
        (1, 7, 0)
    );
    // ...when the urgent one arrives. The test reads nothing until the
    // server holds both results, so the bulk one cannot have been written
    // out meanwhile (32 MiB is far more than the socket buffers hold) and
    // the order below depends on the server's pick, not on scheduling.
    go.send(()).unwrap();
    srv.wait_status("both results at the server", |s| {
        s.nodes.iter().map(|n| n.results).sum::<u64>() >= 2
    })
    .await;
    let mut order = Vec::new();
    let mut bulk_bytes = first.data.len();
    loop {
        let c = chunk_of(u.recv_skip_credit().await.unwrap());
        if c.head.id == 1 {
            bulk_bytes += c.data.len();
        } else {
            assert_eq!((c.head.id, c.head.class, c.data.len()), (2, 0, output));
        }
        if c.head.last {
            order.push(c.head.id);
            if order.len() == 2 {
                break;
            }
        }
    }
    assert_eq!(order, [2, 1], "the urgent result finished first");
    assert_eq!(bulk_bytes, bulk_inputs * output);
}

/// Sends `frames` after a configuration and returns the error the server
/// answers with; the server then closes the connection.
async fn refused(opts: ServerOptions, chunk_size: u32, frames: Vec<Vec<u8>>) -> ErrorMsg {
    let srv = start(opts).await;
    let _n = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let (mut u, _) = chunk_user(srv.users, Some(chunk_size)).await;
    assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
    for f in frames {
        u.send_raw(&f).await;
    }
    let e = u.expect_error().await.expect("an error before the close");
    u.closed().await;
    e
}

fn wire(c: &Chunk) -> Vec<u8> {
    c.to_frame().unwrap().to_vec()
}

fn chunk(id: u32, class: u8, first: bool, last: bool, offset: u64, total: u64, n: usize) -> Chunk {
    let head = ChunkHeader {
        id,
        class,
        first,
        last,
        offset,
        total,
        len: n as u64,
    };
    Chunk {
        head,
        data: Bytes::from(vec![0u8; n]),
    }
}

#[tokio::test]
async fn broken_chunk_sequences_end_the_session_with_the_reason() {
    let cases: Vec<(Vec<Vec<u8>>, &str)> = vec![
        (
            vec![wire(&chunk(3, 1, false, true, 16, 32, 16))],
            "not begun",
        ),
        (
            vec![
                wire(&chunk(3, 1, true, false, 0, 64, 16)),
                wire(&chunk(3, 1, false, false, 32, 64, 16)),
            ],
            "offset 32, expected 16",
        ),
        (
            vec![
                wire(&chunk(3, 1, true, false, 0, 48, 16)),
                wire(&chunk(3, 2, false, true, 16, 48, 32)),
            ],
            "changed from 48 bytes in class 1",
        ),
        (
            vec![wire(&chunk(4, 0, true, true, 0, 1024, 1024))],
            "over the 512 agreed",
        ),
        (
            (0..65)
                .map(|i| wire(&chunk(i, 0, true, false, 0, 64, 16)))
                .collect(),
            "more than 64 messages open",
        ),
    ];
    for (frames, reason) in cases {
        let e = refused(opts(), 512, frames).await;
        assert_eq!(e.code(), Some(ErrorCode::Malformed), "{e}");
        assert!(e.reason.contains(reason), "{reason:?} not in {e}");
    }
    // A class that does not exist, a flag that does not exist, and a
    // header cut short: raw bytes the codec refuses.
    let mut bad_class = wire(&chunk(5, 0, true, true, 0, 16, 16));
    bad_class[8 + 5] = 8;
    let mut bad_flags = wire(&chunk(5, 0, true, true, 0, 16, 16));
    bad_flags[8 + 4] |= 0x80;
    let short = vec![0x1D, 0, 0, 0, 3, 0, 0, 0, 1, 2, 3];
    for (f, reason) in [
        (bad_class, "class 8"),
        (bad_flags, "unknown chunk flags"),
        (short, "chunk"),
    ] {
        let e = refused(opts(), 512, vec![f]).await;
        assert!(e.reason.contains(reason), "{reason:?} not in {e}");
    }
    // A message over --max-message, announced in its first chunk.
    let small = ServerOptions {
        max_message: 4096,
        ..opts()
    };
    let e = refused(
        small,
        512,
        vec![wire(&chunk(6, 0, true, false, 0, 1 << 20, 16))],
    )
    .await;
    assert!(e.reason.contains("exceeds the limit"), "{e}");
}

#[tokio::test]
async fn chunks_without_the_feature_or_before_configuring_are_refused() {
    let srv = start(opts()).await;
    let _n = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let c = wire(&chunk(1, 0, true, true, 0, 16, 16));
    // Agreed, but nothing configured yet.
    let (mut u, _) = chunk_user(srv.users, None).await;
    u.send_raw(&c).await;
    let e = u.expect_error().await.unwrap();
    assert_eq!(e.code(), Some(ErrorCode::NotConfigured), "{e}");
    u.closed().await;
    // Never agreed: an unexpected message.
    srv.wait_free_nodes(1).await;
    let (mut u, _) = FakeUser::hello(srv.users, None).await;
    assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
    u.send_raw(&c).await;
    let e = u.expect_error().await.unwrap();
    assert_eq!(e.code(), Some(ErrorCode::UnexpectedMessage), "{e}");
    assert!(e.reason.contains("chunk"), "{e}");
}

/// Arbitrary bytes as chunk payloads, after a valid start: the server
/// answers with an error or a result, never panics, and serves the next user.
#[tokio::test]
async fn random_chunk_payloads_never_break_the_server() {
    let srv = start(opts()).await;
    let _n = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..40 {
        srv.wait_free_nodes(1).await;
        let (mut u, _) = chunk_user(srv.users, Some(512)).await;
        assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
        let len = (next() % 64) as usize;
        let mut payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 2 == 0 && len >= 24 {
            // Mostly-valid headers reach deeper checks.
            payload[4] = (next() % 4) as u8;
            payload[5] = (next() % 9) as u8;
            payload[8..16].copy_from_slice(&(next() % 64).to_le_bytes());
            payload[16..24].copy_from_slice(&(next() % 128).to_le_bytes());
        }
        let mut f = vec![0x1D, 0, 0, 0];
        f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        f.extend_from_slice(&payload);
        u.send_raw(&f).await;
        // Then a message that would complete if the state were still good.
        u.send(OutFrame::data(99, Bytes::from(vec![0u8; 16])).unwrap())
            .await;
        loop {
            match u.recv_skip_credit().await {
                None => break,
                Some(f) if f.ty == MsgType::Error => {
                    let e = ErrorMsg::parse(&f.payload).unwrap();
                    assert!(!e.reason.is_empty());
                }
                Some(f) => {
                    // Accepted as a valid one-chunk message, or the result of 99.
                    assert_eq!(f.ty, MsgType::Chunk, "round {round}");
                    let c = Chunk::parse(f.payload).unwrap();
                    if c.head.id == 99 {
                        break;
                    }
                }
            }
        }
    }
    srv.wait_free_nodes(1).await;
    let (mut u, _) = FakeUser::hello(srv.users, None).await;
    assert_eq!(u.configure(&bench(16, 16)).await.0, 0);
    assert_eq!(u.stream(0..10, 16, true).await.len(), 10);
}

#[tokio::test]
async fn a_seed_user_is_byte_for_byte_unchanged_next_to_a_chunks_user() {
    let srv = start(opts()).await;
    let _a = FakeNode::spawn(srv.nodes, "a", 1, Behaviour::Echo).await;
    let _b = FakeNode::spawn(srv.nodes, "b", 2, Behaviour::Echo).await;
    srv.wait_free_nodes(2).await;
    let mut h = Hello::new("user");
    h.features = ALL.iter().map(|f| f.to_string()).collect();
    h.nodes = Some(1);
    let (mut chunky, _) = chunk_user_with(srv.users, h).await;
    assert_eq!(chunky.configure(&bench(16, 16)).await.0, 0);

    let mut seed = FakeUser::connect(srv.users).await;
    let (status, errors) = seed.configure(&bench(16, 16)).await;
    assert_eq!((status, errors.len()), (0, 0));
    // The seed user's results are plain data messages of exactly the seed's
    // form: its id, then one output whose first byte is its node's tag.
    let mut tags = Vec::new();
    for id in 0..20u32 {
        seed.send(OutFrame::data(id, Bytes::from(vec![id as u8; 16])).unwrap())
            .await;
        let f = seed.recv().await.expect("a result");
        assert_eq!(f.ty, MsgType::Data);
        assert_eq!(f.payload.len(), 4 + 16);
        assert_eq!(&f.payload[..4], &id.to_le_bytes());
        assert!(f.payload[5..].iter().all(|&b| b == 0));
        tags.push(f.payload[4]);
    }
    assert!(
        tags.iter().all(|&t| t == tags[0] && (t == 1 || t == 2)),
        "{tags:?}"
    );
    // Meanwhile the chunks user still gets chunks.
    send_chunks(&mut chunky, 5, 3, Bytes::from(vec![0u8; 16]), 8).await;
    let (got, _) = recv_messages(&mut chunky, 1).await;
    assert_eq!(got[&5].0, 3);
}

async fn chunk_user_with(addr: std::net::SocketAddr, h: Hello) -> (FakeUser, Hello) {
    let mut u = FakeUser::connect(addr).await;
    u.send(h.to_frame()).await;
    let f = u.recv().await.expect("hello reply");
    (u, Hello::decode(&f.payload).unwrap())
}

#[tokio::test]
async fn shared_mode_takes_chunks_and_answers_in_the_message_class() {
    let srv = start(ServerOptions {
        sharing: corefarm_server::Sharing::Shared,
        ..opts()
    })
    .await;
    let _n = FakeNode::spawn(srv.nodes, "a", 4, Behaviour::Echo).await;
    srv.wait_status("one node", |s| s.nodes.len() == 1).await;
    let (mut u, h) = chunk_user(srv.users, Some(1024)).await;
    assert_eq!(h.chunk_size, Some(1024));
    assert_eq!(u.configure(&bench(4096, 3000)).await.0, 0);
    let data = Bytes::from(vec![5u8; 4096]);
    send_chunks(&mut u, 11, 1, data.clone(), 1024).await;
    u.send(OutFrame::data(12, data).unwrap()).await;
    let (got, _) = recv_messages(&mut u, 2).await;
    assert_eq!((got[&11].0, got[&11].1.len(), got[&11].1[0]), (1, 3000, 4));
    assert_eq!(got[&12].0, DEFAULT_CLASS);
    // A broken sequence is refused here too.
    send_chunks(&mut u, 13, 1, Bytes::from(vec![0u8; 4096]), 4096).await;
    let e = u.expect_error().await.unwrap();
    assert!(e.reason.contains("over the 1024 agreed"), "{e}");
    u.closed().await;
}

#[tokio::test]
async fn results_waiting_as_chunks_go_out_before_the_error_that_ends_the_session() {
    // 1 MiB results, read by nobody until the node has answered 8 and then
    // broken down: more than the sockets hold, so some wait as chunks when
    // the session ends for want of a node. They still go out before the
    // error that ends it.
    let srv = start(opts()).await;
    let _n = FakeNode::spawn(srv.nodes, "a", 3, Behaviour::GarbageAfter(8)).await;
    srv.wait_free_nodes(1).await;
    let mut u = FakeUser::connect(srv.users).await;
    let mut h = Hello::new("user");
    h.features = vec![features::ERROR.into(), features::CHUNKS.into()];
    u.send(h.to_frame()).await;
    assert_eq!(u.recv().await.expect("hello reply").ty, MsgType::Hello);
    assert_eq!(u.configure(&bench(16, 1 << 20)).await.0, 0);
    for id in 0..12u32 {
        u.send(OutFrame::data(id, Bytes::from(vec![0u8; 16])).unwrap())
            .await;
    }
    let (mut results, mut errors, mut open) = (Vec::new(), Vec::new(), HashMap::new());
    while let Some(f) = u.recv().await {
        match f.ty {
            MsgType::Chunk => {
                let c = Chunk::parse(f.payload).unwrap();
                let got: &mut u64 = open.entry(c.head.id).or_default();
                *got += c.data.len() as u64;
                if c.head.last {
                    assert_eq!(*got, 1 << 20, "result {} whole", c.head.id);
                    results.push(c.head.id);
                }
            }
            MsgType::Error => errors.push(ErrorMsg::parse(&f.payload).unwrap()),
            other => panic!("unexpected {}", other.name()),
        }
    }
    let last = errors.pop().expect("the error that ends the session");
    assert_eq!(
        (last.id, last.code()),
        (ErrorMsg::NO_ID, Some(ErrorCode::NoNodes)),
        "{last}"
    );
    // The node answered 0..8, each result is delivered whole; ids the
    // server had read after those get their own error (the server may not
    // have read them all).
    results.sort_unstable();
    assert_eq!(results, (0..8).collect::<Vec<_>>(), "errors {errors:?}");
    assert!(
        errors
            .iter()
            .all(|e| e.id >= 8 && e.code() == Some(ErrorCode::NoNodes)),
        "{errors:?}"
    );
}

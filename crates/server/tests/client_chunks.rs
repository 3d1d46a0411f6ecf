//! The Rust client with `chunks` against the server: priorities per call
//! and per `map`, chunked results reassembled, and one thread's bulk
//! submit letting another thread's urgent submit through between chunks.

use crate::common;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{opts, start, LIMIT};
use corefarm_client::{Client, ClientOptions};
use corefarm_server::ServerOptions;
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::{ConfigurationResponse, Data, Hello, MsgType, OutFrame};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// A node answering each data message with `count × output` bytes (first
/// byte: the count's low byte). The first `hold` messages wait until
/// `release`; everything after is answered at once.
async fn counting_node(
    addr: std::net::SocketAddr,
    input: usize,
    output: usize,
    hold: usize,
) -> oneshot::Sender<()> {
    let s = TcpStream::connect(addr).await.unwrap();
    let (rd, mut w) = s.into_split();
    let mut h = Hello::new("node");
    h.name = Some("counting".into());
    write_frame(&mut w, h.to_frame()).await.unwrap();
    let (release, mut released) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut r = FrameReader::new(rd, 1 << 30);
        let mut held = VecDeque::new();
        let mut holding = hold > 0;
        let answer = |d: &Data| {
            let count = d.data.len() / input;
            let mut out = vec![0u8; count * output];
            out[0] = count as u8;
            OutFrame::data(d.id, Bytes::from(out)).unwrap()
        };
        loop {
            let f = tokio::select! {
                f = r.read_frame() => f,
                _ = &mut released, if holding => {
                    holding = false;
                    for d in held.drain(..) {
                        if write_frame(&mut w, answer(&d)).await.is_err() { return; }
                    }
                    continue;
                }
            };
            let Ok(Some(f)) = f else { return };
            match f.ty {
                MsgType::Configuration => {
                    let ok = ConfigurationResponse {
                        status: ConfigurationResponse::OK,
                    };
                    write_frame(&mut w, ok.to_frame()).await.unwrap();
                }
                MsgType::Data => {
                    let d = Data::parse(f.payload).unwrap();
                    if holding && held.len() < hold {
                        held.push_back(d);
                    } else if write_frame(&mut w, answer(&d)).await.is_err() {
                        return;
                    }
                }
                _ => {}
            }
        }
    });
    release
}

fn chunk_opts(size: Option<u32>) -> ClientOptions {
    ClientOptions {
        chunks: true,
        chunk_size: size,
        io_timeout: Some(LIMIT),
        ..ClientOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_per_call_and_per_map_round_trip_as_chunks() {
    let srv = start(opts()).await;
    let _release = counting_node(srv.nodes, 1024, 700, 0).await;
    srv.wait_free_nodes(1).await;
    let users = srv.users.to_string();
    tokio::task::spawn_blocking(move || {
        let c = Client::connect(&users, chunk_opts(Some(512))).unwrap();
        assert_eq!(c.chunk_size(), Some(512));
        c.configure_benchmark(1024, 700, 0).unwrap();
        let id = c.submit_with(Bytes::from(vec![1u8; 3 * 1024]), 1).unwrap();
        let out = c.recv(Some(LIMIT)).unwrap();
        assert_eq!(
            (out.id, out.count, out.data.len(), out.data[0]),
            (id, 3, 2100, 3)
        );
        // Small and default class: sent whole, answered as chunks all the same.
        c.submit(Bytes::from(vec![2u8; 1024])).unwrap();
        assert_eq!(c.recv(Some(LIMIT)).unwrap().count, 1);
        let inputs = (1..=6).map(|n| Bytes::from(vec![0u8; n * 1024]));
        let counts: Vec<u8> = c.map_with(inputs, 3, 0).map(|r| r.unwrap()[0]).collect();
        assert_eq!(counts, [1, 2, 3, 4, 5, 6]);
        assert!(c.submit_with(Bytes::from(vec![0u8; 1024]), 8).is_err());
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_submit_passes_a_bulk_submit_of_another_thread() {
    let srv = start(ServerOptions {
        user_window: Some(16),
        ..opts()
    })
    .await;
    let (input, output) = (4096usize, 16usize);
    // Four held messages fill the node's window: the server stops reading
    // the user, so a bulk message cannot be written completely.
    let release = counting_node(srv.nodes, input, output, 4).await;
    srv.wait_free_nodes(1).await;
    let users = srv.users.to_string();
    let (ready_tx, ready_rx) = oneshot::channel();
    let client = tokio::task::spawn_blocking(move || {
        let c = std::sync::Arc::new(Client::connect(&users, chunk_opts(None)).unwrap());
        c.configure_benchmark(input as u32, output as u32, 0)
            .unwrap();
        for _ in 0..4 {
            c.submit(Bytes::from(vec![0u8; input])).unwrap();
        }
        let bulk = {
            let c = c.clone();
            // 32 MiB: far beyond what the socket buffers take.
            std::thread::spawn(move || c.submit_with(Bytes::from(vec![7u8; 8192 * input]), 7))
        };
        let deadline = Instant::now() + LIMIT;
        while c.chunks_written() == 0 {
            assert!(Instant::now() < deadline, "the bulk message never started");
            std::thread::yield_now();
        }
        let urgent = {
            let c = c.clone();
            std::thread::spawn(move || c.submit_with(Bytes::from(vec![0u8; input]), 0))
        };
        // Before the node is let go the urgent submit is in line: waiting
        // for its turn while the bulk writer holds the socket, or already
        // written (the server may take the whole bulk message in).
        while c.writers_waiting(0) == 0 && !urgent.is_finished() {
            assert!(Instant::now() < deadline, "the urgent submit never waited");
            std::thread::yield_now();
        }
        ready_tx.send(()).unwrap();
        let mut order = Vec::new();
        while order.len() < 6 {
            order.push(c.recv(Some(LIMIT)).unwrap().count);
        }
        let bulk_id = bulk.join().unwrap().unwrap();
        urgent.join().unwrap().unwrap();
        (order, bulk_id)
    });
    tokio::time::timeout(LIMIT, ready_rx)
        .await
        .unwrap()
        .unwrap();
    release.send(()).unwrap();
    let (order, _) = tokio::time::timeout(Duration::from_secs(30), client)
        .await
        .unwrap()
        .unwrap();
    // Four held, then the urgent one (1 input), the bulk one (8192) last.
    assert_eq!(order, [1, 1, 1, 1, 1, 8192], "{order:?}");
}

/// With bulk messages holding every credit and every place in the node's
/// window, an urgent message is still sent and answered: the server grants
/// a `chunks` user one credit beyond its nodes' windows, the client keeps
/// it for urgent classes, and the node takes one urgent message beyond its
/// window. Without either reserve the urgent submit waits for a bulk
/// result, which the node holds until the urgent one is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_message_passes_bulk_that_holds_every_credit_and_node_slot() {
    let srv = start(ServerOptions {
        credit: 2,
        credit_adaptive: false,
        ..opts()
    })
    .await;
    let (input, output) = (4096usize, 16usize);
    let release = counting_node(srv.nodes, input, output, 2).await;
    srv.wait_free_nodes(1).await;
    let users = srv.users.to_string();
    let client = tokio::task::spawn_blocking(move || {
        let c = std::sync::Arc::new(Client::connect(&users, chunk_opts(None)).unwrap());
        c.configure_benchmark(input as u32, output as u32, 0)
            .unwrap();
        let bulk: Vec<_> = (0..2)
            .map(|_| {
                c.submit_pending_with(Bytes::from(vec![7u8; 4 * input]), 7)
                    .unwrap()
            })
            .collect();
        // A third bulk message leaves the last credit to urgent classes.
        let third = {
            let c = c.clone();
            std::thread::spawn(move || {
                c.submit_pending_with(Bytes::from(vec![7u8; 4 * input]), 7)
                    .map(|p| p.wait(Some(LIMIT)).unwrap().count)
            })
        };
        assert!(
            c.wait_for_credit_waiters(1, LIMIT),
            "the third bulk message waits for credit"
        );
        let urgent = c
            .submit_pending_with(Bytes::from(vec![0u8; input]), 0)
            .unwrap();
        let out = urgent.wait(Some(LIMIT)).unwrap();
        (out.count, bulk, third)
    });
    let (count, bulk, third) = tokio::time::timeout(LIMIT, client).await.unwrap().unwrap();
    assert_eq!(count, 1, "the urgent message's answer");
    release.send(()).unwrap();
    let counts = tokio::task::spawn_blocking(move || {
        let mut v: Vec<u32> = bulk
            .into_iter()
            .map(|p| p.wait(Some(LIMIT)).unwrap().count)
            .collect();
        v.push(third.join().unwrap().unwrap());
        v
    })
    .await
    .unwrap();
    assert_eq!(counts, [4, 4, 4]);
}

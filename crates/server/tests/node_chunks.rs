//! The server↔node link with chunks: negotiation, data messages
//! larger than the chunk size sent as chunks, chunked and interleaved
//! results handed to the user whole, nodes without chunks unchanged, and a
//! node that breaks the chunk rules dropped with its work re-dispatched.

use crate::common;

use std::collections::HashMap;

use bytes::Bytes;
use common::{bench, opts, start, Behaviour, FakeNode, FakeUser, LIMIT};
use corefarm_smp::codec::{write_frame, FrameReader};
use corefarm_smp::hello::features;
use corefarm_smp::stream::{Chunk, Chunks, Reassembler};
use corefarm_smp::{Configuration, ConfigurationResponse, Data, Hello, MsgType};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// What the chunking fake node saw: the server's hello, and per data
/// message how it arrived (chunks, or 0 for a plain data frame).
#[derive(Debug)]
enum Seen {
    Hello(Hello),
    Message { chunks: usize },
}

#[derive(Clone, Copy, PartialEq)]
enum Script {
    /// Answers every message, each result cut into `size`-byte chunks, two
    /// results at a time with their chunks interleaved.
    Interleave(usize),
    /// Sends a chunk of a message it never began.
    BadChunk,
}

async fn chunking_node(
    addr: std::net::SocketAddr,
    size: u32,
    script: Script,
) -> mpsc::UnboundedReceiver<Seen> {
    let s = TcpStream::connect(addr).await.unwrap();
    let (rd, mut w) = s.into_split();
    let mut h = Hello::new("node");
    h.name = Some("chunky".into());
    h.features = vec![features::ERROR.into(), features::CHUNKS.into()];
    h.chunk_size = Some(size);
    write_frame(&mut w, h.to_frame()).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut r = FrameReader::new(rd, 1 << 30);
        let mut re = Reassembler::new(1 << 30, 16, 1 << 30);
        let mut parts: HashMap<u32, usize> = HashMap::new();
        let (mut output, mut waiting) = (0usize, Vec::<(u32, Vec<Chunk>)>::new());
        while let Ok(Some(f)) = r.read_frame().await {
            let done = match f.ty {
                MsgType::Hello => {
                    let _ = tx.send(Seen::Hello(Hello::decode(&f.payload).unwrap()));
                    None
                }
                MsgType::Configuration => {
                    output = Configuration::parse(f.payload).unwrap().output_size as usize;
                    let ok = ConfigurationResponse { status: 0 };
                    write_frame(&mut w, ok.to_frame()).await.unwrap();
                    None
                }
                MsgType::Data => Some((Data::parse(f.payload).unwrap().id, 0)),
                MsgType::Chunk => {
                    let c = Chunk::parse(f.payload).unwrap();
                    *parts.entry(c.head.id).or_default() += 1;
                    re.push(c)
                        .unwrap()
                        .map(|m| (m.id, parts.remove(&m.id).unwrap()))
                }
                _ => None,
            };
            let Some((id, chunks)) = done else { continue };
            let _ = tx.send(Seen::Message { chunks });
            if script == Script::BadChunk {
                let c = Chunk::new(77, 4, 8, 16, Bytes::from_static(&[0; 8]));
                w.write_all(&c.to_frame().unwrap().to_vec()).await.unwrap();
                continue;
            }
            let Script::Interleave(cut) = script else {
                continue;
            };
            let mut out = vec![id as u8; output];
            out[0] = 7;
            let class = (id % 8) as u8;
            waiting.push((
                id,
                Chunks::new(id, class, Bytes::from(out), cut)
                    .unwrap()
                    .collect(),
            ));
            if waiting.len() < 2 {
                continue;
            }
            let (a, b) = (waiting.remove(0).1, waiting.remove(0).1);
            let mut order = Vec::new();
            for i in 0..a.len().max(b.len()) {
                order.extend(a.get(i).cloned());
                order.extend(b.get(i).cloned());
            }
            for c in order {
                if w.write_all(&c.to_frame().unwrap().to_vec()).await.is_err() {
                    return;
                }
            }
        }
    });
    rx
}

#[tokio::test]
async fn chunks_both_ways_and_every_result_reaches_the_user_whole() {
    let srv = start(corefarm_server::ServerOptions {
        node_chunk_size: 1024,
        ..opts()
    })
    .await;
    let mut seen = chunking_node(srv.nodes, 4096, Script::Interleave(1000)).await;
    let Some(Seen::Hello(h)) = seen.recv().await else {
        panic!("the server answers the hello first")
    };
    assert!(h.has(features::CHUNKS), "{h:?}");
    assert_eq!(h.chunk_size, Some(1024), "the smaller size is in force");
    srv.wait_free_nodes(1).await;
    let (mut u, _) = FakeUser::hello(srv.users, Some(1)).await;
    assert_eq!(u.configure(&bench(5000, 3000)).await.0, 0);
    // An even number: the node answers two at a time.
    let results = u.stream(0..40, 5000, true).await;
    assert_eq!(results.len(), 40);
    for (id, r) in &results {
        assert_eq!(r.len(), 3000);
        assert_eq!(r[0], 7);
        assert!(r[1..].iter().all(|&b| b == *id as u8), "result {id}");
    }
    let mut messages = 0;
    while let Ok(s) = seen.try_recv() {
        let Seen::Message { chunks, .. } = s else {
            continue;
        };
        // 5000 bytes in chunks of at most 1024.
        assert_eq!(chunks, 5, "a large message goes as chunks");
        messages += 1;
    }
    assert_eq!(messages, 40);
}

#[tokio::test]
async fn small_messages_and_nodes_without_chunks_keep_plain_data() {
    let srv = start(corefarm_server::ServerOptions {
        node_chunk_size: 1024,
        ..opts()
    })
    .await;
    // Below the chunk size: plain data frames even on a chunking link.
    let mut seen = chunking_node(srv.nodes, 4096, Script::Interleave(100)).await;
    srv.wait_free_nodes(1).await;
    let (mut u, _) = FakeUser::hello(srv.users, Some(1)).await;
    assert_eq!(u.configure(&bench(1000, 500)).await.0, 0);
    assert_eq!(u.stream(0..10, 1000, true).await.len(), 10);
    while let Ok(s) = seen.try_recv() {
        if let Seen::Message { chunks, .. } = s {
            assert_eq!(chunks, 0, "a plain data frame");
        }
    }
    drop(u);
    // A node that does not list chunks (hello without the feature) gets
    // large messages whole.
    let srv = start(corefarm_server::ServerOptions {
        node_chunk_size: 1024,
        ..opts()
    })
    .await;
    let _plain = FakeNode::spawn(srv.nodes, "plain", 3, Behaviour::Echo).await;
    srv.wait_free_nodes(1).await;
    let (mut u, _) = FakeUser::hello(srv.users, Some(1)).await;
    assert_eq!(u.configure(&bench(5000, 3000)).await.0, 0);
    let results = u.stream(0..10, 5000, true).await;
    assert!(results.values().all(|r| r.len() == 3000 && r[0] == 3));
}

#[tokio::test]
async fn a_node_that_breaks_the_chunk_rules_is_dropped_and_its_work_redone() {
    let srv = start(corefarm_server::ServerOptions {
        node_chunk_size: 1024,
        ..opts()
    })
    .await;
    let mut seen = chunking_node(srv.nodes, 1024, Script::BadChunk).await;
    let _good = FakeNode::spawn(srv.nodes, "good", 1, Behaviour::Echo).await;
    srv.wait_free_nodes(2).await;
    let (mut u, _) = FakeUser::hello(srv.users, Some(2)).await;
    assert_eq!(u.configure(&bench(64, 64)).await.0, 0);
    let results = u.stream(0..20, 64, true).await;
    assert_eq!(results.len(), 20);
    assert!(
        results.values().all(|r| r[0] == 1),
        "only the good node answered"
    );
    let s = srv
        .wait_status("the bad node gone", |s| s.nodes.len() == 1)
        .await;
    assert_eq!(s.nodes[0].name.as_deref(), Some("good"));
    // The bad node did receive work before it was dropped.
    let got = tokio::time::timeout(LIMIT, async {
        while let Some(s) = seen.recv().await {
            if matches!(s, Seen::Message { .. }) {
                return true;
            }
        }
        false
    })
    .await
    .unwrap();
    assert!(got);
}

//! Run reads over real TCP sockets: whatever the sender interleaves, the
//! placing reader hands out exactly what reading chunk by chunk would.

use bytes::Bytes;
use proptest::prelude::*;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::codec::tests::placing::read_all;
use crate::codec::{FrameReader, Read};
use crate::message::Frame;
use crate::outframe::OutFrame;
use crate::stream::{Chunk, Message, Reassembler};

fn message(id: u32, n: usize) -> Bytes {
    Bytes::from(
        (0..n)
            .map(|i| (i * 31 + id as usize) as u8)
            .collect::<Vec<u8>>(),
    )
}

/// Chunks of `data` with the given data sizes, in turn (the last one
/// repeated), each chunk the size the sender chose.
fn chunks(id: u32, class: u8, data: &Bytes, sizes: &[usize]) -> Vec<Chunk> {
    let (mut v, mut at, mut k) = (Vec::new(), 0, 0);
    loop {
        let n = sizes[k.min(sizes.len() - 1)].min(data.len() - at);
        k += 1;
        let total = data.len() as u64;
        v.push(Chunk::new(
            id,
            class,
            at as u64,
            total,
            data.slice(at..at + n),
        ));
        at += n;
        if at == data.len() {
            return v;
        }
    }
}

fn wire(c: &Chunk) -> Vec<u8> {
    c.to_frame().unwrap().to_vec()
}

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (b, _) = l.accept().await.unwrap();
    (a, b)
}

/// Writes `stream` in pieces of the sizes given while the reader reads.
async fn send(mut a: TcpStream, stream: Vec<u8>, pieces: Vec<usize>) {
    let mut at = 0;
    for (k, n) in pieces.iter().cycle().enumerate() {
        let end = (at + n).min(stream.len());
        a.write_all(&stream[at..end]).await.unwrap();
        at = end;
        if at == stream.len() {
            break;
        }
        if k % 3 == 0 {
            tokio::task::yield_now().await;
        }
    }
}

#[tokio::test]
async fn a_message_sent_at_once_is_read_in_runs_without_a_copy() {
    let data = message(3, 64 * 4096 + 100);
    let stream: Vec<u8> = chunks(3, 2, &data, &[4096]).iter().flat_map(wire).collect();
    let (a, b) = pair().await;
    let sender = tokio::spawn(send(a, stream, vec![usize::MAX]));
    let mut r = FrameReader::new(b, 1 << 20);
    let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
    let (whole, frames) = read_all(&mut r, &mut re).await.unwrap();
    sender.await.unwrap();
    assert!(frames.is_empty());
    assert_eq!(whole.len(), 1);
    assert_eq!((whole[0].id, whole[0].class), (3, 2));
    assert_eq!(whole[0].data, data);
    assert!(r.run.taken > 0, "no chunk was read ahead");
    // Only the first read, before the message was open, went to the
    // decoder (its smallest read); everything after it went in place.
    assert!(r.dec.copied <= 16 * 1024, "{} bytes copied", r.dec.copied);
}

/// The same stream read chunk by chunk (a byte slice has no socket).
async fn oracle(stream: &[u8]) -> (Vec<Message>, Vec<Frame>) {
    let mut r = FrameReader::new(stream, 1 << 20);
    let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
    read_all(&mut r, &mut re).await.unwrap()
}

/// Messages (id, size, chunk sizes) interleaved chunk by chunk in the
/// order `pick` gives, with a plain frame after every `every`-th chunk.
fn interleave(msgs: &[(u32, usize, Vec<usize>)], pick: &[usize], every: usize) -> Vec<u8> {
    let mut queues: Vec<std::collections::VecDeque<Chunk>> = msgs
        .iter()
        .map(|(id, n, sizes)| chunks(*id, (*id % 8) as u8, &message(*id, *n), sizes).into())
        .collect();
    let (mut stream, mut k) = (Vec::new(), 0);
    while queues.iter().any(|q| !q.is_empty()) {
        let live: Vec<usize> = (0..queues.len())
            .filter(|&i| !queues[i].is_empty())
            .collect();
        let q = live[pick[k % pick.len()] % live.len()];
        stream.extend(wire(&queues[q].pop_front().unwrap()));
        k += 1;
        if every > 0 && k % every == 0 {
            let f = OutFrame::data(1000 + k as u32, Bytes::from(vec![k as u8; k % 300]));
            stream.extend(f.unwrap().to_vec());
        }
    }
    stream
}

async fn check(stream: Vec<u8>, pieces: Vec<usize>) -> usize {
    let (want_whole, want_frames) = oracle(&stream).await;
    let (a, b) = pair().await;
    let sender = tokio::spawn(send(a, stream, pieces));
    let mut r = FrameReader::new(b, 1 << 20);
    let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
    let (whole, frames) = read_all(&mut r, &mut re).await.unwrap();
    sender.await.unwrap();
    let ids = |w: &[Message]| w.iter().map(|m| (m.id, m.class)).collect::<Vec<_>>();
    assert_eq!(ids(&whole), ids(&want_whole));
    for (m, w) in whole.iter().zip(&want_whole) {
        assert_eq!(m.data, w.data, "message {}", m.id);
    }
    assert_eq!(frames.len(), want_frames.len());
    for (f, w) in frames.iter().zip(&want_frames) {
        assert_eq!((f.ty, &f.payload), (w.ty, &w.payload));
    }
    r.run.taken
}

#[tokio::test]
async fn wrong_guesses_go_back_to_the_decoder_in_stream_order() {
    // Chunks shorter and longer than the one before them, other
    // messages' chunks and plain frames between a message's chunks.
    let msgs = vec![
        (1, 90_000, vec![4000, 4000, 1500, 9000, 700, 4000]),
        (2, 20_000, vec![3000]),
        (3, 0, vec![1]),
        (4, 30_001, vec![30_000]),
    ];
    for (pick, every) in [(vec![0], 0), (vec![0, 0, 0, 1], 5), (vec![0, 1, 2, 3], 3)] {
        let taken = check(interleave(&msgs, &pick, every), vec![usize::MAX]).await;
        if every == 0 {
            assert!(taken > 0, "messages one after another are read in runs");
        }
    }
}

/// Reads given up mid-way (their futures dropped) and begun again lose
/// and repeat nothing: a run's `readv` and the chunks it took ahead are
/// settled before the read can wait again.
#[tokio::test]
async fn reads_given_up_and_begun_again_hand_out_the_same() {
    let msgs = vec![(1, 300_000, vec![8192]), (2, 50_000, vec![4096, 999])];
    let stream = interleave(&msgs, &[0, 0, 0, 1], 7);
    let (want_whole, want_frames) = oracle(&stream).await;
    let (mut a, b) = pair().await;
    // The sender writes its next piece only once a read has been given
    // up, so every piece finds the reader waiting somewhere in a frame.
    let (gave_up, mut next) = tokio::sync::mpsc::unbounded_channel::<()>();
    let sender = tokio::spawn(async move {
        for piece in stream.chunks(20_000) {
            next.recv().await.unwrap();
            a.write_all(piece).await.unwrap();
        }
    });
    let mut r = FrameReader::new(b, 1 << 20);
    let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
    let (mut whole, mut frames, mut given_up) = (Vec::new(), Vec::new(), 0);
    loop {
        let t = std::time::Duration::from_micros(50);
        let got = match tokio::time::timeout(t, r.read_placing(&mut re)).await {
            Err(_) => {
                given_up += 1;
                let _ = gave_up.send(()); // the sender may be done
                continue;
            }
            Ok(got) => got.unwrap(),
        };
        match got {
            None => break,
            Some(Read::Placed { whole: m, .. }) => whole.extend(m),
            Some(Read::Frame(f)) if f.ty == crate::header::MsgType::Chunk => {
                whole.extend(re.push(Chunk::parse(f.payload).unwrap()).unwrap());
            }
            Some(Read::Frame(f)) => frames.push(f),
        }
    }
    sender.await.unwrap();
    assert!(given_up > 0, "no read was given up");
    let ids = |w: &[Message]| w.iter().map(|m| (m.id, m.data.clone())).collect::<Vec<_>>();
    assert_eq!(ids(&whole), ids(&want_whole));
    let fr = |f: &[Frame]| f.iter().map(|f| f.payload.clone()).collect::<Vec<_>>();
    assert_eq!(fr(&frames), fr(&want_frames));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random messages, chunk sizes, interleavings, plain frames and
    /// write boundaries: the runs change nothing the reader hands out.
    #[test]
    fn runs_hand_out_what_chunk_by_chunk_reading_does(
        msgs in proptest::collection::vec(
            (0usize..70_000, proptest::collection::vec(1usize..9000, 1..4)),
            1..5,
        ),
        pick in proptest::collection::vec(0usize..8, 1..6),
        every in 0usize..7,
        pieces in proptest::collection::vec(1usize..50_000, 1..4),
    ) {
        let msgs: Vec<(u32, usize, Vec<usize>)> = msgs
            .into_iter()
            .enumerate()
            .map(|(i, (n, sizes))| (i as u32 + 1, n, sizes))
            .collect();
        let stream = interleave(&msgs, &pick, every);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(check(stream, pieces));
    }
}

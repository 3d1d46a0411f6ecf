use super::*;
use bytes::Bytes;
use corefarm_smp::codec::FrameReader;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};

async fn pair() -> (Arc<Sink>, FrameReader<TcpStream>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap());
    let (client, accepted) = tokio::join!(client, l.accept());
    let (_rd, wr) = accepted.unwrap().0.into_split();
    (
        Arc::new(Sink::new(wr)),
        FrameReader::new(client.unwrap(), 64 << 20),
    )
}

fn frame(i: u32, len: usize) -> OutFrame {
    OutFrame::data(i, Bytes::from(vec![i as u8; len])).unwrap()
}

#[tokio::test]
async fn frames_arrive_in_order_whether_written_directly_or_queued() {
    let (sink, mut rd) = pair().await;
    let writer = tokio::spawn({
        let sink = sink.clone();
        async move { sink.run(Duration::from_secs(10), |_| {}).await }
    });
    // Far more than the socket buffers hold while nobody reads: the first
    // frames go out directly, the rest queue behind a partial write.
    let mut outcomes = Vec::new();
    for i in 0..64u32 {
        outcomes.push(sink.send(frame(i, 256 << 10), true));
    }
    assert_eq!(outcomes[0], Sent::Written);
    assert!(outcomes.contains(&Sent::Queued), "the socket never filled");
    for i in 0..64u32 {
        let f = rd.read_frame().await.unwrap().unwrap();
        assert_eq!(&f.payload[..4], &i.to_le_bytes(), "frame {i} out of order");
        assert_eq!(f.payload.len(), 4 + (256 << 10));
        assert!(f.payload[4..].iter().all(|&b| b == i as u8));
    }
    // Drained: the next frame is written directly again.
    sink.room(0).await;
    while sink.send(frame(99, 16), false) != Sent::Written {
        assert_eq!(rd.read_frame().await.unwrap().unwrap().payload[0], 99);
    }
    sink.finish();
    assert_eq!(writer.await.unwrap(), None);
    assert_eq!(rd.read_frame().await.unwrap().unwrap().payload[0], 99);
    assert!(
        rd.read_frame().await.unwrap().is_none(),
        "no end of stream after finish"
    );
    assert_eq!(sink.send(frame(1, 1), false), Sent::Closed);
}

#[tokio::test]
async fn room_waits_for_the_writer_and_close_ends_everything() {
    let (sink, mut rd) = pair().await;
    let mut tagged = 0;
    let mut i = 0;
    while sink.send(frame(i, 256 << 10), true) != Sent::Queued {
        i += 1;
    }
    for j in 0..4 {
        sink.send(frame(i + 1 + j, 16), j % 2 == 0);
    }
    // Nobody runs the writer task yet: the queue cannot shrink.
    tokio::select! {
        biased;
        _ = sink.room(1) => panic!("room with 5 frames queued and max 1"),
        _ = std::future::ready(()) => {}
    }
    let sink2 = sink.clone();
    let run = sink2.run(Duration::from_secs(10), |n| tagged += n);
    let read = async {
        for _ in 0..i + 5 {
            rd.read_frame().await.unwrap().unwrap();
        }
        sink.room(0).await;
        sink.close("test over");
    };
    let (reason, ()) = tokio::join!(run, read);
    assert_eq!(reason.as_deref(), Some("test over"));
    // The partly written frame plus the two tagged small ones.
    assert_eq!(tagged, 3);
    assert_eq!(sink.send(frame(0, 1), true), Sent::Closed);
    assert!(rd.read_frame().await.unwrap().is_none());
}

#[tokio::test]
async fn pushed_frames_wait_for_the_flush_and_share_it() {
    let (sink, mut rd) = pair().await;
    assert!(!sink.unflushed());
    for i in 0..3u32 {
        assert!(sink.push(frame(i, 100), i != 1));
    }
    assert!(sink.unflushed());
    assert_eq!(sink.flush(), 2, "two tagged frames written");
    assert!(!sink.unflushed());
    assert_eq!(sink.flush(), 0, "nothing left to write");
    for i in 0..3u32 {
        let f = rd.read_frame().await.unwrap().unwrap();
        assert_eq!(&f.payload[..4], &i.to_le_bytes());
    }
}

#[tokio::test]
async fn a_sink_via_task_leaves_every_write_to_the_writer_task() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap());
    let (client, accepted) = tokio::join!(client, l.accept());
    let (_rd, wr) = accepted.unwrap().0.into_split();
    let sink = Sink::via_task(wr);
    let mut rd = FrameReader::new(client.unwrap(), 1 << 20);
    for i in 0..3u32 {
        assert!(sink.push(frame(i, 10), true));
    }
    assert!(!sink.unflushed(), "nothing for the owner to flush");
    assert_eq!(sink.flush(), 0);
    let mut written = 0;
    let read = async {
        for i in 0..3u32 {
            let f = rd.read_frame().await.unwrap().unwrap();
            assert_eq!(&f.payload[..4], &i.to_le_bytes());
        }
        sink.close("done");
    };
    let (reason, ()) = tokio::join!(sink.run(Duration::from_secs(10), |n| written += n), read);
    assert_eq!(reason.as_deref(), Some("done"));
    assert_eq!(written, 3, "the task reports every tagged frame");
}

#[tokio::test]
async fn room_returns_once_its_own_flush_wrote_the_queue() {
    let (sink, mut rd) = pair().await;
    for i in 0..3u32 {
        sink.push(frame(i, 10), false);
    }
    // No writer task runs: only the flush inside `room` can make room.
    sink.room(0).await;
    for i in 0..3u32 {
        let f = rd.read_frame().await.unwrap().unwrap();
        assert_eq!(&f.payload[..4], &i.to_le_bytes());
    }
}

/// The producer flushes only when it has nothing else to do; an urgent
/// frame must not wait for that (a handler busy reading a user's bulk
/// chunks never gets there): it is written by the push itself, ahead of
/// the bulk chunks queued before it.
#[tokio::test]
async fn an_urgent_frame_is_written_at_once_ahead_of_queued_bulk_chunks() {
    let (sink, mut rd) = pair().await;
    sink.set_chunk_size(1024);
    assert!(sink.push_class(frame(1, 8 << 10), 7, false));
    assert!(sink.unflushed(), "bulk waits for the producer's flush");
    assert!(sink.push_class(frame(2, 100), 0, false));
    assert!(!sink.unflushed(), "the urgent push wrote the queue itself");
    // No flush from here on: whatever arrives, the push wrote.
    // Outside the default class even a small message goes as one chunk,
    // so that its class reaches the node.
    let first = rd.read_frame().await.unwrap().unwrap();
    assert_eq!(first.ty, corefarm_smp::MsgType::Chunk);
    let c = corefarm_smp::stream::Chunk::parse(first.payload).unwrap();
    assert_eq!(
        (c.head.id, c.head.class, c.head.last),
        (2, 0, true),
        "urgent first, whole"
    );
    let mut bulk = 0;
    while bulk < 8 << 10 {
        let f = rd.read_frame().await.unwrap().unwrap();
        assert_eq!(f.ty, corefarm_smp::MsgType::Chunk);
        bulk += f.payload.len() - corefarm_smp::stream::CHUNK_HEADER_LEN;
    }
    assert_eq!(bulk, 8 << 10);
    // The default class still waits for the flush, to share its writev.
    assert!(sink.push_class(frame(3, 100), DEFAULT_CLASS, false));
    assert!(sink.unflushed());
}

/// A sink on one end of a loopback connection and the bare other end.
async fn raw_pair() -> (Arc<Sink>, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(l.local_addr().unwrap());
    let (client, accepted) = tokio::join!(client, l.accept());
    let (_rd, wr) = accepted.unwrap().0.into_split();
    (Arc::new(Sink::new(wr)), client.unwrap())
}

#[tokio::test(start_paused = true)]
async fn the_write_timeout_cuts_off_a_peer_that_stops_reading_not_a_slow_one() {
    use tokio::io::AsyncReadExt;
    let stall = Duration::from_secs(1);
    // 16 MiB read 64 KiB every 10 ms (of the paused clock): about 2.6 s,
    // in batches of 8 MiB that each take longer than `stall`.
    let (sink, mut slow) = raw_pair().await;
    let writer = tokio::spawn({
        let sink = sink.clone();
        async move { sink.run(stall, |_| {}).await }
    });
    for i in 0..64u32 {
        sink.send(frame(i, 256 << 10), true);
    }
    let total = 64 * (corefarm_smp::HEADER_LEN + 4 + (256 << 10));
    let mut buf = vec![0u8; 64 << 10];
    let mut got = 0;
    while got < total {
        let n = slow.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed after {got} of {total} bytes");
        got += n;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sink.finish();
    assert_eq!(writer.await.unwrap(), None, "a slow reader was cut off");
    // One that stops reading is cut off after `stall` without progress.
    let (sink, _stopped) = raw_pair().await;
    let writer = tokio::spawn({
        let sink = sink.clone();
        async move { sink.run(stall, |_| {}).await }
    });
    for i in 0..64u32 {
        sink.send(frame(i, 256 << 10), true);
    }
    let why = writer.await.unwrap().expect("cut off");
    assert!(why.contains("no progress"), "{why}");
}

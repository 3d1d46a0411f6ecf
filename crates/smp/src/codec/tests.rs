use super::*;
use crate::header::MsgType;
use bytes::Bytes;

/// A buffering writer stands for a TLS stream whose socket was full:
/// it sends only when flushed. Both writers must leave nothing behind.
#[tokio::test]
async fn written_frames_leave_nothing_in_a_buffering_writer() {
    let (a, b) = tokio::io::duplex(1 << 16);
    let mut w = tokio::io::BufWriter::with_capacity(1 << 16, a);
    write_frame(
        &mut w,
        OutFrame::data(1, Bytes::from_static(b"one")).unwrap(),
    )
    .await
    .unwrap();
    let mut second = Some(OutFrame::data(3, Bytes::from_static(b"three")).unwrap());
    let first = OutFrame::data(2, Bytes::from_static(b"two")).unwrap();
    assert_eq!(
        write_batch(&mut w, first, || second.take()).await.unwrap(),
        2
    );
    assert!(w.buffer().is_empty(), "everything was flushed");
    drop(w);
    let mut r = FrameReader::new(b, 1024);
    for (id, body) in [(1u32, &b"one"[..]), (2, b"two"), (3, b"three")] {
        let f = r.read_frame().await.unwrap().unwrap();
        assert_eq!(
            (f.ty, &f.payload[..4], &f.payload[4..]),
            (MsgType::Data, &id.to_le_bytes()[..], body)
        );
    }
}

#[tokio::test]
async fn reads_frames_across_arbitrary_splits() {
    let mut wire = Vec::new();
    for i in 0..50u32 {
        wire.extend(
            OutFrame::data(i, Bytes::from(vec![i as u8; i as usize * 97]))
                .unwrap()
                .to_vec(),
        );
    }
    let (mut a, b) = tokio::io::duplex(333);
    let writer = tokio::spawn(async move {
        for chunk in wire.chunks(1000) {
            a.write_all(chunk).await.unwrap();
        }
    });
    let mut r = FrameReader::new(b, 1 << 20);
    for i in 0..50u32 {
        let f = r.read_frame().await.unwrap().unwrap();
        assert_eq!(f.ty, MsgType::Data);
        assert_eq!(&f.payload[..4], &i.to_le_bytes());
        assert_eq!(f.payload.len(), 4 + i as usize * 97);
    }
    writer.await.unwrap();
    assert!(r.read_frame().await.unwrap().is_none());
}

#[tokio::test]
async fn truncated_stream_is_an_error() {
    let wire = OutFrame::data(1, Bytes::from_static(b"abcdef"))
        .unwrap()
        .to_vec();
    let mut r = FrameReader::new(&wire[..wire.len() - 2], 1024);
    assert!(matches!(
        r.read_frame().await,
        Err(ReadError::Protocol(ProtocolError::TruncatedStream(_)))
    ));
}

#[tokio::test]
async fn oversize_header_fails_before_allocating() {
    let wire = [3u8, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF];
    let mut r = FrameReader::new(&wire[..], 1024);
    assert!(matches!(
        r.read_frame().await,
        Err(ReadError::Protocol(ProtocolError::TooLarge { .. }))
    ));
    // The refusal can still tell what the peer was sending.
    assert_eq!(r.begun_type(), Some(3));
}

#[tokio::test(start_paused = true)]
async fn read_timeout_cuts_a_trickled_header_but_not_an_idle_peer() {
    let t = Duration::from_secs(10);
    let (mut a, b) = tokio::io::duplex(64);
    let mut r = FrameReader::new(b, 1024).with_read_timeout(t);
    // Idle between frames: no deadline (the read is still pending long after t).
    let idle = tokio::time::timeout(t * 3, r.read_frame()).await;
    assert!(
        idle.is_err(),
        "an idle peer is not cut off by the read timeout"
    );
    // One header byte every 3 s: each read makes progress, but the header
    // as a whole takes longer than t.
    let trickle = tokio::spawn(async move {
        for b in [3u8, 0, 0, 0, 2, 0, 0, 0] {
            a.write_all(&[b]).await.unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        a
    });
    let e = r.read_frame().await.unwrap_err();
    match e {
        ReadError::Io(e) => {
            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
            assert!(e.to_string().contains("header"), "{e}");
        }
        other => panic!("expected a timeout, got {other}"),
    }
    drop(trickle);
}

#[tokio::test(start_paused = true)]
async fn read_timeout_needs_payload_progress_not_speed() {
    let t = Duration::from_secs(10);
    let (mut a, b) = tokio::io::duplex(64);
    let mut r = FrameReader::new(b, 1024).with_read_timeout(t);
    let wire = OutFrame::data(7, Bytes::from(vec![1u8; 20]))
        .unwrap()
        .to_vec();
    let (head, rest) = wire.split_at(12);
    a.write_all(head).await.unwrap();
    // Payload bytes every 5 s (each gap < t): slow, but always progressing.
    let rest = rest.to_vec();
    let writer = tokio::spawn(async move {
        for chunk in rest.chunks(4) {
            tokio::time::sleep(Duration::from_secs(5)).await;
            a.write_all(chunk).await.unwrap();
        }
        // Then half a message and silence.
        a.write_all(&[3, 0, 0, 0, 9, 0, 0, 0, 1]).await.unwrap();
        a
    });
    let f = r.read_frame().await.unwrap().unwrap();
    assert_eq!(f.payload.len(), 24);
    let e = r.read_frame().await.unwrap_err();
    assert!(e.to_string().contains("no progress"), "{e}");
    drop(writer);
}

/// Records what a metered reader reports, refusing past `limit`.
#[derive(Debug)]
struct Held {
    seen: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    limit: usize,
}

impl Meter for Held {
    fn hold(&mut self, bytes: usize) -> Result<(), ProtocolError> {
        self.seen.lock().unwrap().push(bytes);
        if bytes > self.limit {
            return Err(ProtocolError::OverBudget(format!("{bytes} held")));
        }
        Ok(())
    }
}

/// A peer that announces a large frame and trickles it: the reader holds,
/// reports and reserves what arrived, not what was announced; the frame
/// once whole is the caller's (reported as no longer held); and a refusal
/// fails the read.
#[tokio::test(start_paused = true)]
async fn a_metered_reader_holds_what_arrived_not_what_was_announced() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let meter = |limit| {
        Box::new(Held {
            seen: seen.clone(),
            limit,
        })
    };
    let announced: u32 = 64 << 20;
    let mut head = vec![MsgType::Configuration as u8, 0, 0, 0];
    head.extend_from_slice(&announced.to_le_bytes());
    let (mut a, b) = tokio::io::duplex(1 << 20);
    let mut r = FrameReader::new(b, u32::MAX).with_meter(meter(usize::MAX));
    a.write_all(&head).await.unwrap();
    a.write_all(&[7u8; 100_000]).await.unwrap();
    let read = tokio::time::timeout(Duration::from_millis(50), r.read_frame()).await;
    assert!(read.is_err(), "the frame is not whole yet");
    assert_eq!(r.dec.buffered(), 8 + 100_000);
    assert_eq!(seen.lock().unwrap().last(), Some(&(8 + 100_000)));
    let reserved = r.dec.buf.capacity();
    assert!(
        reserved <= METERED_RESERVE + (1 << 20),
        "{reserved} bytes reserved for 100 kB of a 64 MiB frame"
    );
    // An unmetered reader reserves the whole announced frame.
    let (mut a2, b2) = tokio::io::duplex(1 << 20);
    let mut whole = FrameReader::new(b2, u32::MAX);
    a2.write_all(&head).await.unwrap();
    let read = tokio::time::timeout(Duration::from_millis(50), whole.read_frame()).await;
    assert!(read.is_err());
    assert!(whole.dec.buf.capacity() >= announced as usize);

    // A small frame whole: nothing held once it is read.
    let (mut a, b) = tokio::io::duplex(1 << 20);
    let mut r = FrameReader::new(b, u32::MAX).with_meter(meter(usize::MAX));
    let wire = OutFrame::data(1, Bytes::from(vec![1u8; 5000]))
        .unwrap()
        .to_vec();
    a.write_all(&wire).await.unwrap();
    let f = r.read_frame().await.unwrap().unwrap();
    assert_eq!(f.payload.len(), 5004);
    assert_eq!(seen.lock().unwrap().last(), Some(&0));

    // Past the meter's limit the read fails with its error.
    let (mut a, b) = tokio::io::duplex(1 << 20);
    let mut r = FrameReader::new(b, u32::MAX).with_meter(meter(10_000));
    a.write_all(&head).await.unwrap();
    a.write_all(&[7u8; 20_000]).await.unwrap();
    let e = r.read_frame().await.unwrap_err();
    assert!(
        matches!(e, ReadError::Protocol(ProtocolError::OverBudget(_))),
        "{e}"
    );
}

pub(crate) mod placing {
    use super::*;
    use crate::stream::{Chunk, Chunks, Message, Reassembler};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    fn message(id: u32, n: usize) -> Bytes {
        Bytes::from(
            (0..n)
                .map(|i| (i * 31 + id as usize) as u8)
                .collect::<Vec<u8>>(),
        )
    }

    fn chunks(id: u32, class: u8, data: &Bytes, size: usize) -> Vec<Chunk> {
        Chunks::new(id, class, data.clone(), size)
            .unwrap()
            .collect()
    }

    fn wire(c: &Chunk) -> Vec<u8> {
        c.to_frame().unwrap().to_vec()
    }

    /// `c` with its header changed by `f`.
    fn with(c: &Chunk, f: impl FnOnce(&mut crate::stream::ChunkHeader)) -> Chunk {
        let mut c = c.clone();
        f(&mut c.head);
        c
    }

    /// Hands out its bytes in pieces of the sizes given, in turn.
    struct Pieces {
        data: Vec<u8>,
        at: usize,
        sizes: Vec<usize>,
        turn: usize,
    }

    impl ReadVectored for Pieces {}

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let size = self.sizes[self.turn % self.sizes.len()];
            self.turn += 1;
            let n = size.min(buf.remaining()).min(self.data.len() - self.at);
            buf.put_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    /// Reads everything: whole messages and ordinary frames, in order.
    pub(crate) async fn read_all<R: AsyncRead + ReadVectored + Unpin>(
        r: &mut FrameReader<R>,
        re: &mut Reassembler,
    ) -> Result<(Vec<Message>, Vec<Frame>), ReadError> {
        let (mut whole, mut frames) = (Vec::new(), Vec::new());
        while let Some(got) = r.read_placing(re).await? {
            match got {
                Read::Placed { whole: m, .. } => whole.extend(m),
                Read::Frame(f) if f.ty == MsgType::Chunk => {
                    whole.extend(re.push(Chunk::parse(f.payload)?)?);
                }
                Read::Frame(f) => frames.push(f),
            }
        }
        Ok((whole, frames))
    }

    #[tokio::test]
    async fn a_chunked_message_read_in_odd_pieces_comes_out_whole_and_in_place() {
        let data = message(7, 100_000);
        let cs = chunks(7, 3, &data, 4096);
        let stream: Vec<u8> = cs.iter().flat_map(wire).collect();
        // Splits inside frame headers, chunk headers and data, and
        // pieces longer than a chunk.
        for sizes in [
            vec![3, 5, 7, 11, 13, 1000, 17],
            vec![1],
            vec![9000, 31],
            vec![32, 4096],
            vec![1 << 20],
        ] {
            let pieces = Pieces {
                data: stream.clone(),
                at: 0,
                sizes: sizes.clone(),
                turn: 0,
            };
            let mut r = FrameReader::new(pieces, 1 << 20);
            let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
            // The first chunk opens the message in place.
            let first = r.read_placing(&mut re).await.unwrap();
            assert!(matches!(first, Some(Read::Placed { whole: None, .. })));
            let at = re.buffer_at(7).unwrap();
            let (whole, frames) = read_all(&mut r, &mut re).await.unwrap();
            assert!(frames.is_empty());
            assert_eq!(whole.len(), 1, "{sizes:?}");
            assert_eq!((whole[0].id, whole[0].class), (7, 3));
            assert_eq!(whole[0].data, data, "{sizes:?}");
            assert_eq!(whole[0].data.as_ptr(), at, "the buffer moved");
            assert_eq!((re.open(), re.held()), (0, 0));
        }
    }

    #[tokio::test]
    async fn chunk_data_the_stream_has_not_delivered_is_read_in_place() {
        let size = 64 << 10;
        let data = message(1, 16 * size);
        let cs = chunks(1, 0, &data, size);
        let (mut a, b) = tokio::io::duplex(4 << 20);
        for (i, c) in cs.iter().enumerate() {
            a.write_all(&wire(c)).await.unwrap();
            if i == 5 {
                let f = OutFrame::data(9, Bytes::from_static(b"between"));
                a.write_all(&f.unwrap().to_vec()).await.unwrap();
            }
        }
        drop(a);
        let mut r = FrameReader::new(b, 1 << 20);
        let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
        let (whole, frames) = read_all(&mut r, &mut re).await.unwrap();
        assert_eq!(whole[0].data, data);
        assert_eq!(&frames[0].payload[4..], b"between");
        // Only the link's first read (16 KiB) took chunk data into the
        // decoder's buffer; after it, reads take the next chunk's headers
        // along, or only them.
        assert!(r.dec.copied <= 16 * 1024, "{} bytes copied", r.dec.copied);
    }

    #[tokio::test]
    async fn interleaved_messages_and_frames_come_out_whole() {
        let (da, db) = (message(1, 50_000), message(2, 9_000));
        let (a, b) = (chunks(1, 6, &da, 4000), chunks(2, 0, &db, 1000));
        let mut stream = Vec::new();
        let mut order = Vec::new();
        for i in 0..a.len().max(b.len()) {
            for c in [a.get(i), b.get(i)].into_iter().flatten() {
                order.push(c.head.id);
                stream.extend(wire(c));
            }
            if i % 3 == 0 {
                let f = OutFrame::data(100 + i as u32, Bytes::from(vec![i as u8; i * 10]));
                stream.extend(f.unwrap().to_vec());
            }
        }
        let pieces = Pieces {
            data: stream,
            at: 0,
            sizes: vec![7, 4001, 29, 333],
            turn: 0,
        };
        let mut r = FrameReader::new(pieces, 1 << 20);
        let mut re = Reassembler::new(1 << 20, 4, 1 << 20)
            .with_id_prefix()
            .preallocate(1 << 20);
        let (whole, frames) = read_all(&mut r, &mut re).await.unwrap();
        let ids: Vec<u32> = whole.iter().map(|m| m.id).collect();
        assert_eq!(ids, [2, 1]);
        assert_eq!(&whole[0].data[4..], &db[..]);
        assert_eq!(&whole[1].data[..4], &1u32.to_le_bytes());
        assert_eq!(&whole[1].data[4..], &da[..]);
        assert_eq!(frames.len(), 5);
        for (k, f) in frames.iter().enumerate() {
            let i = k * 3;
            assert_eq!(&f.payload[..4], &(100 + i as u32).to_le_bytes());
            assert_eq!(&f.payload[4..], &vec![i as u8; i * 10][..]);
        }
    }

    /// The error a placed chunk gets, and the one `push` gives.
    async fn both_errors(
        first: &Chunk,
        bad: &Chunk,
        re: impl Fn() -> Reassembler,
    ) -> (String, String) {
        let mut pushed = re();
        pushed.push(first.clone()).unwrap();
        let want = pushed.push(bad.clone()).unwrap_err().to_string();
        let mut stream = wire(first);
        stream.extend(wire(bad));
        let mut r = FrameReader::new(&stream[..], 1 << 20);
        let mut placed = re();
        let got = read_all(&mut r, &mut placed).await.unwrap_err();
        assert!(
            matches!(got, ReadError::Protocol(ProtocolError::BadChunk(_))),
            "{got}"
        );
        let got = got.to_string();
        (got.trim_start_matches("protocol error: ").to_string(), want)
    }

    #[tokio::test]
    async fn a_placed_chunk_is_refused_as_push_refuses_it() {
        let data = message(3, 3000);
        let cs = chunks(3, 2, &data, 1000);
        let re = || Reassembler::new(1 << 20, 4, 1 << 20);
        let cases = [
            (cs[2].clone(), "offset 2000, expected 1000"),
            (
                with(&cs[1], |h| h.class = 5),
                "changed from 3000 bytes in class 2",
            ),
            (
                with(&cs[1], |h| (h.total, h.last) = (2500, false)),
                "changed from 3000 bytes",
            ),
        ];
        for (bad, why) in cases {
            let (got, want) = both_errors(&cs[0], &bad, re).await;
            assert_eq!(got, want);
            assert!(got.contains(why), "{got}");
        }
        // Over the held bound: the second chunk would hold 2000 of 1500.
        let (got, want) = both_errors(&cs[0], &cs[1], || Reassembler::new(1 << 20, 4, 1500)).await;
        assert_eq!(got, want);
        assert!(got.contains("over 1500 bytes"), "{got}");
        // A message never begun: the chunk is not placed, push reports it.
        let stray = wire(&cs[1]);
        let mut r = FrameReader::new(&stray[..], 1 << 20);
        let got = read_all(&mut r, &mut re()).await.unwrap_err();
        assert!(got.to_string().contains("not begun"), "{got}");
    }

    #[tokio::test]
    async fn a_chunk_over_max_payload_is_refused_before_it_is_placed() {
        let data = message(4, 3000);
        let first = chunks(4, 0, &data, 1000)[0].clone();
        let big = Chunk::new(4, 0, 1000, 3000, data.slice(1000..3000));
        let mut stream = wire(&first);
        stream.extend(wire(&big));
        let mut r = FrameReader::new(&stream[..], 1500);
        let got = read_all(&mut r, &mut Reassembler::new(1 << 20, 4, 1 << 20)).await;
        assert!(matches!(
            got,
            Err(ReadError::Protocol(ProtocolError::TooLarge { .. }))
        ));
    }

    /// A link whose reader has placed `first` (a message's first chunk)
    /// in a reassembler that places the rest of the message too.
    async fn first_chunk_placed(
        first: &Chunk,
    ) -> (
        tokio::io::DuplexStream,
        FrameReader<tokio::io::DuplexStream>,
        Reassembler,
    ) {
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let mut r = FrameReader::new(b, 1 << 20);
        let mut re = Reassembler::new(1 << 20, 4, 1 << 20).reserve_whole();
        a.write_all(&wire(first)).await.unwrap();
        let first = r.read_placing(&mut re).await.unwrap();
        assert!(matches!(first, Some(Read::Placed { whole: None, .. })));
        (a, r, re)
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_cancelled_mid_chunk_resumes_where_it_was() {
        let data = message(5, 40_000);
        let cs = chunks(5, 1, &data, 16_000);
        let (mut a, mut r, mut re) = first_chunk_placed(&cs[0]).await;
        let at = re.buffer_at(5).unwrap();
        let rest: Vec<u8> = cs[1..].iter().flat_map(wire).collect();
        let (mut sent, mut given_up) = (0, 0);
        // Stall mid-header, mid-data and at the boundary, each read
        // given up (the future dropped) and begun again.
        for cut in [
            20,
            5000,
            16_000 + CHUNK_HEAD,
            16_000 + CHUNK_HEAD + 3,
            rest.len(),
        ] {
            a.write_all(&rest[sent..cut]).await.unwrap();
            sent = cut;
            let t = Duration::from_secs(1);
            match tokio::time::timeout(t, r.read_placing(&mut re)).await {
                Err(_) => given_up += 1,
                Ok(got) => match got.unwrap().unwrap() {
                    Read::Placed { whole: None, .. } => continue,
                    Read::Placed { whole: Some(m), .. } => {
                        assert_eq!((sent, given_up), (rest.len(), 3));
                        assert_eq!(m.data, data);
                        assert_eq!(m.data.as_ptr(), at, "the buffer moved");
                        return;
                    }
                    Read::Frame(f) => panic!("{f:?}"),
                },
            }
        }
        // The last placed chunk may need one more read to complete.
        let Read::Placed { whole: Some(m), .. } = r.read_placing(&mut re).await.unwrap().unwrap()
        else {
            panic!("the message is not whole");
        };
        assert_eq!(m.data, data);
        assert_eq!(m.data.as_ptr(), at, "the buffer moved");
    }

    /// A plain read while a cancelled placing read left a chunk half in
    /// its buffer is an error, not a panic; a placing read then finishes it.
    #[tokio::test(start_paused = true)]
    async fn a_plain_read_of_a_half_placed_chunk_is_an_error() {
        let data = message(7, 40_000);
        let cs = chunks(7, 1, &data, 16_000);
        let (mut a, mut r, mut re) = first_chunk_placed(&cs[0]).await;
        let rest: Vec<u8> = cs[1..].iter().flat_map(wire).collect();
        a.write_all(&rest[..5000]).await.unwrap();
        let t = Duration::from_secs(1);
        assert!(tokio::time::timeout(t, r.read_placing(&mut re))
            .await
            .is_err());
        let err = r.read_frame().await.unwrap_err();
        assert!(
            matches!(&err, ReadError::Protocol(ProtocolError::BadChunk(w)) if w.contains("half placed")),
            "{err}"
        );
        a.write_all(&rest[5000..]).await.unwrap();
        loop {
            match r.read_placing(&mut re).await.unwrap().unwrap() {
                Read::Placed { whole: None, .. } => continue,
                Read::Placed { whole: Some(m), .. } => {
                    assert_eq!(m.data, data);
                    break;
                }
                Read::Frame(f) => panic!("{f:?}"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_peer_still_meets_the_read_deadline() {
        let t = Duration::from_secs(10);
        let data = message(6, 3000);
        let cs = chunks(6, 0, &data, 1000);
        let (mut a, b) = tokio::io::duplex(1 << 16);
        let mut r = FrameReader::new(b, 1 << 20).with_read_timeout(t);
        let mut re = Reassembler::new(1 << 20, 4, 1 << 20);
        let mut stream = wire(&cs[0]);
        stream.extend(wire(&cs[1]));
        let third = wire(&cs[2]);
        a.write_all(&stream).await.unwrap();
        let writer = tokio::spawn(async move {
            // The third chunk's headers and data 100 bytes every 5 s
            // (slow, always progressing), then silence with 500 left.
            a.write_all(&third[..CHUNK_HEAD + 100]).await.unwrap();
            for piece in third[CHUNK_HEAD + 100..CHUNK_HEAD + 500].chunks(100) {
                tokio::time::sleep(Duration::from_secs(5)).await;
                a.write_all(piece).await.unwrap();
            }
            a
        });
        let first = r.read_placing(&mut re).await.unwrap();
        assert!(matches!(first, Some(Read::Placed { whole: None, .. })));
        assert!(matches!(
            r.read_placing(&mut re).await.unwrap(),
            Some(Read::Placed { whole: None, .. })
        ));
        let started = Instant::now();
        let e = r.read_placing(&mut re).await.unwrap_err();
        let ReadError::Io(e) = e else {
            panic!("expected a timeout, got {e}")
        };
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("no progress"), "{e}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(20) + t && took < Duration::from_secs(40),
            "{took:?}"
        );
        drop(writer);
    }
}

#[tokio::test]
async fn write_frame_is_byte_exact() {
    let mut out = Vec::new();
    write_frame(
        &mut out,
        OutFrame::data(0x01020304, Bytes::from_static(b"xy")).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(out, [3, 0, 0, 0, 6, 0, 0, 0, 4, 3, 2, 1, b'x', b'y']);
}

/// A meter that records what it was told.
#[derive(Debug, Clone, Default)]
struct Recorded(std::sync::Arc<std::sync::Mutex<Vec<Option<usize>>>>);

impl Meter for Recorded {
    fn hold(&mut self, bytes: usize) -> Result<(), ProtocolError> {
        self.0.lock().unwrap().push(Some(bytes));
        Ok(())
    }
    fn idle(&mut self) {
        self.0.lock().unwrap().push(None);
    }
}

/// An idle link waits without a read buffer, and tells its meter so; the
/// frames around the wait arrive whole and in order.
#[tokio::test]
async fn an_idle_reader_holds_no_buffer_between_frames() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut a = tokio::net::TcpStream::connect(l.local_addr().unwrap())
        .await
        .unwrap();
    let (b, _) = l.accept().await.unwrap();
    let meter = Recorded::default();
    let mut r = FrameReader::new(b, 1 << 20)
        .with_meter(Box::new(meter.clone()))
        .release_when_idle();
    let none: Option<&mut crate::stream::Reassembler> = None;
    // Nothing sent yet: the read waits, and holds no buffer meanwhile.
    let waiting = tokio::time::timeout(Duration::from_millis(50), r.read_with(none)).await;
    assert!(waiting.is_err(), "nothing was sent");
    assert_eq!(r.dec.buf.capacity(), 0, "no buffer while idle");
    assert_eq!(*meter.0.lock().unwrap(), [None]);
    for id in 1..=2u32 {
        write_frame(
            &mut a,
            OutFrame::data(id, Bytes::from(vec![7; 3000])).unwrap(),
        )
        .await
        .unwrap();
        let none: Option<&mut crate::stream::Reassembler> = None;
        let Read::Frame(f) = r.read_with(none).await.unwrap().unwrap() else {
            panic!("a frame")
        };
        assert_eq!(
            (&f.payload[..4], f.payload.len()),
            (&id.to_le_bytes()[..], 3004)
        );
    }
    let none: Option<&mut crate::stream::Reassembler> = None;
    let waiting = tokio::time::timeout(Duration::from_millis(50), r.read_with(none)).await;
    assert!(waiting.is_err());
    assert_eq!(r.dec.buf.capacity(), 0, "released again once idle");
    drop(a);
    let none: Option<&mut crate::stream::Reassembler> = None;
    assert!(r.read_with(none).await.unwrap().is_none(), "a clean end");
}

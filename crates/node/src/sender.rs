//! The sending task: writes results and control frames to the server,
//! several per vectored write when they pile up. Without chunks (a server
//! that did not negotiate them) in the order they were queued; with chunks,
//! results larger than the chunk size go as chunks and every result in its
//! input's class ([`Chunking`]), so a small urgent result overtakes a bulk
//! one between two of its chunks.

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Buf;
use corefarm_smp::stream::{Outbox, DEFAULT_CLASS};
use corefarm_smp::FrameBatch;
use corefarm_smp::{ErrorMsg, OutFrame};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::guard::Reservation;
use crate::handlers::Outgoing;
use crate::notes::NoteLink;

/// Why the sending task stopped before its queue was closed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("writing to the server failed: {0}")]
    Io(#[from] std::io::Error),
    /// A seed-format server cannot be told that an input failed; closing the
    /// connection makes it re-dispatch instead of waiting forever.
    #[error(
        "data id {id} failed: {reason}; closing the connection (the server did not negotiate \
         error messages)"
    )]
    Closed { id: u32, reason: String },
}

/// Bytes a batch takes at most once chunks are on: what an urgent result
/// may find ahead of it in a batch being written.
const CHUNKED_BATCH: usize = 256 * 1024;

/// What the link agreed on chunks, shared by the receiving task (which
/// learns it from the server's hello and the classes from the data) and the
/// sending task.
#[derive(Debug, Default)]
pub struct Chunking {
    /// The chunk size in force; 0: no chunks.
    size: AtomicU32,
    /// Classes of the messages in progress that are not the default class:
    /// their results go back in the same class.
    classes: Mutex<HashMap<u32, u8>>,
}

impl Chunking {
    pub fn set_size(&self, size: u32) {
        self.size.store(size, Ordering::Relaxed);
    }

    pub fn size(&self) -> u32 {
        self.size.load(Ordering::Relaxed)
    }

    /// Message `id` came in `class`: its result (or error) goes back in it.
    pub fn class_of(&self, id: u32, class: u8) {
        if class != DEFAULT_CLASS {
            self.lock().insert(id, class);
        }
    }

    /// The class of message `id`'s result, left in place for the result.
    fn peek(&self, id: u32) -> u8 {
        let c = self.lock();
        c.get(&id).copied().unwrap_or(DEFAULT_CLASS)
    }

    fn take(&self, id: u32) -> u8 {
        let mut c = self.lock();
        if c.is_empty() {
            return DEFAULT_CLASS;
        }
        c.remove(&id).unwrap_or(DEFAULT_CLASS)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, u8>> {
        // Only inserts and removes run under it: a poisoned map is intact.
        self.classes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One queued item ready for the outbox: its frame, its class, and the
/// reservation held until it is written.
type Ready = (OutFrame, u8, Option<Reservation>);

/// The frame for one queued item. `Err` when the only way to report it is
/// to close.
fn to_wire(o: Outgoing, negotiated: bool, chunking: &Chunking) -> Result<Ready, SendError> {
    let (id, code, reason, held) = match o {
        Outgoing::Frame(f) => return Ok((f, 0, None)),
        Outgoing::Notes { .. } => unreachable!("admit sends notes apart"),
        Outgoing::Result {
            id,
            data,
            reservation,
        } => {
            let class = chunking.take(id);
            // Result sizes are bounded when data is accepted, so this is a
            // safety net: the input fails with a reason, the task goes on.
            match OutFrame::data(id, data) {
                Ok(f) => return Ok((f, class, Some(reservation))),
                Err(e) => (
                    id,
                    e.code(),
                    format!("result cannot be sent: {e}"),
                    Some(reservation),
                ),
            }
        }
        Outgoing::Failed {
            id,
            code,
            reason,
            reservation,
        } => (id, code, reason, reservation),
    };
    let class = chunking.take(id);
    tracing::warn!("data id {id} failed: {}", ErrorMsg::clip(&reason));
    if negotiated {
        Ok((ErrorMsg::new(id, code, reason).to_frame(), class, held))
    } else {
        Err(SendError::Closed { id, reason })
    }
}

/// Runs until the queue is closed (`Ok(results written)`) or writing fails.
/// `negotiated` tells whether the server accepts error messages.
pub async fn send_loop<W: AsyncWrite + Unpin>(
    wr: W,
    rx: mpsc::UnboundedReceiver<Outgoing>,
    negotiated: Arc<AtomicBool>,
    stats: Option<Arc<crate::metrics::NodeStats>>,
) -> Result<u64, SendError> {
    send_loop_chunked(wr, rx, negotiated, Arc::default(), Arc::default(), stats).await
}

/// [`send_loop`] on a link that may negotiate chunks (`chunking`) and
/// handler notifications (`notes`).
pub async fn send_loop_chunked<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    negotiated: Arc<AtomicBool>,
    chunking: Arc<Chunking>,
    notes: Arc<NoteLink>,
    stats: Option<Arc<crate::metrics::NodeStats>>,
) -> Result<u64, SendError> {
    let mut results = 0u64;
    // Reservations are released only once their result is on the wire, so
    // the memory guard also counts results waiting for the socket.
    let mut out: Outbox<Option<Reservation>> = Outbox::new();
    // Messages whose notifications wait in a class other than 0: an error
    // for one of them must wait in the same class, behind them.
    let mut noted = std::collections::HashSet::new();
    let (mut closed, mut fatal) = (false, None);
    loop {
        if out.is_empty() {
            if closed || fatal.is_some() {
                break;
            }
            match rx.recv().await {
                Some(o) => admit(
                    o,
                    &mut out,
                    &negotiated,
                    &chunking,
                    (&notes, &mut noted),
                    &mut fatal,
                ),
                None => {
                    closed = true;
                    continue;
                }
            }
        }
        // Everything already queued competes for the next batch by class;
        // nothing after an item that can only be reported by closing.
        while fatal.is_none() && !closed {
            match rx.try_recv() {
                Ok(o) => admit(
                    o,
                    &mut out,
                    &negotiated,
                    &chunking,
                    (&notes, &mut noted),
                    &mut fatal,
                ),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => closed = true,
            }
        }
        let cap = match out.chunk_size() {
            0 => usize::MAX,
            _ => CHUNKED_BATCH,
        };
        let mut batch = FrameBatch::default();
        let mut done = 0usize;
        let mut held = Vec::new();
        while !batch.is_full() && batch.remaining() < cap {
            let Some((f, tag)) = out.pop() else {
                break;
            };
            batch.push(f);
            if let Some(r) = tag.flatten() {
                done += 1;
                held.push(r);
            }
        }
        while batch.has_remaining() {
            let mut iov = [IoSlice::new(&[]); 2 * FrameBatch::MAX_FRAMES];
            let n = batch.chunks_vectored(&mut iov);
            match wr.write_vectored(&iov[..n]).await? {
                0 => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
                k => batch.advance(k),
            }
        }
        // A TLS stream may take the plaintext and keep the records it could
        // not write yet; only a flush sends them (a no-op on plain TCP).
        // Without it the last result before a pause stays in the session.
        if out.is_empty() {
            wr.flush().await?;
        }
        results += done as u64;
        if let Some(s) = &stats {
            s.answered(done);
        }
        drop(held);
    }
    let _ = wr.shutdown().await;
    match fatal {
        Some(why) => Err(why),
        None => Ok(results),
    }
}

fn admit(
    o: Outgoing,
    out: &mut Outbox<Option<Reservation>>,
    negotiated: &AtomicBool,
    chunking: &Chunking,
    (notes, noted): (&NoteLink, &mut std::collections::HashSet<u32>),
    fatal: &mut Option<SendError>,
) {
    // Learnt from the server's hello, which comes before any data.
    let size = chunking.size() as usize;
    if out.chunk_size() != size {
        out.set_chunk_size(size);
    }
    if let Outgoing::Notes {
        id,
        set,
        notes: n,
        over,
    } = o
    {
        // In the class the message's result will take: first in line
        // within a class is first on the wire, so they precede the result.
        let class = chunking.peek(id);
        for f in notes.frames(id, set, n, over) {
            out.push_in_class(f, class, None);
            if class != 0 {
                noted.insert(id);
            }
        }
        return;
    }
    let id = match &o {
        Outgoing::Result { id, .. } | Outgoing::Failed { id, .. } => Some(*id),
        _ => None,
    };
    let after_notes = !noted.is_empty() && id.is_some_and(|id| noted.remove(&id));
    match to_wire(o, negotiated.load(Ordering::Relaxed), chunking) {
        Ok((f, class, held)) if after_notes && f.as_data().is_none() => {
            out.push_in_class(f, class, held)
        }
        Ok((f, class, held)) => out.push(f, class, held),
        Err(why) => *fatal = Some(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::MemoryGuard;
    use bytes::Bytes;
    use corefarm_smp::codec::FrameReader;
    use corefarm_smp::{ErrorCode, MsgType};

    async fn failed(g: &MemoryGuard, id: u32) -> Outgoing {
        Outgoing::Failed {
            id,
            code: ErrorCode::CoreFailure,
            reason: "boom".into(),
            reservation: Some(g.reserve(1024).await),
        }
    }

    #[tokio::test]
    async fn failures_become_error_frames_for_a_negotiating_server() {
        let g = MemoryGuard::new(4096);
        let (tx, rx) = mpsc::unbounded_channel();
        let (a, b) = tokio::io::duplex(1 << 16);
        tx.send(Outgoing::Result {
            id: 1,
            data: Bytes::from_static(b"ok"),
            reservation: g.reserve(1024).await,
        })
        .unwrap();
        tx.send(failed(&g, 2).await).unwrap();
        drop(tx);
        let sent = send_loop(a, rx, Arc::new(AtomicBool::new(true)), None)
            .await
            .unwrap();
        assert_eq!(sent, 2);
        assert_eq!(
            g.available(),
            g.limit(),
            "reservations released once written"
        );
        let mut r = FrameReader::new(b, 1024);
        let f = r.read_frame().await.unwrap().unwrap();
        assert_eq!(
            (f.ty, &f.payload[..]),
            (MsgType::Data, &b"\x01\0\0\0ok"[..])
        );
        let f = r.read_frame().await.unwrap().unwrap();
        let e = ErrorMsg::parse(&f.payload).unwrap();
        assert_eq!(
            (e.id, e.code(), e.reason.as_str()),
            (2, Some(ErrorCode::CoreFailure), "boom")
        );
        assert!(r.read_frame().await.unwrap().is_none(), "then a clean end");
    }

    #[tokio::test]
    async fn a_seed_server_is_told_about_a_failure_by_closing() {
        let g = MemoryGuard::new(4096);
        let (tx, rx) = mpsc::unbounded_channel();
        let (a, b) = tokio::io::duplex(1 << 16);
        tx.send(Outgoing::Frame(
            corefarm_smp::ConfigurationResponse { status: 0 }.to_frame(),
        ))
        .unwrap();
        tx.send(failed(&g, 9).await).unwrap();
        let e = send_loop(a, rx, Arc::new(AtomicBool::new(false)), None)
            .await
            .unwrap_err();
        assert!(matches!(e, SendError::Closed { id: 9, .. }), "{e}");
        let mut r = FrameReader::new(b, 1024);
        let f = r.read_frame().await.unwrap().unwrap();
        assert_eq!(
            f.ty,
            MsgType::ConfigurationResponse,
            "frames before it are written"
        );
        assert!(r.read_frame().await.unwrap().is_none());
        assert_eq!(g.available(), g.limit());
        drop(tx);
    }

    #[tokio::test]
    async fn a_small_urgent_result_overtakes_a_bulk_one_between_its_chunks() {
        use corefarm_smp::stream::{Chunk, Reassembler};
        let g = MemoryGuard::new(64 << 20);
        let (tx, rx) = mpsc::unbounded_channel();
        let chunking = Arc::new(Chunking::default());
        chunking.set_size(64 * 1024);
        chunking.class_of(1, 6);
        chunking.class_of(2, 0);
        let bulk = Bytes::from(vec![0xAB; 4 << 20]);
        tx.send(Outgoing::Result {
            id: 1,
            data: bulk.clone(),
            reservation: g.reserve(1024).await,
        })
        .unwrap();
        // A pipe far smaller than the bulk result: the sender is mid-way
        // through it (or has not started) when the urgent result comes.
        let (a, b) = tokio::io::duplex(64 * 1024);
        let task = tokio::spawn(send_loop_chunked(
            a,
            rx,
            Arc::new(AtomicBool::new(true)),
            chunking,
            Arc::default(),
            None,
        ));
        tx.send(Outgoing::Result {
            id: 2,
            data: Bytes::from_static(b"urgent"),
            reservation: g.reserve(1024).await,
        })
        .unwrap();
        drop(tx);
        let mut r = FrameReader::new(b, 1 << 20);
        let mut re = Reassembler::new(8 << 20, 4, 8 << 20);
        let mut order = Vec::new();
        while let Some(f) = r.read_frame().await.unwrap() {
            match f.ty {
                MsgType::Data => {
                    order.push((u32::from_le_bytes(f.payload[..4].try_into().unwrap()), 4))
                }
                MsgType::Chunk => {
                    if let Some(m) = re.push(Chunk::parse(f.payload).unwrap()).unwrap() {
                        let want = if m.id == 1 { &bulk[..] } else { b"urgent" };
                        assert_eq!(&m.data[..], want);
                        order.push((m.id, m.class));
                    }
                }
                t => panic!("unexpected {t:?}"),
            }
        }
        // The urgent result (small: one chunk carrying its class) before
        // the bulk one's last chunk; both came back in their class.
        assert_eq!(order, [(2, 0), (1, 6)]);
        assert_eq!(task.await.unwrap().unwrap(), 2);
        assert_eq!(g.available(), g.limit());
    }

    /// A writer that, like a TLS stream whose socket is full, accepts bytes
    /// and sends them only when flushed: a result must not wait there for
    /// the next one.
    #[tokio::test(start_paused = true)]
    async fn a_result_is_flushed_before_the_sender_waits() {
        let g = MemoryGuard::new(4096);
        let (tx, rx) = mpsc::unbounded_channel();
        let (a, b) = tokio::io::duplex(1 << 16);
        let task = tokio::spawn(send_loop(
            tokio::io::BufWriter::with_capacity(1 << 16, a),
            rx,
            Arc::new(AtomicBool::new(true)),
            None,
        ));
        tx.send(Outgoing::Result {
            id: 7,
            data: Bytes::from_static(b"done"),
            reservation: g.reserve(1024).await,
        })
        .unwrap();
        let mut r = FrameReader::new(b, 1024);
        // The clock is paused: the timeout fires as soon as nothing else can
        // run, i.e. if the result sits unflushed while the sender waits.
        let f = tokio::time::timeout(std::time::Duration::from_secs(10), r.read_frame())
            .await
            .expect("the result reached the peer while the queue stayed open")
            .unwrap()
            .unwrap();
        assert_eq!(&f.payload[..], b"\x07\0\0\0done");
        drop(tx);
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }

    /// What a sender writes for a message with two notifications (then
    /// its result, or an error for a second one), with `agreed` and
    /// chunks on or off: the frame types in order, and the notes link.
    async fn notes_then_answer(agreed: bool, chunks: bool) -> (Vec<(MsgType, u32)>, Arc<NoteLink>) {
        let g = MemoryGuard::new(1 << 20);
        let (tx, rx) = mpsc::unbounded_channel();
        let chunking = Arc::new(Chunking::default());
        if chunks {
            chunking.set_size(1024);
            chunking.class_of(1, 6);
            chunking.class_of(2, 3);
        }
        let notes = Arc::new(NoteLink::default());
        notes.set_agreed(agreed);
        for id in [1, 2] {
            tx.send(Outgoing::Notes {
                id,
                set: 2,
                notes: vec![b"first".to_vec(), vec![id as u8; 4096]],
                over: 1,
            })
            .unwrap();
        }
        tx.send(Outgoing::Result {
            id: 1,
            data: Bytes::from(vec![9; 3000]),
            reservation: g.reserve(1024).await,
        })
        .unwrap();
        tx.send(failed(&g, 2).await).unwrap();
        drop(tx);
        let (a, b) = tokio::io::duplex(1 << 20);
        let negotiated = Arc::new(AtomicBool::new(true));
        send_loop_chunked(a, rx, negotiated, chunking, notes.clone(), None)
            .await
            .unwrap();
        let mut r = FrameReader::new(b, 1 << 20);
        let mut seen = Vec::new();
        let mut re = corefarm_smp::stream::Reassembler::new(1 << 20, 4, 1 << 20);
        while let Some(f) = r.read_frame().await.unwrap() {
            match f.ty {
                MsgType::Notification => {
                    let n = corefarm_smp::Notification::parse(f.payload).unwrap();
                    assert_eq!(n.set, 2);
                    let want = if n.data.len() == 5 {
                        b"first".to_vec()
                    } else {
                        vec![n.id as u8; 4096]
                    };
                    assert_eq!(n.data, want);
                    seen.push((f.ty, n.id));
                }
                MsgType::Chunk => {
                    let c = corefarm_smp::stream::Chunk::parse(f.payload).unwrap();
                    if let Some(m) = re.push(c).unwrap() {
                        seen.push((MsgType::Data, m.id));
                    }
                }
                MsgType::Data => {
                    seen.push((f.ty, u32::from_le_bytes(f.payload[..4].try_into().unwrap())))
                }
                MsgType::Error => seen.push((f.ty, ErrorMsg::parse(&f.payload).unwrap().id)),
                t => panic!("unexpected {t:?}"),
            }
        }
        (seen, notes)
    }

    #[tokio::test]
    async fn notifications_go_before_their_message_s_answer_when_agreed() {
        for chunks in [false, true] {
            let (seen, notes) = notes_then_answer(true, chunks).await;
            let pos = |x: (MsgType, u32)| seen.iter().position(|&s| s == x).unwrap();
            let of = |id| {
                seen.iter()
                    .filter(|&&s| s == (MsgType::Notification, id))
                    .count()
            };
            assert_eq!(
                (of(1), of(2), seen.len()),
                (2, 2, 6),
                "chunks {chunks}: {seen:?}"
            );
            let last_note = |id| {
                seen.iter()
                    .rposition(|&s| s == (MsgType::Notification, id))
                    .unwrap()
            };
            assert!(
                last_note(1) < pos((MsgType::Data, 1)),
                "chunks {chunks}: {seen:?}"
            );
            assert!(
                last_note(2) < pos((MsgType::Error, 2)),
                "chunks {chunks}: {seen:?}"
            );
            assert_eq!(notes.dropped(), 2, "the ones over the limit");
        }
    }

    #[tokio::test]
    async fn notifications_are_counted_and_dropped_when_not_agreed() {
        let (seen, notes) = notes_then_answer(false, false).await;
        assert_eq!(seen, [(MsgType::Data, 1), (MsgType::Error, 2)]);
        assert_eq!(notes.dropped(), 6);
    }

    #[tokio::test]
    async fn a_write_error_ends_the_task() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (a, b) = tokio::io::duplex(64);
        drop(b);
        tx.send(Outgoing::Frame(
            corefarm_smp::ConfigurationResponse { status: 0 }.to_frame(),
        ))
        .unwrap();
        let e = send_loop(a, rx, Arc::new(AtomicBool::new(true)), None)
            .await
            .unwrap_err();
        assert!(matches!(e, SendError::Io(_)), "{e}");
    }
}

//! Streaming handlers on a node (docs/streams.md): data messages whose
//! first chunk matches one of the image's rulesets go to a lane of their
//! own instead of the cores' queue. The lane has a pool of handler worker
//! processes (`corefarm_cores::worker::HandlerWorker`,
//! [`SpinOptions::workers`] of them), one thread each; a free thread takes
//! the next message and runs it through its worker, cut into chunks of
//! [`SpinOptions::chunk_size`] bytes, and answers with
//! what the handlers produced ([`ResultShape`]): their emitted bytes (as
//! emitted to a server that agreed `any-length`, else zero-padded to the
//! count × output size it expects), nothing (or zeros) when dropped, the
//! cores' result when forwarded (the job joins the cores' queue), or the
//! usual per-message error when a handler failed, crashed or overran.
//! The message's reservation in the memory guard is made to cover the
//! result before it is queued ([`ResultShape::account`]: an `any-length`
//! result longer than count × output size takes the difference from the
//! guard without waiting, or fails the message with `TooLarge`): a lane
//! thread that waited there could wait on memory held only by messages
//! queued behind its own.
//!
//! A message that arrives whole (a plain data frame) is fed to the worker
//! at once; one that arrives as chunks on a link that negotiated them
//! ([`SpinLane::submit_stream`]) is fed chunk by chunk as the receiving
//! task gets them, so its head and payload handlers run while the rest of
//! it is still on the wire (FPsPIN's overlap of transfer and compute).
//!
//! Each worker handles one message at a time (its payload handlers in
//! parallel), so a crash is attributed to exactly one message; the pool
//! runs as many messages at once as it has workers, all sharing the
//! handler sets' memory. Waiting messages start in the cores' queue's
//! order (the most urgent class first, [`ClassQueue`]); they may finish in
//! another. The thread that ran a message sends its notifications and
//! then its result or error, once. The chunks of a streamed message that
//! waits for a free worker queue in its channel, within the memory the
//! guard reserved for it.

use std::thread::JoinHandle;

use bytes::Bytes;
use corefarm_cores::spin::rules::{self, Ruleset};
use corefarm_cores::spin::Outcome;
use corefarm_cores::worker::HandlerWorker;
use corefarm_smp::ErrorCode;
use tokio::sync::mpsc;

use crate::guard::Reservation;
use crate::handlers::{Job, Outgoing};
use crate::jobq::{ClassQueue, JobQueue};

mod result;
pub use result::{ResultLink, ResultShape};

/// A message whose chunks are still arriving.
pub struct StreamJob {
    pub id: u32,
    /// Its priority class, kept for the cores if the handlers forward it.
    pub class: u8,
    /// Inputs in it (its result is count × output size bytes).
    pub count: usize,
    /// Its whole length.
    pub total: u64,
    pub reservation: Reservation,
    /// Its chunks, in order; closed early if the session ends.
    pub chunks: std::sync::mpsc::Receiver<Bytes>,
}

enum LaneJob {
    Whole(Job),
    Stream(StreamJob),
}

/// Node-side settings of streaming handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinOptions {
    /// Bytes per chunk a message is cut into for its handlers.
    pub chunk_size: usize,
    /// Payload handlers of one message running at once.
    pub threads: usize,
    /// Handler worker processes, hence messages handled at once.
    pub workers: usize,
}

impl SpinOptions {
    /// The default pool: two workers (one message can wait on a slow
    /// handler while another runs), fewer on a one-CPU machine.
    pub fn default_workers() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
    }
}

impl Default for SpinOptions {
    fn default() -> Self {
        SpinOptions {
            chunk_size: 4096,
            threads: 4,
            workers: SpinOptions::default_workers(),
        }
    }
}

/// The handler lane of one configuration.
pub struct SpinLane {
    rulesets: Vec<(Ruleset, ())>,
    chunk: usize,
    /// Messages waiting for a free worker, by class like the cores' queue.
    queue: ClassQueue<(usize, LaneJob)>,
    /// One per worker of the pool.
    threads: Vec<JoinHandle<()>>,
}

impl SpinLane {
    /// Starts one thread per worker of `pool` (the workers of one
    /// configuration, `HandlerWorker::sibling`); forwarded messages go to
    /// `cores`.
    pub fn start(
        pool: Vec<HandlerWorker>,
        rulesets: Vec<Ruleset>,
        opts: SpinOptions,
        shape: ResultShape,
        cores: JobQueue,
        results: mpsc::UnboundedSender<Outgoing>,
        node: &str,
    ) -> std::io::Result<SpinLane> {
        let queue = ClassQueue::new();
        let chunk = opts.chunk_size.max(16);
        let mut threads = Vec::with_capacity(pool.len());
        for (i, worker) in pool.into_iter().enumerate() {
            let (rx, cores, results) = (queue.clone(), cores.clone(), results.clone());
            let t = std::thread::Builder::new()
                .name(format!("{node}-spin{i}"))
                .spawn(move || lane(worker, chunk, shape, rx, cores, results));
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    queue.abort();
                    threads.into_iter().for_each(|t| drop(t.join()));
                    return Err(e);
                }
            }
        }
        Ok(SpinLane {
            rulesets: rulesets.into_iter().map(|r| (r, ())).collect(),
            chunk,
            queue,
            threads,
        })
    }

    /// The context whose ruleset matches the message's first chunk.
    pub fn select(&self, data: &[u8]) -> Option<usize> {
        rules::select(&self.rulesets, &data[..data.len().min(self.chunk)]).map(|(i, _)| i)
    }

    pub async fn submit(&self, ctx: usize, job: Job) -> bool {
        let class = job.class;
        self.queue.push(class, (ctx, LaneJob::Whole(job))).is_ok()
    }

    /// Queues a message whose chunks follow through `job.chunks`.
    pub async fn submit_stream(&self, ctx: usize, job: StreamJob) -> bool {
        let class = job.class;
        self.queue.push(class, (ctx, LaneJob::Stream(job))).is_ok()
    }

    /// Lets the threads end once the queued messages are done, without
    /// waiting for them.
    pub fn close(&self) {
        self.queue.close();
    }

    /// Finishes the queued messages, then joins the threads (blocking).
    pub fn stop(self) {
        self.queue.close();
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Drops the queued messages, then joins the threads (blocking).
    pub fn abort(self) {
        self.queue.abort();
        self.stop();
    }
}

/// One worker's thread: the next waiting message, whichever class queue
/// holds it, runs here from its first chunk to its result.
fn lane(
    mut worker: HandlerWorker,
    chunk: usize,
    shape: ResultShape,
    rx: ClassQueue<(usize, LaneJob)>,
    cores: JobQueue,
    results: mpsc::UnboundedSender<Outgoing>,
) {
    while let Some((ctx, job)) = rx.wait() {
        let (mut job, kept, mut done) = match job {
            LaneJob::Whole(job) => {
                let done = worker.run(ctx, job.id, &job.data, chunk);
                (job, Vec::new(), done)
            }
            LaneJob::Stream(s) => match stream(&mut worker, ctx, chunk, s) {
                Some(r) => r,
                // The session ended midway: nobody waits for a result.
                None => continue,
            },
        };
        guard_notes(&mut job, &mut done);
        if !queue_notes(&results, ctx, job.id, &mut done) {
            return;
        }
        let out = match answer(shape, &worker.set(ctx).name, job, done.outcome) {
            Ok(out) => out,
            Err(mut job) => {
                if !kept.is_empty() {
                    job.data = concat(kept);
                }
                let id = job.id;
                match cores.push(job.class, job) {
                    Ok(()) => continue,
                    Err(job) => Outgoing::Failed {
                        id,
                        code: ErrorCode::CoreFailure,
                        reason: "the handlers forwarded the message but the cores have stopped"
                            .into(),
                        reservation: Some(job.reservation),
                    },
                }
            }
        };
        if results.send(out).is_err() {
            return;
        }
    }
}

/// What message `job` (run by handler set `set`) sends for `outcome`;
/// `Err`: the handlers forwarded it to the cores.
///
/// The server takes a result of count × output size bytes only: the
/// handlers' output is padded unless it agreed any-length (`shape`). Its
/// reservation is made to cover the result as it goes out
/// ([`ResultShape::account`]): a longer result that the memory guard
/// cannot cover now fails the message.
fn answer(shape: ResultShape, set: &str, job: Job, outcome: Outcome) -> Result<Outgoing, Job> {
    let data = match outcome {
        Outcome::Forward => return Err(job),
        Outcome::Result(bytes) => shape
            .emitted(set, job.count, bytes)
            .map_err(|e| (e.code(), e.to_string())),
        Outcome::Dropped => Ok(shape.dropped(job.count)),
        Outcome::Failed(reason) => Err((ErrorCode::CoreFailure, reason)),
    };
    let Job {
        id,
        count,
        mut reservation,
        ..
    } = job;
    let failed = |code, reason, reservation| Outgoing::Failed {
        id,
        code,
        reason,
        reservation: Some(reservation),
    };
    let out = match data {
        Err((code, reason)) => failed(code, reason, reservation),
        Ok(data) => match shape.account(set, count, data.len(), &mut reservation) {
            Ok(()) => Outgoing::Result {
                id,
                data,
                reservation,
            },
            Err(e) => failed(e.code(), e.to_string(), reservation),
        },
    };
    Ok(out)
}

/// The notifications of `job` wait in the sending queue before its result
/// (up to 256 of up to 4 KiB each): the job's reservation grows by their
/// bytes, held until its result is written. Without waiting, as for a
/// longer result ([`answer`]); if the guard cannot hold them they are
/// dropped and counted as such, and the message itself goes on.
fn guard_notes(job: &mut Job, done: &mut corefarm_cores::worker::SpinOutcome) {
    let bytes: usize = done.notifications.iter().map(Vec::len).sum();
    if let Err(short) = job.reservation.try_grow(bytes) {
        tracing::warn!(
            id = job.id,
            "{} handler notification(s) of {bytes} bytes dropped: the node's memory guard \
             has {} of its {} bytes free",
            done.notifications.len(),
            short.free,
            short.limit
        );
        done.notifications_dropped += done.notifications.len() as u64;
        done.notifications.clear();
    }
}

/// Queues the notifications of message `id` just before its result or
/// error (the sending task keeps them ahead of it, [`crate::notes`]).
/// `false` once the sending task is gone.
fn queue_notes(
    results: &mpsc::UnboundedSender<Outgoing>,
    ctx: usize,
    id: u32,
    done: &mut corefarm_cores::worker::SpinOutcome,
) -> bool {
    if done.notifications_dropped > 0 {
        tracing::warn!(
            id,
            "{} handler notification(s) over the {} a message may send were dropped",
            done.notifications_dropped,
            corefarm_cores::worker::MAX_NOTIFICATIONS
        );
    }
    // Dropped ones alone still go, to be counted where the rest are.
    if done.notifications.is_empty() && done.notifications_dropped == 0 {
        return true;
    }
    let notes = Outgoing::Notes {
        id,
        set: u8::try_from(ctx).unwrap_or(u8::MAX),
        notes: std::mem::take(&mut done.notifications),
        over: done.notifications_dropped,
    };
    results.send(notes).is_ok()
}

/// Feeds a streamed message to the worker as its chunks arrive. The chunks
/// are kept (shared, not copied) in case the handlers forward the message
/// to the cores, which then get it whole; the job's data is empty until
/// then. `None`: the chunks stopped before the end (the session is over).
fn stream(
    worker: &mut HandlerWorker,
    ctx: usize,
    chunk: usize,
    s: StreamJob,
) -> Option<(Job, Vec<Bytes>, corefarm_cores::worker::SpinOutcome)> {
    let begun = worker.begin(ctx, s.id, s.total);
    let mut kept = Vec::new();
    let mut got = 0u64;
    while got < s.total || kept.is_empty() {
        let Ok(c) = s.chunks.recv() else {
            // Ends the worker's message short: it restarts for the next.
            if begun.is_ok() {
                let _ = worker.finish();
            }
            return None;
        };
        got += c.len() as u64;
        if begun.is_ok() {
            worker.feed(&c, chunk);
        }
        kept.push(c);
    }
    let done = match begun {
        Ok(()) => worker.finish(),
        Err(failed) => failed,
    };
    let job = Job {
        id: s.id,
        class: s.class,
        data: Bytes::new(),
        count: s.count,
        reservation: s.reservation,
        queued: std::time::Instant::now(),
    };
    Some((job, kept, done))
}

/// A message's chunks as one buffer (one chunk: shared as it is).
fn concat(mut kept: Vec<Bytes>) -> Bytes {
    if kept.len() == 1 {
        return kept.pop().expect("one");
    }
    let mut b = bytes::BytesMut::with_capacity(kept.iter().map(Bytes::len).sum());
    kept.iter().for_each(|c| b.extend_from_slice(c));
    b.freeze()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use corefarm_smp::codec::FrameReader;
    use corefarm_smp::MsgType;

    use super::*;
    use crate::guard::MemoryGuard;

    /// A link whose server agreed any-length: 64-byte outputs, results up
    /// to 1 MiB.
    const ANY: ResultShape = ResultShape {
        output_size: 64,
        any_length: true,
        max_data: 1 << 20,
    };

    /// A message of `count` 16-byte inputs, its input and output reserved
    /// as the session reserves them.
    async fn job(g: &MemoryGuard, id: u32, count: usize, shape: ResultShape) -> Job {
        Job {
            id,
            class: corefarm_smp::stream::DEFAULT_CLASS,
            data: Bytes::from(vec![1; 16 * count]),
            count,
            reservation: g.reserve(16 * count + count * shape.output_size).await,
            queued: std::time::Instant::now(),
        }
    }

    fn held(g: &MemoryGuard) -> usize {
        g.limit() - g.available()
    }

    fn noted(notes: Vec<Vec<u8>>) -> corefarm_cores::worker::SpinOutcome {
        corefarm_cores::worker::SpinOutcome {
            outcome: Outcome::Dropped,
            notifications: notes,
            notifications_dropped: 0,
        }
    }

    #[tokio::test]
    async fn notifications_are_held_in_the_guard_or_dropped_when_it_is_full() {
        let g = MemoryGuard::new(64 * 1024);
        let mut j = job(&g, 1, 1, ANY).await;
        let mut done = noted(vec![vec![1; 4096]; 4]);
        guard_notes(&mut j, &mut done);
        assert_eq!(done.notifications.len(), 4);
        assert_eq!(held(&g), 1024 + 4 * 4096, "the notes' bytes join the job's");
        // Another job's notes that do not fit what is left: dropped, counted.
        let mut k = job(&g, 2, 1, ANY).await;
        let mut more = noted(vec![vec![2; 4096]; 12]);
        guard_notes(&mut k, &mut more);
        assert!(more.notifications.is_empty());
        assert_eq!(more.notifications_dropped, 12);
        assert_eq!(held(&g), 2 * 1024 + 4 * 4096, "nothing taken for them");
        drop((j, k));
        assert_eq!(held(&g), 0, "all given back with the jobs");
    }

    #[tokio::test]
    async fn a_longer_result_holds_its_whole_size_in_the_guard_until_sent() {
        let g = MemoryGuard::new(64 * 1024);
        let j = job(&g, 5, 1, ANY).await;
        assert_eq!(held(&g), 1024, "16 + 64 bytes reserved on arrival");
        let out = answer(ANY, "filter", j, Outcome::Result(vec![7; 20_000])).ok();
        let Some(out @ Outgoing::Result { .. }) = out else {
            panic!("a result")
        };
        // Input and result, rounded up to whole KiB (at most one more).
        assert!(
            (16 + 20_000..=16 + 20_000 + 2048).contains(&held(&g)),
            "{} bytes held",
            held(&g)
        );
        let queued = held(&g);
        // Queued to a sending task whose peer reads nothing yet: the bytes
        // stay held while the result is unsent.
        let (tx, rx) = mpsc::unbounded_channel();
        let (a, b) = tokio::io::duplex(256);
        let sender = tokio::spawn(crate::sender::send_loop(
            a,
            rx,
            Arc::new(AtomicBool::new(true)),
            None,
        ));
        tx.send(out).ok().unwrap();
        tokio::task::yield_now().await;
        assert_eq!(held(&g), queued, "held while the result is unsent");
        let mut r = FrameReader::new(b, 1 << 20);
        let f = r.read_frame().await.unwrap().unwrap();
        assert_eq!((f.ty, f.payload.len()), (MsgType::Data, 4 + 20_000));
        drop(tx);
        assert_eq!(sender.await.unwrap().unwrap(), 1);
        assert_eq!(held(&g), 0, "released once written");
    }

    #[tokio::test]
    async fn a_longer_result_the_guard_cannot_hold_fails_its_message() {
        let g = MemoryGuard::new(64 * 1024);
        let others = g.reserve(50 * 1024).await;
        let j = job(&g, 6, 1, ANY).await;
        let Ok(Outgoing::Failed {
            id,
            code,
            reason,
            reservation,
        }) = answer(ANY, "filter", j, Outcome::Result(vec![7; 20_000]))
        else {
            panic!("a failure")
        };
        assert_eq!((id, code), (6, ErrorCode::TooLarge));
        for want in [
            "handler set filter",
            "20000 bytes",
            "13312 of its 65536 bytes free",
        ] {
            assert!(reason.contains(want), "{want:?} in {reason}");
        }
        assert_eq!(held(&g), 51 * 1024, "nothing more taken");
        drop((reservation, others));
        assert_eq!(held(&g), 0);
    }

    #[tokio::test]
    async fn a_shorter_result_gives_its_unused_output_bytes_back() {
        let g = MemoryGuard::new(64 * 1024);
        // 8 inputs: 128 + 8 × 1024 bytes reserved.
        let shape = ResultShape {
            output_size: 1024,
            ..ANY
        };
        let j = job(&g, 7, 8, shape).await;
        assert_eq!(held(&g), 9 * 1024);
        let Ok(Outgoing::Result {
            data, reservation, ..
        }) = answer(shape, "filter", j, Outcome::Result(vec![1; 2000]))
        else {
            panic!("a result")
        };
        assert_eq!(data.len(), 2000);
        assert_eq!(held(&g), 3 * 1024, "128 + 2000 bytes, in whole KiB");
        drop(reservation);
        let j = job(&g, 8, 8, shape).await;
        let Ok(Outgoing::Result {
            data,
            reservation: _kept,
            ..
        }) = answer(shape, "filter", j, Outcome::Dropped)
        else {
            panic!("a result")
        };
        assert!(data.is_empty());
        assert_eq!(held(&g), 1024, "a dropped message keeps its input's");
    }

    #[tokio::test]
    async fn a_fixed_size_result_keeps_its_reservation() {
        let g = MemoryGuard::new(64 * 1024);
        let shape = ResultShape {
            any_length: false,
            ..ANY
        };
        let j = job(&g, 9, 20, shape).await;
        let before = held(&g);
        let Ok(Outgoing::Result {
            data,
            reservation: _kept,
            ..
        }) = answer(shape, "sum", j, Outcome::Result(vec![1; 3]))
        else {
            panic!("a result")
        };
        assert_eq!((data.len(), held(&g)), (20 * 64, before));
    }
}

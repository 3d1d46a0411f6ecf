//! Streaming handlers on a node (docs/streams.md): data messages whose
//! first chunk matches one of the image's rulesets go to a lane of their
//! own instead of the cores' queue. The lane's thread runs each through
//! the handler worker process (`corefarm_cores::worker::HandlerWorker`),
//! cut into chunks of [`SpinOptions::chunk_size`] bytes (until chunked
//! frames on the wire exist), and answers with what the handlers produced:
//! their emitted bytes, zero-padded to the result size the server expects
//! (count × output size; more fails the message), zeros when dropped, the
//! cores' result when forwarded (the job joins the cores' queue), or the
//! usual per-message error when a handler failed, crashed or overran.
//!
//! Messages of the lane are handled one at a time (their payload handlers
//! in parallel), so a crash is attributed to exactly one message.

use std::thread::JoinHandle;

use bytes::Bytes;
use corefarm_cores::spin::rules::{self, Ruleset};
use corefarm_cores::spin::Outcome;
use corefarm_cores::worker::HandlerWorker;
use corefarm_smp::ErrorCode;
use tokio::sync::mpsc;

use crate::handlers::{Job, Outgoing};

/// Node-side settings of streaming handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinOptions {
    /// Bytes per chunk a message is cut into for its handlers.
    pub chunk_size: usize,
    /// Payload handlers of one message running at once.
    pub threads: usize,
}

impl Default for SpinOptions {
    fn default() -> Self {
        SpinOptions {
            chunk_size: 4096,
            threads: 4,
        }
    }
}

/// The handler lane of one configuration.
pub struct SpinLane {
    rulesets: Vec<(Ruleset, ())>,
    chunk: usize,
    input: async_channel::Sender<(usize, Job)>,
    queue: async_channel::Receiver<(usize, Job)>,
    thread: JoinHandle<()>,
}

impl SpinLane {
    /// Starts the lane's thread; forwarded messages go to `cores`.
    pub fn start(
        worker: HandlerWorker,
        rulesets: Vec<Ruleset>,
        opts: SpinOptions,
        output_size: usize,
        cores: async_channel::Sender<Job>,
        results: mpsc::UnboundedSender<Outgoing>,
        node: &str,
    ) -> std::io::Result<SpinLane> {
        let (tx, rx) = async_channel::unbounded::<(usize, Job)>();
        let chunk = opts.chunk_size.max(16);
        let queue = rx.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{node}-spin"))
            .spawn(move || lane(worker, chunk, output_size, rx, cores, results))?;
        Ok(SpinLane {
            rulesets: rulesets.into_iter().map(|r| (r, ())).collect(),
            chunk,
            input: tx,
            queue,
            thread,
        })
    }

    /// The context whose ruleset matches the message's first chunk.
    pub fn select(&self, data: &[u8]) -> Option<usize> {
        rules::select(&self.rulesets, &data[..data.len().min(self.chunk)]).map(|(i, _)| i)
    }

    pub async fn submit(&self, ctx: usize, job: Job) -> bool {
        self.input.send((ctx, job)).await.is_ok()
    }

    /// Finishes the queued messages, then joins the thread (blocking).
    pub fn stop(self) {
        drop(self.input);
        drop(self.queue);
        let _ = self.thread.join();
    }

    /// Drops the queued messages, then joins the thread (blocking).
    pub fn abort(self) {
        self.input.close();
        while self.queue.try_recv().is_ok() {}
        self.stop();
    }
}

fn lane(
    mut worker: HandlerWorker,
    chunk: usize,
    output_size: usize,
    rx: async_channel::Receiver<(usize, Job)>,
    cores: async_channel::Sender<Job>,
    results: mpsc::UnboundedSender<Outgoing>,
) {
    while let Ok((ctx, job)) = rx.recv_blocking() {
        let done = worker.run(ctx, job.id, &job.data, chunk);
        if !done.notifications.is_empty() {
            // No SMP message carries them yet (docs/streams.md).
            tracing::debug!(
                id = job.id,
                "{} handler notifications not delivered",
                done.notifications.len()
            );
        }
        // The server takes a result of count × output size bytes only: the
        // handlers' output is padded with zeros to that (docs/streams.md).
        let room = job.count * output_size;
        let out = match done.outcome {
            Outcome::Result(bytes) if bytes.len() > room => Outgoing::Failed {
                id: job.id,
                code: ErrorCode::CoreFailure,
                reason: format!(
                    "handler set {}: emitted {} bytes, more than this message's result of {} \
                     inputs × {output_size} bytes = {room} bytes",
                    worker.set(ctx).name,
                    bytes.len(),
                    job.count
                ),
                reservation: Some(job.reservation),
            },
            Outcome::Result(mut bytes) => {
                bytes.resize(room, 0);
                Outgoing::Result {
                    id: job.id,
                    data: Bytes::from(bytes),
                    reservation: job.reservation,
                }
            }
            Outcome::Dropped => Outgoing::Result {
                id: job.id,
                data: Bytes::from(vec![0; room]),
                reservation: job.reservation,
            },
            Outcome::Failed(reason) => Outgoing::Failed {
                id: job.id,
                code: ErrorCode::CoreFailure,
                reason,
                reservation: Some(job.reservation),
            },
            Outcome::Forward => {
                let id = job.id;
                match cores.send_blocking(job) {
                    Ok(()) => continue,
                    Err(e) => Outgoing::Failed {
                        id,
                        code: ErrorCode::CoreFailure,
                        reason: "the handlers forwarded the message but the cores have stopped"
                            .into(),
                        reservation: Some(e.into_inner().reservation),
                    },
                }
            }
        };
        if results.send(out).is_err() {
            return;
        }
    }
}

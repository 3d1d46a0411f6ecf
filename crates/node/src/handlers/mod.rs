//! Core handlers: one OS thread per hardware core (seed 000 §3.4.2), fed from
//! the shared input queue ([`JobQueue`]: by priority class). Cores block (an FPGA poll loop, a simulated clock,
//! a C function), so they get real threads rather than async tasks; an
//! isolated core, which computes in its worker process and signals its
//! completions through a descriptor, gets a task on the event loop instead
//! (`isolated`). An
//! [`Engine`] whose cores are instantaneous (the zero-delay benchmarking
//! core) is instead run by the receiving task itself, which saves two thread
//! hand-offs per message; the session does not know the difference.

use std::thread::JoinHandle;

use bytes::{Bytes, BytesMut};
use corefarm_cores::Core;
use corefarm_smp::ErrorCode;
use tokio::sync::mpsc;

use corefarm_cores::spin::Ruleset;
use corefarm_cores::worker::HandlerWorker;

use crate::guard::Reservation;
use crate::jobq::JobQueue;
use crate::spin::{ResultLink, SpinLane, SpinOptions};

mod pipeline;
#[cfg(test)]
mod tests;

use pipeline::pipelined_loop;
pub(crate) use pipeline::{collected, run_alone, PipeOrder, PipeStep};

/// One data message waiting for a core.
pub struct Job {
    pub id: u32,
    /// Priority class (0 most urgent): the message's on a link with chunks,
    /// `stream::DEFAULT_CLASS` otherwise.
    pub class: u8,
    pub data: Bytes,
    pub count: usize,
    pub reservation: Reservation,
}

/// What the sending task writes: results from core handlers, and control
/// frames (responses, errors, hello) from the receiving task, through one
/// channel so results take no extra hop.
pub enum Outgoing {
    Frame(corefarm_smp::OutFrame),
    Result {
        id: u32,
        data: Bytes,
        reservation: Reservation,
    },
    /// The data message `id` produced no result: an `Error` for that id to
    /// a server that negotiated errors, the end of the connection otherwise.
    Failed {
        id: u32,
        code: ErrorCode,
        reason: String,
        reservation: Option<Reservation>,
    },
    /// What the handlers of message `id` (handler set `set`) passed to
    /// `notify`, queued just before its result or error ([`crate::notes`]).
    Notes {
        id: u32,
        set: u8,
        notes: Vec<Vec<u8>>,
        /// More that the node did not keep (over the per-message limit).
        over: u64,
    },
}

/// What the node runs for the current configuration: its cores and the sizes
/// of one input and one output.
pub struct Engine {
    pub cores: Vec<Box<dyn Core>>,
    pub input_size: usize,
    pub output_size: usize,
    /// The cores finish in negligible time without blocking, so the receiving
    /// task runs the first one itself instead of starting handler threads.
    pub inline: bool,
}

/// Runs every input of `job` through `core` into one output buffer,
/// allocated once for the whole job and filled in place (zeroed first, so a
/// core that writes only part of its output never exposes stale memory).
pub fn run_job(core: &mut dyn Core, job: Job, input_size: usize, output_size: usize) -> Outgoing {
    let mut out = BytesMut::zeroed(job.count * output_size);
    // One batch: an isolated core takes all the inputs in one round trip.
    let inputs = &job.data[..job.count * input_size];
    if let Err(e) = core.process_batch(inputs, &mut out, job.count) {
        return Outgoing::Failed {
            id: job.id,
            code: ErrorCode::CoreFailure,
            reason: format!("input {} of {}: {}", e.index, job.count, e.error),
            reservation: Some(job.reservation),
        };
    }
    Outgoing::Result {
        id: job.id,
        data: out.freeze(),
        reservation: job.reservation,
    }
}

/// The running core handlers of one configuration.
pub struct Workers {
    kind: Kind,
    input_size: usize,
    output_size: usize,
    results: mpsc::UnboundedSender<Outgoing>,
    /// Streaming handlers, when the image carries handler sets.
    spin: Option<SpinLane>,
}

enum Kind {
    Inline(Box<dyn Core>),
    Threads {
        queue: JobQueue,
        threads: Vec<JoinHandle<()>>,
        /// Ends (every sender dropped) once the isolated cores' tasks have.
        tasks: Option<std::sync::mpsc::Receiver<()>>,
    },
}

impl Workers {
    /// Starts one handler thread per core (or none for an inline engine).
    /// Fails only if the OS refuses a thread.
    pub fn start(
        engine: Engine,
        results: mpsc::UnboundedSender<Outgoing>,
        node: &str,
    ) -> std::io::Result<Self> {
        let (input_size, output_size) = (engine.input_size, engine.output_size);
        let mut cores = engine.cores.into_iter();
        let kind = match (engine.inline, cores.next()) {
            (_, None) => return Err(std::io::Error::other("the engine has no cores")),
            (true, Some(core)) => Kind::Inline(core),
            (false, Some(first)) => {
                let queue = JobQueue::new();
                let mut threads = Vec::new();
                let (done, tasks) = std::sync::mpsc::channel();
                let runtime = tokio::runtime::Handle::try_current().ok();
                for (i, mut core) in std::iter::once(first).chain(cores).enumerate() {
                    let (q, results) = (queue.clone(), results.clone());
                    if let Some(rt) = &runtime {
                        if let Some(ready) = crate::isolated::ready(core.as_mut()) {
                            let done = done.clone();
                            rt.spawn(crate::isolated::run(
                                core,
                                ready,
                                input_size,
                                output_size,
                                q,
                                results,
                                done,
                            ));
                            continue;
                        }
                    }
                    let t = std::thread::Builder::new()
                        .name(format!("{node}-core{i}"))
                        .spawn(move || core_loop(core, input_size, output_size, q, results));
                    match t {
                        Ok(t) => threads.push(t),
                        Err(e) => {
                            // Threads already started see the closed queue and exit.
                            queue.close();
                            return Err(e);
                        }
                    }
                }
                Kind::Threads {
                    queue,
                    threads,
                    tasks: Some(tasks),
                }
            }
        };
        Ok(Workers {
            kind,
            input_size,
            output_size,
            results,
            spin: None,
        })
    }

    /// Routes the messages that match one of `rulesets` through the pool
    /// of handler workers (docs/streams.md); the others still go to the
    /// cores.
    pub fn attach_spin(
        &mut self,
        pool: Vec<HandlerWorker>,
        rulesets: Vec<Ruleset>,
        opts: SpinOptions,
        link: ResultLink,
        node: &str,
    ) -> std::io::Result<()> {
        let Kind::Threads { queue, .. } = &self.kind else {
            return Err(std::io::Error::other(
                "streaming handlers need a configuration with core handler threads",
            ));
        };
        let lane = SpinLane::start(
            pool,
            rulesets,
            opts,
            link.shape(self.output_size),
            queue.clone(),
            self.results.clone(),
            node,
        )?;
        self.spin = Some(lane);
        Ok(())
    }

    /// The streaming-handler lane, if the image has handler sets.
    pub fn spin(&self) -> Option<&SpinLane> {
        self.spin.as_ref()
    }

    /// Queues a job (or, for an inline engine, runs it now). `false` once
    /// nobody can take it any more (handlers or sending task gone).
    pub async fn submit(&mut self, job: Job) -> bool {
        if let Some(lane) = &self.spin {
            if let Some(ctx) = lane.select(&job.data) {
                return lane.submit(ctx, job).await;
            }
        }
        match &mut self.kind {
            Kind::Inline(core) => {
                let out = run_job(core.as_mut(), job, self.input_size, self.output_size);
                self.results.send(out).is_ok()
            }
            Kind::Threads { queue, .. } => queue.push(job.class, job).is_ok(),
        }
    }

    /// Lets the handlers finish the queued jobs, then joins them (blocking:
    /// call from `spawn_blocking`).
    pub fn stop(mut self) {
        // First the lane: it may still forward messages to the cores.
        if let Some(lane) = self.spin.take() {
            lane.stop();
        }
        if let Kind::Threads {
            queue,
            threads,
            tasks,
        } = &mut self.kind
        {
            queue.close();
            for t in std::mem::take(threads) {
                let _ = t.join();
            }
            // Errs once every task has ended (none sends).
            if let Some(tasks) = tasks.take() {
                let _ = tasks.recv();
            }
        }
    }

    /// Drops the queued jobs (their results could not be delivered), lets
    /// each handler finish the input it is on, then joins them (blocking).
    pub fn abort(mut self) {
        if let Some(lane) = self.spin.take() {
            lane.abort();
        }
        self.drop_queued();
        self.stop();
    }

    /// Closes the input queue and drops what it holds; handlers exit once
    /// done with their current job.
    fn drop_queued(&self) {
        if let Kind::Threads { queue, .. } = &self.kind {
            queue.abort();
        }
    }
}

/// Handlers dropped without [`Workers::stop`] (a configuration refused after
/// its cores started, a group's task aborted when it leaves) still end:
/// their queues close, so each thread, isolated core and lane worker exits
/// once done with what it holds; nobody waits for them here.
impl Drop for Workers {
    fn drop(&mut self) {
        if let Some(lane) = &self.spin {
            lane.close();
        }
        if let Kind::Threads { queue, .. } = &self.kind {
            queue.close();
        }
    }
}

fn core_loop(
    mut core: Box<dyn Core>,
    input_size: usize,
    output_size: usize,
    queue: JobQueue,
    results: mpsc::UnboundedSender<Outgoing>,
) {
    if core.pipeline().is_some() {
        return pipelined_loop(core, input_size, output_size, queue, results);
    }
    while let Some(job) = queue.wait() {
        let out = run_job(core.as_mut(), job, input_size, output_size);
        if results.send(out).is_err() {
            return;
        }
    }
}

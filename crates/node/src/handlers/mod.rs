//! The core engine: how the node runs its cores. One task per core on the
//! node's event loop takes jobs from the input queue ([`JobQueue`], by
//! priority class) and sends each result to the sending task; there is no
//! other way a core runs. What the task does while a job computes depends
//! only on where the core computes (`engine.rs`):
//!
//! - in a worker process (native and RTL cores, isolated by default): the
//!   task rings the job into the core's pipeline and waits on its ready
//!   descriptor like on a socket, ringing the next queued job meanwhile;
//! - on the event loop itself, for a core that declares itself instant
//!   ([`Core::instant`]: the zero-delay benchmarking core), which costs less
//!   than any hand-over; the receiving task runs a job on it at once when
//!   the core is free and nothing is queued, rather than wake the core's
//!   task;
//! - on a thread of its own, for a core that blocks (an FPGA poll loop, the
//!   benchmarking core's delay, an in-process core an embedder loaded, a
//!   test's gated fake): the task hands the thread a job and waits for it
//!   to come back idle, and the thread runs the jobs queued meanwhile itself,
//!   so a busy core goes from job to job without a hop through the task.
//!
//! Cores run in worker processes in a node: `corefarm node` has no way to
//! load user code into its own process (a crash, an overrun or a hang there
//! takes the node down, and the pipelined worker is no slower). The cores
//! crate keeps [`corefarm_cores::Isolation::InProcess`] for the client's
//! co-working cores and for tests; a node embedded with it runs those cores
//! on threads like any other blocking core.

use bytes::{Bytes, BytesMut};
use corefarm_cores::Core;
use corefarm_smp::ErrorCode;
use tokio::sync::mpsc;

use corefarm_cores::spin::Ruleset;
use corefarm_cores::worker::HandlerWorker;

use crate::guard::Reservation;
use crate::jobq::JobQueue;
use crate::spin::{ResultLink, SpinLane, SpinOptions};

mod engine;
mod pipeline;
#[cfg(test)]
mod tests;

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
    /// When the node queued it: a core that emulates a board with a job
    /// queue starts it then if it is free ([`Core::queued_at`]).
    pub queued: std::time::Instant,
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
}

/// Runs every input of `job` through `core` into one output buffer,
/// allocated once for the whole job and filled in place (zeroed first, so a
/// core that writes only part of its output never exposes stale memory).
pub fn run_job(core: &mut dyn Core, job: Job, input_size: usize, output_size: usize) -> Outgoing {
    let mut out = BytesMut::zeroed(job.count * output_size);
    // One batch: an isolated core takes all the inputs in one round trip.
    let inputs = &job.data[..job.count * input_size];
    core.queued_at(job.queued);
    if let Err(e) = core.process_batch(inputs, &mut out, job.count) {
        return Outgoing::Failed {
            id: job.id,
            code: e.error.code(),
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
    queue: JobQueue,
    /// The instant cores, which [`Workers::submit`] may run a job on itself;
    /// `turn` is the one it tries first.
    instant: Vec<engine::Instant>,
    turn: usize,
    input_size: usize,
    /// Each core's task hands its core back here as it ends; ends (every
    /// sender dropped) once every core's task has.
    tasks: Option<std::sync::mpsc::Receiver<(usize, engine::Back)>>,
    cores: usize,
    output_size: usize,
    results: mpsc::UnboundedSender<Outgoing>,
    /// Streaming handlers, when the image carries handler sets.
    spin: Option<SpinLane>,
}

impl Workers {
    /// Starts one task per core on the current tokio runtime (and a thread
    /// for each core that blocks). Fails without a runtime, without cores,
    /// or if the OS refuses a thread.
    pub fn start(
        engine: Engine,
        results: mpsc::UnboundedSender<Outgoing>,
        node: &str,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| std::io::Error::other("the core engine runs on a tokio runtime"))?;
        if engine.cores.is_empty() {
            return Err(std::io::Error::other("the engine has no cores"));
        }
        let (input_size, output_size) = (engine.input_size, engine.output_size);
        let queue = JobQueue::new();
        let (done, tasks) = std::sync::mpsc::channel();
        let shape = engine::Shape {
            input_size,
            output_size,
        };
        let cores = engine.cores.len();
        let mut started = Vec::with_capacity(cores);
        for (i, core) in engine.cores.into_iter().enumerate() {
            // On an error, the threads already started end as their places
            // are dropped.
            let name = format!("{node}-core{i}");
            started.push(engine::Place::of(core, shape, &queue, &results, &name)?);
        }
        let instant = started
            .iter()
            .filter_map(|place| match place {
                engine::Place::Task(core) => Some(core.clone()),
                _ => None,
            })
            .collect();
        for (i, place) in started.into_iter().enumerate() {
            runtime.spawn(engine::run(
                place,
                shape,
                queue.clone(),
                results.clone(),
                i,
                done.clone(),
            ));
        }
        Ok(Workers {
            queue,
            instant,
            turn: 0,
            input_size,
            tasks: Some(tasks),
            cores,
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
        let lane = SpinLane::start(
            pool,
            rulesets,
            opts,
            link.shape(self.output_size),
            self.queue.clone(),
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

    /// Queues a job, or runs it at once on a free instant core. `false`
    /// once nobody can take it any more (the configuration's handlers are
    /// stopping, or the sending task is gone).
    pub async fn submit(&mut self, job: Job) -> bool {
        if let Some(lane) = &self.spin {
            if let Some(ctx) = lane.select(&job.data) {
                return lane.submit(ctx, job).await;
            }
        }
        // An instant core that is free takes the job at once, unless jobs
        // wait before it (forwarded by a streaming handler) and it would
        // overtake them.
        if !self.instant.is_empty() && self.queue.is_empty() {
            let n = self.instant.len();
            for i in 0..n {
                let at = (self.turn + i) % n;
                if let Some(mut core) = engine::try_lock(&self.instant[at]) {
                    self.turn = (at + 1) % n;
                    let out = run_job(core.as_mut(), job, self.input_size, self.output_size);
                    drop(core);
                    return self.results.send(out).is_ok();
                }
            }
        }
        self.queue.push(job.class, job).is_ok()
    }

    /// Lets the handlers finish the queued jobs, then joins them (blocking:
    /// call from `spawn_blocking`). Returns the cores, idle and in their
    /// order, if every one came back (see [`Workers::abort`]).
    pub fn stop(mut self) -> Option<Vec<Box<dyn Core>>> {
        // First the lane: it may still forward messages to the cores.
        if let Some(lane) = self.spin.take() {
            lane.stop();
        }
        self.queue.close();
        // The instant cores' own handles, so each comes back unshared.
        self.instant.clear();
        let tasks = self.tasks.take()?;
        let mut back: Vec<Option<Box<dyn Core>>> = (0..self.cores).map(|_| None).collect();
        // Ends once every task has ended (none sends any more); a task ends
        // after its core's thread, if it has one.
        while let Ok((i, core)) = tasks.recv() {
            back[i] = match core {
                engine::Back::Core(c) => Some(c),
                engine::Back::Shared(c) => std::sync::Arc::try_unwrap(c)
                    .ok()
                    .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner())),
            };
        }
        back.into_iter().collect()
    }

    /// Drops the queued jobs (their results could not be delivered), lets
    /// each handler finish the input it is on, then joins them (blocking).
    /// The cores come back as from [`Workers::stop`]: a node keeps them
    /// across a lost server connection, so the same function configured
    /// again needs no loading.
    pub fn abort(mut self) -> Option<Vec<Box<dyn Core>>> {
        if let Some(lane) = self.spin.take() {
            lane.abort();
        }
        self.drop_queued();
        self.stop()
    }

    /// Closes the input queue and drops what it holds (returns how many
    /// jobs); handlers exit once done with their current job.
    pub fn drop_queued(&self) -> usize {
        self.queue.abort()
    }
}

/// Handlers dropped without [`Workers::stop`] (a configuration refused after
/// its cores started, a group's task aborted when it leaves) still end:
/// their queues close, so each core's task (and thread) and each lane
/// worker exits once done with what it holds; nobody waits for them here.
impl Drop for Workers {
    fn drop(&mut self) {
        if let Some(lane) = &self.spin {
            lane.close();
        }
        self.queue.close();
    }
}

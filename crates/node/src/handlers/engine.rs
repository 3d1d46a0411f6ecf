//! The task that runs one core ([`run`]), by where the core computes
//! ([`Place`]).
//!
//! A core in a worker process already runs on a CPU of its own; a handler
//! thread in between would only relay (wake up to copy a job in and ring
//! the worker, sleep, wake up again at the completion), and on a machine
//! where a system call and a context switch are dear, those two extra
//! hand-overs per message were most of what isolation cost
//! (bench/manual/isolation-quiet.md, "Where the two-core gap comes from").
//! So the task that takes a job from the queue copies it in and rings the
//! worker, and the completion comes back through the core's ready
//! descriptor, polled like a socket: an epoll set of the core's eventfd,
//! which the worker writes only when the task said it waits, and the
//! worker's channel, which hangs up when the worker dies (its job thread
//! holds a robust futex word, so the kernel marks a death at once). The
//! watchdog is looked at every [`PIPELINE_TICK`] of waiting. A product then
//! costs about the hand-overs of a core in the node's own process: at two
//! cores and one product per message, 6.3 context switches per product
//! against 5.5 in process and 9.4 with a relaying thread.
//!
//! The order of jobs is [`PipeOrder`]'s: the next queued job is rung before
//! the current one is collected, but only if no other core waits for work.
//! The task also takes a job pushed while it waits
//! (`JobQueue::wait_ahead_async`, same rule), so a worker kept busy goes
//! from one job to the next without waiting for the task to wake.

use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use bytes::BytesMut;
use corefarm_cores::{Core, Pipeline, PIPELINE_TICK};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::{collected, run_alone, run_job, Job, Outgoing, PipeOrder, PipeStep};
use crate::jobq::JobQueue;

/// The sizes of one input and one output.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub input_size: usize,
    pub output_size: usize,
}

/// Where a core computes, which decides how its task waits for a job.
pub(super) enum Place {
    /// In a worker process: rung through the core's pipeline, waited for on
    /// its ready descriptor.
    Worker {
        core: Box<dyn Core>,
        ready: AsyncFd<File>,
    },
    /// On the task itself: the core finishes in negligible time without
    /// blocking ([`Core::instant`]). The task shares it with
    /// [`super::Workers::submit`], which runs a job on it at once when the
    /// core is free and nothing is queued: at zero delay the hand-over to
    /// this task (a wake-up per job) cost a tenth of the node's
    /// throughput. The task takes what is queued anyway (the jobs a
    /// streaming handler forwards, from its thread).
    Task(Instant),
    /// On a thread of its own: the core blocks.
    Thread(Host),
}

impl Place {
    /// Must be called on the runtime the task will run on (the ready
    /// descriptor is registered with it).
    pub fn of(
        mut core: Box<dyn Core>,
        shape: Shape,
        queue: &JobQueue,
        results: &mpsc::UnboundedSender<Outgoing>,
        name: &str,
    ) -> std::io::Result<Place> {
        if core.instant() {
            return Ok(Place::Task(Arc::new(Mutex::new(core))));
        }
        if let Some(ready) = ready(core.as_mut()) {
            return Ok(Place::Worker { core, ready });
        }
        Host::start(core, shape, queue.clone(), results.clone(), name).map(Place::Thread)
    }
}

/// The task of one core: until the queue closes (and is empty) or the
/// sending task is gone (the queue is then dropped). `done` gets the core
/// back, idle, as the task ends, and is dropped then (after the core's
/// thread, if it has one), which `Workers::stop` waits for; a core lost
/// on the way (its thread panicked) is not sent.
pub(super) async fn run(
    place: Place,
    shape: Shape,
    queue: JobQueue,
    results: mpsc::UnboundedSender<Outgoing>,
    index: usize,
    done: std::sync::mpsc::Sender<(usize, Back)>,
) {
    let back = match place {
        Place::Worker { core, ready } => worker(core, ready, shape, &queue, &results)
            .await
            .map(Back::Core),
        Place::Task(core) => {
            while let Some(job) = queue.wait_async().await {
                let out = run_job(
                    lock(&core).as_mut(),
                    job,
                    shape.input_size,
                    shape.output_size,
                );
                if results.send(out).is_err() {
                    // Nobody takes results any more: what is queued is
                    // not worth running.
                    queue.abort();
                }
            }
            Some(Back::Shared(core))
        }
        Place::Thread(host) => host.serve(&queue).await.map(Back::Core),
    };
    if let Some(b) = back {
        let _ = done.send((index, b));
    }
}

/// A core handed back by its task once the task ended with the core idle
/// (nothing of it outstanding), so a later engine may run it again.
pub(super) enum Back {
    Core(Box<dyn Core>),
    /// An instant core, still shared until the engine drops its own handle.
    Shared(Instant),
}

/// An instant core, run by its task or by the submitting task, whichever
/// holds the lock (they meet only when a job was queued).
pub(super) type Instant = Arc<Mutex<Box<dyn Core>>>;

/// The core, whether or not a job on it panicked before (a core is left
/// as the panic found it, like one in a worker process).
pub(super) fn lock(core: &Instant) -> MutexGuard<'_, Box<dyn Core>> {
    core.lock().unwrap_or_else(|p| p.into_inner())
}

/// The core if nobody runs a job on it now.
pub(super) fn try_lock(core: &Instant) -> Option<MutexGuard<'_, Box<dyn Core>>> {
    match core.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// A core that blocks, on a thread of its own. The task hands it one job
/// and waits for it to come back idle; the thread runs the jobs queued
/// meanwhile itself, so a busy core goes from job to job without a hop
/// through the task, and only a core that ran dry waits on the event loop.
pub(super) struct Host {
    jobs: std::sync::mpsc::Sender<Job>,
    /// One message each time the thread runs dry; closed once it ended
    /// (its core handed back), or if it cannot send results any more.
    idle: mpsc::UnboundedReceiver<()>,
    /// The core, once the thread ended (`Err` if it panicked).
    back: tokio::sync::oneshot::Receiver<Box<dyn Core>>,
}

impl Host {
    fn start(
        mut core: Box<dyn Core>,
        shape: Shape,
        queue: JobQueue,
        results: mpsc::UnboundedSender<Outgoing>,
        name: &str,
    ) -> std::io::Result<Host> {
        let (jobs, handed) = std::sync::mpsc::channel::<Job>();
        let (idle_tx, idle) = mpsc::unbounded_channel();
        let (back_tx, back) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                'serve: while let Ok(job) = handed.recv() {
                    let mut next = Some(job);
                    while let Some(job) = next {
                        let out = run_job(core.as_mut(), job, shape.input_size, shape.output_size);
                        if results.send(out).is_err() {
                            queue.abort();
                            break 'serve;
                        }
                        next = queue.try_pop();
                    }
                    if idle_tx.send(()).is_err() {
                        break;
                    }
                }
                // The core is handed back (or dropped, if nobody waits)
                // before the task hears of the end, so a stopped engine
                // holds every core it will get back.
                drop(back_tx.send(core));
                drop(idle_tx);
            })?;
        Ok(Host { jobs, idle, back })
    }

    async fn serve(mut self, queue: &JobQueue) -> Option<Box<dyn Core>> {
        while let Some(job) = queue.wait_async().await {
            if self.jobs.send(job).is_err() || self.idle.recv().await.is_none() {
                break;
            }
        }
        drop(self.jobs);
        while self.idle.recv().await.is_some() {}
        self.back.await.ok()
    }
}

/// The core's ready descriptor (completions and its worker's death),
/// registered with the event loop; `None` if the core has none (it then
/// runs on a thread).
fn ready(core: &mut dyn Core) -> Option<AsyncFd<File>> {
    let fd = core.pipeline()?.ready_fd()?.try_clone_to_owned().ok()?;
    // SAFETY: the `File` owns the descriptor (a duplicate of the core's
    // ready descriptor) for as long as the `AsyncFd` holds it, and always
    // returns that same descriptor.
    unsafe { AsyncFd::register_with_interest(File::from(fd), tokio::io::Interest::READABLE) }.ok()
}

/// Runs `f` where it may block (starting a worker, a batch too large for
/// the pipeline): off the event loop's thread when the runtime has others.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Copies `job` in and rings it; a lost worker is restarted first, where
/// blocking is allowed.
fn submit(pipe: &mut dyn Pipeline, job: &Job, input_size: usize) {
    let inputs = &job.data[..job.count * input_size];
    if pipe.needs_start() {
        blocking(|| pipe.submit(inputs, job.count));
    } else {
        pipe.submit(inputs, job.count);
    }
}

enum Step {
    Done(Result<(), corefarm_cores::BatchError>),
    /// Armed: the ready descriptor or the tick says when to look again; the
    /// pipeline's depth.
    Wait(usize),
    /// Completed (or lost) in between: look again now.
    Again,
}

/// A core in a worker process, in [`PipeOrder`].
async fn worker(
    mut core: Box<dyn Core>,
    ready: AsyncFd<File>,
    shape: Shape,
    queue: &JobQueue,
    results: &mpsc::UnboundedSender<Outgoing>,
) -> Option<Box<dyn Core>> {
    let Shape {
        input_size,
        output_size,
    } = shape;
    let mut order = PipeOrder::default();
    loop {
        if order.idle() {
            match queue.wait_async().await {
                Some(job) => order.hold(job),
                // Nothing outstanding: the core can be run again.
                None => return Some(core),
            }
        } else {
            order.look_ahead(queue);
        }
        let job = {
            let pipe = core.pipeline()?;
            match order.step(pipe) {
                PipeStep::Submit(job) => {
                    submit(pipe, &job, input_size);
                    order.submitted(job);
                    continue;
                }
                PipeStep::RunAlone(job) => {
                    let c = core.as_mut();
                    if !blocking(|| run_alone(c, job, input_size, output_size, results)) {
                        // Nobody takes results: drop what is queued, then
                        // collect (and drop) what is still in the pipeline.
                        queue.abort();
                    }
                    continue;
                }
                PipeStep::Collect(job) => job,
                PipeStep::Again => continue,
            }
        };
        let mut out = BytesMut::zeroed(job.count * output_size);
        let mut tick = false;
        let outcome = loop {
            // The pipeline is borrowed in here only: a `dyn Pipeline` held
            // across the wait below would make the task not `Send`.
            let step = {
                let pipe = core.pipeline()?;
                if std::mem::take(&mut tick) {
                    pipe.tick();
                }
                let r = if pipe.needs_start() {
                    blocking(|| pipe.try_collect(&mut out))
                } else {
                    pipe.try_collect(&mut out)
                };
                match r {
                    Some(r) => Step::Done(r),
                    None if pipe.arm() => Step::Wait(pipe.depth()),
                    None => Step::Again,
                }
            };
            let depth = match step {
                Step::Done(r) => break r,
                Step::Again => continue,
                Step::Wait(depth) => depth,
            };
            // A job that arrives while the worker computes is rung at once
            // (if a lane is free and no other core waits for work), so the
            // worker goes on to it without waiting for this task to wake.
            let take = order.can_take(depth);
            tokio::select! {
                biased;
                r = tokio::time::timeout(PIPELINE_TICK, ready.readable()) => match r {
                    // The next `arm` resets the descriptor; a signal that
                    // was for an earlier completion costs one more look.
                    Ok(Ok(mut signalled)) => signalled.clear_ready(),
                    // Only at the runtime's shutdown: wait as if by the clock.
                    Ok(Err(_)) => {
                        tokio::time::sleep(PIPELINE_TICK).await;
                        tick = true;
                    }
                    Err(_) => tick = true,
                },
                ahead = queue.wait_ahead_async(), if take => {
                    let pipe = core.pipeline()?;
                    let fits = pipe.fits(ahead.count);
                    if let Some(job) = order.offer(ahead, fits) {
                        submit(pipe, &job, input_size);
                        order.submitted(job);
                    }
                }
            }
        };
        if results.send(collected(job, out, outcome)).is_err() {
            // As above: the jobs still in the pipeline are collected and
            // dropped, so the core is handed back idle.
            queue.abort();
        }
    }
}

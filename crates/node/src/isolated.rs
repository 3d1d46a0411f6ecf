//! Isolated cores driven from the node's event loop: a task per core, no
//! thread. A core in a worker process already runs on a CPU of its own;
//! a handler thread in between only relays (wakes up to copy a job in and
//! ring the worker, sleeps, wakes up again at the completion), and on a
//! machine where a system call and a context switch are dear, those two
//! extra hand-overs per message were most of what isolation cost
//! (docs/benchmarks.md, "Where the two-core gap comes from"). Here the
//! task that takes a job from the queue copies it in and rings the worker,
//! and the completion comes back through the core's ready descriptor,
//! polled like a socket, which a worker's death makes readable too. The
//! watchdog is looked at every [`PIPELINE_TICK`] of waiting.
//!
//! The order of jobs is the core handler threads' ([`PipeOrder`]): the
//! next queued job is rung before the current one is collected, but only
//! if no other core waits for work. Unlike a thread asleep on its worker,
//! the task also takes a job pushed while it waits
//! (`JobQueue::wait_ahead_async`, same rule), so a worker kept busy goes
//! from one job to the next without waiting for the task to wake.

use std::fs::File;

use bytes::BytesMut;
use corefarm_cores::{Core, Pipeline, PIPELINE_TICK};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::handlers::{collected, run_alone, Job, Outgoing, PipeOrder, PipeStep};
use crate::jobq::JobQueue;

/// The core's ready descriptor (completions and its worker's death),
/// registered with the event loop; `None` if the core has none (it then
/// gets a handler thread).
pub fn ready(core: &mut dyn Core) -> Option<AsyncFd<File>> {
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

/// The task of one isolated core: until the queue closes (and is empty)
/// or the sending task is gone. `_done` is dropped when it ends, which
/// `Workers::stop` waits for.
pub async fn run(
    mut core: Box<dyn Core>,
    ready: AsyncFd<File>,
    input_size: usize,
    output_size: usize,
    queue: JobQueue,
    results: mpsc::UnboundedSender<Outgoing>,
    _done: std::sync::mpsc::Sender<()>,
) {
    let mut order = PipeOrder::default();
    loop {
        if order.idle() {
            match queue.wait_async().await {
                Some(job) => order.hold(job),
                None => return,
            }
        } else {
            order.look_ahead(&queue);
        }
        let job = {
            let Some(pipe) = core.pipeline() else { return };
            match order.step(pipe) {
                PipeStep::Submit(job) => {
                    submit(pipe, &job, input_size);
                    order.submitted(job);
                    continue;
                }
                PipeStep::RunAlone(job) => {
                    let c = core.as_mut();
                    if !blocking(|| run_alone(c, job, input_size, output_size, &results)) {
                        return;
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
                let Some(pipe) = core.pipeline() else { return };
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
                    let Some(pipe) = core.pipeline() else { return };
                    let fits = pipe.fits(ahead.count);
                    if let Some(job) = order.offer(ahead, fits) {
                        submit(pipe, &job, input_size);
                        order.submitted(job);
                    }
                }
            }
        };
        if results.send(collected(job, out, outcome)).is_err() {
            return;
        }
    }
}

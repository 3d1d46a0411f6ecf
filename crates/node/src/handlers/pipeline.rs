//! The job order of a core with a pipeline (a core in a worker process):
//! the next job is rung while the one before is collected.

use std::collections::VecDeque;

use bytes::BytesMut;
use corefarm_cores::{BatchError, Core, Pipeline};
use tokio::sync::mpsc;

use super::{run_job, Job, Outgoing};
use crate::jobq::JobQueue;

/// The order of jobs on a core with a pipeline, for its task
/// (`engine::worker`). The next
/// queued job is handed over before the current one is collected, so the
/// worker goes from one to the next while the driver copies. Only jobs
/// already queued are taken ahead (never waited for), and only while no
/// other core waits for work (`JobQueue::ahead`), so a job does not wait
/// behind another while a different core is free.
#[derive(Default)]
pub(crate) struct PipeOrder {
    /// Submitted, oldest first.
    pending: VecDeque<Job>,
    /// Taken from the queue, not submitted yet.
    next: Option<Job>,
}

/// What a pipelined core's driver does next.
pub(crate) enum PipeStep {
    /// Copy the job in and ring it, then [`PipeOrder::submitted`].
    Submit(Job),
    /// Too large for the pipeline, with nothing outstanding: run it alone.
    RunAlone(Job),
    /// Collect the oldest submitted job.
    Collect(Job),
    /// Nothing to do: look at the queue again.
    Again,
}

impl PipeOrder {
    /// Nothing in hand or outstanding: the driver waits for the queue and
    /// passes what it gets to [`PipeOrder::hold`].
    pub fn idle(&self) -> bool {
        self.next.is_none() && self.pending.is_empty()
    }

    pub fn hold(&mut self, job: Job) {
        self.next = Some(job);
    }

    /// With jobs outstanding and none in hand, takes one already queued if
    /// the queue lets this core go ahead.
    pub fn look_ahead(&mut self, queue: &JobQueue) {
        if self.next.is_none() && !self.pending.is_empty() {
            self.next = queue.ahead();
        }
    }

    pub fn step(&mut self, pipe: &dyn Pipeline) -> PipeStep {
        if let Some(job) = self.next.take() {
            if pipe.fits(job.count) && self.pending.len() < pipe.depth() {
                return PipeStep::Submit(job);
            }
            if self.pending.is_empty() {
                return PipeStep::RunAlone(job);
            }
            self.next = Some(job);
        }
        match self.pending.pop_front() {
            Some(job) => PipeStep::Collect(job),
            None => PipeStep::Again,
        }
    }

    /// The job a [`PipeStep::Submit`] (or an [`PipeOrder::offer`]) gave
    /// out was rung: it is outstanding now.
    pub fn submitted(&mut self, job: Job) {
        self.pending.push_back(job);
    }

    /// While collecting the oldest job (not counted here) from a pipeline
    /// `depth` deep: whether one more may be taken meanwhile.
    pub fn can_take(&self, depth: usize) -> bool {
        self.next.is_none() && self.pending.len() + 1 < depth
    }

    /// A job taken while collecting: given back to ring now if it `fits`,
    /// otherwise kept for the next [`PipeOrder::step`].
    pub fn offer(&mut self, job: Job, fits: bool) -> Option<Job> {
        if fits {
            return Some(job);
        }
        self.next = Some(job);
        None
    }
}

/// A job too large for one pipelined job, run alone as a batch (nothing
/// else outstanding); `false` once its result cannot be sent.
pub(crate) fn run_alone(
    core: &mut dyn Core,
    job: Job,
    input_size: usize,
    output_size: usize,
    results: &mpsc::UnboundedSender<Outgoing>,
) -> bool {
    results
        .send(run_job(core, job, input_size, output_size))
        .is_ok()
}

/// What a collected pipelined job sends: its outputs, or its error.
pub(crate) fn collected(job: Job, out: BytesMut, outcome: Result<(), BatchError>) -> Outgoing {
    match outcome {
        Ok(()) => Outgoing::Result {
            id: job.id,
            data: out.freeze(),
            reservation: job.reservation,
        },
        Err(e) => Outgoing::Failed {
            id: job.id,
            code: e.error.code(),
            reason: format!("input {} of {}: {}", e.index, job.count, e.error),
            reservation: Some(job.reservation),
        },
    }
}

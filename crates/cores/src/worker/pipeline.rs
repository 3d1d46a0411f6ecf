//! The node side of the pipeline between a node and its worker: the slots
//! are two lanes, and while the worker runs the job in one lane the node
//! copies the next job into the other and rings it, so the worker goes
//! from one job to the next without waiting for the node, and the node
//! copies outputs out while the worker computes.
//!
//! When the worker is lost (it died, hung or broke the protocol), the jobs
//! outstanding fare according to what the worker did with them: a job it
//! completed before keeps its outputs (they were final at its completion,
//! and the worker ran later jobs in the other lane); the job it was running
//! fails, naming the core and the cause; a job it had not started (its
//! inputs are intact: the worker maps inputs read-only) is rung again on
//! the next worker, so one bad input costs only its own message.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rustix::thread::futex::OWNER_DIED;

use super::doorbell::{self, reached, Wait, NODE_SPIN, SEQ_MASK};
use super::{IsolatedCore, SLICE};
use crate::{BatchError, CoreError, Pipeline};

/// One job handed to the worker and not yet collected.
pub(super) struct InFlight {
    seq: u32,
    /// Lane (0 or 1) holding its inputs and outputs; `NO_LANE` for a job
    /// that failed before it was given one.
    lane: usize,
    n: usize,
    rung: Instant,
    state: State,
}

const NO_LANE: usize = usize::MAX;

pub(super) enum State {
    /// Rung to the current worker.
    Rung,
    /// Rung to a worker that was lost before it started the job: rung
    /// again, unchanged, on the next worker.
    Rerun,
    /// Failed at this input, for this reason; nothing to collect.
    Failed(usize, CoreError),
}

impl IsolatedCore {
    pub(super) fn lane_slots(&self) -> usize {
        self.region.layout().slots / 2
    }

    /// Starts a worker if there is none and rings again, in order, the
    /// jobs the last one did not start.
    fn ensure_worker(&mut self) -> Result<(), String> {
        if self.worker.is_none() {
            // A job the lost worker completed and the node has not collected
            // yet keeps its header entry: number the new worker's jobs (it
            // starts after the number in `job`) so that the first one uses
            // the other entry.
            let next = self.seq.wrapping_add(1) & SEQ_MASK;
            let kept = |p: &InFlight| matches!(p.state, State::Rung) && p.seq & 1 == next & 1;
            if self.pending.iter().any(kept) {
                self.seq = next;
                let h = self.region.header();
                h.job.store(next << 1, Ordering::Release);
            }
            let started = match self.spawn() {
                Ok(w) => {
                    self.worker = Some(w);
                    self.wait_ready()
                        .map_err(|e| format!("{}: restarting failed: {e}", self.label()))
                }
                Err(e) => Err(format!("{}: cannot restart: {e}", self.label())),
            };
            if let Err(e) = started {
                for p in self.pending.iter_mut() {
                    if matches!(p.state, State::Rerun) {
                        p.state = State::Failed(0, CoreError::Worker(e.clone()));
                    }
                }
                return Err(e);
            }
        }
        for i in 0..self.pending.len() {
            if matches!(self.pending[i].state, State::Rerun) {
                let (lane, n) = (self.pending[i].lane, self.pending[i].n);
                let seq = self.ring(lane, n);
                let p = &mut self.pending[i];
                (p.seq, p.state, p.rung) = (seq, State::Rung, Instant::now());
            }
        }
        Ok(())
    }

    /// Describes the next job (its inputs already in `lane`) and rings it.
    fn ring(&mut self, lane: usize, n: usize) -> u32 {
        self.seq = self.seq.wrapping_add(1) & SEQ_MASK;
        let first = lane * self.lane_slots();
        let h = self.region.header();
        let e = &h.jobs[(self.seq & 1) as usize];
        e.first.store(first as u32, Ordering::Relaxed);
        e.count.store(n as u32, Ordering::Relaxed);
        e.progress.store(0, Ordering::Relaxed);
        doorbell::ring(&h.job, self.seq);
        self.seq
    }

    fn refuse(&mut self, why: String) {
        self.pending.push_back(InFlight {
            seq: 0,
            lane: NO_LANE,
            n: 0,
            rung: Instant::now(),
            state: State::Failed(0, CoreError::Failed(why)),
        });
    }

    /// Copies `n` inputs (at most a lane's slots) into a free lane and rings
    /// them as one worker job.
    pub(super) fn submit_job(&mut self, inputs: &[u8], n: usize) {
        let busy = |l: usize| {
            self.pending
                .iter()
                .any(|p| p.lane == l && !matches!(p.state, State::Failed(..)))
        };
        let Some(lane) = (0..2).find(|&l| !busy(l)) else {
            return self.refuse(format!(
                "{}: a job was submitted while two were outstanding",
                self.label()
            ));
        };
        let l = *self.region.layout();
        let first = lane * self.lane_slots();
        for k in 0..n {
            // SAFETY: the lane is free (no job of the worker uses it) and
            // slot first+k's input memory is input_size bytes inside the
            // region.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    inputs[k * l.input_size..].as_ptr(),
                    self.region.at(l.input_at(first + k)),
                    l.input_size,
                )
            };
        }
        // Rung by `ensure_worker`, after any job a restart rings again.
        self.pending.push_back(InFlight {
            seq: 0,
            lane,
            n,
            rung: Instant::now(),
            state: State::Rerun,
        });
        let _ = self.ensure_worker();
    }

    /// Waits for the oldest job and copies its outputs out; on failure
    /// says which of its inputs failed, and writes nothing.
    pub(super) fn collect_job(&mut self, outputs: &mut [u8]) -> Result<(), (usize, CoreError)> {
        loop {
            let Some(front) = self.pending.front() else {
                let e = format!("{}: no job was submitted", self.label());
                return Err((0, CoreError::Failed(e)));
            };
            match front.state {
                State::Failed(..) => {
                    if let Some(InFlight {
                        state: State::Failed(k, e),
                        ..
                    }) = self.pending.pop_front()
                    {
                        return Err((k, e));
                    }
                }
                // A failure marks it failed; either way look again.
                State::Rerun => drop(self.ensure_worker()),
                State::Rung => {
                    if self.wait_for(front.seq) {
                        return self.finish(outputs);
                    }
                }
            }
        }
    }

    /// [`Self::collect_job`] for an event loop: `None` instead of sleeping
    /// while the oldest job runs (a worker restart may still block).
    pub(super) fn try_collect_job(
        &mut self,
        outputs: &mut [u8],
    ) -> Option<Result<(), (usize, CoreError)>> {
        loop {
            let Some(front) = self.pending.front() else {
                let e = format!("{}: no job was submitted", self.label());
                return Some(Err((0, CoreError::Failed(e))));
            };
            match front.state {
                State::Failed(..) => {
                    if let Some(InFlight {
                        state: State::Failed(k, e),
                        ..
                    }) = self.pending.pop_front()
                    {
                        return Some(Err((k, e)));
                    }
                }
                State::Rerun => drop(self.ensure_worker()),
                State::Rung => {
                    let seq = front.seq;
                    let h = self.region.header();
                    if reached(h.completed.load(Ordering::SeqCst), seq) {
                        self.watch = None;
                        return Some(self.finish(outputs));
                    }
                    if h.done.load(Ordering::SeqCst) & OWNER_DIED == 0 {
                        return None;
                    }
                    self.lose_to_crash();
                }
            }
        }
    }

    /// Asks the worker to signal the eventfd at its next completion, and
    /// starts the watchdog on the oldest job if it is not timed yet.
    /// `false` if that job needs no waiting (done, dead worker, none).
    pub(super) fn arm_front(&mut self) -> bool {
        let Some(front) = self.pending.front() else {
            return false;
        };
        if !matches!(front.state, State::Rung) {
            return false;
        }
        let seq = front.seq;
        let h = self.region.header();
        if self.watch.map(|w| w.0) != Some(seq) {
            let p = h.jobs[(seq & 1) as usize].progress.load(Ordering::Acquire);
            self.watch = Some((seq, p, Instant::now() + self.shared.watchdog));
        }
        // A signal of an earlier completion, already looked at, is reset
        // here, so the set is readable only for what comes after.
        let mut count = [0u8; 8];
        let _ = rustix::io::read(&self.event, &mut count);
        h.notify.store(1, Ordering::SeqCst);
        // The completion (or the death) may have come before the request
        // was seen: then nothing will signal.
        !reached(h.completed.load(Ordering::SeqCst), seq)
            && h.done.load(Ordering::SeqCst) & OWNER_DIED == 0
    }

    /// The event loop's periodic look at the oldest job: the watchdog
    /// (reset by progress, as in [`Self::wait_for`]) and a worker that died
    /// without the kernel marking `done`.
    pub(super) fn tick_front(&mut self) {
        let Some(front) = self.pending.front() else {
            return;
        };
        if !matches!(front.state, State::Rung) {
            return;
        }
        let seq = front.seq;
        let h = self.region.header();
        if reached(h.completed.load(Ordering::SeqCst), seq) {
            return;
        }
        let p = h.jobs[(seq & 1) as usize].progress.load(Ordering::Acquire);
        let now = Instant::now();
        match self.watch {
            Some((s, seen, deadline)) if s == seq => {
                if p != seen {
                    self.watch = Some((seq, p, now + self.shared.watchdog));
                } else if now >= deadline {
                    self.watch = None;
                    let cause = self.hung();
                    self.worker_lost(cause, None);
                    return;
                }
            }
            _ => self.watch = Some((seq, p, now + self.shared.watchdog)),
        }
        if h.done.load(Ordering::SeqCst) & OWNER_DIED != 0 || self.worker_gone() {
            self.lose_to_crash();
        }
    }

    fn lose_to_crash(&mut self) {
        self.watch = None;
        let cause = self.crashed();
        self.worker_lost(cause, None);
    }

    /// Drops the oldest job without copying anything out (after a failure
    /// of an earlier job of the same batch); waits for it if it runs.
    pub(super) fn discard_front(&mut self) {
        match self.pending.front() {
            Some(InFlight {
                state: State::Rung,
                n,
                ..
            }) => {
                let mut scratch = std::mem::take(&mut self.discard);
                scratch.resize(n * self.region.layout().output_size, 0);
                let _ = self.collect_job(&mut scratch);
                self.discard = scratch;
            }
            _ => drop(self.pending.pop_front()),
        }
    }

    /// Waits for job `seq` to complete (`true`) or for the worker to be
    /// lost (`false`: the outstanding jobs are marked accordingly).
    fn wait_for(&mut self, seq: u32) -> bool {
        let watchdog = self.shared.watchdog;
        let mut deadline = Instant::now() + watchdog;
        let mut progress = 0;
        // Spin only for a core whose last job was quick.
        let spin = if self.last_job < NODE_SPIN {
            NODE_SPIN
        } else {
            Duration::ZERO
        };
        loop {
            let until = deadline.min(Instant::now() + SLICE);
            let h = self.region.header();
            match doorbell::wait_done(&h.done, &h.completed, seq, until, spin) {
                Wait::Done => return true,
                Wait::Died => break,
                Wait::Slice => {}
            }
            let p = h.jobs[(seq & 1) as usize].progress.load(Ordering::Acquire);
            if p != progress {
                progress = p;
                deadline = Instant::now() + watchdog;
            } else if Instant::now() >= deadline {
                let cause = self.hung();
                self.worker_lost(cause, None);
                return false;
            }
            // A worker that died before it took its thread id into `done`.
            if self.worker_gone() {
                break;
            }
        }
        let cause = self.crashed();
        self.worker_lost(cause, None);
        false
    }

    /// The worker is gone (reaped): the job it was running (`culprit`, or
    /// the one after its last completed job) fails with `cause`, jobs it
    /// had not started are rung again on the next worker, jobs it
    /// completed stand. Returns the error if no outstanding job took it.
    pub(super) fn worker_lost(&mut self, cause: String, culprit: Option<u32>) -> Option<CoreError> {
        let h = self.region.header();
        let completed = h.completed.load(Ordering::Acquire);
        let culprit = culprit.unwrap_or(completed.wrapping_add(1) & SEQ_MASK);
        let at = h.jobs[(culprit & 1) as usize]
            .progress
            .load(Ordering::Acquire) as usize;
        let mut error = Some(self.lost(cause));
        let mut keep = [false; 2];
        for p in self.pending.iter_mut() {
            if !matches!(p.state, State::Rung) {
                continue;
            }
            if p.seq == culprit {
                let e = error
                    .take()
                    .unwrap_or_else(|| CoreError::Worker(String::new()));
                p.state = State::Failed(at.min(p.n), e);
            } else if reached(completed, p.seq) {
                keep[p.lane & 1] = true;
            } else {
                p.state = State::Rerun;
            }
        }
        // The canaries of every lane but a completed job's (still to be
        // checked) are made whole for the next worker.
        let half = self.lane_slots();
        for (lane, _) in keep.iter().enumerate().filter(|(_, k)| !**k) {
            self.fill_slack(lane * half..(lane + 1) * half);
        }
        error
    }

    /// Job at the front completed: checks the worker's account of it and
    /// copies its outputs out.
    fn finish(&mut self, outputs: &mut [u8]) -> Result<(), (usize, CoreError)> {
        let Some(job) = self.pending.pop_front() else {
            let e = format!("{}: no job was submitted", self.label());
            return Err((0, CoreError::Failed(e)));
        };
        let osz = self.init.output_size as usize;
        if outputs.len() != job.n * osz {
            let e = format!(
                "{}: {} output bytes for a job of {}",
                self.label(),
                outputs.len(),
                job.n * osz
            );
            return Err((0, CoreError::Failed(e)));
        }
        let now = Instant::now();
        let ran = now - job.rung.max(self.last_done);
        self.last_done = now;
        self.last_job = ran;
        self.stats.busy += ran;
        let (n, first) = (job.n, job.lane * self.lane_slots());
        let e = &self.region.header().jobs[(job.seq & 1) as usize];
        let (code, done, seq) = (
            e.code.load(Ordering::Relaxed),
            e.progress.load(Ordering::Acquire) as usize,
            e.seq.load(Ordering::Relaxed),
        );
        let (last, all) = (
            e.last_cycles.load(Ordering::Relaxed),
            e.job_cycles.load(Ordering::Relaxed),
        );
        if seq != job.seq
            || done > n
            || (code == doorbell::DONE_OK && done != n)
            || code > doorbell::DONE_FAILED
        {
            let status = self.reap();
            let why = format!("broke the worker protocol (completion {code} of {done}/{n} inputs for another job); the worker {status}");
            let e = self.worker_lost(why, Some(job.seq));
            let e = e.unwrap_or_else(|| CoreError::Worker(self.label()));
            return Err((done.min(n), e));
        }
        if last != u64::MAX {
            self.stats.last_cycles = Some(last);
            self.stats.cycles = Some(self.stats.cycles.unwrap_or(0).saturating_add(all));
        }
        let slots = first..first + n;
        if code == doorbell::DONE_FAILED {
            self.stats.jobs += done as u64;
            self.fill_slack(slots);
            return Err((done, self.failed(job.seq)));
        }
        if let Some(k) = self.overrun(slots.clone()) {
            self.fill_slack(slots);
            self.stats.jobs += k as u64;
            let e = format!(
                "{}: wrote past the end of its {}-byte output memory; the job's output is discarded",
                self.label(),
                self.init.output_size
            );
            return Err((k, CoreError::Worker(e)));
        }
        self.stats.jobs += n as u64;
        let l = *self.region.layout();
        for k in 0..n {
            // SAFETY: the worker completed this job and runs later ones in
            // the other lane; slot first+k's output memory is output_size
            // bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.region.at(l.output_at(first + k)),
                    outputs[k * l.output_size..].as_mut_ptr(),
                    l.output_size,
                )
            };
        }
        Ok(())
    }
}

impl IsolatedCore {
    /// Output buffers of the wrong size for the oldest job: the job is
    /// dropped (waited for if it runs) and this is its error.
    fn check_outputs(&mut self, outputs: &[u8]) -> Option<BatchError> {
        let osz = self.init.output_size as usize;
        let p = self.pending.front()?;
        let want = p.n * osz;
        if matches!(p.state, State::Failed(..)) || outputs.len() == want {
            return None;
        }
        self.discard_front();
        let error = CoreError::Failed(format!(
            "{}: {} output bytes for a job of {want}",
            self.label(),
            outputs.len()
        ));
        Some(BatchError { index: 0, error })
    }
}

impl Pipeline for IsolatedCore {
    fn depth(&self) -> usize {
        2
    }

    fn fits(&self, count: usize) -> bool {
        count <= self.lane_slots()
    }

    fn submit(&mut self, inputs: &[u8], count: usize) {
        let isz = self.init.input_size as usize;
        if Some(inputs.len()) != count.checked_mul(isz) || !self.fits(count) {
            return self.refuse(format!(
                "{}: a pipelined job of {} input bytes for {count} inputs of {isz} bytes (at most {} inputs)",
                self.label(),
                inputs.len(),
                self.lane_slots()
            ));
        }
        self.submit_job(inputs, count)
    }

    fn collect(&mut self, outputs: &mut [u8]) -> Result<(), BatchError> {
        if let Some(e) = self.check_outputs(outputs) {
            return Err(e);
        }
        self.collect_job(outputs)
            .map_err(|(index, error)| BatchError { index, error })
    }

    fn ready_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.ready.as_fd())
    }

    fn try_collect(&mut self, outputs: &mut [u8]) -> Option<Result<(), BatchError>> {
        if let Some(e) = self.check_outputs(outputs) {
            return Some(Err(e));
        }
        self.try_collect_job(outputs)
            .map(|r| r.map_err(|(index, error)| BatchError { index, error }))
    }

    fn arm(&mut self) -> bool {
        self.arm_front()
    }

    fn tick(&mut self) {
        self.tick_front()
    }

    fn needs_start(&self) -> bool {
        self.worker.is_none() || self.pending.iter().any(|p| matches!(p.state, State::Rerun))
    }
}

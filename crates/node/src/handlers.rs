//! Core handlers: one OS thread per hardware core (seed 000 §3.4.2), fed from
//! the shared input queue ([`JobQueue`]: by priority class). Cores block (an FPGA poll loop, a simulated clock,
//! a C function), so they get real threads rather than async tasks; an
//! isolated core, which computes in its worker process and signals its
//! completions through a descriptor, gets a task on the event loop instead
//! (`isolated`). An
//! [`Engine`] whose cores are instantaneous (the zero-delay benchmarking
//! core) is instead run by the receiving task itself, which saves two thread
//! hand-offs per message; the session does not know the difference.

use std::collections::VecDeque;
use std::thread::JoinHandle;

use bytes::{Bytes, BytesMut};
use corefarm_cores::{BatchError, Core, Pipeline};
use corefarm_smp::ErrorCode;
use tokio::sync::mpsc;

use corefarm_cores::spin::Ruleset;
use corefarm_cores::worker::HandlerWorker;

use crate::guard::Reservation;
use crate::jobq::JobQueue;
use crate::spin::{ResultLink, SpinLane, SpinOptions};

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
        } = self.kind
        {
            queue.close();
            for t in threads {
                let _ = t.join();
            }
            // Errs once every task has ended (none sends).
            if let Some(tasks) = tasks {
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

/// The order of jobs on a core with a pipeline (an isolated core), for
/// both of its drivers: the handler thread ([`pipelined_loop`]) and the
/// task of a core with a ready descriptor (`isolated::run`). The next
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

/// The core loop of a core with a pipeline and no ready descriptor, in the
/// order [`PipeOrder`] gives.
fn pipelined_loop(
    mut core: Box<dyn Core>,
    input_size: usize,
    output_size: usize,
    queue: JobQueue,
    results: mpsc::UnboundedSender<Outgoing>,
) {
    let mut order = PipeOrder::default();
    loop {
        if order.idle() {
            match queue.wait() {
                Some(job) => order.hold(job),
                None => return,
            }
        } else {
            order.look_ahead(&queue);
        }
        let Some(pipe) = core.pipeline() else { return };
        match order.step(pipe) {
            PipeStep::Submit(job) => {
                pipe.submit(&job.data[..job.count * input_size], job.count);
                order.submitted(job);
            }
            PipeStep::RunAlone(job) => {
                if !run_alone(core.as_mut(), job, input_size, output_size, &results) {
                    return;
                }
            }
            PipeStep::Collect(job) => {
                let mut out = BytesMut::zeroed(job.count * output_size);
                let outcome = pipe.collect(&mut out);
                if results.send(collected(job, out, outcome)).is_err() {
                    return;
                }
            }
            PipeStep::Again => {}
        }
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
            code: ErrorCode::CoreFailure,
            reason: format!("input {} of {}: {}", e.index, job.count, e.error),
            reservation: Some(job.reservation),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::MemoryGuard;
    use corefarm_cores::CoreError;

    /// Output = input + 1 byte-wise; fails on an input starting with 0xFF;
    /// blocks on `gate` (if any) before each input.
    #[derive(Default)]
    struct PlusOne {
        gate: Option<std::sync::mpsc::Receiver<()>>,
        started: Option<std::sync::mpsc::Sender<()>>,
    }

    impl Core for PlusOne {
        fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
            if let Some(s) = &self.started {
                let _ = s.send(());
            }
            if let Some(g) = &self.gate {
                g.recv()
                    .map_err(|_| CoreError::Failed("gate closed".into()))?;
            }
            if input[0] == 0xFF {
                return Err(CoreError::Failed("bad input".into()));
            }
            for (o, i) in output.iter_mut().zip(input) {
                *o = i.wrapping_add(1);
            }
            Ok(())
        }
    }

    async fn job(guard: &MemoryGuard, id: u32, data: &[u8], count: usize) -> Job {
        Job {
            id,
            class: corefarm_smp::stream::DEFAULT_CLASS,
            data: Bytes::copy_from_slice(data),
            count,
            reservation: guard.reserve(data.len()).await,
        }
    }

    #[tokio::test]
    async fn run_job_fills_one_buffer_and_names_the_failing_input() {
        let g = MemoryGuard::new(1 << 20);
        let mut core = PlusOne::default();
        match run_job(&mut core, job(&g, 7, &[1, 2, 3, 4, 5, 6], 3).await, 2, 3) {
            Outgoing::Result { id, data, .. } => {
                assert_eq!(id, 7);
                // The third output byte of each input is left zero.
                assert_eq!(&data[..], &[2, 3, 0, 4, 5, 0, 6, 7, 0]);
            }
            _ => panic!("expected a result"),
        }
        match run_job(&mut core, job(&g, 8, &[1, 2, 0xFF, 0], 2).await, 2, 2) {
            Outgoing::Failed {
                id, code, reason, ..
            } => {
                assert_eq!((id, code), (8, ErrorCode::CoreFailure));
                assert!(reason.contains("input 1 of 2") && reason.contains("bad input"));
            }
            _ => panic!("expected a failure"),
        }
    }

    #[tokio::test]
    async fn threads_finish_queued_work_on_stop() {
        let g = MemoryGuard::new(1 << 20);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let engine = Engine {
            cores: vec![Box::new(PlusOne::default()), Box::new(PlusOne::default())],
            input_size: 1,
            output_size: 1,
            inline: false,
        };
        let mut w = Workers::start(engine, tx, "t").unwrap();
        for id in 0..20u32 {
            assert!(w.submit(job(&g, id, &[id as u8], 1).await).await);
        }
        tokio::task::spawn_blocking(move || w.stop()).await.unwrap();
        let mut seen = Vec::new();
        while let Some(o) = rx.recv().await {
            let Outgoing::Result { id, data, .. } = o else {
                panic!("unexpected failure")
            };
            assert_eq!(data[0], id as u8 + 1);
            seen.push(id);
        }
        seen.sort();
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
        assert_eq!(g.available(), g.limit(), "every reservation released");
    }

    #[tokio::test]
    async fn abort_drops_queued_jobs() {
        let g = MemoryGuard::new(1 << 20);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (open, gate) = std::sync::mpsc::channel();
        let (started_tx, started) = std::sync::mpsc::channel();
        let engine = Engine {
            cores: vec![Box::new(PlusOne {
                gate: Some(gate),
                started: Some(started_tx),
            })],
            input_size: 1,
            output_size: 1,
            inline: false,
        };
        let mut w = Workers::start(engine, tx, "t").unwrap();
        for id in 0..5u32 {
            assert!(w.submit(job(&g, id, &[id as u8], 1).await).await);
        }
        // Job 0 is in the core: it finishes, the four queued ones are dropped.
        tokio::task::spawn_blocking(move || started.recv().unwrap())
            .await
            .unwrap();
        w.drop_queued();
        open.send(()).unwrap();
        tokio::task::spawn_blocking(move || w.stop()).await.unwrap();
        let Some(Outgoing::Result { id: 0, .. }) = rx.recv().await else {
            panic!("job 0 completes")
        };
        assert!(rx.recv().await.is_none(), "queued jobs produce nothing");
        assert_eq!(g.available(), g.limit(), "their reservations are released");
    }

    /// A core with a pipeline of two: output = input + 1 byte-wise, fails
    /// an input starting with 0xFF; jobs of more than two inputs go through
    /// `process_batch`. The first collect waits for `gate`.
    struct Piped {
        inner: PlusOne,
        queue: std::collections::VecDeque<Vec<u8>>,
        gate: Option<std::sync::mpsc::Receiver<()>>,
        most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Core for Piped {
        fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
            self.inner.process(input, output)
        }
        fn pipeline(&mut self) -> Option<&mut dyn corefarm_cores::Pipeline> {
            Some(self)
        }
    }

    impl corefarm_cores::Pipeline for Piped {
        fn depth(&self) -> usize {
            2
        }
        fn fits(&self, count: usize) -> bool {
            count <= 2
        }
        fn submit(&mut self, inputs: &[u8], _count: usize) {
            self.queue.push_back(inputs.to_vec());
            self.most
                .fetch_max(self.queue.len(), std::sync::atomic::Ordering::Relaxed);
        }
        fn collect(&mut self, outputs: &mut [u8]) -> Result<(), corefarm_cores::BatchError> {
            if let Some(g) = self.gate.take() {
                let _ = g.recv();
            }
            let inputs = self.queue.pop_front().expect("collect after submit");
            let n = inputs.len();
            self.inner.process_batch(&inputs, outputs, n)
        }
    }

    #[tokio::test]
    async fn pipe_order_rings_ahead_and_runs_a_large_job_alone_once_nothing_is_outstanding() {
        let g = MemoryGuard::new(1 << 20);
        // Depth 2; jobs of up to 2 inputs fit.
        let pipe = Piped {
            inner: PlusOne::default(),
            queue: Default::default(),
            gate: None,
            most: Default::default(),
        };
        let mut o = PipeOrder::default();
        let id = |s: PipeStep| match s {
            PipeStep::Submit(j) => ('s', j.id),
            PipeStep::RunAlone(j) => ('a', j.id),
            PipeStep::Collect(j) => ('c', j.id),
            PipeStep::Again => ('-', 0),
        };
        assert!(o.idle());
        for n in 0..2 {
            o.hold(job(&g, n, &[1], 1).await);
            let PipeStep::Submit(j) = o.step(&pipe) else {
                panic!("job {n} fits")
            };
            o.submitted(j);
        }
        assert!(!o.idle());
        // Full: the oldest is collected first, then the third is rung.
        o.hold(job(&g, 2, &[1], 1).await);
        assert_eq!(id(o.step(&pipe)), ('c', 0));
        let PipeStep::Submit(j) = o.step(&pipe) else {
            panic!("room for job 2")
        };
        o.submitted(j);
        // Too large for the pipeline: it waits for the outstanding two.
        o.hold(job(&g, 3, &[1, 2, 3], 3).await);
        assert_eq!(id(o.step(&pipe)), ('c', 1));
        assert_eq!(id(o.step(&pipe)), ('c', 2));
        assert_eq!(id(o.step(&pipe)), ('a', 3));
        assert_eq!(id(o.step(&pipe)), ('-', 0));
        assert!(o.idle());
        // While one is collected: one more may be taken (depth 2); a job
        // that fits is given back to ring, one that does not is kept.
        assert!(o.can_take(2) && !o.can_take(1));
        let back = o.offer(job(&g, 4, &[1], 1).await, true).map(|j| j.id);
        assert_eq!(back, Some(4));
        assert!(o.offer(job(&g, 5, &[1, 2, 3], 3).await, false).is_none());
        assert!(!o.can_take(2), "one is in hand");
        assert_eq!(id(o.step(&pipe)), ('a', 5));
    }

    #[tokio::test]
    async fn a_pipelined_core_gets_the_next_queued_job_before_the_current_one_ends() {
        let g = MemoryGuard::new(1 << 20);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (open, gate) = std::sync::mpsc::channel();
        let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let engine = Engine {
            cores: vec![Box::new(Piped {
                inner: PlusOne::default(),
                queue: Default::default(),
                gate: Some(gate),
                most: most.clone(),
            })],
            input_size: 1,
            output_size: 1,
            inline: false,
        };
        let mut w = Workers::start(engine, tx, "t").unwrap();
        // Counts 1 to 4 (3 and 4 do not fit the pipeline); id 13 fails.
        let data = |id: u32| -> Vec<u8> {
            let first = if id == 13 { 0xFF } else { id as u8 };
            (0..1 + id as usize % 4)
                .map(|k| first.wrapping_add(k as u8 * (first != 0xFF) as u8))
                .collect()
        };
        for id in 0..30u32 {
            let d = data(id);
            assert!(w.submit(job(&g, id, &d, d.len()).await).await);
        }
        open.send(()).unwrap();
        tokio::task::spawn_blocking(move || w.stop()).await.unwrap();
        let mut seen = Vec::new();
        while let Some(o) = rx.recv().await {
            match o {
                Outgoing::Result { id, data: out, .. } => {
                    let want: Vec<u8> = data(id).iter().map(|b| b + 1).collect();
                    assert_eq!(&out[..], &want[..], "id {id}");
                    seen.push(id);
                }
                Outgoing::Failed { id, reason, .. } => {
                    assert_eq!(id, 13);
                    assert!(reason.contains("bad input"), "{reason}");
                    seen.push(id);
                }
                Outgoing::Frame(_) | Outgoing::Notes { .. } => panic!("no frames from handlers"),
            }
        }
        seen.sort();
        assert_eq!(seen, (0..30).collect::<Vec<_>>());
        assert_eq!(most.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert_eq!(g.available(), g.limit(), "every reservation released");
    }

    #[tokio::test]
    async fn inline_engine_answers_on_submit() {
        let g = MemoryGuard::new(1 << 20);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let engine = Engine {
            cores: vec![Box::new(PlusOne::default())],
            input_size: 2,
            output_size: 2,
            inline: true,
        };
        let mut w = Workers::start(engine, tx, "t").unwrap();
        assert!(w.submit(job(&g, 3, &[1, 2], 1).await).await);
        let Ok(Outgoing::Result { id, data, .. }) = rx.try_recv() else {
            panic!("the result is queued before submit returns")
        };
        assert_eq!((id, &data[..]), (3, &[2u8, 3][..]));
    }
}

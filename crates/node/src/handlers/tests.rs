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
        queued: std::time::Instant::now(),
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

/// A core with a pipeline of two, like a core in a worker process:
/// output = input + 1 byte-wise, fails an input starting with 0xFF; jobs of
/// more than two inputs go through `process_batch`. Nothing completes
/// until a byte arrives on its ready descriptor (the gate), which the
/// engine waits on as on a worker's.
struct Piped {
    inner: PlusOne,
    queue: std::collections::VecDeque<Vec<u8>>,
    /// `None` once the gate opened.
    gate: Option<std::os::unix::net::UnixStream>,
    ready: std::os::unix::net::UnixStream,
    most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Piped {
    /// The core, and the end of its gate that opens it (write a byte).
    fn new(
        most: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) -> (Piped, std::os::unix::net::UnixStream) {
        let (ready, opener) = std::os::unix::net::UnixStream::pair().unwrap();
        ready.set_nonblocking(true).unwrap();
        let gate = Some(ready.try_clone().unwrap());
        let core = Piped {
            inner: PlusOne::default(),
            queue: Default::default(),
            gate,
            ready,
            most: most.clone(),
        };
        (core, opener)
    }

    fn open(&mut self) -> bool {
        use std::io::Read;
        if let Some(g) = &mut self.gate {
            if g.read(&mut [0]).is_err() {
                return false;
            }
            self.gate = None;
        }
        true
    }
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
        let inputs = self.queue.pop_front().expect("collect after submit");
        let n = inputs.len();
        self.inner.process_batch(&inputs, outputs, n)
    }
    fn ready_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        Some(self.ready.as_fd())
    }
    fn try_collect(
        &mut self,
        outputs: &mut [u8],
    ) -> Option<Result<(), corefarm_cores::BatchError>> {
        self.open().then(|| self.collect(outputs))
    }
    fn arm(&mut self) -> bool {
        !self.open()
    }
}

#[tokio::test]
async fn pipe_order_rings_ahead_and_runs_a_large_job_alone_once_nothing_is_outstanding() {
    let g = MemoryGuard::new(1 << 20);
    // Depth 2; jobs of up to 2 inputs fit.
    let (pipe, _opener) = Piped::new(&Default::default());
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
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (piped, mut opener) = Piped::new(&most);
    let engine = Engine {
        cores: vec![Box::new(piped)],
        input_size: 1,
        output_size: 1,
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
    std::io::Write::write_all(&mut opener, &[1]).unwrap();
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

/// PlusOne that may say it is instant, and records the thread it ran on.
struct Where {
    instant: bool,
    ran_on: std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>,
}

impl Core for Where {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        let name = std::thread::current().name().map(str::to_string);
        self.ran_on.lock().unwrap().push(name);
        PlusOne::default().process(input, output)
    }
    fn instant(&self) -> bool {
        self.instant
    }
}

#[tokio::test]
async fn an_instant_core_runs_on_the_event_loop_and_a_blocking_one_on_its_thread() {
    let g = MemoryGuard::new(1 << 20);
    // A current-thread runtime: the event loop is this test's thread.
    let here = std::thread::current().name().map(str::to_string);
    for (instant, want) in [(true, here), (false, Some("t-core0".to_string()))] {
        let ran_on = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let engine = Engine {
            cores: vec![Box::new(Where {
                instant,
                ran_on: ran_on.clone(),
            })],
            input_size: 2,
            output_size: 2,
        };
        let mut w = Workers::start(engine, tx, "t").unwrap();
        assert!(w.submit(job(&g, 3, &[1, 2], 1).await).await);
        let Some(Outgoing::Result { id, data, .. }) = rx.recv().await else {
            panic!("a result")
        };
        assert_eq!((id, &data[..]), (3, &[2u8, 3][..]));
        tokio::task::spawn_blocking(move || w.stop()).await.unwrap();
        assert_eq!(*ran_on.lock().unwrap(), [want], "instant: {instant}");
    }
}

#[tokio::test]
async fn a_job_for_an_instant_core_never_overtakes_one_already_queued() {
    let g = MemoryGuard::new(1 << 20);
    let ran_on = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let engine = Engine {
        cores: vec![Box::new(Where {
            instant: true,
            ran_on: ran_on.clone(),
        })],
        input_size: 2,
        output_size: 2,
    };
    let mut w = Workers::start(engine, tx, "t").unwrap();
    // What a streaming handler forwards to the cores is queued (from its
    // thread); the core's task has not run yet on this one-thread runtime.
    let class = corefarm_smp::stream::DEFAULT_CLASS;
    assert!(w.queue.push(class, job(&g, 1, &[1, 2], 1).await).is_ok());
    assert!(w.submit(job(&g, 2, &[3, 4], 1).await).await);
    // Once nothing is queued, the submitting task runs the next job itself.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let Some(Outgoing::Result { id, .. }) = rx.recv().await else {
            panic!("a result")
        };
        ids.push(id);
    }
    assert_eq!(ids, [1, 2]);
    assert!(w.submit(job(&g, 3, &[5, 6], 1).await).await);
    assert!(
        matches!(rx.try_recv(), Ok(Outgoing::Result { id: 3, .. })),
        "the result is sent before submit returns"
    );
    tokio::task::spawn_blocking(move || w.stop()).await.unwrap();
    assert_eq!(ran_on.lock().unwrap().len(), 3);
}

/// The cores come back from a stop, idle and in their order, so a node can
/// run them again: cores on threads even when nobody takes their results
/// any more (the queued jobs are then dropped), instant cores too.
#[tokio::test]
async fn stopped_handlers_hand_their_cores_back() {
    let g = MemoryGuard::new(1 << 20);
    let (tx, rx) = mpsc::unbounded_channel();
    drop(rx);
    let engine = Engine {
        cores: vec![Box::new(PlusOne::default()), Box::new(PlusOne::default())],
        input_size: 1,
        output_size: 1,
    };
    let mut w = Workers::start(engine, tx, "t").unwrap();
    for id in 0..10u32 {
        // Accepted or refused (the queue is dropped once a result finds
        // nobody), never stuck.
        let _ = w.submit(job(&g, id, &[id as u8], 1).await).await;
    }
    let back = tokio::task::spawn_blocking(move || w.abort())
        .await
        .unwrap();
    assert_eq!(back.map(|c| c.len()), Some(2));
    assert_eq!(g.available(), g.limit(), "every reservation released");

    let b = corefarm_smp::BenchmarkConfig {
        input_size: 16,
        output_size: 16,
        delay_us: 0,
    };
    let engine = crate::bench::BenchCore::engine(&b);
    let n = engine.cores.len();
    let (tx, _rx) = mpsc::unbounded_channel();
    let mut w = Workers::start(engine, tx, "t").unwrap();
    assert!(w.submit(job(&g, 1, &[0; 16], 1).await).await);
    let back = tokio::task::spawn_blocking(move || w.stop()).await.unwrap();
    let back = back.expect("every instant core back");
    assert_eq!(back.len(), n);
    assert!(back.iter().all(|c| c.instant()));
}

/// A pipelined core whose results nobody takes any more collects (and
/// drops) what it has in its pipeline before it is handed back, so it
/// comes back idle.
#[tokio::test]
async fn a_pipelined_core_comes_back_idle_when_nobody_takes_results() {
    let g = MemoryGuard::new(1 << 20);
    let (tx, rx) = mpsc::unbounded_channel();
    drop(rx);
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (piped, mut opener) = Piped::new(&most);
    let engine = Engine {
        cores: vec![Box::new(piped)],
        input_size: 1,
        output_size: 1,
    };
    let mut w = Workers::start(engine, tx, "t").unwrap();
    for id in 0..8u32 {
        let _ = w.submit(job(&g, id, &[id as u8], 1).await).await;
    }
    std::io::Write::write_all(&mut opener, &[1]).unwrap();
    let back = tokio::task::spawn_blocking(move || w.abort())
        .await
        .unwrap();
    assert_eq!(back.map(|c| c.len()), Some(1));
    assert_eq!(g.available(), g.limit(), "every reservation released");
}

//! The splitter with fake local cores, a fake cluster and a fake clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use corefarm_cores::{Core, CoreError};

use super::engine::{self, ClusterPath};
use super::policy::{Clock, Estimates, Knobs, WallClock};
use super::*;

const IN: usize = 8;
const OUT: usize = 4;

/// The function both sides compute: 8 bytes in, 4 out.
fn f(input: &[u8]) -> Vec<u8> {
    input
        .chunks(IN)
        .flat_map(|c| (0..OUT).map(move |j| c[j].wrapping_mul(3) ^ c[j + OUT].rotate_left(1)))
        .collect()
}

fn inputs(n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| {
            let k = 1 + i % 3; // 1 to 3 inputs per message
            Bytes::from(
                (0..k * IN)
                    .map(|j| (i * 31 + j * 7) as u8)
                    .collect::<Vec<_>>(),
            )
        })
        .collect()
}

fn expected(inputs: &[Bytes]) -> Vec<Bytes> {
    inputs.iter().map(|b| Bytes::from(f(b))).collect()
}

/// Shared by the fakes of one test.
#[derive(Default)]
struct World {
    /// Jobs (single inputs) the local cores processed.
    local_jobs: AtomicUsize,
    /// Messages the fake cluster accepted.
    submitted: Mutex<usize>,
    grew: Condvar,
    /// Time, advanced by the fakes.
    clock: Mutex<f64>,
}

impl Clock for World {
    fn now(&self) -> f64 {
        *self.clock.lock().unwrap()
    }
}

struct FakeCore {
    w: Arc<World>,
    /// Fail on a job whose first byte is this.
    fail_on: Option<u8>,
    /// Panic on a job whose first byte is this.
    panic_on: Option<u8>,
    /// At this many local jobs, wait for the cluster to have taken work.
    gate_at: Option<usize>,
    /// Seconds of fake time per job.
    cost: f64,
}

impl FakeCore {
    /// Never fails, never waits, costs no time.
    fn new(w: &Arc<World>) -> FakeCore {
        FakeCore {
            w: w.clone(),
            fail_on: None,
            panic_on: None,
            gate_at: None,
            cost: 0.0,
        }
    }
}

impl Core for FakeCore {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        if self.fail_on == Some(input[0]) {
            return Err(CoreError::Failed("injected".into()));
        }
        if self.panic_on == Some(input[0]) {
            panic!("injected panic");
        }
        let done = self.w.local_jobs.fetch_add(1, Ordering::SeqCst) + 1;
        if self.gate_at.is_some_and(|g| done >= g) {
            self.gate_at = None;
            let st = self.w.submitted.lock().unwrap();
            let (st, t) = self
                .w
                .grew
                .wait_timeout_while(st, Duration::from_secs(20), |n| *n == 0)
                .unwrap();
            assert!(!t.timed_out() && *st > 0, "the cluster never took work");
        }
        *self.w.clock.lock().unwrap() += self.cost;
        output.copy_from_slice(&f(input));
        Ok(())
    }
}

struct FakeCluster {
    w: Arc<World>,
    /// Ready once the local cores processed this many jobs (0: at once;
    /// `usize::MAX`: never).
    ready_after: usize,
    /// Submissions past this many fail.
    fail_after: Option<usize>,
    /// Results one byte short.
    short: bool,
    /// Readiness checks so far; ready from this many on as well.
    polls: AtomicUsize,
    ready_after_polls: usize,
    /// A configuration is "on its way, due now" for this many checks
    /// (then it is not: refused, or never asked).
    pending_polls: usize,
}

impl ClusterPath for FakeCluster {
    type Ticket = Result<Bytes, ClientError>;

    fn ready(&self) -> bool {
        let polls = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
        self.w.local_jobs.load(Ordering::SeqCst) >= self.ready_after
            || polls >= self.ready_after_polls
    }

    fn expected_wait(&self) -> Option<f64> {
        (self.polls.load(Ordering::SeqCst) < self.pending_polls).then_some(0.0)
    }

    fn submit(&self, data: &Bytes) -> Result<Self::Ticket, ClientError> {
        let mut n = self.w.submitted.lock().unwrap();
        if self.fail_after.is_some_and(|max| *n >= max) {
            return Err(ClientError::Closed {
                during: "while sending data",
            });
        }
        *n += 1;
        self.w.grew.notify_all();
        let mut out = f(data);
        if self.short {
            out.pop();
        }
        Ok(Ok(Bytes::from(out)))
    }

    fn wait(&self, ticket: Self::Ticket) -> Result<Bytes, ClientError> {
        ticket
    }
}

fn cores(w: &Arc<World>, n: usize) -> Vec<Box<dyn Core>> {
    (0..n)
        .map(|_| Box::new(FakeCore::new(w)) as Box<dyn Core>)
        .collect()
}

fn cluster(w: &Arc<World>, ready_after: usize) -> FakeCluster {
    FakeCluster {
        w: w.clone(),
        ready_after,
        fail_after: None,
        short: false,
        polls: AtomicUsize::new(0),
        ready_after_polls: usize::MAX,
        pending_polls: 0,
    }
}

const KNOBS: Knobs = Knobs {
    window: 8,
    threads: 0, // set from the cores
    local_max: 16,
    jobs: 6,
    backup: true,
};

fn run(
    w: &Arc<World>,
    inputs: &[Bytes],
    cores: Vec<Box<dyn Core>>,
    cluster: &FakeCluster,
    prior: Estimates,
) -> Result<(Vec<Bytes>, CoworkReport), CoworkError> {
    run_with(w, inputs, cores, cluster, prior, KNOBS)
}

fn run_with(
    w: &Arc<World>,
    inputs: &[Bytes],
    mut cores: Vec<Box<dyn Core>>,
    cluster: &FakeCluster,
    prior: Estimates,
    knobs: Knobs,
) -> Result<(Vec<Bytes>, CoworkReport), CoworkError> {
    engine::run(
        inputs,
        (IN, OUT),
        &mut cores,
        cluster,
        &**w,
        knobs,
        prior,
        Estimates::default(),
    )
}

/// One message of `n` inputs.
fn one_message(n: usize) -> Vec<Bytes> {
    vec![Bytes::from(
        (0..n * IN).map(|j| (j * 13) as u8).collect::<Vec<_>>(),
    )]
}

#[test]
fn a_message_a_local_thread_is_on_is_copied_to_the_idle_cluster() {
    let w = Arc::new(World::default());
    let ins = one_message(3);
    // The local thread takes the only message; the cluster is configured
    // once it has begun, and the thread's first input waits until the
    // cluster has taken work — which only a backup copy can be.
    let core = FakeCore {
        gate_at: Some(1),
        ..FakeCore::new(&w)
    };
    let (out, report) = run(
        &w,
        &ins,
        vec![Box::new(core)],
        &cluster(&w, 1),
        Estimates::default(),
    )
    .unwrap();
    assert_eq!(out, expected(&ins));
    assert_eq!((report.backups, *w.submitted.lock().unwrap()), (1, 1));
    // Whichever side answered first is counted, once.
    assert_eq!(report.local_items + report.cluster_items, 1, "{report:?}");
}

#[test]
fn without_backups_the_local_thread_keeps_its_message() {
    let w = Arc::new(World::default());
    let ins = one_message(3);
    let core = FakeCore::new(&w);
    let knobs = Knobs {
        backup: false,
        ..KNOBS
    };
    let (out, report) = run_with(
        &w,
        &ins,
        vec![Box::new(core)],
        &cluster(&w, 1),
        Estimates::default(),
        knobs,
    )
    .unwrap();
    assert_eq!(out, expected(&ins));
    assert_eq!(
        (report.local_items, report.cluster_items, report.backups),
        (1, 0, 0)
    );
    assert_eq!(*w.submitted.lock().unwrap(), 0);
}

#[test]
fn both_sides_work_and_results_keep_input_order() {
    let w = Arc::new(World::default());
    let ins = inputs(300);
    // The cluster is ready once a local job has begun, and each local
    // core's first job waits until the cluster has taken work, so both
    // sides compute some of it however the threads race (an unmeasured
    // cluster keeps its window full and could otherwise take it all).
    // Without backups: the instant fake cluster would otherwise answer
    // the local threads' messages too, and which side wins is a race.
    let gated: Vec<Box<dyn Core>> = (0..2)
        .map(|_| {
            Box::new(FakeCore {
                gate_at: Some(1),
                ..FakeCore::new(&w)
            }) as Box<dyn Core>
        })
        .collect();
    let knobs = Knobs {
        backup: false,
        ..KNOBS
    };
    let cl = cluster(&w, 1);
    let (out, report) = run_with(&w, &ins, gated, &cl, Estimates::default(), knobs).unwrap();
    assert_eq!(out, expected(&ins));
    assert!(
        report.cluster_items > 0 && report.local_items > 0,
        "{report:?}"
    );
    assert_eq!(report.local_items + report.cluster_items, ins.len());
    assert_eq!(report.cluster_items, *w.submitted.lock().unwrap());
    assert!(report.cluster_error.is_none());
}

#[test]
fn with_backups_every_message_is_answered_once_whichever_side_wins() {
    let w = Arc::new(World::default());
    let ins = inputs(300);
    let (out, report) = run(
        &w,
        &ins,
        cores(&w, 2),
        &cluster(&w, 1),
        Estimates::default(),
    )
    .unwrap();
    assert_eq!(out, expected(&ins));
    assert_eq!(report.local_items + report.cluster_items, ins.len());
    // Every message the cluster answered was sent to it; a backup copy may
    // have been answered locally first.
    let sent = *w.submitted.lock().unwrap();
    assert!(report.cluster_items <= sent && sent <= report.cluster_items + report.backups);
    assert!(report.cluster_error.is_none());
}

#[test]
fn unconfigured_cluster_leaves_everything_local() {
    let w = Arc::new(World::default());
    let ins = inputs(100);
    let (out, report) = run(
        &w,
        &ins,
        cores(&w, 2),
        &cluster(&w, usize::MAX),
        Estimates::default(),
    )
    .unwrap();
    assert_eq!(out, expected(&ins));
    assert_eq!((report.local_items, report.cluster_items), (100, 0));
    assert_eq!(*w.submitted.lock().unwrap(), 0);
}

#[test]
fn cluster_configured_midway_joins_in() {
    let w = Arc::new(World::default());
    let ins = inputs(400);
    // The cluster is configured after 10 local jobs; the local core then
    // waits at job 60 until the cluster has taken work, so it must join.
    let core = FakeCore {
        gate_at: Some(60),
        ..FakeCore::new(&w)
    };
    let (out, report) = run(
        &w,
        &ins,
        vec![Box::new(core)],
        &cluster(&w, 10),
        Estimates::default(),
    )
    .unwrap();
    assert_eq!(out, expected(&ins));
    assert!(report.cluster_items > 0, "{report:?}");
    assert_eq!(report.local_items + report.cluster_items, 400);
}

#[test]
fn below_break_even_nothing_goes_to_the_cluster() {
    let w = Arc::new(World::default());
    let ins = inputs(50);
    // X_c = 10⁵/s and D_a = 10 ms: N_L ≈ 1000 > 50.
    let prior = Estimates {
        x_c: Some(1e5),
        x_a: Some(1e5),
        d_a: Some(0.010),
        o_c: Some(0.0),
        o_0: Some(0.0),
        x_a_beside: None,
    };
    let (out, report) = run(&w, &ins, cores(&w, 2), &cluster(&w, 0), prior).unwrap();
    assert_eq!(out, expected(&ins));
    assert_eq!(report.cluster_items, 0);
    assert_eq!(*w.submitted.lock().unwrap(), 0);
    assert!(report.break_even().unwrap() > 50.0);
}

#[test]
fn failed_cluster_work_is_done_locally() {
    let w = Arc::new(World::default());
    let ins = inputs(200);
    let mut c = cluster(&w, 0);
    c.fail_after = Some(5);
    let core = FakeCore {
        gate_at: Some(3),
        ..FakeCore::new(&w)
    };
    let (out, report) = run(&w, &ins, vec![Box::new(core)], &c, Estimates::default()).unwrap();
    assert_eq!(out, expected(&ins));
    assert!(report.cluster_items <= 5, "{report:?}");
    let why = report.cluster_error.as_deref().unwrap();
    assert!(why.contains("closed the connection"), "{why}");
    assert_eq!(report.local_items + report.cluster_items, 200);
}

#[test]
fn results_of_the_wrong_size_are_refused() {
    let w = Arc::new(World::default());
    let ins = inputs(60);
    let mut c = cluster(&w, 0);
    c.short = true;
    let core = FakeCore {
        gate_at: Some(2),
        ..FakeCore::new(&w)
    };
    let (out, report) = run(&w, &ins, vec![Box::new(core)], &c, Estimates::default()).unwrap();
    assert_eq!(out, expected(&ins));
    assert_eq!(report.cluster_items, 0);
    let why = report.cluster_error.unwrap();
    assert!(why.contains("expected"), "{why}");
}

#[test]
fn a_local_failure_names_the_input() {
    let w = Arc::new(World::default());
    let ins = inputs(40);
    let bad = ins[17][0];
    assert!(
        ins.iter()
            .filter(|b| b.chunks(IN).any(|c| c[0] == bad))
            .count()
            == 1
    );
    let core = FakeCore {
        fail_on: Some(bad),
        ..FakeCore::new(&w)
    };
    let e = run(
        &w,
        &ins,
        vec![Box::new(core)],
        &cluster(&w, usize::MAX),
        Estimates::default(),
    )
    .unwrap_err();
    assert!(matches!(e, CoworkError::Local { index: 17, .. }), "{e}");
}

#[test]
fn local_throughput_is_measured_on_the_fake_clock() {
    let w = Arc::new(World::default());
    let ins: Vec<Bytes> = (0..40).map(|i| Bytes::from(vec![i as u8; IN])).collect();
    let core = FakeCore {
        // 2 ms per input: 500 inputs/s
        cost: 0.002,
        ..FakeCore::new(&w)
    };
    let (_, report) = run(
        &w,
        &ins,
        vec![Box::new(core)],
        &cluster(&w, usize::MAX),
        Estimates::default(),
    )
    .unwrap();
    let x_c = report.measured.x_c.unwrap();
    assert!((x_c - 500.0).abs() < 1e-6, "{x_c}");
    assert!((report.seconds - 0.080).abs() < 1e-9, "{}", report.seconds);
    assert_eq!(report.measured.x_a, None);
}

#[test]
fn cowork_checks_inputs_and_keeps_estimates_between_runs() {
    let w = Arc::new(World::default());
    let core = FakeCore {
        cost: 0.001,
        ..FakeCore::new(&w)
    };
    let cw = Cowork::from_cores(IN as u32, OUT as u32, vec![Box::new(core)]);
    let e = cw
        .run(
            &[Bytes::from(vec![0u8; IN + 1])],
            4,
            &cluster(&w, 0),
            &WallClock::new(),
        )
        .unwrap_err();
    assert!(matches!(e, CoworkError::Input { index: 0, .. }), "{e}");
    assert_eq!(cw.estimates().x_c, None);
    let ins: Vec<Bytes> = (0..30).map(|i| Bytes::from(vec![i as u8; IN])).collect();
    let r = cw.run(&ins, 4, &cluster(&w, usize::MAX), &*w).unwrap();
    assert_eq!(r.results, expected(&ins));
    assert_eq!(cw.estimates().x_c, r.report.measured.x_c);
    assert!((cw.estimates().x_c.unwrap() - 1000.0).abs() < 1e-6);
    cw.set_cluster_throughput(Some(1234.0));
    assert_eq!(cw.estimates().x_a, Some(1234.0));
    cw.set_cluster_throughput(Some(f64::NAN));
    assert_eq!(cw.estimates().x_a, None);
}

#[test]
fn cluster_throughput_from_a_shared_mode_status() {
    use corefarm_smp::{ClusterStatus, FunctionStatus, UserStatus};
    let mut s = ClusterStatus {
        you: Some(7),
        users: vec![UserStatus {
            id: 7,
            function: Some("abc".into()),
            ..Default::default()
        }],
        functions: vec![FunctionStatus {
            id: "abc".into(),
            replicas: 3,
            service_us: Some(500.0),
            ..Default::default()
        }],
        ..Default::default()
    };
    // 3 replicas, 500 µs per input, 4 inputs per message: 1500 messages/s.
    let x = super::reported_throughput(&s, 4).unwrap();
    assert!((x - 1500.0).abs() < 1e-9, "{x}");
    // No measurement yet, no replica, or another user's function: unknown.
    s.functions[0].service_us = None;
    assert_eq!(super::reported_throughput(&s, 4), None);
    s.functions[0].service_us = Some(500.0);
    s.functions[0].replicas = 0;
    assert_eq!(super::reported_throughput(&s, 4), None);
    s.functions[0].replicas = 3;
    // A server that names functions shows the user's by its name.
    s.functions[0].name = Some("crc (sha256:5b05cb74bb3d)".into());
    s.users[0].function = s.functions[0].name.clone();
    assert_eq!(super::reported_throughput(&s, 4), Some(1500.0));
    s.you = Some(8);
    assert_eq!(super::reported_throughput(&s, 4), None);
}

/// Known from earlier runs: a local message takes 10 ms (X_c = 100/s),
/// the cluster does 10⁵ messages a second, 1 ms after it gets them.
fn slow_local() -> Estimates {
    Estimates {
        x_c: Some(100.0),
        x_a: Some(1e5),
        d_a: Some(0.001),
        o_c: Some(0.0),
        o_0: Some(0.0),
        x_a_beside: None,
    }
}

/// 50 inputs on two local threads against a cluster never ready through
/// local work, ready after `ready_after_polls` checks, with a
/// configuration "due now" for `pending_polls` checks: (local, cluster).
fn split_while_configuring(ready_after_polls: usize, pending_polls: usize) -> (usize, usize) {
    let w = Arc::new(World::default());
    let ins = inputs(50);
    let c = FakeCluster {
        ready_after_polls,
        pending_polls,
        ..cluster(&w, usize::MAX)
    };
    let (out, report) = run(&w, &ins, cores(&w, 2), &c, slow_local()).unwrap();
    assert_eq!(out, expected(&ins));
    (report.local_items, report.cluster_items)
}

#[test]
fn local_threads_wait_for_a_configuration_due_before_their_message() {
    assert_eq!(split_while_configuring(5, usize::MAX), (0, 50));
}

#[test]
fn a_configuration_that_never_comes_leaves_the_work_local() {
    // "Due now" for a few checks, then no longer on its way (refused):
    // the local threads stop waiting and do everything.
    assert_eq!(split_while_configuring(usize::MAX, 5), (50, 0));
}

/// Runs `ins` on one core that panics on the job whose first byte is
/// `bad`, against a cluster ready after `ready_after` local jobs, on a
/// thread of its own: the error, or a test failure if the run hangs,
/// panics or succeeds.
fn run_with_a_panicking_core(
    ins: Vec<Bytes>,
    bad: u8,
    ready_after: usize,
    backup: bool,
) -> CoworkError {
    let jobs = ins.iter().flat_map(|b| b.chunks(IN));
    assert_eq!(jobs.filter(|c| c[0] == bad).count(), 1);
    let w = Arc::new(World::default());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let core = FakeCore {
            panic_on: Some(bad),
            ..FakeCore::new(&w)
        };
        let knobs = Knobs { backup, ..KNOBS };
        let c = cluster(&w, ready_after);
        let r = run_with(
            &w,
            &ins,
            vec![Box::new(core)],
            &c,
            Estimates::default(),
            knobs,
        );
        let _ = tx.send(r.map(|_| ()));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(r) => r.expect_err("a core that panicked cannot have computed every input"),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("the run hung"),
        Err(e) => panic!("the run panicked instead of failing: {e}"),
    }
}

#[test]
fn a_panicking_local_core_fails_the_run_with_the_input_instead_of_hanging() {
    // Unconfigured cluster: nobody else would ever take the message the
    // panicked thread held (the run used to wait for it forever, with or
    // without backups).
    for backup in [true, false] {
        let ins = inputs(40);
        let bad = ins[17][0];
        let e = run_with_a_panicking_core(ins, bad, usize::MAX, backup);
        assert!(matches!(e, CoworkError::Local { index: 17, .. }), "{e}");
        assert!(e.to_string().contains("panicked"), "{e}");
    }
}

#[test]
fn a_panicking_local_core_beside_a_cluster_is_an_error_not_a_panic() {
    // The local thread takes message 0 (the cluster is ready only once a
    // local job is done) and panics on its second input while the cluster
    // computes the rest: the run used to re-raise the panic in the caller.
    let mut ins = one_message(3);
    let bad = ins[0][IN];
    let clean = |b: &Bytes| b.chunks(IN).all(|c| c[0] != bad);
    ins.extend(inputs(30).into_iter().filter(clean));
    let e = run_with_a_panicking_core(ins, bad, 1, false);
    assert!(matches!(e, CoworkError::Local { index: 0, .. }), "{e}");
}

/// Bounded wait for a condition nothing signals (an atomic flag).
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        std::thread::yield_now();
    }
}

/// A fake server that answers the hello, refuses the first `refuse`
/// configurations, then reports (on the channel) the type of the next
/// frame it reads, or "eof"; and a co-working client for it that
/// configures by itself.
fn configuring_client(refuse: usize) -> (Client, Cowork, std::sync::mpsc::Receiver<String>) {
    use corefarm_smp::MsgType;
    let (tx, rx) = std::sync::mpsc::channel();
    let (addr, _srv) = crate::tests::fake(move |mut p| {
        p.hello(&[], 1);
        for _ in 0..refuse {
            p.configured(1);
            tx.send("refused".to_string()).unwrap();
        }
        let next = match p.r.read_frame() {
            Ok(Some(f)) if f.ty == MsgType::Configuration => "configuration".to_string(),
            Ok(Some(f)) => format!("{:?}", f.ty),
            Ok(None) | Err(_) => "eof".to_string(),
        };
        let _ = tx.send(next);
    });
    let c = Client::connect(&addr, crate::ClientOptions::default()).unwrap();
    let w = Arc::new(World::default());
    let opts = CoworkOptions {
        configure: true,
        ..CoworkOptions::default()
    };
    let cfg = corefarm_smp::Configuration {
        input_size: IN as u32,
        output_size: OUT as u32,
        cores: crate::default_core_table(1, IN as u32, OUT as u32).unwrap(),
        bitstream: Bytes::from_static(b"a function"),
    };
    let cw = Cowork::with_cores(&cfg, cores(&w, 1), opts).unwrap();
    (c, cw, rx)
}

fn asking(c: &Client) -> bool {
    c.inner
        .cowork_configuring
        .load(std::sync::atomic::Ordering::Acquire)
}

#[test]
fn a_refused_configuration_is_not_asked_for_again_in_the_same_call() {
    let (c, cw, rx) = configuring_client(1);
    let path = ClientPath::new(&c, &cw);
    let wait = Duration::from_secs(20);
    engine::ClusterPath::request(&path);
    assert_eq!(rx.recv_timeout(wait).unwrap(), "refused");
    wait_until("the refusal is taken in", || {
        !asking(&c)
            && crate::inner::lock(&c.inner.configure_timing)
                .since
                .is_none()
    });
    assert!(!engine::ClusterPath::ready(&path));
    // The engine checks again after every local batch and every
    // millisecond: each check used to send the configuration (the whole
    // bitstream) once more.
    engine::ClusterPath::request(&path);
    assert!(!asking(&c), "the refused configuration was sent again");
    drop(c);
    assert_eq!(rx.recv_timeout(wait).unwrap(), "eof");
}

#[test]
fn a_call_without_inputs_sends_no_configuration() {
    let (c, cw, rx) = configuring_client(0);
    let run = c.map_cowork(&[], 4, &cw).unwrap();
    assert!(run.results.is_empty());
    assert_eq!((run.report.local_items, run.report.cluster_items), (0, 0));
    assert!(!asking(&c), "an empty call asked for the cluster");
    drop(c);
    let next = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(next, "eof");
}

/// A core that panicked may have stopped halfway through changing its own
/// state: it is not run again. A cowork over caller-built cores goes on
/// with the others, and says so when none is left (one loaded from a
/// configuration loads a fresh core instead).
#[test]
fn a_core_that_panicked_is_not_run_again() {
    let w = Arc::new(World::default());
    let ins = inputs(40);
    let bad = ins[17][0];
    let clean: Vec<Bytes> = ins
        .iter()
        .filter(|b| b.chunks(IN).all(|c| c[0] != bad))
        .cloned()
        .collect();
    let panicky = || {
        Box::new(FakeCore {
            panic_on: Some(bad),
            ..FakeCore::new(&w)
        }) as Box<dyn Core>
    };
    let cw = Cowork::from_cores(IN as u32, OUT as u32, vec![panicky(), panicky()]);
    let never = cluster(&w, usize::MAX);
    for left in [1, 0] {
        let e = cw.run(&ins, 8, &never, &*w).unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        assert_eq!(cw.threads(), left);
        if left > 0 {
            let run = cw.run(&clean, 8, &never, &*w).unwrap();
            assert_eq!(run.results.len(), clean.len());
        }
    }
    let e = cw.run(&clean, 8, &never, &*w).unwrap_err();
    assert!(e.to_string().contains("make a new Cowork"), "{e}");
}

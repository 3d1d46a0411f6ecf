//! Isolated cores: each native or RTL core runs in a worker process of its
//! own, so that user code that crashes, overruns its memories or hangs
//! fails its job instead of taking the node manager down.
//!
//! The node side is [`IsolatedCore`], a [`Core`] like the others. Per core:
//! a shared memory region (`shm`: header, then one input and one output
//! memory per slot, between guard pages), a `SOCK_SEQPACKET` control
//! channel (`proto`: start-up, and the reason of a failed job) and a
//! child process, the same executable re-run with [`SUBCOMMAND`] (or any
//! program whose `main` calls [`main`]). The slots are two lanes; a job is
//! up to a lane's worth of inputs (all the inputs of a data message, when
//! they fit): one copy of each into its slot, a doorbell each way in the
//! shared header (`doorbell`: futex words, no system call while the other
//! side is quick), one copy out of each output. Through [`Pipeline`] the
//! node rings the next job into the other lane while the worker runs the
//! current one (`pipeline`), so at one input per message the worker does
//! not wait for the node's copies and hand-offs. The node waits for a
//! completion at most the core timeout per input (the watchdog); a worker
//! that dies (the kernel wakes the node through a robust futex) or times
//! out is killed and reaped, the job it was running fails with an error
//! naming the core, the input and the cause, a job waiting behind it runs
//! on a fresh worker, and nothing a failed job wrote is copied out.
//!
//! Streaming handlers run in handler workers, the same executable with
//! init kind "spin" ([`HandlerWorker`], its child `spin_child`): one
//! message at a time each, several of them per configuration sharing the
//! handler sets' memory (`spin_memory`).

mod child;
mod doorbell;
mod pipeline;
mod plumbing;
mod proto;
pub(crate) mod shm;
mod spin;
mod spin_child;
mod spin_memory;

pub use spin::{HandlerWorker, SpinOutcome, MAX_NOTIFICATIONS};

use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::{OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corefarm_smp::Configuration;
use rustix::net::sockopt::Timeout;
use rustix::net::RecvFlags;

pub use child::main;
use pipeline::InFlight;
use plumbing::describe;
use proto::{Init, Msg, RefusalKind};
use shm::{Layout, Region};

use crate::{
    ArtifactKind, BatchError, Core, CoreError, CoreStats, LoadError, LoadOptions, Pipeline,
    WorkerCommand,
};

/// The hidden subcommand a worker is started with.
pub const SUBCOMMAND: &str = "__core-worker";

/// Where a worker finds what the node gives it (docs/interfaces.md).
pub(crate) const FD_CONTROL: RawFd = 3;
pub(crate) const FD_REGION: RawFd = 4;
pub(crate) const FD_ARTIFACT: RawFd = 5;
pub(crate) const FD_EVENT: RawFd = 6;

/// Longest a worker may take to load its core before the load fails.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the node sleeps on a job before it looks at the watchdog, the
/// worker's progress and whether the worker still lives (one that died
/// before it published its thread id leaves no robust-futex mark).
const SLICE: Duration = Duration::from_millis(20);

/// How to start a worker for any core of one load (what those cores share).
struct WorkerSpec {
    program: PathBuf,
    /// Sealed memfd holding the artifact; each worker reads it.
    artifact: OwnedFd,
    /// "native vadd", for messages.
    name: String,
    /// How long the node waits for one completion.
    watchdog: Duration,
}

struct Worker {
    child: Child,
    sock: OwnedFd,
    /// The socket's receive timeout (zero: to be set).
    timeout: Duration,
    /// The end of its stderr, for the message when it dies.
    stderr: Option<plumbing::StderrTail>,
}

/// One core running in its own worker process (see the module docs).
pub struct IsolatedCore {
    shared: Arc<WorkerSpec>,
    index: usize,
    init: Init,
    region_fd: OwnedFd,
    region: Region,
    /// Signalled by the worker at a completion the node asked to hear of
    /// (`Header::notify`). One per core, kept across worker restarts.
    event: OwnedFd,
    /// What an event loop waits on (`Pipeline::ready_fd`): an epoll set of
    /// `event` and the running worker's channel, which hangs up when the
    /// worker dies, so a crash wakes the loop as a completion does. A
    /// stable descriptor: the worker's channel joins it at each start and
    /// leaves it when the worker is reaped.
    ready: OwnedFd,
    /// The front job the event loop's watchdog is timing: its sequence
    /// number, the progress last seen, and the deadline from then.
    watch: Option<(u32, u32, Instant)>,
    worker: Option<Worker>,
    /// The worker's job thread id (its mark in `done`).
    tid: u32,
    /// The last job rung.
    seq: u32,
    /// Jobs rung (or to be rung) and not yet collected, oldest first.
    pending: VecDeque<InFlight>,
    /// How long the last completed job took, from the later of its ring
    /// and the previous completion to its completion.
    last_job: Duration,
    last_done: Instant,
    buf: Vec<u8>,
    /// Copy of the output's slack, for the canary check.
    scratch: Vec<u8>,
    /// Outputs of a job dropped after an earlier one of its batch failed.
    discard: Vec<u8>,
    stats: CoreStats,
}

fn backend(what: &str) -> impl Fn(std::io::Error) -> LoadError + '_ {
    move |e| LoadError::Backend(format!("{what}: {e}"))
}

/// A sealed memfd holding `so`, which every worker reads.
fn sealed_artifact(so: &[u8]) -> Result<OwnedFd, LoadError> {
    let artifact = rustix::fs::memfd_create(
        "corefarm-artifact",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|e| backend("memfd_create")(e.into()))?;
    std::fs::File::from(artifact.try_clone().map_err(backend("dup"))?)
        .write_all(so)
        .map_err(backend("cannot write the artifact"))?;
    use rustix::fs::SealFlags as S;
    rustix::fs::fcntl_add_seals(&artifact, S::SHRINK | S::GROW | S::WRITE | S::SEAL)
        .map_err(|e| backend("sealing the artifact")(e.into()))?;
    Ok(artifact)
}

/// The worker program `opts` names.
fn program(opts: &LoadOptions) -> Result<PathBuf, LoadError> {
    match &opts.worker {
        WorkerCommand::CurrentExe => {
            std::env::current_exe().map_err(backend("cannot find this executable"))
        }
        WorkerCommand::Program(p) => Ok(p.clone()),
    }
}

/// One isolated core per core-table entry, their workers started and loaded.
pub(crate) fn load_cores(
    kind: ArtifactKind,
    so: &[u8],
    entry: &str,
    control: Option<&crate::image::Control>,
    image_name: &str,
    cfg: &Configuration,
    opts: &LoadOptions,
) -> Result<Vec<Box<dyn Core>>, LoadError> {
    let program = program(opts)?;
    let artifact = sealed_artifact(so)?;
    let timeout = opts.driver.timeout;
    let (kind_name, watchdog) = match kind {
        ArtifactKind::Native => ("native", timeout),
        // The driver inside the worker times a stuck model out and resets
        // it (a cheap recovery); the node only steps in if that fails.
        _ => ("rtl", timeout + (timeout / 2).max(Duration::from_secs(1))),
    };
    let shared = Arc::new(WorkerSpec {
        program,
        artifact,
        name: format!("{kind_name} {image_name}"),
        watchdog,
    });
    let layout = Layout::new(cfg.input_size as usize, cfg.output_size as usize);
    let mut cores = Vec::with_capacity(cfg.cores.len());
    for (index, c) in cfg.cores.iter().enumerate() {
        let region_fd = shm::create(&layout).map_err(backend("shared memory"))?;
        let region = Region::map(&region_fd, layout, false).map_err(backend("mmap"))?;
        let mut core = IsolatedCore {
            shared: shared.clone(),
            index,
            init: Init {
                kind: kind_name.into(),
                entry: entry.into(),
                input_size: cfg.input_size,
                output_size: cfg.output_size,
                core: [c.control, c.input, c.output],
                timeout_us: timeout.as_micros().min(u64::MAX as u128) as u64,
                poll_us: opts.driver.poll.as_micros().min(u64::MAX as u128) as u64,
                region_len: layout.len as u64,
                slots: layout.slots as u32,
                spin: Vec::new(),
                spin_threads: 0,
                control: control.cloned(),
            },
            region_fd,
            region,
            event: rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )
            .map_err(|e| backend("eventfd")(e.into()))?,
            ready: rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)
                .map_err(|e| backend("epoll")(e.into()))?,
            watch: None,
            worker: None,
            tid: 0,
            seq: 0,
            pending: VecDeque::new(),
            last_job: Duration::ZERO,
            last_done: Instant::now(),
            buf: vec![0; 4096],
            scratch: Vec::new(),
            discard: Vec::new(),
            stats: CoreStats::default(),
        };
        rustix::event::epoll::add(
            &core.ready,
            &core.event,
            rustix::event::epoll::EventData::new_u64(0),
            rustix::event::epoll::EventFlags::IN,
        )
        .map_err(|e| backend("epoll")(e.into()))?;
        core.fill_slack(0..layout.slots);
        // Started here, waited for below: the workers load in parallel.
        core.worker = Some(
            core.spawn()
                .map_err(|e| LoadError::Backend(e.to_string()))?,
        );
        cores.push(core);
    }
    for core in &mut cores {
        core.wait_ready()?;
    }
    Ok(cores
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn Core>)
        .collect())
}

/// How waiting for a message from the worker ended, other than with one.
#[derive(Debug)]
enum Lost {
    TimedOut,
    /// The channel closed (the worker exited or died) or failed.
    Closed,
    /// The worker sent something the protocol does not allow.
    Garbled(proto::DecodeError),
}

/// "; its stderr ended with: …" for a message about a dead worker.
fn last_words(words: Option<String>) -> String {
    words.map_or(String::new(), |w| format!("; its stderr ended with: {w}"))
}

impl IsolatedCore {
    fn label(&self) -> String {
        format!("core {} ({})", self.index, self.shared.name)
    }

    /// Waits for the worker's verdict on its core.
    fn wait_ready(&mut self) -> Result<(), LoadError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        match self.recv(deadline) {
            Ok(Msg::Ready) => {
                let tid = self.region.header().worker_tid.load(Ordering::Acquire);
                if tid & !doorbell::TID_MASK != 0 || tid <= doorbell::DONE_FAILED {
                    let status = self.reap();
                    return Err(LoadError::Backend(format!(
                        "the core worker {} published a bad thread id {tid}; it {status}",
                        self.shared.program.display()
                    )));
                }
                self.tid = tid;
                Ok(())
            }
            Ok(Msg::Refused(kind, why)) => {
                self.reap();
                Err(match kind {
                    RefusalKind::Unsupported => LoadError::Unsupported(why),
                    RefusalKind::Invalid => LoadError::Invalid(why),
                    RefusalKind::Backend => LoadError::Backend(why),
                })
            }
            other => {
                let why = match other {
                    Ok(m) => format!("sent {m:?} instead of a ready message"),
                    Err(Lost::TimedOut) => {
                        format!("did not load its core within {READY_TIMEOUT:?}")
                    }
                    Err(Lost::Garbled(e)) => e.to_string(),
                    Err(Lost::Closed) => String::new(),
                };
                let (status, words) = self.reap_with_stderr();
                let status = match status {
                    Ok(s) => describe(s, None),
                    Err(e) => e.to_string(),
                };
                // The core's initialisers run as it loads: a failed assert
                // there says which in the worker's stderr.
                Err(LoadError::Backend(format!(
                    "the core worker {} {}{} before its core was loaded (is it a corefarm \
                     executable?){}",
                    self.shared.program.display(),
                    if why.is_empty() { "" } else { "failed: " },
                    if why.is_empty() { status } else { why },
                    last_words(words),
                )))
            }
        }
    }

    /// Receives one message before `deadline`: a blocking recv bounded by
    /// the socket's receive timeout (one system call per message; poll
    /// before recv measurably cost throughput).
    fn recv(&mut self, deadline: Instant) -> Result<Msg, Lost> {
        let w = self.worker.as_mut().expect("a running worker");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Lost::TimedOut);
            }
            // Set once per worker in the common case: every job's deadline
            // is the watchdog from now, so the timeout already fits (to 2 %).
            if w.timeout.is_zero() || w.timeout > left + left / 64 {
                rustix::net::sockopt::set_socket_timeout(&w.sock, Timeout::Recv, Some(left))
                    .map_err(|_| Lost::Closed)?;
                w.timeout = left;
            }
            match rustix::net::recv(&w.sock, &mut self.buf[..], RecvFlags::empty()) {
                Ok((_, 0)) => return Err(Lost::Closed),
                Ok((_, n)) => {
                    return Msg::decode(&self.buf[..n.min(self.buf.len())]).map_err(Lost::Garbled)
                }
                // Timed out (checked at the top) or interrupted: wait on.
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {
                    w.timeout = Duration::ZERO;
                    continue;
                }
                // A worker that died with requests unread leaves a reset on
                // our end, reported before the datagrams still queued (its
                // fault report among them) and cleared once reported.
                Err(rustix::io::Errno::CONNRESET) => continue,
                Err(_) => return Err(Lost::Closed),
            }
        }
    }

    /// Slot `k`'s output slack, between its end and its guard page.
    fn slack(&self, k: usize) -> (*mut u8, usize) {
        let r = self.region.layout().slack(k);
        (self.region.at(r.start), r.len())
    }

    /// Puts the canary into the output slack of `slots`: when the region
    /// is made and after a job that may have overwritten it.
    fn fill_slack(&mut self, slots: std::ops::Range<usize>) {
        for k in slots {
            let (p, len) = self.slack(k);
            // SAFETY: the slack lies inside the region's output area, and no
            // job of a worker uses these slots while the node holds them.
            unsafe { std::ptr::write_bytes(p, shm::CANARY, len) };
        }
    }

    /// Offset in `slots` of the first output whose canary is damaged.
    fn overrun(&mut self, slots: std::ops::Range<usize>) -> Option<usize> {
        let first = slots.start;
        slots
            .into_iter()
            .find(|&k| {
                let (p, len) = self.slack(k);
                self.scratch.resize(len, 0);
                // SAFETY: as in `fill_slack`. Copied out rather than
                // borrowed: the worker process could still be writing there.
                unsafe { std::ptr::copy_nonoverlapping(p, self.scratch.as_mut_ptr(), len) };
                self.scratch.iter().any(|&b| b != shm::CANARY)
            })
            .map(|k| k - first)
    }

    /// The worker is gone: counts the restart to come.
    fn lost(&mut self, cause: String) -> CoreError {
        self.stats.resets += 1;
        CoreError::Worker(format!(
            "{}: {cause}; the job's output is discarded and the core restarts for the next job",
            self.label()
        ))
    }

    /// The worker reported that job `seq`'s current input failed (its
    /// reason follows on the control channel); the worker lives on.
    fn failed(&mut self, seq: u32) -> CoreError {
        let deadline = Instant::now() + self.shared.watchdog;
        match self.recv(deadline) {
            Ok(Msg::Done {
                seq: s,
                error: Some(e),
                ..
            }) if s == seq as u64 => {
                if e.starts_with("timed out") {
                    self.stats.timeouts += 1;
                }
                CoreError::Worker(format!("{}: {e}", self.label()))
            }
            other => {
                let status = self.reap();
                let why = format!(
                    "broke the worker protocol ({other:?} for a failed job); the worker {status}"
                );
                self.worker_lost(why, Some(seq))
                    .unwrap_or_else(|| CoreError::Worker(self.label()))
            }
        }
    }

    /// The worker died: reaps it and says how, with its last words.
    fn crashed(&mut self) -> String {
        let (status, words) = self.reap_with_stderr();
        let l = *self.region.layout();
        let h = self.region.header();
        let fault = match h.fault.load(Ordering::Relaxed) {
            0 => None,
            a => Some(shm::describe_fault(
                &l,
                h.worker_base.load(Ordering::Relaxed),
                a - 1,
            )),
        };
        let how = match status {
            Ok(s) => describe(s, fault),
            Err(e) => e.to_string(),
        };
        format!("the worker {how}{}", last_words(words))
    }

    /// The running job's current input outlived the watchdog: kills the
    /// worker and says so.
    fn hung(&mut self) -> String {
        self.stats.timeouts += 1;
        let h = self.region.header();
        let cycles = h
            .cycles_now
            .load(Ordering::Relaxed)
            .saturating_sub(h.cycles_at_start.load(Ordering::Relaxed));
        self.reap();
        let sim = if self.init.kind == "rtl" {
            format!(" after {cycles} simulated cycles of the job")
        } else {
            String::new()
        };
        format!(
            "no result within {:?} (the core timeout); the worker was killed (SIGKILL){sim}",
            self.shared.watchdog
        )
    }
}

impl Core for IsolatedCore {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        self.process_batch(input, output, 1).map_err(|e| e.error)
    }

    /// Runs the batch as jobs of up to a lane's slots, each submitted
    /// while the one before runs.
    fn process_batch(
        &mut self,
        inputs: &[u8],
        outputs: &mut [u8],
        count: usize,
    ) -> Result<(), BatchError> {
        let (isz, osz) = (
            self.init.input_size as usize,
            self.init.output_size as usize,
        );
        let refuse = |why: String| {
            Err(BatchError {
                index: 0,
                error: CoreError::Failed(why),
            })
        };
        if !self.pending.is_empty() {
            return refuse(format!(
                "{}: a batch while pipelined jobs are outstanding",
                self.label()
            ));
        }
        if Some(inputs.len()) != count.checked_mul(isz)
            || Some(outputs.len()) != count.checked_mul(osz)
        {
            return refuse(format!(
                "job of {} input / {} output bytes for {count} inputs of a core of {isz} / {osz}",
                inputs.len(),
                outputs.len(),
            ));
        }
        let per = self.lane_slots();
        let (mut submitted, mut collected, mut failure) = (0, 0, None);
        while collected < count {
            while failure.is_none() && submitted < count && self.pending.len() < 2 {
                let n = per.min(count - submitted);
                self.submit_job(&inputs[submitted * isz..(submitted + n) * isz], n);
                submitted += n;
            }
            let n = per.min(count - collected);
            if failure.is_some() {
                self.discard_front();
            } else if let Err((k, error)) =
                self.collect_job(&mut outputs[collected * osz..(collected + n) * osz])
            {
                failure = Some(BatchError {
                    index: collected + k,
                    error,
                });
            }
            collected += n;
        }
        failure.map_or(Ok(()), Err)
    }

    fn stats(&self) -> CoreStats {
        self.stats.clone()
    }

    fn pipeline(&mut self) -> Option<&mut dyn Pipeline> {
        Some(self)
    }
}

impl Drop for IsolatedCore {
    fn drop(&mut self) {
        self.reap();
    }
}

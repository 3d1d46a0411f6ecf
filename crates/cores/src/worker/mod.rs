//! Isolated cores: each native or RTL core runs in a worker process of its
//! own, so that user code that crashes, overruns its memories or hangs
//! fails its job instead of taking the node manager down.
//!
//! The node side is [`IsolatedCore`], a [`Core`] like the others. Per core:
//! a shared memory region ([`shm`]: header, then one input and one output
//! memory per slot, between guard pages), a `SOCK_SEQPACKET` control
//! channel ([`proto`]: start-up, and the reason of a failed job) and a
//! child process, the same executable re-run with [`SUBCOMMAND`] (or any
//! program whose `main` calls [`main`]). A job is up to one slot's worth
//! of inputs (all the inputs of a data message, when they fit): one copy of
//! each into its slot, a doorbell each way in the shared header
//! ([`doorbell`]: futex words, no system call while the other side is
//! quick), one copy out of each output. The node waits for the completion
//! at most the core timeout per input (the watchdog); a worker that dies
//! (the kernel wakes the node through a robust futex) or times out is
//! killed and reaped, the job fails with an error naming the core, the
//! input and the cause, and the next job starts a fresh worker. Nothing a
//! failed job wrote is copied out.

mod child;
mod doorbell;
mod plumbing;
mod proto;
pub(crate) mod shm;
mod spin;
mod spin_child;

pub use spin::{HandlerWorker, SpinOutcome};

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
use doorbell::Wait;
use plumbing::describe;
use proto::{Init, Msg, RefusalKind};
use shm::{Layout, Region};

use crate::{
    ArtifactKind, BatchError, Core, CoreError, CoreStats, LoadError, LoadOptions, WorkerCommand,
};

/// The hidden subcommand a worker is started with.
pub const SUBCOMMAND: &str = "__core-worker";

/// Where a worker finds what the node gives it (docs/interfaces.md).
pub(crate) const FD_CONTROL: RawFd = 3;
pub(crate) const FD_REGION: RawFd = 4;
pub(crate) const FD_ARTIFACT: RawFd = 5;

/// Longest a worker may take to load its core before the load fails.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the node sleeps on a job before it looks at the watchdog, the
/// worker's progress and whether the worker still lives (one that died
/// between jobs leaves no robust-futex mark).
const SLICE: Duration = Duration::from_millis(20);
/// Job numbers travel in 31 bits of the `job` doorbell.
const SEQ_MASK: u32 = 0x7fff_ffff;

/// What the cores of one load share.
struct Shared {
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
}

/// One core running in its own worker process (see the module docs).
pub struct IsolatedCore {
    shared: Arc<Shared>,
    index: usize,
    init: Init,
    region_fd: OwnedFd,
    region: Region,
    worker: Option<Worker>,
    /// The worker's job thread id (its running mark in `done`).
    tid: u32,
    seq: u32,
    /// How long the last completed job took, from ring to completion.
    last_job: Duration,
    buf: Vec<u8>,
    /// Copy of the output's slack, for the canary check.
    scratch: Vec<u8>,
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
    let shared = Arc::new(Shared {
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
            },
            region_fd,
            region,
            worker: None,
            tid: 0,
            seq: 0,
            last_job: Duration::ZERO,
            buf: vec![0; 4096],
            scratch: Vec::new(),
            stats: CoreStats::default(),
        };
        core.fill_slack(layout.slots);
        // Started here, waited for below: the workers load in parallel.
        core.worker = Some(core.spawn().map_err(LoadError::Backend)?);
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
    Garbled(String),
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
                    Err(Lost::Garbled(e)) => e,
                    Err(Lost::Closed) => String::new(),
                };
                let status = self.reap();
                Err(LoadError::Backend(format!(
                    "the core worker {} {}{} before its core was loaded (is it a corefarm executable?)",
                    self.shared.program.display(),
                    if why.is_empty() { "" } else { "failed: " },
                    if why.is_empty() { status } else { why },
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
                Err(_) => return Err(Lost::Closed),
            }
        }
    }

    /// Slot `k`'s output slack, between its end and its guard page.
    fn slack(&self, k: usize) -> (*mut u8, usize) {
        let r = self.region.layout().slack(k);
        (self.region.at(r.start), r.len())
    }

    /// Puts the canary into the first `n` outputs' slack: when the region
    /// is made and after a job that may have overwritten it.
    fn fill_slack(&mut self, n: usize) {
        for k in 0..n {
            let (p, len) = self.slack(k);
            // SAFETY: the slack lies inside the region's output area, and no
            // worker runs a job while the node holds the memories.
            unsafe { std::ptr::write_bytes(p, shm::CANARY, len) };
        }
    }

    /// The first of the first `n` outputs whose canary is damaged.
    fn overrun(&mut self, n: usize) -> Option<usize> {
        (0..n).find(|&k| {
            let (p, len) = self.slack(k);
            self.scratch.resize(len, 0);
            // SAFETY: as in `fill_slack`. Copied out rather than borrowed:
            // the worker process could still be writing the region.
            unsafe { std::ptr::copy_nonoverlapping(p, self.scratch.as_mut_ptr(), len) };
            self.scratch.iter().any(|&b| b != shm::CANARY)
        })
    }

    /// The job failed and the worker is gone: count the restart to come.
    fn lost(&mut self, cause: String) -> CoreError {
        self.stats.resets += 1;
        self.fill_slack(self.region.layout().slots);
        CoreError::Worker(format!(
            "{}: {cause}; the job's output is discarded and the core restarts for the next job",
            self.label()
        ))
    }

    /// Runs the `n` inputs laid end to end in `inputs` (at most one slot
    /// each) as one worker job; on failure, says which input failed.
    fn run_job(
        &mut self,
        inputs: &[u8],
        outputs: &mut [u8],
        n: usize,
    ) -> Result<(), (usize, CoreError)> {
        if self.worker.is_none() {
            let w = self.spawn().map_err(|e| {
                (
                    0,
                    CoreError::Worker(format!("{}: cannot restart: {e}", self.label())),
                )
            })?;
            self.worker = Some(w);
            self.wait_ready().map_err(|e| {
                let e = format!("{}: restarting failed: {e}", self.label());
                (0, CoreError::Worker(e))
            })?;
        }
        let l = *self.region.layout();
        let (isz, osz) = (l.input_size, l.output_size);
        for k in 0..n {
            // SAFETY: the worker is idle (between jobs); slot k's input
            // memory is input_size bytes inside the region.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    inputs[k * isz..].as_ptr(),
                    self.region.at(l.input_at(k)),
                    isz,
                )
            };
        }
        self.seq = self.seq.wrapping_add(1) & SEQ_MASK;
        let (seq, tid) = (self.seq, self.tid);
        let h = self.region.header();
        h.count.store(n as u32, Ordering::Relaxed);
        h.progress.store(0, Ordering::Relaxed);
        h.done.store(tid, Ordering::Relaxed);
        doorbell::ring(&h.job, seq);
        // The watchdog: each input gets the core timeout, counted from the
        // previous one's completion.
        let rung = Instant::now();
        let mut deadline = rung + self.shared.watchdog;
        let mut progress = 0;
        // Spin only for a core whose last job was quick.
        let spin = if self.last_job < doorbell::NODE_SPIN {
            doorbell::NODE_SPIN
        } else {
            Duration::ZERO
        };
        let code = loop {
            let until = deadline.min(Instant::now() + SLICE);
            match doorbell::wait_done(&self.region.header().done, tid, until, spin) {
                Wait::Done(code) => break code,
                Wait::Died => return Err(self.crashed()),
                Wait::Slice => {}
            }
            let p = self.region.header().progress.load(Ordering::Acquire);
            if p != progress {
                progress = p;
                deadline = Instant::now() + self.shared.watchdog;
            } else if Instant::now() >= deadline {
                return Err(self.hung());
            }
            // A worker that died between jobs left no mark in `done`.
            if self.worker_gone() {
                return Err(self.crashed());
            }
        };
        self.last_job = rung.elapsed();
        let h = self.region.header();
        let done = h.progress.load(Ordering::Acquire) as usize;
        let (last, all) = (
            h.last_cycles.load(Ordering::Relaxed),
            h.job_cycles.load(Ordering::Relaxed),
        );
        if h.done_seq.load(Ordering::Relaxed) != seq
            || done > n
            || (code == doorbell::DONE_OK && done != n)
            || code > doorbell::DONE_FAILED
        {
            let status = self.reap();
            let why = format!("broke the worker protocol (completion {code} of {done}/{n} inputs for another job); the worker {status}");
            return Err((done.min(n), self.lost(why)));
        }
        if last != u64::MAX {
            self.stats.last_cycles = Some(last);
            self.stats.cycles = Some(self.stats.cycles.unwrap_or(0) + all);
        }
        if code == doorbell::DONE_FAILED {
            self.stats.jobs += done as u64;
            return Err((done, self.failed(n)));
        }
        if let Some(k) = self.overrun(n) {
            self.fill_slack(n);
            self.stats.jobs += k as u64;
            let e = format!(
                "{}: wrote past the end of its {osz}-byte output memory; the job's output is discarded",
                self.label()
            );
            return Err((k, CoreError::Worker(e)));
        }
        self.stats.jobs += n as u64;
        for k in 0..n {
            // SAFETY: the worker completed the job and waits for the next
            // one; slot k's output memory is output_size bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.region.at(l.output_at(k)),
                    outputs[k * osz..].as_mut_ptr(),
                    osz,
                )
            };
        }
        Ok(())
    }

    /// The worker reported that the job's current input failed (its
    /// reason follows on the control channel); the worker lives on.
    fn failed(&mut self, n: usize) -> CoreError {
        self.fill_slack(n);
        let deadline = Instant::now() + self.shared.watchdog;
        match self.recv(deadline) {
            Ok(Msg::Done {
                seq,
                error: Some(e),
                ..
            }) if seq == self.seq as u64 => {
                if e.starts_with("timed out") {
                    self.stats.timeouts += 1;
                }
                CoreError::Worker(format!("{}: {e}", self.label()))
            }
            other => {
                let status = self.reap();
                self.lost(format!(
                    "broke the worker protocol ({other:?} for a failed job); the worker {status}"
                ))
            }
        }
    }

    /// The worker died during the job.
    fn crashed(&mut self) -> (usize, CoreError) {
        let at = self.region.header().progress.load(Ordering::Relaxed) as usize;
        let status = self.reap_status();
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
            Err(e) => e,
        };
        (at, self.lost(format!("the worker {how}")))
    }

    /// The job's current input outlived the watchdog.
    fn hung(&mut self) -> (usize, CoreError) {
        self.stats.timeouts += 1;
        let h = self.region.header();
        let at = h.progress.load(Ordering::Relaxed) as usize;
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
        let e = self.lost(format!(
            "no result within {:?} (the core timeout); the worker was killed (SIGKILL){sim}",
            self.shared.watchdog
        ));
        (at, e)
    }
}

impl Core for IsolatedCore {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        self.process_batch(input, output, 1).map_err(|e| e.error)
    }

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
        if Some(inputs.len()) != count.checked_mul(isz)
            || Some(outputs.len()) != count.checked_mul(osz)
        {
            let error = CoreError::Failed(format!(
                "job of {} input / {} output bytes for {count} inputs of a core of {isz} / {osz}",
                inputs.len(),
                outputs.len(),
            ));
            return Err(BatchError { index: 0, error });
        }
        let slots = self.region.layout().slots;
        let mut first = 0;
        while first < count {
            let n = slots.min(count - first);
            let started = Instant::now();
            let r = self.run_job(
                &inputs[first * isz..(first + n) * isz],
                &mut outputs[first * osz..(first + n) * osz],
                n,
            );
            if let Err((k, error)) = r {
                return Err(BatchError {
                    index: first + k,
                    error,
                });
            }
            self.stats.busy += started.elapsed();
            first += n;
        }
        Ok(())
    }

    fn stats(&self) -> CoreStats {
        self.stats.clone()
    }
}

impl Drop for IsolatedCore {
    fn drop(&mut self) {
        self.reap();
    }
}

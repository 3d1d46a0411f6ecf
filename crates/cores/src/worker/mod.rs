//! Isolated cores: each native or RTL core runs in a worker process of its
//! own, so that user code that crashes, overruns its memories or hangs
//! fails its job instead of taking the node manager down.
//!
//! The node side is [`IsolatedCore`], a [`Core`] like the others. Per core:
//! a shared memory region ([`shm`]: header, input and output between guard
//! pages), a `SOCK_SEQPACKET` control channel ([`proto`]) and a child
//! process, the same executable re-run with [`SUBCOMMAND`] (or any program
//! whose `main` calls [`main`]). A job is one copy into the shared input,
//! a job message, a completion message, one copy out of the shared output.
//! The node waits for the completion at most the core timeout (the
//! watchdog); a worker that dies or times out is killed and reaped, the job
//! fails with an error naming the core and the cause, and the next job
//! starts a fresh worker. Nothing a failed job wrote is copied out.

mod child;
mod proto;
pub(crate) mod shm;

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corefarm_smp::Configuration;
use rustix::net::sockopt::Timeout;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

pub use child::main;
use proto::{Init, Msg, RefusalKind};
use shm::{Layout, Region};

use crate::{ArtifactKind, Core, CoreError, CoreStats, LoadError, LoadOptions, WorkerCommand};

/// The hidden subcommand a worker is started with.
pub const SUBCOMMAND: &str = "__core-worker";

/// Where a worker finds what the node gives it (docs/interfaces.md).
pub(crate) const FD_CONTROL: RawFd = 3;
pub(crate) const FD_REGION: RawFd = 4;
pub(crate) const FD_ARTIFACT: RawFd = 5;

/// Longest a worker may take to load its core before the load fails.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

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
    seq: u64,
    buf: Vec<u8>,
    /// Copy of the output's slack, for the canary check.
    scratch: Vec<u8>,
    stats: CoreStats,
}

fn backend(what: &str) -> impl Fn(std::io::Error) -> LoadError + '_ {
    move |e| LoadError::Backend(format!("{what}: {e}"))
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
    let program = match &opts.worker {
        WorkerCommand::CurrentExe => {
            std::env::current_exe().map_err(backend("cannot find this executable"))?
        }
        WorkerCommand::Program(p) => p.clone(),
    };
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
            },
            region_fd,
            region,
            worker: None,
            seq: 0,
            buf: vec![0; 4096],
            scratch: Vec::new(),
            stats: CoreStats::default(),
        };
        core.fill_slack();
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

    /// Starts a worker and sends it its init message.
    fn spawn(&self) -> Result<Worker, String> {
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| format!("socketpair: {e}"))?;
        let fds = [
            theirs.as_raw_fd(),
            self.region_fd.as_raw_fd(),
            self.shared.artifact.as_raw_fd(),
        ];
        let mut cmd = Command::new(&self.shared.program);
        cmd.arg(SUBCOMMAND).stdin(Stdio::null());
        // SAFETY: `place_fds` only makes async-signal-safe calls.
        unsafe { cmd.pre_exec(move || place_fds(fds)) };
        let child = cmd.spawn().map_err(|e| {
            format!(
                "cannot start the core worker {}: {e}",
                self.shared.program.display()
            )
        })?;
        drop(theirs);
        let w = Worker {
            child,
            sock: ours,
            timeout: Duration::ZERO,
        };
        // A worker that already died is reported by `wait_ready`, with its
        // exit status.
        let _ = rustix::net::send(
            &w.sock,
            &Msg::Init(self.init.clone()).encode(),
            SendFlags::NOSIGNAL,
        );
        Ok(w)
    }

    /// Waits for the worker's verdict on its core.
    fn wait_ready(&mut self) -> Result<(), LoadError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        match self.recv(deadline) {
            Ok(Msg::Ready) => Ok(()),
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

    /// The output's slack, between its end and its guard page.
    fn slack(&self) -> *mut u8 {
        self.region.at(self.region.layout().slack().start)
    }

    /// Puts the canary into the output's slack: when the region is made and
    /// after a job that may have overwritten it.
    fn fill_slack(&mut self) {
        let n = self.region.layout().slack().len();
        // SAFETY: the slack lies inside the region's output area, and no
        // worker runs a job while the node holds the memories.
        unsafe { std::ptr::write_bytes(self.slack(), shm::CANARY, n) };
    }

    fn slack_intact(&mut self) -> bool {
        let n = self.region.layout().slack().len();
        self.scratch.resize(n, 0);
        // SAFETY: as in `fill_slack`. Copied out rather than borrowed: the
        // worker process could still be writing the region.
        unsafe { std::ptr::copy_nonoverlapping(self.slack(), self.scratch.as_mut_ptr(), n) };
        self.scratch.iter().all(|&b| b == shm::CANARY)
    }

    /// Kills and reaps the worker; describes how it ended.
    fn reap(&mut self) -> String {
        match self.reap_status() {
            Ok(s) => describe(s, None),
            Err(e) => e,
        }
    }

    fn reap_status(&mut self) -> Result<std::process::ExitStatus, String> {
        let Some(mut w) = self.worker.take() else {
            return Err("was not running".into());
        };
        // Killing an exiting process does not change its exit status, so a
        // crash is still reported as the crash; one that closed its channel
        // and lives on is not waited for forever.
        let _ = w.child.kill();
        drop(w.sock);
        w.child
            .wait()
            .map_err(|e| format!("could not be reaped: {e}"))
    }

    /// The job failed and the worker is gone: count the restart to come.
    fn lost(&mut self, cause: String) -> CoreError {
        self.stats.resets += 1;
        self.fill_slack();
        CoreError::Worker(format!(
            "{}: {cause}; the job's output is discarded and the core restarts for the next job",
            self.label()
        ))
    }

    fn run_job(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        if self.worker.is_none() {
            let w = self
                .spawn()
                .map_err(|e| CoreError::Worker(format!("{}: cannot restart: {e}", self.label())))?;
            self.worker = Some(w);
            self.wait_ready().map_err(|e| {
                CoreError::Worker(format!("{}: restarting failed: {e}", self.label()))
            })?;
        }
        let l = *self.region.layout();
        // SAFETY: the worker is idle (between jobs) and the input memory is
        // input_size bytes inside the region; `input` has that length.
        unsafe {
            std::ptr::copy_nonoverlapping(input.as_ptr(), self.region.at(l.input), input.len())
        };
        self.seq += 1;
        let job = Msg::Job {
            seq: self.seq,
            count: 1,
        };
        let sock = &self.worker.as_ref().expect("started above").sock;
        if let Err(e) = rustix::net::send(sock, &job.encode(), SendFlags::NOSIGNAL) {
            let status = self.reap();
            return Err(self.lost(format!("control channel failed ({e}); the worker {status}")));
        }
        let deadline = Instant::now() + self.shared.watchdog;
        match self.recv(deadline) {
            Ok(Msg::Done { seq, cycles, error }) if seq == self.seq => {
                if cycles.is_some() {
                    self.stats.last_cycles = cycles;
                    self.stats.cycles = Some(self.stats.cycles.unwrap_or(0) + cycles.unwrap_or(0));
                }
                if let Some(e) = error {
                    if e.starts_with("timed out") {
                        self.stats.timeouts += 1;
                    }
                    return Err(CoreError::Worker(format!("{}: {e}", self.label())));
                }
                if !self.slack_intact() {
                    self.fill_slack();
                    return Err(CoreError::Worker(format!(
                        "{}: wrote past the end of its {}-byte output memory; the job's output is discarded",
                        self.label(),
                        l.output_size
                    )));
                }
                // SAFETY: the worker completed the job and waits for the
                // next one; the output memory is output_size bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.region.at(l.output),
                        output.as_mut_ptr(),
                        output.len(),
                    )
                };
                Ok(())
            }
            Ok(m) => {
                let status = self.reap();
                Err(self.lost(format!("answered with {m:?}; the worker {status}")))
            }
            Err(Lost::Garbled(e)) => {
                let status = self.reap();
                Err(self.lost(format!(
                    "broke the worker protocol ({e}); the worker {status}"
                )))
            }
            Err(Lost::Closed) => {
                let status = self.reap_status();
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
                Err(self.lost(format!("the worker {how}")))
            }
            Err(Lost::TimedOut) => {
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
                Err(self.lost(format!(
                    "no result within {:?} (the core timeout); the worker was killed (SIGKILL){sim}",
                    self.shared.watchdog
                )))
            }
        }
    }
}

impl Core for IsolatedCore {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        let (isz, osz) = (
            self.init.input_size as usize,
            self.init.output_size as usize,
        );
        if input.len() != isz || output.len() != osz {
            return Err(CoreError::Failed(format!(
                "job of {} input / {} output bytes for a core of {isz} / {osz}",
                input.len(),
                output.len(),
            )));
        }
        let started = Instant::now();
        self.run_job(input, output)?;
        self.stats.jobs += 1;
        self.stats.busy += started.elapsed();
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

/// In the child between fork and exec: moves the three descriptors to
/// their fixed numbers (first above 9, so no source is overwritten before
/// it is moved; dup2 clears close-on-exec on the copies), sends the core's
/// stdout to stderr (the node's stdout may be machine-read), and disables
/// core dumps (a crashing core is expected, not worth a dump).
fn place_fds(fds: [RawFd; 3]) -> std::io::Result<()> {
    let mut tmp = [0; 3];
    for (t, fd) in tmp.iter_mut().zip(fds) {
        // SAFETY: async-signal-safe calls on descriptors this process owns.
        *t = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
        if *t < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    for (i, t) in tmp.into_iter().enumerate() {
        // SAFETY: as above.
        if unsafe { libc::dup2(t, FD_CONTROL + i as RawFd) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    let no_dumps = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as above; failures of these two are harmless.
    unsafe {
        libc::dup2(2, 1);
        libc::setrlimit(libc::RLIMIT_CORE, &no_dumps);
    }
    Ok(())
}

/// "was killed by SIGSEGV (…)" / "exited with status 3"; `fault` says
/// where a SIGSEGV or SIGBUS happened, when the worker could tell.
fn describe(s: std::process::ExitStatus, fault: Option<String>) -> String {
    if let (Some(sig @ (libc::SIGSEGV | libc::SIGBUS)), Some(at)) = (s.signal(), &fault) {
        let name = if sig == libc::SIGSEGV {
            "SIGSEGV"
        } else {
            "SIGBUS"
        };
        return format!("was killed by {name}: an invalid memory access {at}");
    }
    if let Some(sig) = s.signal() {
        let (name, hint) = match sig {
            libc::SIGSEGV => ("SIGSEGV", " (invalid memory access: a write past the output memory, a write to the input memory, or a bad pointer)"),
            libc::SIGBUS => ("SIGBUS", " (bad memory access)"),
            libc::SIGABRT => ("SIGABRT", " (the core called abort(), or a failed assertion)"),
            libc::SIGFPE => ("SIGFPE", " (arithmetic error, e.g. an integer division by zero)"),
            libc::SIGILL => ("SIGILL", " (illegal instruction)"),
            libc::SIGKILL => ("SIGKILL", ""),
            libc::SIGTRAP => ("SIGTRAP", ""),
            libc::SIGSYS => ("SIGSYS", ""),
            libc::SIGTERM => ("SIGTERM", ""),
            _ => ("", ""),
        };
        if name.is_empty() {
            format!("was killed by signal {sig}")
        } else {
            format!("was killed by {name}{hint}")
        }
    } else {
        match s.code() {
            Some(c) => format!("exited with status {c}"),
            None => "ended".into(),
        }
    }
}

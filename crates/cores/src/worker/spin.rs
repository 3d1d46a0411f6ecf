//! The node's side of the handler worker ([`super::spin_child`]): the
//! process that runs an image's streaming handler sets, so that a handler
//! which crashes or loops fails only its message. The node streams one
//! message at a time to it in chunks over the control channel and reads
//! back the result pieces, notifications and the outcome. A worker that
//! dies, reports an overrun or stops answering is killed and reaped; the
//! message fails with an error naming the handler set and stage, and the
//! next message starts a fresh worker.
//!
//! To run several messages at once a node starts a pool of such workers
//! ([`HandlerWorker::sibling`]): each still runs one message at a time, so
//! a crash stays pinned on exactly one message, and all of them map the
//! same handler memory ([`super::spin_memory`]), so handler sets keep one
//! shared memory and one set of counters whichever worker runs a message.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::net::sockopt::Timeout;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use super::plumbing::{describe, place_fds, ProcessError, Reaped, StderrTail};
use super::proto::{Init, Msg, RefusalKind, SpinEnd, MAX_MESSAGE, MAX_PIECE};
use super::{sealed_artifact, SUBCOMMAND};
use crate::spin::rules::{self, Ruleset};
use crate::spin::{HandlerSet, Outcome};
use crate::{LoadError, LoadOptions};

/// Longest a handler worker may take to load its handler sets.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Added to the per-call budgets when the node bounds a whole message: the
/// worker's own monitor reports overruns; this only catches a worker that
/// stopped answering altogether.
const SLACK: Duration = Duration::from_secs(10);

/// What became of a message the handlers took.
#[derive(Debug)]
pub struct SpinOutcome {
    pub outcome: Outcome,
    /// What the handlers passed to `notify`, in order, at most
    /// [`MAX_NOTIFICATIONS`] of them.
    pub notifications: Vec<Vec<u8>>,
    /// Notifications past [`MAX_NOTIFICATIONS`], dropped.
    pub notifications_dropped: u64,
}

pub use crate::spin::engine::MAX_NOTIFICATIONS;

/// What every worker of a pool starts from.
struct PoolSpec {
    program: std::path::PathBuf,
    /// The handler sets' shared object (a sealed memfd).
    artifact: OwnedFd,
    /// The handler memory all workers map ([`super::spin_memory`]).
    memory: OwnedFd,
}

/// A running (or, after a failure, to be restarted) handler worker.
pub struct HandlerWorker {
    shared: Arc<PoolSpec>,
    init: Init,
    contexts: Vec<(Ruleset, ())>,
    worker: Option<(Child, OwnedFd, Option<StderrTail>)>,
    buf: Vec<u8>,
    /// The message being fed (see [`HandlerWorker::begin`]).
    current: Option<Current>,
    /// Workers restarted after a failure.
    pub restarts: u64,
}

/// A message begun and not finished.
struct Current {
    ctx: usize,
    id: u32,
    len: u64,
    sent: u64,
    pieces: u32,
    begun: bool,
    /// Sending failed: the worker is gone, `finish` says why.
    broken: bool,
}

impl HandlerWorker {
    /// Starts a worker that loads `sets` from the shared object `so` and
    /// waits until it has (an unknown symbol is refused here, with the
    /// reason). `threads`: payload handlers running at once.
    pub fn start(
        so: &[u8],
        sets: Vec<HandlerSet>,
        threads: usize,
        opts: &LoadOptions,
    ) -> Result<HandlerWorker, LoadError> {
        crate::spin::manifest::check(&sets)?;
        let contexts = sets.iter().map(|s| (s.ruleset.clone(), ())).collect();
        let memory = super::spin_memory::create(&sets)
            .map_err(|e| LoadError::Backend(format!("handler memory: {e}")))?;
        let shared = Arc::new(PoolSpec {
            program: super::program(opts)?,
            artifact: sealed_artifact(so)?,
            memory,
        });
        let init = Init {
            kind: "spin".into(),
            entry: String::new(),
            input_size: 0,
            output_size: 0,
            core: [0; 3],
            timeout_us: 0,
            poll_us: 0,
            region_len: 0,
            slots: 0,
            spin: sets,
            spin_threads: threads.clamp(1, 64) as u32,
            control: None,
        };
        Self::launch(shared, init, contexts)
    }

    /// Starts another worker of this one's pool: the same handler sets,
    /// sharing their memory and counters with it, and running messages of
    /// its own concurrently with it.
    pub fn sibling(&self) -> Result<HandlerWorker, LoadError> {
        Self::launch(
            self.shared.clone(),
            self.init.clone(),
            self.contexts.clone(),
        )
    }

    /// A worker of the pool `shared` belongs to, started and loaded.
    fn launch(
        shared: Arc<PoolSpec>,
        init: Init,
        contexts: Vec<(Ruleset, ())>,
    ) -> Result<HandlerWorker, LoadError> {
        let mut w = HandlerWorker {
            shared,
            init,
            contexts,
            worker: None,
            buf: vec![0; MAX_MESSAGE],
            current: None,
            restarts: 0,
        };
        w.ensure()?;
        Ok(w)
    }

    /// The execution context whose ruleset matches a message's first chunk.
    pub fn select(&self, first_chunk: &[u8]) -> Option<usize> {
        rules::select(&self.contexts, first_chunk).map(|(i, _)| i)
    }

    /// Number of execution contexts.
    pub fn contexts(&self) -> usize {
        self.contexts.len()
    }

    /// The handler set of context `i`.
    pub fn set(&self, i: usize) -> &HandlerSet {
        &self.init.spin[i]
    }

    fn label(&self, ctx: usize) -> String {
        format!("handler set {}", self.init.spin[ctx].name)
    }

    /// Runs message `id` (`data`, cut into chunks of `chunk` bytes) through
    /// context `ctx`. Never panics on what the worker does: every failure
    /// is an [`Outcome::Failed`] naming the set.
    pub fn run(&mut self, ctx: usize, id: u32, data: &[u8], chunk: usize) -> SpinOutcome {
        if let Err(failed) = self.begin(ctx, id, data.len() as u64) {
            return failed;
        }
        self.feed(data, chunk);
        self.finish()
    }

    /// Begins message `id` of `len` bytes in context `ctx`: its bytes follow
    /// with [`HandlerWorker::feed`] as they arrive (the head handler runs on
    /// the first piece, payload handlers on each piece as it comes, not
    /// after the last), then [`HandlerWorker::finish`] waits for the outcome.
    pub fn begin(&mut self, ctx: usize, id: u32, len: u64) -> Result<(), SpinOutcome> {
        // A worker that died between messages (killed from outside) is
        // not this message's fault: start a fresh one first.
        if self.gone() {
            self.reap();
            self.restarts += 1;
        }
        if let Err(e) = self.ensure() {
            return Err(SpinOutcome {
                outcome: Outcome::Failed(format!(
                    "{}: the handler worker cannot restart: {e}",
                    self.label(ctx)
                )),
                notifications: Vec::new(),
                notifications_dropped: 0,
            });
        }
        self.current = Some(Current {
            ctx,
            id,
            len,
            sent: 0,
            pieces: 0,
            begun: false,
            broken: false,
        });
        Ok(())
    }

    /// The next bytes of the message begun, cut into pieces of at most
    /// `chunk` bytes; bytes past its length are ignored. A worker that is
    /// gone is noticed by [`HandlerWorker::finish`].
    pub fn feed(&mut self, data: &[u8], chunk: usize) {
        let Some(cur) = self.current.as_mut() else {
            return;
        };
        let chunk = chunk.clamp(16, MAX_PIECE);
        let room = cur.len - cur.sent;
        let data = &data[..data.len().min(room as usize)];
        let mut pieces: Vec<&[u8]> = data.chunks(chunk).collect();
        if cur.len == 0 && !cur.begun {
            pieces.push(&[]);
        }
        for p in pieces {
            if cur.broken {
                return;
            }
            cur.sent += p.len() as u64;
            let eom = cur.sent == cur.len;
            let m = if cur.begun {
                Msg::Chunk {
                    eom,
                    data: p.to_vec(),
                }
            } else {
                cur.begun = true;
                Msg::Begin {
                    id: cur.id,
                    len: cur.len,
                    eom,
                    data: p.to_vec(),
                }
            };
            cur.pieces += 1;
            let (_, sock, _) = self.worker.as_ref().expect("ensured by begin");
            if rustix::net::send(sock, &m.encode(), SendFlags::NOSIGNAL).is_err() {
                // The worker is gone: what it said last tells why.
                cur.broken = true;
            }
        }
    }

    /// The outcome of the message begun, once all its bytes were fed (a
    /// message fed short fails: its handlers never saw its end).
    pub fn finish(&mut self) -> SpinOutcome {
        let failed = |why: String| SpinOutcome {
            outcome: Outcome::Failed(why),
            notifications: Vec::new(),
            notifications_dropped: 0,
        };
        let Some(cur) = self.current.take() else {
            return failed("no message was begun".into());
        };
        let ctx = cur.ctx;
        if cur.sent < cur.len && !cur.broken {
            // The worker holds a message that will never end: start afresh.
            self.reap();
            self.restarts += 1;
            return failed(format!(
                "{}: the message ended after {} of its {} bytes",
                self.label(ctx),
                cur.sent,
                cur.len
            ));
        }
        let budget = self.init.spin[ctx].budgets.budgets().per_call;
        let deadline = Instant::now() + budget * (cur.pieces + 2) + SLACK;
        let (mut out, mut notes, mut fault) = (Vec::new(), Vec::new(), None);
        let mut notes_dropped = 0u64;
        let limit = self.init.spin[ctx].budgets.output;
        loop {
            match self.recv(deadline) {
                Ok(Msg::Output(p)) if out.len() as u64 + p.len() as u64 <= limit => {
                    out.extend_from_slice(&p)
                }
                Ok(Msg::Notify(n)) if n.len() <= crate::spin::manifest::NOTIFICATION as usize => {
                    if notes.len() < MAX_NOTIFICATIONS {
                        notes.push(n)
                    } else {
                        notes_dropped += 1;
                    }
                }
                Ok(Msg::NotesDropped(n)) => notes_dropped += n,
                Ok(Msg::Fault { context, stage }) => fault = Some((context, stage)),
                Ok(Msg::Finished(end, why)) => {
                    let outcome = match end {
                        SpinEnd::Result => Outcome::Result(out),
                        SpinEnd::Forward => Outcome::Forward,
                        SpinEnd::Dropped => Outcome::Dropped,
                        SpinEnd::Failed => Outcome::Failed(why),
                        SpinEnd::Overrun => {
                            self.reap();
                            self.restarts += 1;
                            Outcome::Failed(why)
                        }
                    };
                    return SpinOutcome {
                        outcome,
                        notifications: notes,
                        notifications_dropped: notes_dropped,
                    };
                }
                Ok(other) => {
                    let status = self.reap();
                    self.restarts += 1;
                    return failed(format!(
                        "{}: the handler worker broke the protocol ({}); it {status}",
                        self.label(ctx),
                        describe_msg(&other)
                    ));
                }
                Err(timed_out) => {
                    let (status, words) = self.reap_with_stderr();
                    self.restarts += 1;
                    if timed_out {
                        return failed(format!(
                            "{}: no outcome within {:?}; the handler worker was killed (SIGKILL) and restarts",
                            self.label(ctx),
                            deadline.saturating_duration_since(Instant::now())
                        ));
                    }
                    let how = match status {
                        Ok(s) => describe_handler_end(s),
                        Err(e) => e.to_string(),
                    };
                    let at = match fault {
                        Some((c, s)) if (c as usize) < self.init.spin.len() => format!(
                            "{}: the {} handler crashed",
                            self.label(c as usize),
                            ["head", "payload", "tail"][s as usize]
                        ),
                        _ => format!("{}: a handler crashed", self.label(ctx)),
                    };
                    let words =
                        words.map_or(String::new(), |w| format!("; its stderr ended with: {w}"));
                    return failed(format!(
                        "{at}: the handler worker {how}{words}; it restarts for the next message"
                    ));
                }
            }
        }
    }

    /// The running worker's process id.
    pub fn pid(&self) -> Option<u32> {
        self.worker.as_ref().map(|(c, _, _)| c.id())
    }

    /// Whether the worker process has ended (its channel hung up).
    fn gone(&self) -> bool {
        use rustix::event::{PollFd, PollFlags};
        let Some((_, sock, _)) = &self.worker else {
            return false;
        };
        let mut p = [PollFd::new(sock, PollFlags::RDHUP)];
        match rustix::event::poll(&mut p, Some(&rustix::event::Timespec::default())) {
            Ok(_) => p[0]
                .revents()
                .intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR),
            Err(_) => false,
        }
    }

    /// Starts the worker if none runs, and waits for it to load.
    fn ensure(&mut self) -> Result<(), LoadError> {
        if self.worker.is_some() {
            return Ok(());
        }
        self.worker = Some(
            self.spawn()
                .map_err(|e| LoadError::Backend(e.to_string()))?,
        );
        match self.recv(Instant::now() + READY_TIMEOUT) {
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
                let status = self.reap();
                Err(LoadError::Backend(format!(
                    "the handler worker {} did not load ({}); it {status} (is it a corefarm executable?)",
                    self.shared.program.display(),
                    match other {
                        Ok(m) => describe_msg(&m),
                        Err(true) => format!("no answer within {READY_TIMEOUT:?}"),
                        Err(false) => "channel closed".into(),
                    }
                )))
            }
        }
    }

    fn spawn(&self) -> Result<(Child, OwnedFd, Option<StderrTail>), ProcessError> {
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(ProcessError::SocketPair)?;
        // The region of a core worker is the handler memory here.
        let fds = [
            theirs.as_raw_fd(),
            self.shared.memory.as_raw_fd(),
            self.shared.artifact.as_raw_fd(),
        ];
        let mut cmd = std::process::Command::new(&self.shared.program);
        cmd.arg(SUBCOMMAND)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        // SAFETY: `place_fds` only makes async-signal-safe calls.
        unsafe { std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || place_fds(fds)) };
        let mut child = cmd.spawn().map_err(|error| ProcessError::Exec {
            what: "handler worker",
            program: self.shared.program.display().to_string(),
            error,
        })?;
        drop(theirs);
        // A worker that already died is reported by the ready wait.
        let _ = rustix::net::send(
            &ours,
            &Msg::Init(self.init.clone()).encode(),
            SendFlags::NOSIGNAL,
        );
        let stderr = child.stderr.take().map(StderrTail::start);
        Ok((child, ours, stderr))
    }

    /// One message before `deadline`; `Err(true)`: timed out, `Err(false)`:
    /// the channel closed or sent garbage.
    fn recv(&mut self, deadline: Instant) -> Result<Msg, bool> {
        let Some((_, sock, _)) = &self.worker else {
            return Err(false);
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(true);
            }
            rustix::net::sockopt::set_socket_timeout(sock, Timeout::Recv, Some(left))
                .map_err(|_| false)?;
            match rustix::net::recv(sock, &mut self.buf[..], RecvFlags::empty()) {
                Ok((_, 0)) => return Err(false),
                Ok((_, n)) => {
                    return Msg::decode(&self.buf[..n.min(self.buf.len())]).map_err(|_| false)
                }
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => continue,
                // A worker that died with pieces of the message unread
                // leaves a reset on our end, which Linux reports before the
                // datagrams still queued (its fault report among them) and
                // clears once reported: read on to those, then to the end.
                Err(rustix::io::Errno::CONNRESET) => continue,
                Err(_) => return Err(false),
            }
        }
    }

    fn reap(&mut self) -> String {
        match self.reap_status() {
            Ok(s) => describe(s, None),
            Err(e) => e.to_string(),
        }
    }

    fn reap_status(&mut self) -> Result<std::process::ExitStatus, ProcessError> {
        self.reap_and_read(false).0
    }

    /// [`reap_status`](Self::reap_status), and the worker's last stderr
    /// lines (a failed `assert` in a handler says there which one).
    fn reap_with_stderr(&mut self) -> Reaped {
        self.reap_and_read(true)
    }

    fn reap_and_read(&mut self, read: bool) -> Reaped {
        let Some((mut child, sock, stderr)) = self.worker.take() else {
            return (Err(ProcessError::NotRunning), None);
        };
        // Killing an exiting process keeps its exit status (a crash stays
        // a crash).
        let _ = child.kill();
        drop(sock);
        let status = child.wait().map_err(ProcessError::Wait);
        // Only a death's message waits for the end of the stream.
        let words = stderr.filter(|_| read).and_then(StderrTail::last_words);
        (status, words)
    }
}

/// How a handler worker ended; the cores' hints (output memory, …) do not
/// apply to handlers.
fn describe_handler_end(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    let hint = match s.signal() {
        Some(libc::SIGSEGV) => " (an invalid memory access: a bad pointer, or a write past the scratchpad, shared memory or counters)",
        Some(libc::SIGBUS) => " (a bad memory access)",
        Some(libc::SIGFPE) => " (an arithmetic error, e.g. an integer division by zero)",
        Some(libc::SIGABRT) => " (the handler called abort(), or an assertion failed)",
        _ => return describe(s, None),
    };
    let plain = describe(s, None);
    let name = plain.split(" (").next().unwrap_or(&plain);
    format!("{name}{hint}")
}

fn describe_msg(m: &Msg) -> String {
    match m {
        Msg::Output(p) => format!("{} result bytes past the output budget", p.len()),
        Msg::Notify(n) => format!("a notification of {} bytes", n.len()),
        other => format!("{:?}", std::mem::discriminant(other)),
    }
}

impl Drop for HandlerWorker {
    fn drop(&mut self) {
        self.reap();
    }
}

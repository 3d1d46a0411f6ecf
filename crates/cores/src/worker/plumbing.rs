//! Process plumbing of the node side: placing a worker's descriptors
//! before exec, and describing how a worker ended.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rustix::event::{epoll, PollFd, PollFlags};
use rustix::net::{AddressFamily, SendFlags, SocketFlags, SocketType};

use super::proto::Msg;
use super::{IsolatedCore, Worker, FD_CONTROL, SUBCOMMAND};

/// Why a worker process did not start, or could not be reaped.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("socketpair: {0}")]
    SocketPair(rustix::io::Errno),
    #[error("cannot start the {what} {program}: {error}")]
    Exec {
        what: &'static str,
        program: String,
        error: std::io::Error,
    },
    #[error("was not running")]
    NotRunning,
    #[error("could not be reaped: {0}")]
    Wait(std::io::Error),
}

impl IsolatedCore {
    /// Starts a worker and sends it its init message.
    pub(super) fn spawn(&self) -> Result<Worker, ProcessError> {
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(ProcessError::SocketPair)?;
        let fds = [
            theirs.as_raw_fd(),
            self.region_fd.as_raw_fd(),
            self.shared.artifact.as_raw_fd(),
            self.event.as_raw_fd(),
        ];
        let mut cmd = Command::new(&self.shared.program);
        cmd.arg(SUBCOMMAND)
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: `place_fds` only makes async-signal-safe calls.
        unsafe { cmd.pre_exec(move || place_fds(fds)) };
        let mut child = cmd.spawn().map_err(|error| ProcessError::Exec {
            what: "core worker",
            program: self.shared.program.display().to_string(),
            error,
        })?;
        drop(theirs);
        let stderr = child.stderr.take().map(StderrTail::start);
        // Its hang-up (the worker ended) makes the ready set readable.
        let _ = epoll::add(
            &self.ready,
            &ours,
            epoll::EventData::new_u64(1),
            epoll::EventFlags::RDHUP,
        );
        let w = Worker {
            child,
            sock: ours,
            timeout: Duration::ZERO,
            stderr,
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

    /// Kills and reaps the worker; describes how it ended.
    pub(super) fn reap(&mut self) -> String {
        match self.reap_status() {
            Ok(s) => describe(s, None),
            Err(e) => e.to_string(),
        }
    }

    pub(super) fn reap_status(&mut self) -> Result<std::process::ExitStatus, ProcessError> {
        self.reap_and_read(false).0
    }

    /// [`reap_status`](Self::reap_status), and what the worker last wrote
    /// to its stderr (a failed `assert` says there which one failed).
    pub(super) fn reap_with_stderr(&mut self) -> Reaped {
        self.reap_and_read(true)
    }

    fn reap_and_read(&mut self, read: bool) -> Reaped {
        let Some(mut w) = self.worker.take() else {
            return (Err(ProcessError::NotRunning), None);
        };
        // Killing an exiting process does not change its exit status, so a
        // crash is still reported as the crash; one that closed its channel
        // and lives on is not waited for forever.
        let _ = w.child.kill();
        let _ = epoll::delete(&self.ready, &w.sock);
        drop(w.sock);
        let status = w.child.wait().map_err(ProcessError::Wait);
        // Only a death's message waits for the end of the stream.
        let words = w.stderr.filter(|_| read).and_then(StderrTail::last_words);
        (status, words)
    }

    /// Whether the worker process has ended (its channel hung up).
    pub(super) fn worker_gone(&self) -> bool {
        let Some(w) = &self.worker else { return true };
        let mut p = [PollFd::new(&w.sock, PollFlags::RDHUP)];
        match rustix::event::poll(&mut p, Some(&rustix::event::Timespec::default())) {
            Ok(_) => p[0]
                .revents()
                .intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR),
            Err(_) => false,
        }
    }
}

/// How a reaped worker ended, and its last stderr lines if asked for.
pub(super) type Reaped = (
    Result<std::process::ExitStatus, ProcessError>,
    Option<String>,
);

/// Most bytes of a worker's stderr kept for its error message.
pub(super) const STDERR_TAIL: usize = 2048;

/// Longest the node waits, once a worker is reaped, for the end of its
/// stderr: only a process the core started and that holds the pipe open
/// delays it; everything the worker wrote is in the pipe by then.
const STDERR_END: Duration = Duration::from_secs(1);

/// A worker's stderr, passed on to the node's stderr as it comes (what
/// operators read) while its last [`STDERR_TAIL`] bytes are kept for the
/// error the user gets when the worker dies.
pub(super) struct StderrTail {
    shared: Arc<(Mutex<Tail>, Condvar)>,
}

#[derive(Default)]
struct Tail {
    bytes: VecDeque<u8>,
    /// Bytes dropped from the front.
    cut: bool,
    ended: bool,
}

impl StderrTail {
    pub(super) fn start(mut pipe: std::process::ChildStderr) -> StderrTail {
        let shared = Arc::new((Mutex::new(Tail::default()), Condvar::new()));
        let theirs = shared.clone();
        let pass_on = move || {
            let mut buf = [0u8; 4096];
            loop {
                let n = match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let _ = std::io::stderr().write_all(&buf[..n]);
                let mut t = theirs.0.lock().unwrap_or_else(|e| e.into_inner());
                t.bytes.extend(&buf[..n]);
                if t.bytes.len() > STDERR_TAIL {
                    let extra = t.bytes.len() - STDERR_TAIL;
                    t.bytes.drain(..extra);
                    t.cut = true;
                }
            }
            theirs.0.lock().unwrap_or_else(|e| e.into_inner()).ended = true;
            theirs.1.notify_all();
        };
        // Without the thread the pipe closes and the worker's writes fail
        // (EPIPE: it ignores SIGPIPE, as Rust programs do); it runs on.
        let _ = std::thread::Builder::new()
            .name("core-stderr".into())
            .spawn(pass_on);
        StderrTail { shared }
    }

    /// The last lines of the stream, once it has ended (the worker is
    /// reaped), on one line; `None` if there were none.
    pub(super) fn last_words(self) -> Option<String> {
        let (lock, ended) = &*self.shared;
        let t = lock.lock().unwrap_or_else(|e| e.into_inner());
        let (t, _) = ended
            .wait_timeout_while(t, STDERR_END, |t| !t.ended)
            .unwrap_or_else(|e| e.into_inner());
        let bytes: Vec<u8> = t.bytes.iter().copied().collect();
        let text = String::from_utf8_lossy(&bytes);
        // A line cut at the front is dropped, unless it is the only one.
        let text = match (t.cut, text.split_once('\n')) {
            (true, Some((_, rest))) if !rest.trim().is_empty() => rest,
            _ => &text,
        };
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.is_empty())
            .collect();
        (!lines.is_empty()).then(|| lines.join(" | "))
    }
}

/// In the child between fork and exec: moves the descriptors to their
/// fixed numbers (first above 9, so no source is overwritten before
/// it is moved; dup2 clears close-on-exec on the copies), sends the core's
/// stdout to stderr (the node's stdout may be machine-read), and disables
/// core dumps (a crashing core is expected, not worth a dump).
pub(super) fn place_fds<const N: usize>(fds: [RawFd; N]) -> std::io::Result<()> {
    let mut tmp = [0; N];
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
pub(super) fn describe(s: std::process::ExitStatus, fault: Option<String>) -> String {
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

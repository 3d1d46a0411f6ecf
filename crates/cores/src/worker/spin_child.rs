//! The handler worker (init kind "spin"): loads an image's handler sets
//! from the artifact and runs the sPIN engine on the messages the node
//! streams to it, one message at a time, its payload handlers in parallel
//! on a pool of threads. A node runs several such workers
//! (`HandlerWorker::sibling`), all mapping the same handler memory
//! ([`super::spin_memory`]), to run several messages at once. User code
//! that crashes takes only this process down: the fault handler first
//! tells the node which handler set and stage was running. A handler call that outruns its time budget cannot be
//! interrupted inside a thread, so a monitor thread reports it and ends
//! the process; the node restarts it for the next message.

use std::cell::Cell;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustix::net::RecvFlags;

use super::child::{exit_with_the_node, send};
use super::proto::{Init, Msg, RefusalKind, SpinEnd, MAX_MESSAGE, MAX_PIECE};
use super::FD_CONTROL;
use crate::spin::engine::{Actions, ChunkRef, Memory};
use crate::spin::{Context, Engine, Handlers, NativeHandlers, Outcome, Pool, Stage};

thread_local! {
    /// (context + 1) << 8 | stage of the handler this thread runs; 0: none.
    /// Const-initialised, so the fault handler may read it.
    static RUNNING: Cell<u32> = const { Cell::new(0) };
}

fn stage_code(s: Stage) -> u8 {
    match s {
        Stage::Head => 0,
        Stage::Payload => 1,
        Stage::Tail => 2,
    }
}

/// Handler calls in progress, for the overrun monitor.
type Calls = Mutex<HashMap<ThreadId, (Instant, Duration, String, Stage)>>;

/// A handler set that records what runs where (for the fault handler and
/// the monitor).
struct Watched {
    inner: NativeHandlers,
    context: u32,
    budget: Duration,
    calls: Arc<Calls>,
}

impl Handlers for Watched {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn has(&self, stage: Stage) -> bool {
        self.inner.has(stage)
    }
    fn call(
        &self,
        stage: Stage,
        chunk: &ChunkRef<'_>,
        mem: &Memory,
        actions: &Actions<'_>,
    ) -> Result<(), String> {
        let me = std::thread::current().id();
        self.calls.lock().unwrap().insert(
            me,
            (
                Instant::now(),
                self.budget,
                self.inner.name().to_string(),
                stage,
            ),
        );
        RUNNING.with(|r| r.set((self.context + 1) << 8 | stage_code(stage) as u32));
        let r = self.inner.call(stage, chunk, mem, actions);
        RUNNING.with(|r| r.set(0));
        self.calls.lock().unwrap().remove(&me);
        r
    }
}

pub(super) fn run(
    sock: OwnedFd,
    memory: OwnedFd,
    artifact: OwnedFd,
    init: Init,
) -> Result<(), String> {
    report_faults()?;
    let calls: Arc<Calls> = Arc::default();
    let engine = match load(&artifact, &memory, &init, &calls) {
        Ok(e) => e,
        Err(why) => return send(&sock, &Msg::Refused(RefusalKind::Invalid, why)),
    };
    send(&sock, &Msg::Ready)?;
    exit_with_the_node(&sock)?;
    watch_overruns(&sock, calls)?;

    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut current: Option<crate::spin::engine::Message> = None;
    loop {
        let n = match rustix::net::recv(&sock, &mut buf[..], RecvFlags::empty()) {
            Ok((_, 0)) => return Ok(()),
            Ok((_, n)) => n.min(buf.len()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(format!("control channel: {e}")),
        };
        let (msg, eom) = match Msg::decode(&buf[..n]).map_err(|e| e.to_string())? {
            Msg::Begin { id, len, eom, data } => {
                match engine.begin(id, len).first_chunk(Bytes::from(data), eom) {
                    Some(m) => (m, eom),
                    None => {
                        // The node matched with the same rules: not reached
                        // unless the two disagree, and then the cores decide.
                        send(&sock, &Msg::Finished(SpinEnd::Forward, String::new()))?;
                        continue;
                    }
                }
            }
            Msg::Chunk { eom, data } => {
                let Some(mut m) = current.take() else {
                    return Err("a chunk without a message".into());
                };
                m.chunk(Bytes::from(data), eom);
                (m, eom)
            }
            m => return Err(format!("unexpected {m:?}")),
        };
        if !eom {
            current = Some(msg);
            continue;
        }
        // The monitor ends the process if a handler never returns, so the
        // wait is bounded by the budgets; the timeout is only a backstop.
        let Some(done) = msg.finish(Duration::from_secs(24 * 3600)) else {
            return Err("a message never finished".into());
        };
        for n in &done.notifications {
            send(&sock, &Msg::Notify(n.clone()))?;
        }
        if done.notifications_dropped > 0 {
            send(&sock, &Msg::NotesDropped(done.notifications_dropped))?;
        }
        let (end, why) = match done.outcome {
            Outcome::Result(bytes) => {
                for piece in bytes.chunks(MAX_PIECE) {
                    send(&sock, &Msg::Output(piece.to_vec()))?;
                }
                (SpinEnd::Result, String::new())
            }
            Outcome::Forward => (SpinEnd::Forward, String::new()),
            Outcome::Dropped => (SpinEnd::Dropped, String::new()),
            Outcome::Failed(e) => (SpinEnd::Failed, e),
        };
        send(&sock, &Msg::Finished(end, why))?;
    }
}

fn load(
    artifact: &OwnedFd,
    memory: &OwnedFd,
    init: &Init,
    calls: &Arc<Calls>,
) -> Result<Engine, String> {
    // The artifact is a sealed memfd: dlopen it through /proc.
    let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", artifact.as_raw_fd()));
    let mut contexts = Vec::with_capacity(init.spin.len());
    let memories = super::spin_memory::map(memory, &init.spin)?;
    for ((i, set), memory) in init.spin.iter().enumerate().zip(memories) {
        let inner = NativeHandlers::open(&path, &set.name)
            .map_err(|e| format!("handler set {:?}: {e}", set.name))?;
        let budgets = set.budgets.budgets();
        contexts.push(Context {
            ruleset: set.ruleset.clone(),
            handlers: Arc::new(Watched {
                inner,
                context: i as u32,
                budget: budgets.per_call,
                calls: calls.clone(),
            }),
            memory: Arc::new(memory),
            budgets,
        });
    }
    let pool = Pool::new(init.spin_threads.clamp(1, 64) as usize)
        .map_err(|e| format!("cannot start the handler threads: {e}"))?;
    Engine::new(contexts, Arc::new(pool)).map_err(|e| e.to_string())
}

/// Ends the process when a handler call outruns its budget, after telling
/// the node which one (the message fails; the node restarts the worker).
fn watch_overruns(sock: &OwnedFd, calls: Arc<Calls>) -> Result<(), String> {
    let sock = sock.try_clone().map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("spin-watch".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(5));
            let over = calls
                .lock()
                .unwrap()
                .values()
                .find(|(t, budget, _, _)| t.elapsed() > *budget)
                .map(|(t, budget, name, stage)| {
                    format!(
                        "{name}: {stage:?} handler still running after {:?}, over its budget of {budget:?}; it was stopped (the handler worker is restarted)",
                        t.elapsed()
                    )
                });
            if let Some(why) = over {
                let _ = send(&sock, &Msg::Finished(SpinEnd::Overrun, why));
                // SAFETY: _exit ends the process at once; no destructor runs
                // under a handler that still holds locks.
                unsafe { libc::_exit(3) };
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the watch thread: {e}"))
}

/// The first fault's report: 0 none yet, 1 being sent, 2 sent.
static REPORT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

extern "C" fn on_fault(sig: libc::c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    use std::sync::atomic::Ordering;
    // Async-signal-safe: a const thread-local read, atomics, send(2),
    // sched_yield(2) and signal(2). The first thread to fault reports it;
    // one faulting beside it (a message's pieces run on several threads)
    // waits until that report is sent: the default action it restores
    // would end the process with the report unsent.
    if REPORT
        .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        let running = RUNNING.with(|r| r.get());
        if running != 0 {
            let ctx = (running >> 8) - 1;
            let mut b = [b'X', 0, 0, 0, 0, (running & 0xff) as u8];
            b[1..5].copy_from_slice(&ctx.to_le_bytes());
            // SAFETY: send(2) is async-signal-safe; the buffer is on the stack.
            unsafe { libc::send(FD_CONTROL, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
        }
        REPORT.store(2, Ordering::Release);
    } else {
        // Bounded: a report stuck in a full socket must not hold the
        // process alive past the host's deadline.
        for _ in 0..1_000_000 {
            if REPORT.load(Ordering::Acquire) == 2 {
                break;
            }
            // SAFETY: a plain syscall without memory arguments.
            unsafe { libc::sched_yield() };
        }
    }
    // Returning re-runs the faulting instruction (or abort() re-raises)
    // under the default action, which ends the process.
    // SAFETY: signal(2) restoring the default is async-signal-safe.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

/// Installs [`on_fault`] for the signals a bad handler raises. Pool
/// threads have no alternate signal stack, so a handler that overflows its
/// stack is reported by the signal alone, without its stage.
fn report_faults() -> Result<(), String> {
    // SAFETY: the handler only makes async-signal-safe calls; the sigaction
    // struct is zero-initialised then filled.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_fault as *const () as usize;
        // Not SA_RESETHAND: a second thread faulting while the first
        // reports must reach the handler too (see on_fault).
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGABRT,
        ] {
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(format!("sigaction: {}", std::io::Error::last_os_error()));
            }
        }
    }
    Ok(())
}

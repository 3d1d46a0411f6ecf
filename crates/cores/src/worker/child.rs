//! The worker process: loads one core, then runs jobs out of the shared
//! memory in the order the node rings them through the header's doorbells
//! (the next one is often waiting when one ends), until the node closes
//! the control channel.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use corefarm_smp::CoreInfo;
use rustix::net::{RecvFlags, SendFlags};

use super::doorbell;
use super::proto::{Init, Msg, RefusalKind, MAX_MESSAGE};
use super::shm::{Header, Layout, Region};
use super::{FD_ARTIFACT, FD_CONTROL, FD_EVENT, FD_REGION};
use crate::bus::{Bus, BusError};
use crate::native::{NativeCore, NativeLib};
use crate::rtl::{AddressMap, RtlBus, RtlLib};
use crate::{Core, CoreError, Driver, DriverOptions, LoadError};

/// Entry point of the worker process (`corefarm __core-worker`). Never
/// returns: exits 0 when the node closes the channel, 2 on a protocol error.
pub fn main() -> ! {
    let code = match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("corefarm core worker: {e}");
            2
        }
    };
    std::process::exit(code)
}

/// Takes ownership of an fd the node placed at a fixed number.
fn inherited(n: i32, what: &str) -> Result<OwnedFd, String> {
    // SAFETY: F_GETFD only inspects the descriptor table.
    if unsafe { libc::fcntl(n, libc::F_GETFD) } < 0 {
        return Err(format!(
            "fd {n} ({what}) is not open: this command is started by a node manager, not by hand"
        ));
    }
    // SAFETY: the node put this descriptor here for this process alone
    // (docs/interfaces.md, worker protocol) and nothing else in the
    // process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

pub(super) fn send(sock: &OwnedFd, m: &Msg) -> Result<(), String> {
    rustix::net::send(sock, &m.encode(), SendFlags::NOSIGNAL)
        .map(drop)
        .map_err(|e| format!("control channel: {e}"))
}

fn run() -> Result<(), String> {
    let sock = inherited(FD_CONTROL, "control channel")?;
    let region_fd = inherited(FD_REGION, "shared memory")?;
    let artifact = inherited(FD_ARTIFACT, "artifact")?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (_, n) = rustix::net::recv(&sock, &mut buf[..], RecvFlags::empty())
        .map_err(|e| format!("control channel: {e}"))?;
    let init = match Msg::decode(&buf[..n.min(buf.len())]).map_err(|e| e.to_string())? {
        Msg::Init(i) => i,
        m => return Err(format!("expected the init message, got {m:?}")),
    };
    if init.kind == "spin" {
        // The region is the handler memory every worker of the pool shares.
        return super::spin_child::run(sock, region_fd, artifact, init);
    }
    let layout = Layout::with_slots(
        init.input_size as usize,
        init.output_size as usize,
        init.slots.max(1) as usize,
    );
    if layout.len as u64 != init.region_len || layout.slots != init.slots as usize {
        return Err(format!(
            "the node's shared region is {} bytes, this worker computes {}",
            init.region_len, layout.len
        ));
    }
    let event = inherited(FD_EVENT, "completion eventfd")?;
    let region = Region::map(&region_fd, layout, true).map_err(|e| format!("mmap: {e}"))?;
    drop(region_fd);
    // The region lives until the process exits: the core may keep pointers.
    let region: &'static Region = Box::leak(Box::new(region));
    let header = region.header();
    header.fault.store(0, Ordering::Relaxed);
    header
        .worker_base
        .store(region.at(0) as u64, Ordering::Relaxed);
    report_faults(header)?;

    let mut core = match load(&init, artifact, region.header()) {
        Ok(c) => c,
        Err(e) => {
            let (kind, why) = match e {
                LoadError::Unsupported(w) => (RefusalKind::Unsupported, w),
                LoadError::Invalid(w) => (RefusalKind::Invalid, w),
                LoadError::Backend(w) => (RefusalKind::Backend, w),
                e @ LoadError::Board(_) => (RefusalKind::Backend, e.to_string()),
                // The node checks signatures before it starts a worker.
                e @ LoadError::NoEntry(_) => (RefusalKind::Invalid, e.to_string()),
                e @ (LoadError::Untrusted(_) | LoadError::HandlerSets(_)) => {
                    (RefusalKind::Invalid, e.to_string())
                }
            };
            return send(&sock, &Msg::Refused(kind, why));
        }
    };
    // This thread runs the jobs: if it dies, the kernel marks `done` and
    // wakes the node. A job number already in the doorbell (left by a
    // worker this one replaces) is not a job for this one.
    doorbell::watch_death(&header.done)?;
    let tid = doorbell::tid();
    header.worker_tid.store(tid, Ordering::Relaxed);
    let mut last = header.job.load(Ordering::Acquire) >> 1;
    header.job.store(last << 1, Ordering::Release);
    header.completed.store(last, Ordering::Release);
    header.done.store(tid, Ordering::Release);
    send(&sock, &Msg::Ready)?;
    exit_with_the_node(&sock)?;

    loop {
        doorbell::next_job(&header.job, last);
        // In order: the node may already have rung the job after this one.
        let seq = last.wrapping_add(1) & doorbell::SEQ_MASK;
        last = seq;
        let entry = &header.jobs[(seq & 1) as usize];
        let first = (entry.first.load(Ordering::Relaxed) as usize).min(layout.slots);
        let count = (entry.count.load(Ordering::Relaxed) as usize).min(layout.slots - first);
        let (mut cycles, mut last_cycles, mut error) = (0u64, u64::MAX, None);
        for k in first..first + count {
            // SAFETY: both memories are mapped for the process's lifetime
            // (leaked above). Between ringing the job and its completion
            // the node does not touch the job's slots, and this thread is
            // the only one using them here.
            let (input, output) = unsafe {
                (
                    std::slice::from_raw_parts(region.at(layout.input_at(k)), layout.input_size),
                    std::slice::from_raw_parts_mut(
                        region.at(layout.output_at(k)),
                        layout.output_size,
                    ),
                )
            };
            let start = header.cycles_now.load(Ordering::Relaxed);
            header.cycles_at_start.store(start, Ordering::Relaxed);
            if let Err(e) = core.process(input, output) {
                error = Some(match e {
                    CoreError::Timeout(t) => {
                        let now = header.cycles_now.load(Ordering::Relaxed);
                        format!(
                            "timed out after {t:?}, {} simulated cycles into the job; the core was reset",
                            now.saturating_sub(start)
                        )
                    }
                    e => e.to_string(),
                });
                break;
            }
            // Counted for completed inputs only (a failed one's count
            // would be the previous input's).
            if let Some(c) = core.stats().last_cycles {
                last_cycles = c;
                cycles += c;
            }
            entry
                .progress
                .store((k - first) as u32 + 1, Ordering::Release);
        }
        entry.last_cycles.store(last_cycles, Ordering::Relaxed);
        entry.job_cycles.store(cycles, Ordering::Relaxed);
        entry.seq.store(seq, Ordering::Relaxed);
        let code = match error {
            None => doorbell::DONE_OK,
            Some(error) => {
                let cycles = Some(last_cycles).filter(|&c| c != u64::MAX);
                let seq = seq as u64;
                let error = Some(error);
                send(&sock, &Msg::Done { seq, cycles, error })?;
                doorbell::DONE_FAILED
            }
        };
        entry.code.store(code, Ordering::Relaxed);
        doorbell::complete(&header.done, &header.completed, seq);
        // After `completed` (both sequentially consistent): either the
        // node's event loop sees the completion or this sees its request.
        if header.notify.swap(0, Ordering::SeqCst) != 0 {
            let _ = rustix::io::write(&event, &1u64.to_ne_bytes());
        }
    }
}

/// Where the SIGSEGV/SIGBUS handler publishes the faulting address.
static FAULT: std::sync::OnceLock<&'static Header> = std::sync::OnceLock::new();

extern "C" fn on_fault(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // Async-signal-safe: an atomic load of a set OnceLock and an atomic
    // store. SA_RESETHAND restored the default action, so returning re-runs
    // the access, which now kills the process with the same signal.
    if let Some(h) = FAULT.get() {
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        let addr = unsafe { (*info).si_addr() } as u64;
        h.fault.store(addr.wrapping_add(1), Ordering::Relaxed);
    }
}

/// Installs the fault handler, on an alternate stack so that a core that
/// overflows its stack is reported too.
fn report_faults(header: &'static Header) -> Result<(), String> {
    let _ = FAULT.set(header);
    let stack = Box::leak(vec![0u8; 64 * 1024].into_boxed_slice());
    let ss = libc::stack_t {
        ss_sp: stack.as_mut_ptr().cast(),
        ss_flags: 0,
        ss_size: stack.len(),
    };
    // SAFETY: the stack is leaked (lives until exit); the handler only
    // makes async-signal-safe calls; sigaction structs are zero-initialised
    // then filled.
    unsafe {
        if libc::sigaltstack(&ss, std::ptr::null_mut()) != 0 {
            return Err(format!("sigaltstack: {}", std::io::Error::last_os_error()));
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_fault as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        for sig in [libc::SIGSEGV, libc::SIGBUS] {
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(format!("sigaction: {}", std::io::Error::last_os_error()));
            }
        }
    }
    Ok(())
}

/// A thread that ends this process as soon as the node's end of the
/// channel closes, even while a job never returns: a worker must not
/// outlive its node (a dead node cannot kill it any more).
pub(super) fn exit_with_the_node(sock: &OwnedFd) -> Result<(), String> {
    let fd = sock
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("node-watch".into())
        .spawn(move || loop {
            let mut p = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::RDHUP,
            )];
            match rustix::event::poll(&mut p, None) {
                // _exit: no atexit handlers or C++ destructors of the core's
                // code while the main thread may still be running it.
                Ok(_) if !p[0].revents().is_empty() => {
                    // SAFETY: _exit ends the process at once; nothing runs after it.
                    unsafe { libc::_exit(0) }
                }
                _ => continue,
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the watch thread: {e}"))
}

/// Reads the whole artifact with positioned reads: the node and the other
/// workers share the descriptor's file offset.
fn read_artifact(fd: &OwnedFd) -> Result<Vec<u8>, LoadError> {
    use std::os::unix::fs::FileExt;
    let err = |e: std::io::Error| LoadError::Backend(format!("cannot read the artifact: {e}"));
    let file = std::fs::File::from(fd.try_clone().map_err(err)?);
    let len = file.metadata().map_err(err)?.len();
    let mut so = vec![
        0u8;
        usize::try_from(len)
            .map_err(|_| LoadError::Backend("artifact too large".into()))?
    ];
    file.read_exact_at(&mut so, 0).map_err(err)?;
    Ok(so)
}

/// dlopens the sealed artifact through /proc: a worker loads one core, so
/// it needs no copy of its own, and nothing is written to disk that a
/// worker killed by its core's initialisers would leave behind. Where
/// memory files may not be mapped executable (`vm.memfd_noexec`), the
/// object is copied to a temporary file as before (`copy`), and that
/// attempt's error is the one reported.
fn open_artifact<T>(
    artifact: &OwnedFd,
    open: impl FnOnce(&std::path::Path) -> Result<T, LoadError>,
    copy: impl FnOnce(&[u8]) -> Result<T, LoadError>,
) -> Result<T, LoadError> {
    let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", artifact.as_raw_fd()));
    match open(&path) {
        Ok(lib) => Ok(lib),
        Err(_) => copy(&read_artifact(artifact)?),
    }
}

fn load(
    init: &Init,
    artifact: OwnedFd,
    header: &'static Header,
) -> Result<Box<dyn Core>, LoadError> {
    match init.kind.as_str() {
        "native" => {
            let lib = open_artifact(
                &artifact,
                |path| NativeLib::open(path, &init.entry),
                |so| NativeLib::load(so, &init.entry),
            )?;
            Ok(Box::new(NativeCore::new(
                lib,
                init.input_size,
                init.output_size,
            )))
        }
        "rtl" => {
            let lib = Arc::new(open_artifact(&artifact, RtlLib::open, RtlLib::load)?);
            crate::check_rtl_top(&lib, &init.entry)?;
            let [control, input, output] = init.core;
            let core = CoreInfo {
                control,
                input,
                output,
            };
            let protocol = init.control.as_ref();
            let map = Arc::new(AddressMap::with_control(
                &[core],
                init.input_size,
                init.output_size,
                protocol,
            ));
            let bus = Publishing {
                inner: RtlBus::new(lib, map, 0)?,
                control: control as u64,
                header,
            };
            let opts = DriverOptions {
                timeout: Duration::from_micros(init.timeout_us),
                poll: Duration::from_micros(init.poll_us),
            };
            let d = Driver::with_control(
                Box::new(bus),
                core,
                init.input_size,
                init.output_size,
                protocol,
                opts,
            )
            .map_err(|e| LoadError::Backend(e.to_string()))?;
            Ok(Box::new(d))
        }
        k => Err(LoadError::Unsupported(format!("no worker backend {k:?}"))),
    }
}

/// An RTL bus that publishes the simulated cycle count in the shared
/// header after every operation, so the node can say how far a job got
/// when it has to kill the worker.
struct Publishing {
    inner: RtlBus,
    control: u64,
    header: &'static Header,
}

impl Publishing {
    fn publish(&self) {
        if let Some(c) = self.inner.cycles(self.control) {
            self.header.cycles_now.store(c, Ordering::Relaxed);
        }
    }
}

impl Bus for Publishing {
    fn read64(&mut self, addr: u64) -> Result<u64, BusError> {
        self.inner.read64(addr)
    }
    fn write64(&mut self, addr: u64, value: u64) -> Result<(), BusError> {
        self.inner.write64(addr, value)
    }
    fn read_block(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), BusError> {
        let r = self.inner.read_block(addr, buf);
        self.publish();
        r
    }
    fn write_block(&mut self, addr: u64, data: &[u8]) -> Result<(), BusError> {
        let r = self.inner.write_block(addr, data);
        self.publish();
        r
    }
    fn idle(&mut self, budget: Duration) {
        self.inner.idle(budget);
        self.publish();
    }
    fn irq(&mut self, control: u64) -> Option<bool> {
        self.inner.irq(control)
    }
    fn reset(&mut self, control: u64) -> bool {
        self.inner.reset(control)
    }
    fn cycles(&self, control: u64) -> Option<u64> {
        self.inner.cycles(control)
    }
    fn dma_window(&self) -> Option<crate::bus::DmaWindow> {
        self.inner.dma_window()
    }
}

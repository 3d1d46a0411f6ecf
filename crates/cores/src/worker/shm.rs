//! The memory a node and one core worker share: a memfd holding a header
//! page and `slots` pairs of input and output memories (one pair per input
//! of a batch), each memory between guard pages.
//!
//! ```text
//! page 0        header (doorbells, worker-published counters)
//! page 1        guard
//! slot 0:
//!   input area    input right-aligned against the next guard (16-byte aligned start)
//!   guard
//!   output area   output right-aligned against the next guard
//!   guard
//! slot 1: the same, `stride` bytes further
//! ...
//! ```
//!
//! The worker maps the guards `PROT_NONE` and the inputs read-only, so a
//! core that writes into its input, or far past its output, faults at once
//! in its own process. The output does not end exactly at its guard: its
//! start is placed half a page (plus 128 bytes) away from the input's start
//! modulo the page size. With both memories page-aligned, as sizes that are
//! multiples of 4 KiB would make them, every store to the output shares
//! its page offset with loads from the input ("4K aliasing"), which cost
//! the reference matrix product about 7 %. The slack this leaves between
//! each output's end and its guard (less than a page + 16 bytes) holds a
//! canary the node checks after every job, so a short overrun is caught
//! too.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

/// Alignment of both memories, as [`crate::native::ALIGN`].
const ALIGN: usize = crate::native::ALIGN;
/// Byte the node keeps in the output's slack.
pub const CANARY: u8 = 0xC5;
/// Bytes of input and output a region holds at most, all slots together
/// (the slots of two jobs in flight); at least two slots are always made.
const BATCH_BYTES: usize = 1 << 20;
/// Most inputs of one batch.
pub const MAX_SLOTS: usize = 64;

/// Offsets of the region for one pair of sizes; both sides compute it from
/// the sizes and the page size, so only the sizes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub page: usize,
    pub input_area: usize,
    pub input_area_len: usize,
    pub output_area: usize,
    pub output_area_len: usize,
    pub input: usize,
    pub input_size: usize,
    pub output: usize,
    pub output_size: usize,
    /// Input/output pairs, `stride` bytes apart.
    pub slots: usize,
    pub stride: usize,
    pub len: usize,
}

impl Layout {
    pub fn new(input_size: usize, output_size: usize) -> Layout {
        // At least two: one job runs while the node fills the next.
        let slots = (BATCH_BYTES / (input_size + output_size).max(1)).clamp(2, MAX_SLOTS);
        Self::with_slots(input_size, output_size, slots)
    }

    pub fn with_slots(input_size: usize, output_size: usize, slots: usize) -> Layout {
        let page = rustix::param::page_size();
        let r16 = |n: usize| n.div_ceil(ALIGN) * ALIGN;
        let area = |n: usize| r16(n).div_ceil(page).max(1) * page;
        let input_area = 2 * page;
        let input_area_len = area(input_size);
        let input = input_area + input_area_len - r16(input_size);
        let output_area = input_area + input_area_len + page;
        // One page more than needed, to move the output's start (see above).
        let output_area_len = area(output_size) + page;
        let end = output_area + output_area_len - r16(output_size);
        let want = (input + page / 2 + 128) % page;
        let output = end - (end % page + page - want) % page;
        // A multiple of the page size, so every slot has the same offsets
        // modulo a page (and so the same aliasing and slack).
        let stride = input_area_len + page + output_area_len + page;
        Layout {
            page,
            input_area,
            input_area_len,
            output_area,
            output_area_len,
            input,
            input_size,
            output,
            output_size,
            slots,
            stride,
            len: input_area + slots * stride,
        }
    }

    /// Offset of slot `k`'s input memory.
    pub fn input_at(&self, k: usize) -> usize {
        self.input + k * self.stride
    }

    /// Offset of slot `k`'s output memory.
    pub fn output_at(&self, k: usize) -> usize {
        self.output + k * self.stride
    }

    /// Slot `k`'s output slack before its guard page (less than a page +
    /// 16 bytes).
    pub fn slack(&self, k: usize) -> std::ops::Range<usize> {
        let at = k * self.stride;
        at + self.output + self.output_size..at + self.output_area + self.output_area_len
    }
}

/// One job's entry in the header; job `seq` uses entry `seq & 1`, so the
/// node can describe the next job while the worker runs the current one.
#[repr(C, align(64))]
pub struct JobEntry {
    /// node → worker, before ringing: the job's first slot and its inputs.
    pub first: AtomicU32,
    pub count: AtomicU32,
    /// worker → node: inputs completed so far (zeroed by the node before
    /// ringing; for the watchdog and to say which input failed).
    pub progress: AtomicU32,
    /// worker → node, before it publishes the completion: the outcome
    /// (`doorbell::DONE_OK` or `DONE_FAILED`) and the job it is for.
    pub code: AtomicU32,
    pub seq: AtomicU32,
    /// Simulated cycles of the job's last input and of all its inputs
    /// (u64::MAX: the core counts none).
    pub last_cycles: AtomicU64,
    pub job_cycles: AtomicU64,
}

/// The start of the header page: the doorbells (futex words, see
/// `doorbell`), the two job entries and counters the worker publishes.
#[repr(C)]
pub struct Header {
    /// node → worker: the newest job's sequence number shifted left by
    /// one; bit 0 is set by a worker asleep on this word. The worker runs
    /// jobs in order, so the job after the one it finished may already be
    /// waiting here.
    pub job: AtomicU32,
    /// The worker's job thread id for as long as it lives, as a robust
    /// futex (the kernel marks it OWNER_DIED and wakes the node if the
    /// thread dies); a node asleep on it sets WAITERS.
    pub done: AtomicU32,
    /// worker → node: the sequence number of the last completed job.
    pub completed: AtomicU32,
    /// The worker's job thread id, as the kernel writes it into `done`.
    pub worker_tid: AtomicU32,
    /// Simulated cycles of the core so far (RTL only).
    pub cycles_now: AtomicU64,
    /// `cycles_now` when the current input started.
    pub cycles_at_start: AtomicU64,
    /// Address of the worker's own mapping of the region.
    pub worker_base: AtomicU64,
    /// Address whose access raised SIGSEGV or SIGBUS in the worker, plus one
    /// (0: none), stored by its signal handler just before it dies.
    pub fault: AtomicU64,
    /// Set by a node that waits for the next completion on its event loop
    /// (the eventfd at `FD_EVENT`) rather than asleep on `done`; the
    /// worker, after storing `completed`, clears it and signals the
    /// eventfd only if it was set.
    pub notify: AtomicU32,
    pub jobs: [JobEntry; 2],
}

/// Where a faulting address lies, for the node's message.
pub fn describe_fault(l: &Layout, base: u64, addr: u64) -> String {
    let Some(off) = addr.checked_sub(base).filter(|&o| o < l.len as u64) else {
        return if addr < 4096 {
            format!("at address {addr:#x} (a null pointer)")
        } else {
            format!("at address {addr:#x}, outside its memories")
        };
    };
    let mut off = off as usize;
    if off >= l.input_area {
        // The same place in slot 0: every slot has the same offsets.
        off = l.input_area + (off - l.input_area) % l.stride;
    }
    let (isz, osz) = (l.input_size, l.output_size);
    if off >= l.output {
        let at = off - l.output;
        let past = if at >= osz { ", past its end" } else { "" };
        format!("at byte {at} of its {osz}-byte output memory{past}")
    } else if off >= l.input && off < l.input + isz {
        format!(
            "at byte {} of its {isz}-byte input memory, which is read-only",
            off - l.input
        )
    } else if off >= l.input {
        format!(
            "at byte {} of its {isz}-byte input memory, past its end",
            off - l.input
        )
    } else {
        format!("{} bytes before its input memory", l.input - off)
    }
}

/// A mapping of the whole region.
pub struct Region {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the region is plain shared memory; the owner accesses it through
// raw pointers only while the protocol gives it the memory (see worker/).
unsafe impl Send for Region {}

/// A new memfd sized for `layout`.
pub fn create(layout: &Layout) -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(
        "corefarm-core",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&fd, layout.len as u64)?;
    // The size can no longer change: neither side can make the other's
    // mapping fault by truncating the file.
    rustix::fs::fcntl_add_seals(
        &fd,
        rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW | rustix::fs::SealFlags::SEAL,
    )?;
    Ok(fd)
}

impl Region {
    /// Maps `fd` (of at least `layout.len` bytes). `worker` applies the
    /// worker's protections (guards, read-only input); the node maps all
    /// of it read/write.
    pub fn map(fd: impl AsFd, layout: Layout, worker: bool) -> std::io::Result<Region> {
        let prot = if worker {
            ProtFlags::empty()
        } else {
            ProtFlags::READ | ProtFlags::WRITE
        };
        // SAFETY: a fresh mapping chosen by the kernel (no fixed address),
        // of a file that is at least `len` bytes and sealed against shrinking.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                layout.len,
                prot,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        let region = Region {
            ptr: NonNull::new(p.cast()).expect("mmap returned null"),
            layout,
        };
        if worker {
            let rw = MprotectFlags::READ | MprotectFlags::WRITE;
            region.protect(0, layout.page, rw)?;
            for k in 0..layout.slots {
                let at = k * layout.stride;
                let (i, o) = (at + layout.input_area, at + layout.output_area);
                region.protect(i, layout.input_area_len, MprotectFlags::READ)?;
                region.protect(o, layout.output_area_len, rw)?;
            }
        }
        Ok(region)
    }

    fn protect(&self, off: usize, len: usize, flags: MprotectFlags) -> std::io::Result<()> {
        // SAFETY: page-aligned range inside our own mapping; nothing in this
        // process holds references into it yet.
        unsafe { rustix::mm::mprotect(self.ptr.as_ptr().add(off).cast(), len, flags)? };
        Ok(())
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the header page is mapped read/write on both sides for the
        // region's lifetime; it only holds atomics, which may be shared.
        unsafe { &*self.ptr.as_ptr().cast::<Header>() }
    }

    /// Pointer to byte `off` of the region.
    pub fn at(&self, off: usize) -> *mut u8 {
        assert!(off <= self.layout.len);
        // SAFETY: within the mapping (checked above).
        unsafe { self.ptr.as_ptr().add(off) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no references
        // into it outlive the region.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.layout.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memories_end_at_their_guards_and_start_aligned() {
        for (i, o) in [
            (1, 1),
            (16, 16),
            (20, 12),
            (32768, 16384),
            (4096, 4097),
            (0, 8),
        ] {
            let l = Layout::new(i, o);
            assert_eq!(l.input % ALIGN, 0);
            assert_eq!(l.output % ALIGN, 0);
            assert!(l.input >= l.input_area && l.input + i <= l.input_area + l.input_area_len);
            assert!(l.output >= l.output_area);
            assert!(l.output + o <= l.output_area + l.output_area_len);
            let last = l.slots - 1;
            assert!(
                l.slack(0).len() < l.page + ALIGN,
                "{i}/{o}: {:?}",
                l.slack(0)
            );
            assert_eq!(l.slack(last).len(), l.slack(0).len());
            assert_eq!(l.slack(last).end + l.page, l.len);
            assert_eq!(l.output_at(last) - l.input_at(last), l.output - l.input);
            assert_eq!(
                (l.output + l.page - l.input % l.page) % l.page,
                l.page / 2 + 128
            );
            assert_eq!((l.input_area + l.input_area_len) % l.page, 0);
            assert_eq!(l.output_area, l.input_area + l.input_area_len + l.page);
            assert_eq!(
                l.stride,
                l.output_area + l.output_area_len + l.page - l.input_area
            );
            assert_eq!(l.stride % l.page, 0);
            assert_eq!(l.len, l.input_area + l.slots * l.stride);
            assert!(l.slots >= 2 && l.slots <= MAX_SLOTS);
            assert!(l.slots == 2 || l.slots * (i + o) <= BATCH_BYTES);
        }
        assert_eq!(Layout::new(32768, 16384).slots, 21);
        assert_eq!(Layout::new(64, 64).slots, MAX_SLOTS);
        assert_eq!(Layout::new(4 << 20, 16).slots, 2);
    }

    #[test]
    fn header_fits_its_page() {
        assert!(std::mem::size_of::<Header>() <= 4096);
    }

    #[test]
    fn faults_are_located() {
        let l = Layout::new(64, 64);
        let base = 0x7000_0000_0000u64;
        let at = |off: usize| describe_fault(&l, base, base + off as u64);
        assert_eq!(
            at(l.output + 70),
            "at byte 70 of its 64-byte output memory, past its end"
        );
        assert_eq!(
            at(l.input + 3),
            "at byte 3 of its 64-byte input memory, which is read-only"
        );
        assert_eq!(
            at(l.input + 64),
            "at byte 64 of its 64-byte input memory, past its end"
        );
        assert_eq!(at(l.input - 8), "8 bytes before its input memory");
        assert_eq!(
            describe_fault(&l, base, 0),
            "at address 0x0 (a null pointer)"
        );
        assert!(describe_fault(&l, base, base - 1).contains("outside its memories"));
        // Slot 2: the same places, named the same way.
        let at2 = |off: usize| describe_fault(&l, base, base + (off + 2 * l.stride) as u64);
        assert_eq!(at2(l.output + 70), at(l.output + 70));
        assert_eq!(at2(l.input + 3), at(l.input + 3));
        assert_eq!(at2(l.input - 8), at(l.input - 8));
    }
}

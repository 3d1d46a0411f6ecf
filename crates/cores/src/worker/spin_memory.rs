//! The handler sets' memory that every handler worker of a node's pool
//! shares (sPIN's per-context shared memory and counters, kept across
//! messages): one memfd, created by the node side once per configuration
//! and mapped by each worker at start. Handlers of different messages may
//! therefore run at the same time in different processes on the same
//! bytes, which is why spin.h asks for atomics. A worker that crashes
//! leaves the memory as it was, and its replacement maps the same file.
//!
//! Layout, computed on both sides from the handler sets alone (so the
//! init message needs nothing new): per set, its counters (8-byte
//! aligned) then its shared bytes, rounded up to a page, then one guard
//! page the worker maps without access, so a write past one set's memory
//! faults instead of landing in the next set's.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

use crate::spin::{ContextMemory, HandlerSet};

/// Where one set's memory lies in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place {
    pub counters_at: usize,
    pub counters: usize,
    pub shared_at: usize,
    pub shared: usize,
    /// The guard page after it.
    pub guard_at: usize,
}

fn page() -> usize {
    rustix::param::page_size()
}

/// Each set's place and the file's length; `None` when the sets' budgets
/// together exceed the address space (a 32-bit board's, say).
pub(super) fn checked_layout(sets: &[HandlerSet]) -> Option<(Vec<Place>, usize)> {
    let page = page();
    let mut at: usize = 0;
    let mut places = Vec::with_capacity(sets.len());
    for s in sets {
        let counters = usize::try_from(s.budgets.counters).ok()?;
        let shared = usize::try_from(s.budgets.shared).ok()?;
        let shared_at = at.checked_add(counters.checked_mul(8)?)?;
        let guard_at = shared_at
            .checked_add(shared)?
            .checked_next_multiple_of(page)?;
        places.push(Place {
            counters_at: at,
            counters,
            shared_at,
            shared,
            guard_at,
        });
        at = guard_at.checked_add(page)?;
    }
    Some((places, at))
}

/// [`checked_layout`] of sets that [`create`] accepted.
pub(super) fn layout(sets: &[HandlerSet]) -> (Vec<Place>, usize) {
    checked_layout(sets).unwrap_or_default()
}

/// A new, zeroed memfd for `sets`, sealed against resizing (a worker
/// cannot make another's mapping fault by truncating it).
pub(super) fn create(sets: &[HandlerSet]) -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(
        "corefarm-handler-memory",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )?;
    let Some((_, len)) = checked_layout(sets) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the handler sets' counters and shared memory together exceed this machine's \
             address space",
        ));
    };
    rustix::fs::ftruncate(&fd, len as u64)?;
    rustix::fs::fcntl_add_seals(
        &fd,
        rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW | rustix::fs::SealFlags::SEAL,
    )?;
    Ok(fd)
}

/// The worker's mapping of the file; unmapped when the last context
/// using it is gone.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain shared memory reached only through raw pointers by
// handlers (their own synchronisation) and through atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map`; no context uses it
        // any more (they hold the Arc).
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}

/// Maps `fd` and gives each set its [`ContextMemory`], in order.
pub(super) fn map(fd: impl AsFd, sets: &[HandlerSet]) -> Result<Vec<ContextMemory>, String> {
    let (places, len) = layout(sets);
    if len == 0 {
        return Ok(Vec::new());
    }
    let size = rustix::fs::fstat(&fd).map_err(|e| format!("handler memory: {e}"))?;
    if (size.st_size as u64) < len as u64 {
        return Err(format!(
            "handler memory: {} bytes, the handler sets need {len}",
            size.st_size
        ));
    }
    // SAFETY: a fresh mapping chosen by the kernel, of a file at least
    // `len` bytes long and sealed against shrinking.
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
    }
    .map_err(|e| format!("handler memory: mmap: {e}"))?
    .cast::<u8>();
    let mapping = Arc::new(Mapping { ptr, len });
    places
        .iter()
        .map(|p| {
            // SAFETY: the guard page lies inside our mapping (layout) and
            // nothing uses it yet.
            unsafe {
                rustix::mm::mprotect(ptr.add(p.guard_at).cast(), page(), MprotectFlags::empty())
            }
            .map_err(|e| format!("handler memory: mprotect: {e}"))?;
            // SAFETY: both ranges lie inside the mapping, which `mapping`
            // keeps alive; counters start 8-byte aligned (page-aligned
            // places, counters first); only handlers and atomics use them.
            Ok(unsafe {
                ContextMemory::mapped(
                    ptr.add(p.shared_at),
                    p.shared,
                    ptr.add(p.counters_at).cast(),
                    p.counters,
                    mapping.clone(),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spin::{BudgetSpec, Mode, Ruleset};

    fn set(shared: u64, counters: u32) -> HandlerSet {
        HandlerSet {
            name: "s".into(),
            ruleset: Ruleset {
                mode: Mode::And,
                rules: Vec::new(),
            },
            budgets: BudgetSpec {
                shared,
                counters,
                ..BudgetSpec::default()
            },
            result_type: None,
        }
    }

    #[test]
    fn budgets_past_the_address_space_are_refused_not_an_overflow() {
        let huge = set(u64::MAX / 4, 1 << 20);
        assert!(checked_layout(&[huge.clone(), huge.clone(), huge.clone(), huge]).is_none());
        assert!(create(&[set(u64::MAX, 0)]).is_err());
    }

    #[test]
    fn each_set_starts_on_a_page_and_ends_at_a_guard() {
        let page = page();
        let (places, len) = layout(&[set(10, 3), set(0, 0), set(page as u64, 1)]);
        assert_eq!(places[0].counters_at, 0);
        assert_eq!(places[0].shared_at, 24);
        assert_eq!(places[0].guard_at, page);
        assert_eq!(places[1].counters_at, 2 * page);
        assert_eq!(places[1].guard_at, 2 * page);
        assert_eq!(places[2].counters_at, 3 * page);
        assert_eq!(places[2].guard_at, 5 * page);
        assert_eq!(len, 6 * page);
    }

    #[test]
    fn two_mappings_of_one_file_see_each_others_counters() {
        let sets = [set(16, 2), set(8, 1)];
        let fd = create(&sets).unwrap();
        let a = map(&fd, &sets).unwrap();
        let b = map(&fd, &sets).unwrap();
        assert_eq!(a[1].counters(), vec![0]);
        // A write through one mapping is a read through the other.
        a[1].counter(0)
            .unwrap()
            .fetch_add(5, std::sync::atomic::Ordering::AcqRel);
        assert_eq!(b[1].counters(), vec![5]);
        assert_eq!(b[0].counters(), vec![0, 0]);
    }
}

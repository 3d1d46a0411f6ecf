//! The memory handlers reach through raw pointers: a message's scratchpad
//! and an execution context's shared memory and counters (seed 004 §2.2).
//! Handlers synchronise in their own code (spin.h: atomics), so Rust never
//! forms references to these bytes while a handler may run.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Zeroed bytes that handlers reach only through a raw pointer: payload
/// handlers of a message write them concurrently (synchronising in their
/// own code, as spin.h asks), so Rust never forms a reference to them.
pub(super) struct RawBuf {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

// SAFETY: RawBuf owns its allocation; access to the bytes is the handlers'
// (raw pointers, their own synchronisation), never through Rust references.
unsafe impl Send for RawBuf {}
// SAFETY: as above.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    pub(super) fn zeroed(len: usize) -> RawBuf {
        let b: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        RawBuf {
            len: b.len(),
            ptr: Box::into_raw(b) as *mut u8,
        }
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from Box::into_raw of a boxed slice of len
        // bytes; no handler runs any more (the last Arc is gone).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// Memory of one execution context, kept across messages: on the heap in
/// process, or in a mapping every handler worker of a node's pool shares
/// (`crate::worker`), so that handlers of messages run by different
/// workers see each other's updates.
pub struct ContextMemory {
    pub(super) shared: *mut u8,
    pub(super) shared_len: usize,
    pub(super) counters: *const AtomicU64,
    pub(super) counters_len: usize,
    /// Keeps the memory alive as long as this context.
    _owner: Box<dyn Send + Sync>,
}

// SAFETY: the bytes are reached through raw pointers only (handlers, with
// their own synchronisation) and the counters are atomics; the owner keeps
// them alive and is itself Send + Sync.
unsafe impl Send for ContextMemory {}
// SAFETY: as above.
unsafe impl Sync for ContextMemory {}

impl ContextMemory {
    pub fn new(shared: u64, counters: u32) -> ContextMemory {
        let buf = RawBuf::zeroed(shared as usize);
        let c: Box<[AtomicU64]> = (0..counters).map(|_| AtomicU64::new(0)).collect();
        ContextMemory {
            shared: buf.ptr,
            shared_len: buf.len,
            counters: c.as_ptr(),
            counters_len: c.len(),
            _owner: Box::new((buf, c)),
        }
    }

    /// Memory inside a mapping that `owner` keeps alive.
    ///
    /// # Safety
    /// `shared` must be valid for `shared_len` bytes and `counters` (8-byte
    /// aligned) for `counters_len` u64s, both for as long as `owner` lives,
    /// and reached by nothing but handlers and atomics.
    pub unsafe fn mapped(
        shared: *mut u8,
        shared_len: usize,
        counters: *mut u64,
        counters_len: usize,
        owner: Arc<dyn Send + Sync>,
    ) -> ContextMemory {
        ContextMemory {
            shared,
            shared_len,
            counters: counters.cast_const().cast(),
            counters_len,
            _owner: Box::new(owner),
        }
    }

    fn counter_slice(&self) -> &[AtomicU64] {
        if self.counters_len == 0 {
            return &[];
        }
        // SAFETY: valid, aligned and alive for our lifetime (constructors);
        // AtomicU64 has u64's layout and may be shared.
        unsafe { std::slice::from_raw_parts(self.counters, self.counters_len) }
    }

    /// Counter `i`, to update from Rust as handlers do from C.
    pub fn counter(&self, i: usize) -> Option<&AtomicU64> {
        self.counter_slice().get(i)
    }

    pub fn counters(&self) -> Vec<u64> {
        self.counter_slice()
            .iter()
            .map(|c| c.load(std::sync::atomic::Ordering::Acquire))
            .collect()
    }
}

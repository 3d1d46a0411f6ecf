//! Handler sets written in C against `include/corefarm/spin.h`: the three
//! functions `<set>_head`, `<set>_payload`, `<set>_tail` of a shared object.

use std::ffi::{c_int, c_void};
use std::path::Path;

use super::engine::{Actions, ChunkRef, Handlers, Memory, Stage};

/// `cf_spin_args` of spin.h.
#[repr(C)]
struct Args {
    message_id: u32,
    chunk_index: u32,
    offset: u64,
    message_len: u64,
    data: *const u8,
    len: u32,
    eom: u32,
    scratch: *mut u8,
    scratch_len: u32,
    counters_len: u32,
    shared: *mut u8,
    shared_len: u64,
    counters: *mut u64,
}

/// `cf_spin_ops` of spin.h.
#[repr(C)]
struct Ops {
    ctx: *mut c_void,
    emit: unsafe extern "C" fn(*mut c_void, *const u8, u32) -> c_int,
    forward: unsafe extern "C" fn(*mut c_void),
    drop: unsafe extern "C" fn(*mut c_void),
    notify: unsafe extern "C" fn(*mut c_void, *const u8, u32) -> c_int,
}

type HandlerFn = unsafe extern "C" fn(*const Args, *const Ops) -> c_int;

/// Rebuilds the byte slice a handler passed to an action. A null pointer
/// with a length, or a length the handler made up, is the handler's fault;
/// a null pointer with length 0 is an empty slice.
///
/// # Safety
/// `p` must point to `len` readable bytes for the duration of the call.
unsafe fn bytes<'a>(p: *const u8, len: u32) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's contract (the handler passes its own buffer).
    Some(unsafe { std::slice::from_raw_parts(p, len as usize) })
}

unsafe extern "C" fn emit(ctx: *mut c_void, p: *const u8, len: u32) -> c_int {
    // SAFETY: ctx is the `Actions` of the current call (set in `call`),
    // alive until the handler returns; actions are only valid during it.
    let actions = unsafe { &*(ctx as *const Actions<'_>) };
    // SAFETY: the handler vouches for its buffer (spin.h).
    match unsafe { bytes(p, len) } {
        Some(b) if actions.emit(b) => 0,
        _ => -1,
    }
}

unsafe extern "C" fn forward(ctx: *mut c_void) {
    // SAFETY: as in `emit`.
    unsafe { &*(ctx as *const Actions<'_>) }.forward();
}

unsafe extern "C" fn drop_message(ctx: *mut c_void) {
    // SAFETY: as in `emit`.
    unsafe { &*(ctx as *const Actions<'_>) }.drop_message();
}

unsafe extern "C" fn notify(ctx: *mut c_void, p: *const u8, len: u32) -> c_int {
    // SAFETY: as in `emit`.
    let actions = unsafe { &*(ctx as *const Actions<'_>) };
    // SAFETY: as in `emit`.
    match unsafe { bytes(p, len) } {
        Some(b) if actions.notify(b) => 0,
        _ => -1,
    }
}

/// A handler set loaded from a shared object.
pub struct NativeHandlers {
    name: String,
    _lib: libloading::Library,
    head: Option<HandlerFn>,
    payload: Option<HandlerFn>,
    tail: Option<HandlerFn>,
}

impl NativeHandlers {
    /// dlopens `path` and resolves `<set>_head/_payload/_tail`; at least
    /// one must exist.
    pub fn open(path: &Path, set: &str) -> Result<NativeHandlers, String> {
        if set.is_empty() || !set.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("invalid handler set name {set:?} (a C identifier)"));
        }
        // SAFETY: loading runs the object's initialisers; the object comes
        // from an image the user chose to run on this node (the trust model
        // of every core, docs/images.md).
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("handler object cannot be loaded: {e}"))?;
        let get = |stage: &str| -> Option<HandlerFn> {
            let sym = format!("{set}_{stage}");
            // SAFETY: spin.h fixes the type of every handler symbol; the
            // copied pointer is used only while `lib` keeps the code mapped.
            unsafe { lib.get::<HandlerFn>(sym.as_bytes()) }
                .ok()
                .map(|s| *s)
        };
        let (head, payload, tail) = (get("head"), get("payload"), get("tail"));
        if head.is_none() && payload.is_none() && tail.is_none() {
            return Err(format!(
                "the handler object defines none of {set}_head, {set}_payload, {set}_tail"
            ));
        }
        Ok(NativeHandlers {
            name: format!("handler set {set}"),
            _lib: lib,
            head,
            payload,
            tail,
        })
    }

    fn get(&self, stage: Stage) -> Option<HandlerFn> {
        match stage {
            Stage::Head => self.head,
            Stage::Payload => self.payload,
            Stage::Tail => self.tail,
        }
    }
}

impl Handlers for NativeHandlers {
    fn name(&self) -> &str {
        &self.name
    }

    fn has(&self, stage: Stage) -> bool {
        self.get(stage).is_some()
    }

    fn call(
        &self,
        stage: Stage,
        chunk: &ChunkRef<'_>,
        mem: &Memory,
        actions: &Actions<'_>,
    ) -> Result<(), String> {
        let Some(f) = self.get(stage) else {
            return Ok(());
        };
        let args = Args {
            message_id: chunk.message_id,
            chunk_index: chunk.index,
            offset: chunk.offset,
            message_len: chunk.message_len,
            data: if chunk.data.is_empty() {
                std::ptr::null()
            } else {
                chunk.data.as_ptr()
            },
            len: chunk.data.len() as u32,
            eom: chunk.eom as u32,
            scratch: mem.scratch,
            scratch_len: mem.scratch_len,
            counters_len: mem.counters_len,
            shared: mem.shared,
            shared_len: mem.shared_len,
            counters: mem.counters,
        };
        let ops = Ops {
            ctx: actions as *const Actions<'_> as *mut c_void,
            emit,
            forward,
            drop: drop_message,
            notify,
        };
        // SAFETY: `f` has spin.h's handler type; `args` and `ops` live until
        // it returns, their pointers are valid for the lengths given, and
        // `ops.ctx` is the `Actions` the trampolines expect. A handler that
        // breaks the contract (writes past its buffers) is user code at
        // fault; containing that is the worker process's job.
        let rc = unsafe { f(&args, &ops) };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("returned {rc}"))
        }
    }
}

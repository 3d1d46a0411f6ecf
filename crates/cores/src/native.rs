//! Native soft cores: a shared object exporting
//! `void entry(const uint8_t *in, uint8_t *out)` (docs/interfaces.md).
//!
//! Unlike the RTL and FPGA backends, a native core does not go through the
//! [`crate::Driver`] and an emulated bus. Its CSR block would only be
//! bookkeeping around one synchronous function call: "start" is the call,
//! "done" is its return, the input and output memories are the two
//! pointers. Emulating the registers cost a second thread per core (so that
//! the driver had something to time out) and five copies of every job, about
//! 30 µs per 64×64 matrix product on the reference machine, for no
//! protection: a thread running a C function cannot be stopped, so a timed
//! out job only leaked a thread. [`NativeCore`] therefore calls the function
//! on the calling thread (in a node, the job thread of the core's worker
//! process) and is a [`Core`] like the others, so the node cannot tell the
//! difference.
//!
//! A native function that never returns blocks the thread that called it
//! for good; only running cores in a separate process could interrupt it,
//! which is why a node always runs them in one (`worker`).

use std::path::Path;
use std::sync::OnceLock;
use std::time::Instant;

use crate::{Core, CoreError, CoreStats, LoadError};

type EntryFn = unsafe extern "C" fn(*const u8, *mut u8);

/// Alignment the entry function may assume for both pointers: that of
/// `max_align_t` on the supported targets, as a hardware memory's base
/// address is aligned. C code casting `in` to `int *` or `double *` relies
/// on it (a misaligned access faults on armv7).
pub const ALIGN: usize = 16;

/// One dlopen'ed copy of a native artifact. Each core gets its own copy so
/// that static state in the C code is per core, as it is per hardware core.
pub struct NativeLib {
    // Keeps the code of `entry` mapped.
    _lib: crate::dl::Object,
    entry: EntryFn,
}

impl NativeLib {
    /// dlopens a private copy of `so` (crate::dl) and resolves `entry`.
    pub fn load(so: &[u8], entry: &str) -> Result<NativeLib, LoadError> {
        check_entry(entry)?;
        Self::resolve(crate::dl::open_copy(so, "native")?, entry, || {
            Some(so.to_vec())
        })
    }

    /// dlopens an existing shared object.
    pub fn open(path: &Path, entry: &str) -> Result<NativeLib, LoadError> {
        check_entry(entry)?;
        Self::resolve(crate::dl::open_path(path, "native")?, entry, || {
            std::fs::read(path).ok()
        })
    }

    /// `object`: the object's bytes, read only to explain a missing entry.
    fn resolve(
        obj: crate::dl::Object,
        entry: &str,
        object: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Result<NativeLib, LoadError> {
        let lib = obj.lib();
        // SAFETY: the native ABI (docs/interfaces.md) fixes the symbol's type
        // as `void (const uint8_t *, uint8_t *)`; the copied function pointer
        // is only used while `lib` (stored next to it) keeps the code mapped.
        let entry_fn = unsafe { lib.get::<EntryFn>(entry.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| {
                let exported = object()
                    .and_then(|so| crate::elf::exported_functions(&so))
                    .unwrap_or_default();
                LoadError::NoEntry(NoEntry::new(entry, e.to_string(), exported))
            })?;
        Ok(NativeLib {
            _lib: obj,
            entry: entry_fn,
        })
    }
}

/// A native artifact that does not export its entry symbol, with what it
/// does export: a C++ entry without `extern "C"` is there under its
/// mangled name, which the message names with the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoEntry {
    pub entry: String,
    /// The dynamic loader's reason.
    pub loader: String,
    /// Exported functions whose C++ (mangled) name is that of a function
    /// called `entry` (`_Z5crc32PKhPh` for `crc32`).
    pub mangled: Vec<String>,
    /// Other exported functions, at most [`NoEntry::SHOWN`], those whose
    /// names contain `entry` first.
    pub exported: Vec<String>,
    /// Exported functions left out of `exported`.
    pub more: usize,
}

impl NoEntry {
    /// Most other exported functions a message names.
    pub const SHOWN: usize = 8;

    fn new(entry: &str, loader: String, functions: Vec<String>) -> NoEntry {
        let (mangled, mut rest): (Vec<String>, Vec<String>) = functions
            .into_iter()
            .partition(|f| crate::elf::mangles(f, entry));
        // Stable: those naming the entry first, else in table order.
        rest.sort_by_key(|f| !f.contains(entry));
        let more = rest.len().saturating_sub(Self::SHOWN);
        rest.truncate(Self::SHOWN);
        NoEntry {
            entry: entry.into(),
            loader,
            mangled,
            exported: rest,
            more,
        }
    }
}

impl std::fmt::Display for NoEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entry = &self.entry;
        write!(
            f,
            "native artifact has no entry symbol {entry:?}: {}",
            self.loader
        )?;
        let list = |names: &[String]| {
            names
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !self.mangled.is_empty() {
            write!(
                f,
                "; it exports {}, the C++ (mangled) name of a function {entry}: declare \
                 it extern \"C\" (`extern \"C\" void {entry}(...)`, or `component` from \
                 corefarm/hls.h) so that its symbol is {entry:?}",
                list(&self.mangled)
            )
        } else if !self.exported.is_empty() {
            let more = match self.more {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            write!(
                f,
                "; it exports the functions {}{more}: name one of them as the entry (a C++ \
                 function only once declared extern \"C\")",
                list(&self.exported)
            )
        } else {
            Ok(())
        }
    }
}

impl std::error::Error for NoEntry {}

fn check_entry(entry: &str) -> Result<(), LoadError> {
    if entry.is_empty() || entry.contains('\0') {
        return Err(LoadError::Invalid(format!(
            "invalid native entry symbol {entry:?}"
        )));
    }
    Ok(())
}

/// A heap buffer with an [`ALIGN`]-aligned window of `len` bytes, for jobs
/// whose caller-provided slices are not aligned.
struct Staging {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl Staging {
    /// `len` is the length of an existing slice, so `len + ALIGN` fits a usize.
    fn new(len: usize) -> Staging {
        let buf = vec![0u8; len + ALIGN - 1];
        // The buffer never grows, so its address and this offset stay valid.
        let start = (ALIGN - buf.as_ptr() as usize % ALIGN) % ALIGN;
        Staging { buf, start, len }
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

fn aligned(p: *const u8) -> bool {
    p as usize % ALIGN == 0
}

/// One native soft core, run on the thread that calls [`Core::process`].
///
/// Copies: none when the caller's input and output slices are
/// [`ALIGN`]-aligned (the input is passed as is, the function writes the
/// output slice directly); otherwise one copy in and/or one copy out through
/// a per-core aligned buffer. The function therefore finds unspecified bytes
/// in `out` when it starts (docs/interfaces.md): it must write every byte it
/// returns.
pub struct NativeCore {
    lib: NativeLib,
    input_size: usize,
    output_size: usize,
    input_stage: Option<Staging>,
    output_stage: Option<Staging>,
    stats: CoreStats,
}

impl NativeCore {
    pub fn new(lib: NativeLib, input_size: u32, output_size: u32) -> NativeCore {
        NativeCore {
            lib,
            input_size: input_size as usize,
            output_size: output_size as usize,
            input_stage: None,
            output_stage: None,
            stats: CoreStats::default(),
        }
    }
}

/// Calls the entry function.
///
/// # Safety
/// `input` must point to the core's `input_size` readable bytes and
/// `output` to its `output_size` writable bytes, both [`ALIGN`]-aligned,
/// with no other access to them during the call.
unsafe fn call(entry: EntryFn, input: *const u8, output: *mut u8) {
    debug_assert!(aligned(input) && aligned(output));
    // SAFETY: the caller provides what the native ABI (docs/interfaces.md)
    // promises the function. The function is trusted to keep its side of
    // the ABI (read at most input_size bytes of `in` without writing them,
    // write at most output_size bytes of `out`), as the node trusts the
    // code it loads with the whole process (see `NativeLib::open`).
    unsafe { entry(input, output) }
}

impl Core for NativeCore {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        crate::check_job_sizes(input, output, self.input_size, self.output_size)?;
        let started = Instant::now();
        let entry = self.lib.entry;
        let in_ptr = if aligned(input.as_ptr()) {
            input.as_ptr()
        } else {
            let stage = self
                .input_stage
                .get_or_insert_with(|| Staging::new(input.len()));
            let bytes = stage.bytes();
            bytes.copy_from_slice(input);
            bytes.as_ptr()
        };
        if aligned(output.as_ptr()) {
            // SAFETY: `in_ptr` is `input` or the input stage (input_size
            // bytes, aligned, not touched again until the call returns);
            // `output` is output_size bytes, aligned, borrowed mutably here.
            unsafe { call(entry, in_ptr, output.as_mut_ptr()) };
        } else {
            let stage = self
                .output_stage
                .get_or_insert_with(|| Staging::new(output.len()));
            let bytes = stage.bytes();
            // SAFETY: as above; the output stage is output_size aligned
            // bytes borrowed mutably here.
            unsafe { call(entry, in_ptr, bytes.as_mut_ptr()) };
            output.copy_from_slice(bytes);
        }
        self.stats.jobs += 1;
        self.stats.busy += started.elapsed();
        Ok(())
    }

    fn stats(&self) -> CoreStats {
        self.stats.clone()
    }
}

/// Whether this process can load native and RTL artifacts: it has a
/// dynamic loader (a static binary has none), and memory files may be
/// mapped executable or, where they may not, the temporary directory the
/// artifacts are then written to allows it (a `noexec` mount does not).
/// Checked once per process.
pub fn dlopen_works() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        match can_dlopen(&std::env::temp_dir(), crate::dl::memory_files_execute()) {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!("native and RTL cores are unavailable: {why}");
                false
            }
        }
    })
}

fn can_dlopen(dir: &Path, in_memory: bool) -> Result<(), String> {
    #[cfg(unix)]
    {
        // SAFETY: dlopen(NULL) returns a handle to the already loaded main
        // program: it loads no new object, so no initialiser runs.
        unsafe {
            libloading::os::unix::Library::open(None::<&str>, libloading::os::unix::RTLD_LAZY)
        }
        .map_err(|e| format!("this process cannot dlopen ({e})"))?;
        if in_memory {
            return Ok(());
        }
        let mut file = tempfile::tempfile_in(dir)
            .map_err(|e| format!("cannot create a file in {}: {e}", dir.display()))?;
        std::io::Write::write_all(&mut file, &[0xc3])
            .map_err(|e| format!("cannot write a file in {}: {e}", dir.display()))?;
        // SAFETY: the file is private to this function (unnamed, just
        // created), so nothing changes it while mapped; the mapping is
        // neither read nor executed, only dropped.
        unsafe { memmap2::MmapOptions::new().len(1).map_exec(&file) }
            .map(drop)
            .map_err(|e| {
                format!(
                    "{} does not allow executable mappings ({e}); set TMPDIR to a directory that does",
                    dir.display()
                )
            })
    }
    #[cfg(not(unix))]
    {
        let _ = (dir, in_memory);
        Err("native and RTL cores need a Unix dynamic loader".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_can_dlopen_from_its_temp_dir() {
        // The tests run as an ordinary dynamically linked program.
        assert_eq!(can_dlopen(&std::env::temp_dir(), false), Ok(()));
        assert!(dlopen_works());
    }

    #[test]
    fn an_unusable_directory_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("missing");
        let e = can_dlopen(&gone, false).unwrap_err();
        assert!(e.contains("missing"), "{e}");
        // Memory files that execute need no directory.
        assert_eq!(can_dlopen(&gone, true), Ok(()));
    }

    #[test]
    fn staging_windows_are_aligned() {
        for len in [0, 1, 15, 16, 17, 4096] {
            let mut s = Staging::new(len);
            assert_eq!(s.bytes().len(), len);
            assert!(aligned(s.bytes().as_ptr()));
        }
    }
}

//! Native soft cores: a shared object exporting
//! `void entry(const uint8_t *in, uint8_t *out)` (docs/interfaces.md), run
//! behind an emulated bus whose CSR block implements seed 000 table 3.1, so
//! the same [`Driver`] drives it as it drives RTL simulation and the FPGA.
//!
//! The C function runs on a worker thread per core, started by the write to
//! the start register: a function that never returns then shows up as a core
//! that never raises done, which the driver turns into a timeout.

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use corefarm_smp::CoreInfo;

use crate::bus::{csr, Bus, BusError};
use crate::LoadError;

type EntryFn = unsafe extern "C" fn(*const u8, *mut u8);

/// One dlopen'ed copy of a native artifact. Each core gets its own copy so
/// that static state in the C code is per core, as it is per hardware core.
pub struct NativeLib {
    // Kept alive as long as any worker (even an abandoned, stuck one) runs its code.
    _lib: libloading::Library,
    entry: EntryFn,
}

impl NativeLib {
    /// Writes `so` to a private temporary file, dlopens it and resolves `entry`.
    pub fn load(so: &[u8], entry: &str) -> Result<NativeLib, LoadError> {
        if entry.is_empty() || entry.contains('\0') {
            return Err(LoadError::Invalid(format!(
                "invalid native entry symbol {entry:?}"
            )));
        }
        let file = tempfile::Builder::new()
            .prefix("corefarm-native-")
            .suffix(".so")
            .tempfile()
            .map_err(|e| {
                LoadError::Backend(format!(
                    "cannot create a temporary file for the native core: {e}"
                ))
            })?;
        std::fs::write(file.path(), so)
            .map_err(|e| LoadError::Backend(format!("cannot write the native core: {e}")))?;
        Self::open(file.path(), entry)
        // The file is removed here; the mapping stays valid once loaded.
    }

    /// dlopens an existing shared object.
    pub fn open(path: &Path, entry: &str) -> Result<NativeLib, LoadError> {
        // SAFETY: loading runs the object's initialisers. The object comes from
        // a configuration the user chose to run on this node, which is the
        // trust model of the whole system (a bitstream can do anything too).
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| LoadError::Invalid(format!("native artifact cannot be loaded: {e}")))?;
        // SAFETY: the ABI of docs/interfaces.md fixes the symbol's type.
        let entry_fn = unsafe { lib.get::<EntryFn>(entry.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| {
                LoadError::Invalid(format!(
                    "native artifact has no entry symbol {entry:?}: {e}"
                ))
            })?;
        Ok(NativeLib {
            _lib: lib,
            entry: entry_fn,
        })
    }
}

/// Register and memory state of one emulated core, shared with its worker.
struct State {
    input: Vec<u8>,
    output: Vec<u8>,
    busy: bool,
    done: bool,
    irq_enable: bool,
    /// Bumped by reset: a worker from an older generation discards its result.
    generation: u64,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a thread panicked between two plain
        // field updates; the state itself is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Emulated bus of one native core: decodes its three windows, implements
/// the CSR, runs the C function on its worker thread when started.
pub struct NativeBus {
    core: CoreInfo,
    shared: Arc<Shared>,
    lib: Arc<NativeLib>,
    start_tx: mpsc::Sender<u64>,
    input_size: usize,
    output_size: usize,
}

enum Window {
    Csr(u64),
    Input(usize),
    Output(usize),
}

fn window_len(size: usize) -> u64 {
    (size as u64).div_ceil(8) * 8
}

impl NativeBus {
    pub fn new(
        lib: NativeLib,
        core: CoreInfo,
        input_size: u32,
        output_size: u32,
    ) -> Result<NativeBus, LoadError> {
        let (i, o) = (input_size as usize, output_size as usize);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                input: vec![0; window_len(i) as usize],
                output: vec![0; window_len(o) as usize],
                busy: false,
                done: false,
                irq_enable: false,
                generation: 0,
            }),
            changed: Condvar::new(),
        });
        let lib = Arc::new(lib);
        let start_tx = spawn_worker(&shared, &lib, i, o)?;
        Ok(NativeBus {
            core,
            shared,
            lib,
            start_tx,
            input_size: i,
            output_size: o,
        })
    }

    fn decode(&self, addr: u64, len: usize) -> Result<Window, BusError> {
        let end = addr + len as u64;
        let within = |base: u32, span: u64| addr >= base as u64 && end <= base as u64 + span;
        if within(self.core.control, csr::SPAN) {
            Ok(Window::Csr(addr - self.core.control as u64))
        } else if within(self.core.input, window_len(self.input_size)) {
            Ok(Window::Input((addr - self.core.input as u64) as usize))
        } else if within(self.core.output, window_len(self.output_size)) {
            Ok(Window::Output((addr - self.core.output as u64) as usize))
        } else {
            Err(BusError::Unmapped { addr, len })
        }
    }
}

fn spawn_worker(
    shared: &Arc<Shared>,
    lib: &Arc<NativeLib>,
    input_size: usize,
    output_size: usize,
) -> Result<mpsc::Sender<u64>, LoadError> {
    let (tx, rx) = mpsc::channel::<u64>();
    let (shared, lib) = (shared.clone(), lib.clone());
    std::thread::Builder::new()
        .name("corefarm-native-core".into())
        .spawn(move || {
            // The C function sees exactly input_size / output_size bytes,
            // like the hardware core sees its memories.
            let mut inp = vec![0u8; input_size.max(1)];
            let mut out = vec![0u8; output_size.max(1)];
            // Ends when the bus (the sender) is dropped or reset.
            while let Ok(generation) = rx.recv() {
                {
                    let st = shared.lock();
                    inp[..input_size].copy_from_slice(&st.input[..input_size]);
                    out[..output_size].copy_from_slice(&st.output[..output_size]);
                }
                // SAFETY: both buffers hold the sizes the core was built for;
                // the function's signature is fixed by the native ABI.
                unsafe { (lib.entry)(inp.as_ptr(), out.as_mut_ptr()) };
                let mut st = shared.lock();
                if st.generation != generation {
                    continue; // reset while we ran: this result belongs to no one
                }
                st.output[..output_size].copy_from_slice(&out[..output_size]);
                st.busy = false;
                st.done = true;
                shared.changed.notify_all();
            }
        })
        .map_err(|e| LoadError::Backend(format!("cannot start a native core thread: {e}")))?;
    Ok(tx)
}

impl Bus for NativeBus {
    fn read64(&mut self, addr: u64) -> Result<u64, BusError> {
        if addr % 8 != 0 {
            return Err(BusError::Unaligned { addr });
        }
        let w = self.decode(addr, 8)?;
        let st = self.shared.lock();
        let word =
            |m: &[u8], o: usize| u64::from_le_bytes(m[o..o + 8].try_into().expect("8 bytes"));
        Ok(match w {
            Window::Csr(csr::BUSY) => st.busy as u64,
            Window::Csr(csr::INTERRUPT_ENABLE) => st.irq_enable as u64,
            Window::Csr(csr::DONE) => st.done as u64,
            Window::Csr(_) => 0,
            Window::Input(o) => word(&st.input, o),
            Window::Output(o) => word(&st.output, o),
        })
    }

    fn write64(&mut self, addr: u64, value: u64) -> Result<(), BusError> {
        if addr % 8 != 0 {
            return Err(BusError::Unaligned { addr });
        }
        let w = self.decode(addr, 8)?;
        let mut st = self.shared.lock();
        match w {
            Window::Csr(csr::START) => {
                // Like the HLS CSR, a start while busy is ignored.
                if value & 1 == 1 && !st.busy {
                    st.busy = true;
                    let generation = st.generation;
                    drop(st);
                    self.start_tx
                        .send(generation)
                        .map_err(|_| BusError::Other("native core thread has exited".into()))?;
                }
            }
            Window::Csr(csr::INTERRUPT_ENABLE) => st.irq_enable = value & 1 == 1,
            Window::Csr(csr::DONE) => {
                if value & 1 == 1 {
                    st.done = false;
                }
            }
            Window::Csr(_) => {}
            Window::Input(o) => st.input[o..o + 8].copy_from_slice(&value.to_le_bytes()),
            Window::Output(o) => st.output[o..o + 8].copy_from_slice(&value.to_le_bytes()),
        }
        Ok(())
    }

    fn read_block(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), BusError> {
        let st_range = |o: usize| o..o + buf.len();
        match self.decode(addr, buf.len())? {
            Window::Input(o) => buf.copy_from_slice(&self.shared.lock().input[st_range(o)]),
            Window::Output(o) => buf.copy_from_slice(&self.shared.lock().output[st_range(o)]),
            Window::Csr(_) => return Err(BusError::Other("block read from a CSR".into())),
        }
        Ok(())
    }

    fn write_block(&mut self, addr: u64, data: &[u8]) -> Result<(), BusError> {
        let r = |o: usize| o..o + data.len();
        match self.decode(addr, data.len())? {
            Window::Input(o) => self.shared.lock().input[r(o)].copy_from_slice(data),
            Window::Output(o) => self.shared.lock().output[r(o)].copy_from_slice(data),
            Window::Csr(_) => return Err(BusError::Other("block write to a CSR".into())),
        }
        Ok(())
    }

    fn idle(&mut self, budget: Duration) {
        let st = self.shared.lock();
        if st.busy && !st.done {
            // Woken by the worker as soon as the function returns.
            let _ = self.shared.changed.wait_timeout(st, budget);
        }
    }

    /// Abandons a stuck worker (a thread cannot be killed: it keeps its own
    /// buffers and library reference, and its result is discarded) and starts
    /// a fresh one, like a reset line returns a hardware core to idle.
    fn reset(&mut self, _control: u64) -> bool {
        let Ok(tx) = spawn_worker(&self.shared, &self.lib, self.input_size, self.output_size)
        else {
            return false;
        };
        let mut st = self.shared.lock();
        st.generation += 1;
        st.busy = false;
        st.done = false;
        self.start_tx = tx;
        true
    }
}

/// Whether this process can dlopen shared objects at all (a static binary
/// cannot), which native and RTL backends both need.
pub fn dlopen_works() -> bool {
    #[cfg(unix)]
    {
        libloading::os::unix::Library::this();
        true
    }
    #[cfg(not(unix))]
    {
        false
    }
}

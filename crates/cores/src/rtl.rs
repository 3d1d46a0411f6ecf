//! RTL simulation backend: a Verilator-built shared object implementing the
//! RTL simulation ABI of docs/interfaces.md, one instance per core-table
//! entry. An [`AddressMap`] plays Platform Designer's interconnect: it maps
//! each core's control/input/output base address to (instance, interface),
//! and the same [`crate::Driver`] runs the job cycle; its wait hook clocks
//! the instance, so simulated cycles per job come out exactly.

use std::ffi::{c_char, c_void, CStr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use corefarm_smp::CoreInfo;

use crate::bus::{csr, Bus, BusError, DmaWindow};
use crate::image::{Control, ControlProtocol};
use crate::LoadError;

/// Interface numbers of the ABI.
pub const IFACE_CSR: u32 = 0;
pub const IFACE_INPUT: u32 = 1;
pub const IFACE_OUTPUT: u32 = 2;
/// The host-memory model behind an AXI core's master port (AXI wrapper only).
pub const IFACE_HOST: u32 = 3;

/// Bus address of the host-memory model of an AXI core: above 4 GiB, so
/// the high word of every pointer register matters.
pub const HOST_BASE: u64 = 1 << 32;

/// Most cycles one call of the wait hook simulates before handing control
/// back to the driver (which checks its deadline between calls).
const MAX_CYCLES_PER_IDLE: u32 = 4096;

type Inst = *mut c_void;

/// The resolved ABI of one loaded RTL artifact.
pub struct RtlLib {
    _lib: crate::dl::Object,
    top: String,
    create: unsafe extern "C" fn() -> Inst,
    destroy: unsafe extern "C" fn(Inst),
    reset: unsafe extern "C" fn(Inst),
    read: unsafe extern "C" fn(Inst, u32, u32) -> u64,
    write: unsafe extern "C" fn(Inst, u32, u32, u64, u8),
    tick: unsafe extern "C" fn(Inst, u32),
    cycles: unsafe extern "C" fn(Inst) -> u64,
    irq: unsafe extern "C" fn(Inst) -> i32,
    /// AXI wrapper only: bytes of the host-memory model behind the core's
    /// master port, cycles with master traffic, AXI rule violations seen.
    host_bytes: Option<unsafe extern "C" fn() -> u64>,
    mem_cycles: Option<unsafe extern "C" fn(Inst) -> u64>,
    axi_errors: Option<unsafe extern "C" fn(Inst) -> u64>,
}

impl RtlLib {
    /// dlopens a private copy of the artifact (crate::dl).
    pub fn load(so: &[u8]) -> Result<RtlLib, LoadError> {
        Self::from_lib(crate::dl::open_copy(so, "RTL")?)
    }

    /// dlopens an RTL shared object and checks its ABI version.
    pub fn open(path: &Path) -> Result<RtlLib, LoadError> {
        Self::from_lib(crate::dl::open_path(path, "RTL")?)
    }

    fn from_lib(obj: crate::dl::Object) -> Result<RtlLib, LoadError> {
        let lib = obj.lib();
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the RTL ABI of docs/interfaces.md fixes each symbol's type.
                *unsafe { lib.get($name) }.map_err(|e| {
                    LoadError::Invalid(format!(
                        "RTL artifact lacks {}: {e}",
                        String::from_utf8_lossy(&$name[..$name.len()])
                    ))
                })?
            };
        }
        let version: unsafe extern "C" fn() -> u32 = sym!(b"cf_rtl_abi_version");
        // SAFETY: plain C function without arguments.
        let v = unsafe { version() };
        if v != 1 {
            return Err(LoadError::Invalid(format!(
                "RTL artifact implements ABI version {v}, this node speaks version 1"
            )));
        }
        let top_name: unsafe extern "C" fn() -> *const c_char = sym!(b"cf_rtl_top_name");
        // SAFETY: the ABI returns a static NUL-terminated string (or null).
        let top = unsafe {
            let p = top_name();
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        macro_rules! optional {
            ($name:literal) => {
                // SAFETY: as above; these symbols exist in the AXI wrapper only.
                unsafe { lib.get($name) }.ok().map(|s| *s)
            };
        }
        Ok(RtlLib {
            host_bytes: optional!(b"cf_rtl_host_bytes"),
            mem_cycles: optional!(b"cf_rtl_mem_cycles"),
            axi_errors: optional!(b"cf_rtl_axi_errors"),
            top,
            create: sym!(b"cf_rtl_create"),
            destroy: sym!(b"cf_rtl_destroy"),
            reset: sym!(b"cf_rtl_reset"),
            read: sym!(b"cf_rtl_read"),
            write: sym!(b"cf_rtl_write"),
            tick: sym!(b"cf_rtl_tick"),
            cycles: sym!(b"cf_rtl_cycles"),
            irq: sym!(b"cf_rtl_irq"),
            _lib: obj,
        })
    }

    /// Name of the Verilog top module the object was built from.
    pub fn top(&self) -> &str {
        &self.top
    }

    /// The host memory an AXI core masters (AXI wrapper only).
    pub fn host_window(&self) -> Option<DmaWindow> {
        // SAFETY: plain C function without arguments.
        self.host_bytes.map(|f| DmaWindow {
            base: HOST_BASE,
            len: unsafe { f() },
        })
    }
}

/// One address window of the interconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    base: u64,
    len: u64,
    core: usize,
    iface: u32,
}

/// The interconnect: every core's three windows, decoded by address.
#[derive(Debug, Clone)]
pub struct AddressMap {
    windows: Vec<Window>,
}

impl AddressMap {
    /// Builds the map of a core table. Windows: CSR 0x20 bytes, input and
    /// output memories their sizes rounded up to whole 64-bit words.
    /// (Overlaps are refused earlier, by `load`.)
    pub fn new(cores: &[CoreInfo], input_size: u32, output_size: u32) -> AddressMap {
        let r8 = |n: u32| (n as u64).div_ceil(8) * 8;
        let mut windows = Vec::new();
        for (i, c) in cores.iter().enumerate() {
            windows.push(Window {
                base: c.control as u64,
                len: csr::SPAN,
                core: i,
                iface: IFACE_CSR,
            });
            windows.push(Window {
                base: c.input as u64,
                len: r8(input_size),
                core: i,
                iface: IFACE_INPUT,
            });
            windows.push(Window {
                base: c.output as u64,
                len: r8(output_size),
                core: i,
                iface: IFACE_OUTPUT,
            });
        }
        windows.sort_by_key(|w| w.base);
        AddressMap { windows }
    }

    /// [`AddressMap::new`] for cores in the protocol `control` names: an
    /// `ap_ctrl_hs` core has only its register block on this bus (its data
    /// lives in host memory, the bus's DMA window).
    pub fn with_control(
        cores: &[CoreInfo],
        input_size: u32,
        output_size: u32,
        control: Option<&Control>,
    ) -> AddressMap {
        let Some(c) = control.filter(|c| c.protocol == ControlProtocol::ApCtrlHs) else {
            return AddressMap::new(cores, input_size, output_size);
        };
        let (_, end) = crate::driver::ap_ctrl_hs::register_offsets(&c.args);
        let mut windows: Vec<Window> = cores
            .iter()
            .enumerate()
            .map(|(i, c)| Window {
                base: c.control as u64,
                len: end.next_multiple_of(8),
                core: i,
                iface: IFACE_CSR,
            })
            .collect();
        windows.sort_by_key(|w| w.base);
        AddressMap { windows }
    }

    /// (core, interface, word index) of an 8-byte-aligned access of `len` bytes.
    pub fn decode(&self, addr: u64, len: usize) -> Result<(usize, u32, u32), BusError> {
        if addr % 8 != 0 {
            return Err(BusError::Unaligned { addr });
        }
        let i = self.windows.partition_point(|w| w.base <= addr);
        let w = i
            .checked_sub(1)
            .map(|i| self.windows[i])
            .filter(|w| addr + len as u64 <= w.base + w.len)
            .ok_or(BusError::Unmapped { addr, len })?;
        Ok((w.core, w.iface, ((addr - w.base) / 8) as u32))
    }
}

/// The bus one core handler sees: the shared interconnect, through which it
/// reaches its own instance (instances are not thread-safe, so each core
/// handler owns exactly one).
pub struct RtlBus {
    lib: Arc<RtlLib>,
    map: Arc<AddressMap>,
    core: usize,
    inst: Inst,
    host: Option<DmaWindow>,
}

// SAFETY: an instance is only ever used by the thread that owns this bus
// (distinct instances are independent, docs in cf_rtl_wrapper.cpp).
unsafe impl Send for RtlBus {}

impl RtlBus {
    pub fn new(lib: Arc<RtlLib>, map: Arc<AddressMap>, core: usize) -> Result<RtlBus, LoadError> {
        // SAFETY: ABI call without preconditions.
        let inst = unsafe { (lib.create)() };
        if inst.is_null() {
            return Err(LoadError::Backend(
                "cf_rtl_create returned no instance".into(),
            ));
        }
        let host = lib.host_window();
        Ok(RtlBus {
            lib,
            map,
            core,
            inst,
            host,
        })
    }

    /// Cycles in which the core's master port was busy (requests pending
    /// or data moving), AXI cores only.
    pub fn mem_cycles(&self) -> Option<u64> {
        // SAFETY: live instance.
        self.lib.mem_cycles.map(|f| unsafe { f(self.inst) })
    }

    /// AXI rule violations the wrapper saw on the master port (valid
    /// dropped before ready, a burst crossing 4 KiB), AXI cores only.
    pub fn axi_errors(&self) -> Option<u64> {
        // SAFETY: live instance.
        self.lib.axi_errors.map(|f| unsafe { f(self.inst) })
    }

    fn target(&self, addr: u64, len: usize) -> Result<(u32, u32), BusError> {
        if let Some(h) = self.host.filter(|h| addr >= h.base) {
            if addr % 8 != 0 {
                return Err(BusError::Unaligned { addr });
            }
            if addr - h.base + len as u64 > h.len {
                return Err(BusError::Unmapped { addr, len });
            }
            return Ok((IFACE_HOST, ((addr - h.base) / 8) as u32));
        }
        let (core, iface, word) = self.map.decode(addr, len)?;
        if core != self.core {
            return Err(BusError::Other(format!(
                "address {addr:#x} belongs to core {core}, not to core {} driven here",
                self.core
            )));
        }
        Ok((iface, word))
    }

    fn word_read(&mut self, iface: u32, word: u32) -> u64 {
        // SAFETY: inst is live (destroyed only in Drop); word is within the window.
        unsafe { (self.lib.read)(self.inst, iface, word) }
    }

    fn word_write(&mut self, iface: u32, word: u32, v: u64, be: u8) {
        // SAFETY: as above.
        unsafe { (self.lib.write)(self.inst, iface, word, v, be) }
    }
}

impl Drop for RtlBus {
    fn drop(&mut self) {
        // SAFETY: created by cf_rtl_create, destroyed once.
        unsafe { (self.lib.destroy)(self.inst) }
    }
}

impl Bus for RtlBus {
    fn read64(&mut self, addr: u64) -> Result<u64, BusError> {
        let (iface, word) = self.target(addr, 8)?;
        Ok(self.word_read(iface, word))
    }

    fn write64(&mut self, addr: u64, value: u64) -> Result<(), BusError> {
        let (iface, word) = self.target(addr, 8)?;
        self.word_write(iface, word, value, 0xff);
        Ok(())
    }

    fn read_block(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), BusError> {
        let (iface, word) = self.target(addr, buf.len())?;
        for (i, chunk) in buf.chunks_mut(8).enumerate() {
            let w = self.word_read(iface, word + i as u32).to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
        Ok(())
    }

    /// A partial last word uses byteenable, as an Avalon master would.
    fn write_block(&mut self, addr: u64, data: &[u8]) -> Result<(), BusError> {
        let (iface, word) = self.target(addr, data.len())?;
        for (i, chunk) in data.chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            let be = if chunk.len() == 8 {
                0xff
            } else {
                (1u8 << chunk.len()) - 1
            };
            self.word_write(iface, word + i as u32, u64::from_le_bytes(w), be);
        }
        Ok(())
    }

    /// Clocks the instance cycle by cycle until its interrupt rises (the
    /// driver enabled it), so the cycle count of a job is exact.
    fn idle(&mut self, _budget: Duration) {
        for _ in 0..MAX_CYCLES_PER_IDLE {
            // SAFETY: live instance.
            unsafe {
                (self.lib.tick)(self.inst, 1);
                if (self.lib.irq)(self.inst) != 0 {
                    break;
                }
            }
        }
    }

    fn irq(&mut self, _control: u64) -> Option<bool> {
        // SAFETY: live instance.
        Some(unsafe { (self.lib.irq)(self.inst) } != 0)
    }

    fn reset(&mut self, _control: u64) -> bool {
        // SAFETY: live instance.
        unsafe { (self.lib.reset)(self.inst) };
        // Reset clears interrupt enable, which the Avalon driver set once at
        // creation (the ap_ctrl_hs driver sets it on every job).
        if self.host.is_none() {
            self.word_write(IFACE_CSR, (csr::INTERRUPT_ENABLE / 8) as u32, 1, 0xff);
        }
        true
    }

    fn cycles(&self, _control: u64) -> Option<u64> {
        // SAFETY: live instance.
        Some(unsafe { (self.lib.cycles)(self.inst) })
    }

    fn dma_window(&self) -> Option<DmaWindow> {
        self.host
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_map_decodes_each_window() {
        let cores = crate::image::default_core_table(2, 20, 12).unwrap();
        let m = AddressMap::new(&cores, 20, 12);
        let c1 = cores[1];
        assert_eq!(m.decode(c1.control as u64 + 0x18, 8), Ok((1, IFACE_CSR, 3)));
        assert_eq!(m.decode(c1.input as u64 + 16, 8), Ok((1, IFACE_INPUT, 2)));
        assert_eq!(m.decode(c1.input as u64, 24), Ok((1, IFACE_INPUT, 0)));
        assert_eq!(
            m.decode(cores[0].output as u64 + 8, 8),
            Ok((0, IFACE_OUTPUT, 1))
        );
        // Past the 24-byte input window, before the window, unaligned.
        assert!(m.decode(c1.input as u64 + 24, 8).is_err());
        assert!(m.decode(c1.input as u64, 32).is_err());
        assert!(m.decode(0x1000, 8).is_err());
        assert!(m.decode(c1.control as u64 + 0x20, 8).is_err());
        assert_eq!(
            m.decode(c1.control as u64 + 4, 8),
            Err(BusError::Unaligned {
                addr: c1.control as u64 + 4
            })
        );
    }
}

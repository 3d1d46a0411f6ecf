//! Cyclone V SoC FPGA backend (seed 000 §3.4): program the raw bitstream
//! through a configurable programmer, mmap the HPS-to-FPGA bridge and run the
//! same [`Driver`] over the mapped region with volatile accesses.
//!
//! Completion is polled, or awaited on each core's interrupt through UIO
//! (the core's `irq` wired to the HPS's `f2h_irq0`, a `generic-uio` node
//! whose `reg` covers the core's CSR): see [`FpgaOptions::interrupts`].
//!
//! NOTE: written against the documented interfaces (Linux FPGA manager,
//! /dev/mem, UIO) and tested with regular files standing in for the bridge
//! and the UIO map; it has not been run on a DE10 board (docs/images.md).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use corefarm_smp::Configuration;
use memmap2::{MmapOptions, MmapRaw};

use crate::bus::{Bus, BusError};
use crate::zynq::UioInterrupt;
use crate::{Core, Driver, DriverOptions, LoadError, Loaded};

/// Placeholder replaced by the bitstream's path in a programmer command.
pub const BITSTREAM_PLACEHOLDER: &str = "{bitstream}";

/// How the bitstream gets into the FPGA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Programmer {
    /// Linux FPGA manager: the bitstream is written to `firmware_dir`, its
    /// file name to `<manager>/firmware`, then `<manager>/state` must read
    /// "operating" (the socfpga kernels' sysfs interface).
    FpgaManager {
        manager: PathBuf,
        firmware_dir: PathBuf,
    },
    /// An external command. Arguments equal to or containing `{bitstream}`
    /// get the path of a file holding the bitstream; if none does, the
    /// bitstream is piped to the command's standard input (so
    /// `["dd", "of=/dev/fpga0"]` works). Must exit 0.
    Command(Vec<String>),
}

impl Default for Programmer {
    fn default() -> Self {
        Programmer::FpgaManager {
            manager: "/sys/class/fpga_manager/fpga0".into(),
            firmware_dir: "/lib/firmware".into(),
        }
    }
}

/// How to program the FPGA and where its bridge is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FpgaOptions {
    pub programmer: Programmer,
    /// File to map the bridge from (`/dev/mem`).
    pub device: PathBuf,
    /// Offset of the bridge within `device` (its physical address for /dev/mem).
    pub device_offset: u64,
    /// Physical address of the bridge window that core-table addresses refer
    /// to. Addresses below `span` are taken as bridge-relative offsets, as in
    /// Platform Designer's address map (seed 000 figure 4.6).
    pub base: u64,
    /// Bytes of the bridge window.
    pub span: u64,
    /// Wait for completion on each core's UIO interrupt, the UIO devices
    /// found under this root (`/` on a board) by the physical address of
    /// the core's CSR; `None` polls the done register.
    pub interrupts: Option<corefarm_board::Root>,
}

impl Default for FpgaOptions {
    fn default() -> Self {
        FpgaOptions {
            programmer: Programmer::default(),
            device: "/dev/mem".into(),
            device_offset: 0xC000_0000,
            base: 0xC000_0000,
            span: 0x3C00_0000,
            interrupts: None,
        }
    }
}

fn backend(msg: String) -> LoadError {
    LoadError::Backend(msg)
}

/// The file (in the firmware directory) the FPGA manager loads.
pub const FIRMWARE_NAME: &str = "corefarm.rbf";

/// Programs `bitstream` with the configured programmer.
pub fn program(p: &Programmer, bitstream: &[u8]) -> Result<(), LoadError> {
    match p {
        Programmer::FpgaManager {
            manager,
            firmware_dir,
        } => {
            // One file, rewritten for each bitstream: the manager reads it
            // while the write to its `firmware` attribute lasts, and a file
            // per bitstream would fill the board's card, one per user's.
            let name = FIRMWARE_NAME;
            let fw = firmware_dir.join(name);
            std::fs::write(&fw, bitstream).map_err(|e| {
                backend(format!(
                    "cannot write the bitstream to {}: {e}",
                    fw.display()
                ))
            })?;
            let ctl = manager.join("firmware");
            std::fs::write(&ctl, name).map_err(|e| {
                backend(format!(
                    "FPGA manager refused the bitstream ({}): {e}",
                    ctl.display()
                ))
            })?;
            let state_file = manager.join("state");
            let state = std::fs::read_to_string(&state_file)
                .map_err(|e| backend(format!("cannot read {}: {e}", state_file.display())))?;
            if state.trim() != "operating" {
                return Err(backend(format!(
                    "FPGA manager reports state {:?} after programming, expected \"operating\"",
                    state.trim()
                )));
            }
            Ok(())
        }
        Programmer::Command(argv) => {
            let Some((prog, args)) = argv.split_first() else {
                return Err(LoadError::Invalid("empty FPGA programmer command".into()));
            };
            let mut file = tempfile::Builder::new()
                .prefix("corefarm-bitstream-")
                .suffix(".rbf")
                .tempfile()
                .map_err(|e| backend(format!("cannot create a bitstream file: {e}")))?;
            file.write_all(bitstream)
                .and_then(|_| file.flush())
                .map_err(|e| backend(format!("cannot write the bitstream file: {e}")))?;
            let path = file.path().to_string_lossy().into_owned();
            let uses_path = args.iter().any(|a| a.contains(BITSTREAM_PLACEHOLDER));
            let mut cmd = Command::new(prog);
            cmd.args(args.iter().map(|a| a.replace(BITSTREAM_PLACEHOLDER, &path)))
                .stdin(if uses_path {
                    Stdio::null()
                } else {
                    Stdio::piped()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = cmd
                .spawn()
                .map_err(|e| backend(format!("cannot run FPGA programmer {prog:?}: {e}")))?;
            if let Some(mut stdin) = child.stdin.take() {
                // A programmer that exits early closes the pipe; its exit
                // status below says why, so a write error adds nothing.
                let _ = stdin.write_all(bitstream);
            }
            let out = child
                .wait_with_output()
                .map_err(|e| backend(format!("FPGA programmer {prog:?} failed: {e}")))?;
            if !out.status.success() {
                return Err(backend(format!(
                    "FPGA programmer {argv:?} exited with {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            Ok(())
        }
    }
}

/// The mapped bridge, shared by every core's bus.
struct Bridge {
    map: MmapRaw,
    base: u64,
    span: u64,
}

impl Bridge {
    fn offset(&self, addr: u64, len: usize) -> Result<usize, BusError> {
        bridge_offset(self.base, self.span, addr, len as u64)
            .map(|o| o as usize)
            .ok_or(BusError::Unmapped { addr, len })
    }
}

/// Offset into the bridge window of an access of `len` bytes at `addr`:
/// physical addresses within `base..base+span`, or bridge-relative offsets.
fn bridge_offset(base: u64, span: u64, addr: u64, len: u64) -> Option<u64> {
    if addr >= base && addr - base + len <= span {
        Some(addr - base)
    } else if addr + len <= span {
        Some(addr)
    } else {
        None
    }
}

/// One core's view of the bridge.
pub struct FpgaBus {
    bridge: Arc<Bridge>,
    irq: Option<UioInterrupt>,
}

impl FpgaBus {
    /// Pointer to `len` bytes at `addr`, checked to lie within the mapping
    /// and to be 8-byte aligned in memory.
    fn ptr(&self, addr: u64, len: usize) -> Result<*mut u8, BusError> {
        let off = self.bridge.offset(addr, len)?;
        // SAFETY: off + len <= span (checked by `offset`) and the mapping is
        // `span` bytes long, so the result stays within it.
        let p = unsafe { self.bridge.map.as_mut_ptr().add(off) };
        if addr % 8 != 0 || p as usize % 8 != 0 {
            return Err(BusError::Unaligned { addr });
        }
        Ok(p)
    }
}

impl Bus for FpgaBus {
    fn read64(&mut self, addr: u64) -> Result<u64, BusError> {
        let p = self.ptr(addr, 8)?;
        // SAFETY: 8 bytes within the mapping, aligned (both checked by
        // `ptr`); volatile because it is device memory.
        Ok(unsafe { std::ptr::read_volatile(p as *const u64) })
    }

    fn write64(&mut self, addr: u64, value: u64) -> Result<(), BusError> {
        let p = self.ptr(addr, 8)?;
        // SAFETY: as in `read64`.
        unsafe { std::ptr::write_volatile(p as *mut u64, value) };
        Ok(())
    }

    fn read_block(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), BusError> {
        // Whole words are read, so the partial last one must be mapped too.
        let p = self.ptr(addr, buf.len().div_ceil(8) * 8)?;
        for (i, chunk) in buf.chunks_mut(8).enumerate() {
            // SAFETY: word i lies within the words `ptr` checked; aligned;
            // volatile because it is device memory.
            let w = unsafe { std::ptr::read_volatile((p as *const u64).add(i)) };
            chunk.copy_from_slice(&w.to_le_bytes()[..chunk.len()]);
        }
        Ok(())
    }

    fn write_block(&mut self, addr: u64, data: &[u8]) -> Result<(), BusError> {
        let p = self.ptr(addr, data.len())?;
        for (i, chunk) in data.chunks(8).enumerate() {
            if chunk.len() == 8 {
                let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
                // SAFETY: a whole word within the `data.len()` bytes `ptr`
                // checked; aligned; volatile because it is device memory.
                unsafe { std::ptr::write_volatile((p as *mut u64).add(i), w) };
            } else {
                // Byte writes for the tail: bytes past the data stay untouched.
                for (j, b) in chunk.iter().enumerate() {
                    // SAFETY: byte 8i+j < data.len(), within what `ptr` checked.
                    unsafe { std::ptr::write_volatile(p.add(8 * i + j), *b) };
                }
            }
        }
        Ok(())
    }

    fn idle(&mut self, budget: Duration) {
        // The bridge has no wait primitive; short sleeps keep the HPS's two
        // CPUs free for the other core handlers.
        std::thread::sleep(budget.min(Duration::from_micros(100)));
    }

    fn irq(&mut self, _control: u64) -> Option<bool> {
        self.irq.as_ref().map(UioInterrupt::level)
    }

    fn wait_irq(&mut self, _control: u64, timeout: Duration) -> bool {
        self.irq.as_mut().is_some_and(|i| i.wait(timeout))
    }
}

impl FpgaOptions {
    /// Opens the bridge device as a configuration would, and checks that a
    /// regular file covers the window: a node started with a device it
    /// cannot use says so at start, not at its first configuration. With
    /// interrupts, UIO must be there too (each core's device is found when a
    /// configuration names the core).
    pub fn check(&self) -> Result<(), LoadError> {
        open_device(self)?;
        if let Some(root) = &self.interrupts {
            if corefarm_board::uio::list(root)?.is_empty() {
                return Err(corefarm_board::BoardError::Missing {
                    piece: corefarm_board::Piece::Uio,
                    path: root.path("/sys/class/uio/uio0"),
                }
                .into());
            }
        }
        Ok(())
    }
}

/// The bridge device of `opts`, opened for an uncached mapping.
fn open_device(opts: &FpgaOptions) -> Result<std::fs::File, LoadError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        // Uncached mapping of device memory on /dev/mem.
        .custom_flags(libc::O_SYNC)
        .open(&opts.device)
        .map_err(|e| {
            backend(format!(
                "cannot open the bridge device {}: {e}",
                opts.device.display()
            ))
        })?;
    let meta = file
        .metadata()
        .map_err(|e| backend(format!("cannot stat {}: {e}", opts.device.display())))?;
    // A regular file (tests) must cover the window, or accesses would SIGBUS.
    if meta.is_file() && meta.len() < opts.device_offset + opts.span {
        return Err(backend(format!(
            "{} is {} bytes, the bridge window needs {:#x}",
            opts.device.display(),
            meta.len(),
            opts.device_offset + opts.span
        )));
    }
    Ok(file)
}

/// Maps the bridge window of `opts`.
fn map_bridge(opts: &FpgaOptions) -> Result<Bridge, LoadError> {
    let file = open_device(opts)?;
    // Every bound below is checked against the span: on a 32-bit board a
    // span past the address space must be refused, not cut short.
    let span = usize::try_from(opts.span).map_err(|_| {
        backend(format!(
            "a bridge span of {:#x} bytes does not fit this machine's address space",
            opts.span
        ))
    })?;
    let map = MmapOptions::new()
        .offset(opts.device_offset)
        .len(span)
        .map_raw(&file)
        .map_err(|e| {
            backend(format!(
                "cannot map {:#x} bytes of {} at {:#x}: {e}",
                opts.span,
                opts.device.display(),
                opts.device_offset
            ))
        })?;
    Ok(Bridge {
        map,
        base: opts.base,
        span: opts.span,
    })
}

pub(crate) fn load(
    opts: &FpgaOptions,
    cfg: &Configuration,
    bitstream: &[u8],
    name: &str,
    dopts: DriverOptions,
) -> Result<Loaded, LoadError> {
    // Check the table against the window before touching the hardware.
    let r8 = |n: u32| (n as usize).div_ceil(8) * 8;
    for (i, c) in cfg.cores.iter().enumerate() {
        for (what, a, len) in [
            ("control", c.control, crate::bus::csr::SPAN as usize),
            ("input", c.input, r8(cfg.input_size)),
            ("output", c.output, r8(cfg.output_size)),
        ] {
            bridge_offset(opts.base, opts.span, a as u64, len as u64).ok_or_else(|| {
                LoadError::Invalid(format!(
                    "core {i} {what} window {a:#x}+{len:#x} lies outside the HPS-to-FPGA bridge \
                     ({:#x}+{:#x})",
                    opts.base, opts.span
                ))
            })?;
        }
    }
    // Each core's interrupt, found before the FPGA is touched.
    let mut irqs = Vec::new();
    for c in &cfg.cores {
        irqs.push(match &opts.interrupts {
            Some(root) => {
                let off = bridge_offset(opts.base, opts.span, c.control as u64, 8)
                    .expect("checked above");
                let uio = corefarm_board::Uio::open_covering(root, opts.base + off)?;
                Some(UioInterrupt::new(uio))
            }
            None => None,
        });
    }
    program(&opts.programmer, bitstream)?;
    let bridge = Arc::new(map_bridge(opts)?);
    let cores = cfg
        .cores
        .iter()
        .zip(irqs)
        .map(|(c, irq)| {
            let bus = FpgaBus {
                bridge: bridge.clone(),
                irq,
            };
            let d = Driver::new(Box::new(bus), *c, cfg.input_size, cfg.output_size, dopts)
                .map_err(|e| backend(e.to_string()))?;
            Ok(Box::new(d) as Box<dyn Core>)
        })
        .collect::<Result<Vec<_>, LoadError>>()?;
    Ok(Loaded {
        description: format!(
            "{} × fpga {name} ({}, {})",
            cores.len(),
            crate::image::FPGA_TARGET,
            if opts.interrupts.is_some() {
                "interrupts"
            } else {
                "polling"
            }
        ),
        cores,
    })
}

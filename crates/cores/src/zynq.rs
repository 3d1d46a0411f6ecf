//! AMD Zynq backend (Zynq-7000, Zynq UltraScale+): the bitstream is
//! programmed through the Linux FPGA manager, each core's registers are the
//! UIO device whose map covers its control address, a bus-mastering core's
//! buffers live in a u-dma-buf region (the bus's [`DmaWindow`]), and a job's
//! completion is awaited on the core's UIO interrupt, with polling as the
//! fallback. The same [`Driver`] runs over it as over the Cyclone V bridge.
//! The board interfaces themselves are `corefarm_board`'s.
//!
//! NOTE: written against the documented kernel interfaces and tested
//! against a fake sysfs/devfs tree with a thread playing the core (an
//! Avalon CSR one, or a Vitis `ap_ctrl_hs` one mastering the buffer); it has
//! not been run on a Zynq board (docs/operations.md).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use corefarm_board::{uio, BoardError, FpgaManager, Mapping, Overlay, Piece, Root, UdmaBuf, Uio};
use corefarm_smp::Configuration;

use crate::bus::{Bus, BusError, DmaWindow};
use crate::{Core, Driver, DriverOptions, LoadError, Loaded};

/// The image target of a Zynq bitstream (a `.bin`, as the Xilinx FPGA
/// manager takes it).
pub const ZYNQ_TARGET: &str = "fpga-zynq";

/// The file (in the firmware directory) the FPGA manager loads.
pub const FIRMWARE_NAME: &str = "corefarm.bin";

/// Longest single sleep on an interrupt: a core whose interrupt is not
/// wired (or a device tree that names the wrong one) then finishes its jobs
/// this late, found by the done register, instead of timing out.
pub const MAX_IRQ_WAIT: Duration = Duration::from_millis(10);

/// Where the board's interfaces are and how to wait for a core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZynqOptions {
    /// Root of `/sys`, `/dev` and `/lib/firmware` (`/` on a board).
    pub root: Root,
    /// The FPGA manager's name under `/sys/class/fpga_manager`.
    pub fpga_manager: String,
    /// The u-dma-buf buffer shared out among the cores (`udmabuf0`); `None`
    /// for designs whose cores do not master the bus.
    pub udmabuf: Option<String>,
    /// Wait for completion on the UIO interrupt (else poll the registers).
    pub interrupts: bool,
    /// A device-tree overlay (`.dtbo`) applied through configfs for each
    /// configuration: its `firmware-name` names [`FIRMWARE_NAME`], and it
    /// adds the cores' UIO devices and the buffer. Without the configfs
    /// interface on the board, the FPGA manager programs the bitstream and
    /// the devices must be in the base device tree.
    pub overlay: Option<PathBuf>,
}

impl Default for ZynqOptions {
    fn default() -> Self {
        ZynqOptions {
            root: Root::default(),
            fpga_manager: "fpga0".into(),
            udmabuf: Some("udmabuf0".into()),
            interrupts: true,
            overlay: None,
        }
    }
}

impl ZynqOptions {
    /// Opens every piece a configuration would need but the cores' own UIO
    /// devices: a node started on a board that lacks one says so at start.
    pub fn check(&self) -> Result<(), LoadError> {
        if let Programming::Overlay { .. } = self.programming()? {
            // The overlay adds the devices: they need not be there yet.
            return Ok(());
        }
        if uio::list(&self.root)?.is_empty() {
            return Err(BoardError::Missing {
                piece: Piece::Uio,
                path: self.root.path("/sys/class/uio/uio0"),
            }
            .into());
        }
        if let Some(b) = &self.udmabuf {
            UdmaBuf::open_named(&self.root, b)?;
        }
        Ok(())
    }
}

/// The configfs directory of the overlay this backend applies.
pub const OVERLAY_NAME: &str = "corefarm";

/// The file (in the firmware directory) the overlay is applied from.
pub const OVERLAY_FILE: &str = "corefarm.dtbo";

/// How a configuration's bitstream gets into the FPGA.
enum Programming {
    Manager(FpgaManager),
    Overlay { overlay: Overlay, dtbo: Vec<u8> },
}

impl ZynqOptions {
    /// The overlay where one is given and the board has configfs
    /// overlays, else the FPGA manager.
    fn programming(&self) -> Result<Programming, LoadError> {
        if let Some(path) = &self.overlay {
            match Overlay::open(&self.root, OVERLAY_NAME) {
                Ok(overlay) => {
                    let dtbo = std::fs::read(path).map_err(|e| {
                        LoadError::Backend(format!("the overlay {}: {e}", path.display()))
                    })?;
                    return Ok(Programming::Overlay { overlay, dtbo });
                }
                Err(e) if e.piece() == Some(Piece::Overlay) => {
                    tracing::warn!("{e}; programming through the FPGA manager instead");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Programming::Manager(FpgaManager::open(
            &self.root,
            &self.fpga_manager,
        )?))
    }
}

/// A core's completion interrupt through UIO, for this backend and the
/// Cyclone V one.
pub(crate) struct UioInterrupt {
    uio: Uio,
    /// Whether the done register is worth reading: the interrupt fired, or
    /// the last wait ended without it (a lost interrupt costs one
    /// [`MAX_IRQ_WAIT`], not the job).
    look: bool,
    /// The device refused a wait (a UIO device without an interrupt fails
    /// its reads and writes with EIO): the core is polled from then on.
    failed: bool,
}

impl UioInterrupt {
    pub(crate) fn new(uio: Uio) -> UioInterrupt {
        UioInterrupt {
            uio,
            look: true,
            failed: false,
        }
    }

    /// [`Bus::irq`]'s level.
    pub(crate) fn level(&self) -> bool {
        self.look
    }

    /// [`Bus::wait_irq`]: enables the interrupt (the kernel masks it each
    /// time it fires) and sleeps on it.
    pub(crate) fn wait(&mut self, timeout: Duration) -> bool {
        self.look = true;
        if self.failed {
            return false;
        }
        let r = self
            .uio
            .enable()
            .and_then(|()| self.uio.wait(Some(timeout.min(MAX_IRQ_WAIT))));
        match r {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!("{e}; polling this core from now on");
                self.failed = true;
                false
            }
        }
    }
}

/// One mapped range of bus addresses.
struct Window {
    base: u64,
    len: u64,
    /// Offset of `base` within the mapping.
    skip: u64,
    /// Registers behind a 32-bit AXI4-Lite port, accessed a word at a time.
    registers: bool,
    map: Mapping,
}

/// Every window of the configured design, shared by the cores' buses.
struct Board {
    windows: Vec<Window>,
}

impl Board {
    fn find(&self, addr: u64, len: usize) -> Result<(&Window, u64), BusError> {
        if addr % 8 != 0 {
            return Err(BusError::Unaligned { addr });
        }
        self.windows
            .iter()
            .find(|w| addr >= w.base && addr - w.base + len as u64 <= w.len)
            .map(|w| (w, w.skip + addr - w.base))
            .ok_or(BusError::Unmapped { addr, len })
    }
}

fn bus_error(addr: u64, len: usize, e: BoardError) -> BusError {
    match e {
        BoardError::OutOfRange { .. } => BusError::Unmapped { addr, len },
        e => BusError::Other(e.to_string()),
    }
}

/// One core's view of the board.
pub struct ZynqBus {
    board: Arc<Board>,
    dma: Option<DmaWindow>,
    irq: Option<UioInterrupt>,
}

impl Bus for ZynqBus {
    fn read64(&mut self, addr: u64) -> Result<u64, BusError> {
        let (w, off) = self.board.find(addr, 8)?;
        let r = if w.registers {
            // Low word first, as a 32-bit master reads a 64-bit register.
            w.map.read32(off).and_then(|lo| {
                w.map
                    .read32(off + 4)
                    .map(|hi| u64::from(lo) | u64::from(hi) << 32)
            })
        } else {
            w.map.read64(off)
        };
        r.map_err(|e| bus_error(addr, 8, e))
    }

    fn write64(&mut self, addr: u64, value: u64) -> Result<(), BusError> {
        let (w, off) = self.board.find(addr, 8)?;
        let r = if w.registers {
            w.map
                .write32(off, value as u32)
                .and_then(|()| w.map.write32(off + 4, (value >> 32) as u32))
        } else {
            w.map.write64(off, value)
        };
        r.map_err(|e| bus_error(addr, 8, e))
    }

    fn read_block(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), BusError> {
        let (w, off) = self.board.find(addr, buf.len())?;
        w.map
            .read_bytes(off, buf)
            .map_err(|e| bus_error(addr, buf.len(), e))
    }

    fn write_block(&mut self, addr: u64, data: &[u8]) -> Result<(), BusError> {
        let (w, off) = self.board.find(addr, data.len())?;
        w.map
            .write_bytes(off, data)
            .map_err(|e| bus_error(addr, data.len(), e))
    }

    fn idle(&mut self, budget: Duration) {
        std::thread::sleep(budget.min(Duration::from_micros(100)));
    }

    fn irq(&mut self, _control: u64) -> Option<bool> {
        self.irq.as_ref().map(UioInterrupt::level)
    }

    fn wait_irq(&mut self, _control: u64, timeout: Duration) -> bool {
        self.irq.as_mut().is_some_and(|i| i.wait(timeout))
    }

    fn dma_window(&self) -> Option<DmaWindow> {
        self.dma
    }
}

/// Core `i` of `n`'s share of a buffer of `len` bytes at `base`: equal
/// parts, whole 4 KiB pages each, so no core's bursts cross into another's.
fn dma_share(base: u64, len: u64, i: usize, n: usize) -> Option<DmaWindow> {
    let part = len / n as u64 / 4096 * 4096;
    (part > 0).then(|| DmaWindow {
        base: base + i as u64 * part,
        len: part,
    })
}

/// The buses of `cfg`'s cores, every piece opened and mapped: with the FPGA
/// manager nothing on the board is touched yet, so a device tree without a
/// core's UIO device is refused with the FPGA as it was.
fn open(opts: &ZynqOptions, cfg: &Configuration) -> Result<Vec<ZynqBus>, LoadError> {
    let uios = cfg
        .cores
        .iter()
        .map(|c| Uio::open_covering(&opts.root, c.control as u64))
        .collect::<Result<Vec<_>, _>>()?;
    let buf = match &opts.udmabuf {
        Some(b) => Some(UdmaBuf::open_named(&opts.root, b)?),
        None => None,
    };
    let mut windows = Vec::new();
    let mut mapped = Vec::new();
    for u in &uios {
        if mapped.contains(&u.index()) {
            continue;
        }
        mapped.push(u.index());
        for m in u.maps() {
            windows.push(Window {
                base: m.addr,
                len: m.size,
                skip: m.offset,
                registers: true,
                map: u.map(m.index)?,
            });
        }
    }
    let dma = buf.map(|b| {
        let (base, len) = (b.phys_addr(), b.size());
        windows.push(Window {
            base,
            len,
            skip: 0,
            registers: false,
            map: b.into_mapping(),
        });
        (base, len)
    });
    let board = Arc::new(Board { windows });
    let n = uios.len();
    let buses = uios
        .into_iter()
        .enumerate()
        .map(|(i, u)| ZynqBus {
            board: board.clone(),
            dma: dma.and_then(|(base, len)| dma_share(base, len, i, n)),
            irq: opts.interrupts.then(|| UioInterrupt::new(u)),
        })
        .collect();
    Ok(buses)
}

pub(crate) fn load(
    opts: &ZynqOptions,
    cfg: &Configuration,
    bitstream: &[u8],
    name: &str,
    control: Option<&crate::image::Control>,
    dopts: DriverOptions,
) -> Result<Loaded, LoadError> {
    let buses = match opts.programming()? {
        Programming::Manager(mgr) => {
            let buses = open(opts, cfg)?;
            mgr.program(FIRMWARE_NAME, bitstream)?;
            buses
        }
        Programming::Overlay { overlay, dtbo } => {
            // The previous configuration's overlay goes first (with its
            // devices); this one adds the cores' devices, so they are
            // opened once it is applied.
            if overlay.is_applied() {
                overlay.remove()?;
            }
            overlay.apply_with_bitstream(FIRMWARE_NAME, bitstream, OVERLAY_FILE, &dtbo)?;
            open(opts, cfg).inspect_err(|_| {
                let _ = overlay.remove();
            })?
        }
    };
    let cores = cfg
        .cores
        .iter()
        .zip(buses)
        .map(|(c, bus)| {
            // The manifest's control protocol: Vitis-style cores are the
            // usual ones on a Zynq, Avalon CSR when it names none.
            let d = Driver::with_control(
                Box::new(bus),
                *c,
                cfg.input_size,
                cfg.output_size,
                control,
                dopts,
            )
            .map_err(|e| LoadError::Backend(e.to_string()))?;
            Ok(Box::new(d) as Box<dyn Core>)
        })
        .collect::<Result<Vec<_>, LoadError>>()?;
    Ok(Loaded {
        description: format!(
            "{} × zynq {name} ({ZYNQ_TARGET}, {})",
            cores.len(),
            if opts.interrupts {
                "interrupts"
            } else {
                "polling"
            }
        ),
        cores,
    })
}

pub mod fake {
    //! A core played by a thread behind a fake board tree, for tests and
    //! the interrupt benchmark: it follows the CSR of seed 000 table 3.1
    //! in a regular file standing in for the register map, as hardware
    //! would (it sees start, takes `latency`, writes the output and done)
    //! and fires its stand-in UIO interrupt when the driver enabled it.

    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;
    use std::time::Duration;

    use corefarm_board::fake::FakeInterrupt;
    use corefarm_board::{Mapping, Piece};
    use corefarm_smp::CoreInfo;

    use crate::bus::csr;
    use crate::driver::ap_ctrl_hs::{reg, register_offsets};
    use crate::image::Argument;

    /// Bits the core puts beside done, so that it can tell the driver's
    /// write-1-to-clear (which stores a plain 1 in a file) from its own.
    const TAG: u64 = 1 << 32;

    /// How often the core looks for a start: it is hardware, its own
    /// polling costs the driver nothing.
    const LOOK: Duration = Duration::from_micros(50);

    /// How long after a job the core watches for the driver's clear.
    const CLEAR_WATCH: Duration = Duration::from_millis(2);

    /// What the core did, returned by [`FakeCore::stop`].
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Played {
        pub jobs: u64,
        pub interrupts: u64,
    }

    /// The thread playing the core; stopped when dropped.
    pub struct FakeCore {
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<Played>>,
    }

    impl FakeCore {
        /// Plays `core` (physical addresses) in `file`, whose offset 0 is
        /// physical address `base`: `out[i] = in[i] + 1` over `size` bytes,
        /// `latency` per job; fires `irq` when the core's interrupt is
        /// enabled.
        pub fn start(
            file: &Path,
            base: u64,
            core: CoreInfo,
            size: usize,
            latency: Duration,
            mut irq: Option<FakeInterrupt>,
        ) -> FakeCore {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(file)
                .expect("the fake register file");
            let len = f.metadata().expect("its length").len();
            let map = Mapping::new(Piece::Uio, &f, file, 0, len).expect("the fake register file");
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let off = move |a: u32| a as u64 - base;
            let (ctl, inp, out) = (off(core.control), off(core.input), off(core.output));
            let thread = std::thread::spawn(move || {
                let mut played = Played::default();
                let mut buf = vec![0u8; size];
                while !s2.load(Ordering::SeqCst) {
                    if let Some(i) = &mut irq {
                        // Takes the driver's enables as they come.
                        i.fire_if(false).expect("the fake interrupt");
                    }
                    if map.read64(ctl + csr::DONE).unwrap() == 1 {
                        map.write64(ctl + csr::DONE, 0).unwrap();
                    }
                    if map.read64(ctl + csr::START).unwrap() & 1 == 0 {
                        std::thread::sleep(LOOK);
                        continue;
                    }
                    map.write64(ctl + csr::START, 0).unwrap();
                    map.write64(ctl + csr::BUSY, 1).unwrap();
                    std::thread::sleep(latency);
                    map.read_bytes(inp, &mut buf).unwrap();
                    buf.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                    map.write_bytes(out, &buf).unwrap();
                    map.write64(ctl + csr::BUSY, 0).unwrap();
                    map.write64(ctl + csr::DONE, 1 | TAG).unwrap();
                    played.jobs += 1;
                    if map.read64(ctl + csr::INTERRUPT_ENABLE).unwrap() & 1 == 1 {
                        if let Some(i) = &mut irq {
                            i.fire().expect("the fake interrupt");
                            played.interrupts += 1;
                        }
                    }
                    // Hardware clears done the moment the driver writes
                    // its 1: the core watches for that write closely for a
                    // while, so that the driver's next job does not find a
                    // done bit a real core would have cleared.
                    let until = std::time::Instant::now() + CLEAR_WATCH;
                    while map.read64(ctl + csr::DONE).unwrap() != 1
                        && std::time::Instant::now() < until
                        && !s2.load(Ordering::SeqCst)
                    {
                        std::thread::yield_now();
                    }
                }
                played
            });
            FakeCore {
                stop,
                thread: Some(thread),
            }
        }

        /// Stops the core; what it did.
        pub fn stop(mut self) -> Played {
            self.halt()
        }

        fn halt(&mut self) -> Played {
            self.stop.store(true, Ordering::SeqCst);
            self.thread
                .take()
                .map(|t| t.join().expect("the fake core"))
                .unwrap_or_default()
        }
    }

    impl Drop for FakeCore {
        fn drop(&mut self) {
            self.halt();
        }
    }

    /// What a Vitis-style core saw when it was started: the registers as the
    /// driver left them, for checks against the `s_axi_control` map.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Started {
        /// The control word (0x00) as written: `ap_start` alone.
        pub ctrl: u32,
        /// Global interrupt enable (0x04).
        pub gie: u32,
        /// IP interrupt enable (0x08).
        pub ier: u32,
        /// The argument registers from 0x10 to the end of the argument
        /// block, a word each (reserved words included).
        pub args: Vec<u32>,
    }

    /// What a [`FakeAxiCore`] did, returned by [`FakeAxiCore::stop`].
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct AxiPlayed {
        pub jobs: u64,
        pub interrupts: u64,
        /// Writes that toggled a status bit (0x0C) off.
        pub status_clears: u64,
        /// Each job's registers at its start.
        pub started: Vec<Started>,
        /// Jobs whose pointer registers named memory outside the buffer.
        pub bad_pointers: u64,
    }

    /// A thread playing a Vitis HLS `ap_ctrl_hs` core in the regular files
    /// standing in for its UIO register map and the u-dma-buf buffer, as
    /// the hardware behaves: it sees `ap_start`, reads its `m_axi` pointer
    /// arguments from the argument registers, reads its inputs from the
    /// buffer at those bus addresses, writes its output there, sets
    /// `ap_done`/`ap_idle`/`ap_ready`, sets the status bits the driver
    /// enabled (0x0C, toggled off by the driver's write of 1) and raises its
    /// interrupt while the global enable is on and a status bit is set.
    /// On completion every output buffer gets `out[i] = Σ in[i] + k`, over
    /// the input buffers in order and the first scalar `k`.
    ///
    /// A file cannot clear `ap_done` on a read; the driver's next write of
    /// `ap_start` replaces it, which is all the driver relies on.
    pub struct FakeAxiCore {
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<AxiPlayed>>,
    }

    /// Bit the core keeps beside the status bits it set itself, so that it
    /// tells the driver's toggling write (a plain 1 in the file) from them.
    const STATUS_TAG: u32 = 1 << 31;

    fn map_file(file: &Path, piece: Piece) -> Mapping {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(file)
            .expect("a fake board file");
        let len = f.metadata().expect("its length").len();
        Mapping::new(piece, &f, file, 0, len).expect("a fake board file")
    }

    impl FakeAxiCore {
        /// Plays a core whose registers are at offset 0 of `regs` and
        /// whose arguments are `args`; the buffer `dma` holds bus addresses
        /// from `dma_base`. Each job takes `latency`.
        pub fn start(
            regs: &Path,
            dma: &Path,
            dma_base: u64,
            args: Vec<Argument>,
            latency: Duration,
            mut irq: Option<FakeInterrupt>,
        ) -> FakeAxiCore {
            let regs = map_file(regs, Piece::Uio);
            let mem = map_file(dma, Piece::UdmaBuf);
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let (offsets, end) = register_offsets(&args);
            let thread = std::thread::spawn(move || {
                let mut played = AxiPlayed::default();
                regs.write32(reg::CTRL, reg::AP_IDLE).unwrap();
                // Status bits as the core holds them, and as it last wrote
                // the register (tagged when set).
                let mut isr = 0u32;
                let mut line_enables = 0u32;
                let r = |o: u64| regs.read32(o).unwrap();
                let tagged = |v: u32| if v == 0 { 0 } else { v | STATUS_TAG };
                // Takes the driver's write to the status register, if any:
                // each 1 toggles its bit. Returns whether a bit went off.
                let status_write = |isr: &mut u32| {
                    let now = r(reg::ISR);
                    if now == tagged(*isr) {
                        return false;
                    }
                    let before = *isr;
                    *isr ^= now & (reg::INT_DONE | reg::INT_READY);
                    regs.write32(reg::ISR, tagged(*isr)).unwrap();
                    before & !*isr != 0
                };
                while !s2.load(Ordering::SeqCst) {
                    // The enables first: the driver's status write before
                    // an enable it sent is then in the file too, so a line
                    // the driver lowered does not fire again.
                    let enables = match &mut irq {
                        Some(i) => i.enables().expect("the fake interrupt"),
                        None => 0,
                    };
                    played.status_clears += u64::from(status_write(&mut isr));
                    if let Some(i) = &mut irq {
                        // A level interrupt: it fires on an enable while the
                        // line is high (the kernel masks it as it fires).
                        if r(reg::GIE) & 1 == 1 && isr != 0 && enables > line_enables {
                            i.fire().expect("the fake interrupt");
                            line_enables = enables;
                            played.interrupts += 1;
                        }
                    }
                    let ctrl = r(reg::CTRL);
                    if ctrl & reg::AP_START == 0 {
                        std::thread::sleep(LOOK);
                        continue;
                    }
                    let words = ((end - reg::ARGS) / 4) as usize;
                    played.started.push(Started {
                        ctrl,
                        gie: r(reg::GIE),
                        ier: r(reg::IER),
                        args: (0..words as u64).map(|w| r(reg::ARGS + 4 * w)).collect(),
                    });
                    // Busy: start held, not idle.
                    regs.write32(reg::CTRL, reg::AP_START).unwrap();
                    std::thread::sleep(latency);
                    let ptr = |o: u64| u64::from(r(o)) | u64::from(r(o + 4)) << 32;
                    let mut ins = Vec::new();
                    let mut outs = Vec::new();
                    let mut k = None;
                    for (a, &o) in args.iter().zip(&offsets) {
                        match a {
                            Argument::In { size, .. } => ins.push((ptr(o), *size as usize)),
                            Argument::Out { size, .. } => outs.push((ptr(o), *size as usize)),
                            Argument::Scalar { .. } => {
                                k.get_or_insert(r(o) as u8);
                            }
                        }
                    }
                    let inside = |(a, n): &(u64, usize)| {
                        *a >= dma_base && a - dma_base + *n as u64 <= mem.len()
                    };
                    if ins.iter().chain(&outs).all(inside) {
                        let data: Vec<Vec<u8>> = ins
                            .iter()
                            .map(|&(a, n)| {
                                let mut b = vec![0u8; n];
                                mem.read_bytes(a - dma_base, &mut b).unwrap();
                                b
                            })
                            .collect();
                        for &(a, n) in &outs {
                            let out: Vec<u8> = (0..n)
                                .map(|i| {
                                    data.iter()
                                        .filter_map(|d| d.get(i))
                                        .fold(k.unwrap_or(0), |s, b| s.wrapping_add(*b))
                                })
                                .collect();
                            mem.write_bytes(a - dma_base, &out).unwrap();
                        }
                    } else {
                        played.bad_pointers += 1;
                    }
                    // The status bits the driver enabled, then done.
                    played.status_clears += u64::from(status_write(&mut isr));
                    isr |= r(reg::IER) & (reg::INT_DONE | reg::INT_READY);
                    regs.write32(reg::ISR, tagged(isr)).unwrap();
                    regs.write32(reg::CTRL, reg::AP_DONE | reg::AP_IDLE | reg::AP_READY)
                        .unwrap();
                    played.jobs += 1;
                }
                // The driver's last write is in the file whether or not
                // the loop came round to it.
                played.status_clears += u64::from(status_write(&mut isr));
                played
            });
            FakeAxiCore {
                stop,
                thread: Some(thread),
            }
        }

        /// Stops the core; what it did.
        pub fn stop(mut self) -> AxiPlayed {
            self.halt()
        }

        fn halt(&mut self) -> AxiPlayed {
            self.stop.store(true, Ordering::SeqCst);
            self.thread
                .take()
                .map(|t| t.join().expect("the fake core"))
                .unwrap_or_default()
        }
    }

    impl Drop for FakeAxiCore {
        fn drop(&mut self) {
            self.halt();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use corefarm_board::fake::{FakeInterrupt, TempTree};
    use corefarm_smp::CoreInfo;

    fn cfg(cores: Vec<CoreInfo>) -> Configuration {
        Configuration {
            input_size: 8,
            output_size: 8,
            cores,
            bitstream: Default::default(),
        }
    }

    #[test]
    fn buses_decode_registers_and_the_dma_buffer() {
        let t = TempTree::new();
        t.fpga_manager("fpga0", "operating");
        t.uio(0, "a", &[(0x43c0_0000, 0x1000)]);
        t.uio(1, "b", &[(0x43c1_0000, 0x1000)]);
        let buf = t.udmabuf(0, 0x3f00_0000, 1 << 16);
        let _irqs = [
            FakeInterrupt::bind(&t.root(), 0),
            FakeInterrupt::bind(&t.root(), 1),
        ];
        let core = |c| CoreInfo {
            control: c,
            input: c + 0x100,
            output: c + 0x200,
        };
        let opts = ZynqOptions {
            root: t.root(),
            ..ZynqOptions::default()
        };
        let mut buses = open(&opts, &cfg(vec![core(0x43c1_0000), core(0x43c0_0000)])).unwrap();
        let w = buses[1].dma_window().unwrap();
        assert_eq!(
            w,
            DmaWindow {
                base: 0x3f00_8000,
                len: 0x8000
            }
        );
        buses[1].write_block(w.base + 8, b"argument").unwrap();
        assert_eq!(&std::fs::read(buf).unwrap()[0x8008..0x8010], b"argument");
        buses[0].write64(0x43c1_0010, 0x1_0000_0002).unwrap();
        let regs = std::fs::read(t.root().path("/dev/uio1")).unwrap();
        assert_eq!(&regs[0x10..0x18], &0x1_0000_0002u64.to_le_bytes());
        assert_eq!(buses[0].read64(0x43c1_0010).unwrap(), 0x1_0000_0002);
        assert_eq!(buses[0].irq(0x43c1_0000), Some(true));
        assert!(matches!(
            buses[0].read64(0x43c2_0000),
            Err(BusError::Unmapped { .. })
        ));
    }

    #[test]
    fn the_buffer_is_shared_out_in_whole_pages() {
        assert_eq!(
            dma_share(0x1000_0000, 3 << 20, 2, 3),
            Some(DmaWindow {
                base: 0x1000_0000 + (2 << 20),
                len: 1 << 20
            })
        );
        assert_eq!(dma_share(0, 3 * 4096 + 5, 1, 2).unwrap().len, 4096);
        assert_eq!(dma_share(0, 4096, 0, 2), None);
    }
}

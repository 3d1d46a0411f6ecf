//! Vitis HLS `ap_ctrl_hs` on the AXI4-Lite `s_axi_control` slave, as Vitis
//! generates it (32-bit registers):
//!
//! | offset | register |
//! |---|---|
//! | 0x00 | control: bit 0 ap_start, 1 ap_done (clear on read), 2 ap_idle, 3 ap_ready, 7 auto_restart |
//! | 0x04 | global interrupt enable (bit 0) |
//! | 0x08 | IP interrupt enable: bit 0 ap_done, bit 1 ap_ready |
//! | 0x0C | IP interrupt status: same bits, toggled by writing 1 |
//! | 0x10… | arguments: a 64-bit pointer takes two words and a reserved one, a 32-bit scalar one word and a reserved one |
//!
//! The core's `m_axi` pointers reach host memory: the driver places one
//! buffer per pointer in the bus's DMA window (4 KiB aligned, as a page
//! allocator would), copies the job's input there, writes the addresses,
//! starts the core and copies the output buffers back.
//!
//! The [`Bus`] moves 64-bit words, so two registers travel together: the
//! driver writes whole words whose other half it means (control with the
//! global enable, interrupt enable with the status bits to toggle, the
//! argument block from a full image of it), never a read-modify-write of
//! a register with side effects.

use std::time::Instant;

use super::{Driver, DriverError};
use crate::bus::{Bus, DmaWindow};
use crate::image::Argument;
use crate::CoreError;

/// Register offsets and bits of `s_axi_control`.
pub mod reg {
    pub const CTRL: u64 = 0x00;
    pub const GIE: u64 = 0x04;
    pub const IER: u64 = 0x08;
    pub const ISR: u64 = 0x0C;
    /// First argument register.
    pub const ARGS: u64 = 0x10;
    pub const AP_START: u32 = 1 << 0;
    pub const AP_DONE: u32 = 1 << 1;
    pub const AP_IDLE: u32 = 1 << 2;
    pub const AP_READY: u32 = 1 << 3;
    pub const AUTO_RESTART: u32 = 1 << 7;
    /// IER/ISR bits.
    pub const INT_DONE: u32 = 1 << 0;
    pub const INT_READY: u32 = 1 << 1;
}

/// Byte offset of each argument's first register, in argument order, and
/// the end of the argument block.
pub fn register_offsets(args: &[Argument]) -> (Vec<u64>, u64) {
    let mut at = reg::ARGS;
    let offsets = args
        .iter()
        .map(|a| {
            let o = at;
            at += match a {
                // Low word, high word, reserved.
                Argument::In { .. } | Argument::Out { .. } => 12,
                // Value, reserved.
                Argument::Scalar { .. } => 8,
            };
            o
        })
        .collect();
    (offsets, at)
}

/// Where the buffers of one pointer argument live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Buffer {
    addr: u64,
    size: usize,
    input: bool,
}

/// The argument layout of one core, fixed when the driver is made.
pub(super) struct ApCtrlHs {
    /// Pointer buffers in argument order.
    buffers: Vec<Buffer>,
    /// The argument registers from 0x10 as 32-bit words, padded to whole
    /// 64-bit words; scalars from the message are filled in per job.
    words: Vec<u32>,
    /// Word index in `words` of each scalar taken from the message.
    message_scalars: Vec<usize>,
}

const PAGE: u64 = 4096;

impl ApCtrlHs {
    pub(super) fn new(args: &[Argument], window: DmaWindow) -> Result<ApCtrlHs, DriverError> {
        let (offsets, end) = register_offsets(args);
        let mut words = vec![0u32; ((end - reg::ARGS) / 4).next_multiple_of(2) as usize];
        let mut buffers = Vec::new();
        let mut message_scalars = Vec::new();
        let base = window.base.next_multiple_of(PAGE);
        let mut next = base;
        for (a, off) in args.iter().zip(offsets) {
            let w = ((off - reg::ARGS) / 4) as usize;
            match a {
                Argument::In { size, .. } | Argument::Out { size, .. } => {
                    let addr = next;
                    next += u64::from(*size).max(1).next_multiple_of(PAGE);
                    words[w] = addr as u32;
                    words[w + 1] = (addr >> 32) as u32;
                    buffers.push(Buffer {
                        addr,
                        size: *size as usize,
                        input: matches!(a, Argument::In { .. }),
                    });
                }
                Argument::Scalar { value: Some(v), .. } => words[w] = *v,
                Argument::Scalar { value: None, .. } => message_scalars.push(w),
            }
        }
        let need = next - window.base;
        if need > window.len {
            return Err(DriverError::WindowTooSmall {
                need,
                have: window.len,
            });
        }
        Ok(ApCtrlHs {
            buffers,
            words,
            message_scalars,
        })
    }
}

fn ctrl(word: u64) -> u32 {
    word as u32
}

/// Writes IER (keeping `ier`) and toggles whichever status bits are set,
/// clearing them.
fn clear_status(bus: &mut dyn Bus, c: u64, ier: u32) -> Result<(), CoreError> {
    let isr = (bus.read64(c + reg::IER)? >> 32) as u32 & (reg::INT_DONE | reg::INT_READY);
    bus.write64(c + reg::IER, u64::from(ier) | u64::from(isr) << 32)?;
    Ok(())
}

pub(super) fn run(
    d: &mut Driver,
    deadline: Instant,
    input: &[u8],
    output: &mut [u8],
) -> Result<(), CoreError> {
    let c = d.control;
    // Reading control also clears a done bit left from the last job.
    let idle = d.wait_until(deadline, false, |d| {
        Ok(ctrl(d.bus.read64(c + reg::CTRL)?) & reg::AP_IDLE != 0)
    })?;
    if !idle {
        return Err(d.timed_out("stayed busy"));
    }

    let super::Protocol::ApCtrlHs(p) = &mut d.protocol else {
        unreachable!("called for ap_ctrl_hs only")
    };
    let (scalars, mut rest) = input.split_at(4 * p.message_scalars.len());
    for (&w, v) in p.message_scalars.iter().zip(scalars.chunks_exact(4)) {
        p.words[w] = u32::from_le_bytes(v.try_into().expect("four bytes"));
    }
    for b in p.buffers.iter().filter(|b| b.input) {
        let (now, later) = rest.split_at(b.size);
        d.bus.write_block(b.addr, now)?;
        rest = later;
    }
    for (i, pair) in p.words.chunks_exact(2).enumerate() {
        let v = u64::from(pair[0]) | u64::from(pair[1]) << 32;
        d.bus.write64(c + reg::ARGS + 8 * i as u64, v)?;
    }
    // Interrupts are (re)enabled on every job: a reset clears them.
    let gie = u64::from(d.use_irq);
    if d.use_irq {
        clear_status(d.bus.as_mut(), c, reg::INT_DONE)?;
    }
    d.bus
        .write64(c + reg::CTRL, u64::from(reg::AP_START) | gie << 32)?;

    let done = d.wait_until(deadline, true, |d| {
        if d.use_irq && d.bus.irq(c) == Some(false) {
            return Ok(false);
        }
        Ok(ctrl(d.bus.read64(c + reg::CTRL)?) & reg::AP_DONE != 0)
    })?;
    if !done {
        return Err(d.timed_out("did not finish"));
    }
    if d.use_irq {
        clear_status(d.bus.as_mut(), c, reg::INT_DONE)?;
    }
    let super::Protocol::ApCtrlHs(p) = &d.protocol else {
        unreachable!()
    };
    let mut out = output;
    for b in p.buffers.iter().filter(|b| !b.input) {
        let (now, later) = out.split_at_mut(b.size);
        d.bus.read_block(b.addr, now)?;
        out = later;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bus::BusError;
    use crate::driver::DriverOptions;
    use crate::image::{Control, ControlProtocol};
    use crate::Core;
    use corefarm_smp::CoreInfo;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// A Vitis-style core behind a fake bus: the `s_axi_control` map with
    /// its side effects (done clear on read, status toggle on write), host
    /// memory behind the DMA window, time advanced only by the wait hook.
    /// On completion: out[i] = in0[i] + in1[i] + scalar (every pointer
    /// argument, in order; the first scalar).
    pub struct FakeAxi {
        pub regs: HashMap<u64, u32>,
        pub mem: Vec<u8>,
        pub window: DmaWindow,
        pub args: Vec<Argument>,
        /// Idle calls a job takes; `None`: never finishes.
        pub latency: Option<u32>,
        countdown: Option<u32>,
        pub irq_line: bool,
        pub log: Arc<Mutex<Vec<String>>>,
        pub resets: u32,
    }

    const C: u64 = 0xA000_0000;

    impl FakeAxi {
        pub fn new(args: Vec<Argument>, latency: Option<u32>, irq_line: bool) -> FakeAxi {
            let window = DmaWindow {
                base: 0x1_0000_0000,
                len: 64 * 1024,
            };
            let mut f = FakeAxi {
                regs: HashMap::new(),
                mem: vec![0; window.len as usize],
                window,
                args,
                latency,
                countdown: None,
                irq_line,
                log: Arc::default(),
                resets: 0,
            };
            f.regs.insert(reg::CTRL, reg::AP_IDLE);
            f
        }
        fn r(&self, off: u64) -> u32 {
            *self.regs.get(&off).unwrap_or(&0)
        }
        fn arg64(&self, off: u64) -> u64 {
            u64::from(self.r(off)) | u64::from(self.r(off + 4)) << 32
        }
        fn finish(&mut self) {
            let (offs, _) = register_offsets(&self.args);
            let mut ins = Vec::new();
            let mut outs = Vec::new();
            let mut scalar = 0u8;
            let mut first_scalar = true;
            for (a, off) in self.args.clone().iter().zip(offs) {
                match a {
                    Argument::In { size, .. } => ins.push((self.arg64(off), *size as usize)),
                    Argument::Out { size, .. } => outs.push((self.arg64(off), *size as usize)),
                    Argument::Scalar { .. } if first_scalar => {
                        scalar = self.r(off) as u8;
                        first_scalar = false;
                    }
                    Argument::Scalar { .. } => {}
                }
            }
            let at = |a: u64| (a - self.window.base) as usize;
            for (oa, os) in outs {
                for i in 0..os {
                    let mut v = scalar;
                    for &(ia, is) in &ins {
                        if i < is {
                            v = v.wrapping_add(self.mem[at(ia) + i]);
                        }
                    }
                    let o = at(oa) + i;
                    self.mem[o] = v;
                }
            }
            let ctrl = (self.r(reg::CTRL) & !reg::AP_START) | reg::AP_DONE | reg::AP_IDLE;
            self.regs.insert(reg::CTRL, ctrl);
            let isr = self.r(reg::ISR) | (self.r(reg::IER) & reg::INT_DONE);
            self.regs.insert(reg::ISR, isr);
        }
        fn write32(&mut self, off: u64, v: u32) {
            match off {
                reg::CTRL => {
                    if v & reg::AP_START != 0 && self.r(reg::CTRL) & reg::AP_IDLE != 0 {
                        self.log.lock().unwrap().push("start".into());
                        self.regs.insert(reg::CTRL, reg::AP_START);
                        self.countdown = self.latency;
                    }
                }
                reg::ISR => {
                    if v != 0 {
                        self.log.lock().unwrap().push("clear".into());
                    }
                    let isr = self.r(reg::ISR) ^ v;
                    self.regs.insert(reg::ISR, isr);
                }
                _ => {
                    self.regs.insert(off, v);
                }
            }
        }
        fn read32(&mut self, off: u64) -> u32 {
            let v = self.r(off);
            if off == reg::CTRL {
                // ap_done is clear on read.
                self.regs.insert(reg::CTRL, v & !reg::AP_DONE);
            }
            v
        }
    }

    impl Bus for FakeAxi {
        fn read64(&mut self, addr: u64) -> Result<u64, BusError> {
            if addr % 8 != 0 {
                return Err(BusError::Unaligned { addr });
            }
            if addr >= self.window.base {
                let o = (addr - self.window.base) as usize;
                return Ok(u64::from_le_bytes(self.mem[o..o + 8].try_into().unwrap()));
            }
            let off = addr - C;
            Ok(u64::from(self.read32(off)) | u64::from(self.read32(off + 4)) << 32)
        }
        fn write64(&mut self, addr: u64, value: u64) -> Result<(), BusError> {
            if addr % 8 != 0 {
                return Err(BusError::Unaligned { addr });
            }
            if addr >= self.window.base {
                let o = (addr - self.window.base) as usize;
                self.mem[o..o + 8].copy_from_slice(&value.to_le_bytes());
                return Ok(());
            }
            let off = addr - C;
            self.write32(off, value as u32);
            self.write32(off + 4, (value >> 32) as u32);
            Ok(())
        }
        fn idle(&mut self, _budget: Duration) {
            match self.countdown {
                Some(0) => {
                    self.countdown = None;
                    self.finish();
                }
                Some(n) => self.countdown = Some(n - 1),
                None => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        fn irq(&mut self, _control: u64) -> Option<bool> {
            self.irq_line
                .then(|| self.r(reg::GIE) & 1 == 1 && self.r(reg::ISR) & self.r(reg::IER) != 0)
        }
        fn reset(&mut self, _control: u64) -> bool {
            self.resets += 1;
            self.regs.clear();
            self.regs.insert(reg::CTRL, reg::AP_IDLE);
            self.countdown = None;
            true
        }
        fn dma_window(&self) -> Option<DmaWindow> {
            Some(self.window)
        }
    }

    const CORE: CoreInfo = CoreInfo {
        control: C as u32,
        input: 0,
        output: 0,
    };

    fn vadd_args(n: u32, scalar: Option<u32>) -> Vec<Argument> {
        vec![
            Argument::In {
                name: "a".into(),
                size: n,
            },
            Argument::In {
                name: "b".into(),
                size: n,
            },
            Argument::Out {
                name: "c".into(),
                size: n,
            },
            Argument::Scalar {
                name: "k".into(),
                value: scalar,
            },
        ]
    }

    fn opts(ms: u64) -> DriverOptions {
        DriverOptions {
            timeout: Duration::from_millis(ms),
            poll: Duration::from_micros(100),
        }
    }

    fn driver(bus: FakeAxi, n: u32, input: u32, ms: u64) -> Result<Driver, CoreError> {
        let control = Control::ap_ctrl_hs(bus.args.clone());
        Driver::with_control(Box::new(bus), CORE, input, n, Some(&control), opts(ms))
    }

    #[test]
    fn register_offsets_follow_vitis() {
        // The vadd of Vitis's examples: three pointers then a scalar.
        let (offs, end) = register_offsets(&vadd_args(8, None));
        assert_eq!(offs, [0x10, 0x1C, 0x28, 0x34]);
        assert_eq!(end, 0x3C);
    }

    #[test]
    fn job_cycle_places_buffers_and_reads_the_output() {
        for irq in [false, true] {
            // The scalar comes from the message: four bytes before a and b.
            let bus = FakeAxi::new(vadd_args(13, None), Some(3), irq);
            let log = bus.log.clone();
            let mut d = driver(bus, 13, 4 + 26, 5000).unwrap();
            for k in 0..3u8 {
                let mut input = vec![k, 0, 0, 0];
                input.extend(0..13u8);
                input.extend([100u8; 13]);
                let mut out = vec![0u8; 13];
                d.process(&input, &mut out).unwrap();
                let want: Vec<u8> = (0..13u8).map(|i| i + 100 + k).collect();
                assert_eq!(out, want, "irq {irq}");
            }
            assert_eq!(d.stats().jobs, 3);
            let log = log.lock().unwrap();
            if irq {
                assert_eq!(
                    log.as_slice(),
                    ["start", "clear", "start", "clear", "start", "clear"]
                );
            } else {
                assert_eq!(log.as_slice(), ["start", "start", "start"]);
            }
        }
    }

    #[test]
    fn addresses_are_written_as_two_words_and_scalars_from_the_manifest() {
        let bus = FakeAxi::new(vadd_args(8, Some(5)), Some(0), false);
        let mut d = driver(bus, 8, 16, 5000).unwrap();
        let mut out = [0u8; 8];
        d.process(&[1; 16], &mut out).unwrap();
        assert_eq!(out, [7; 8]);
        // The pointers sit above 4 GiB: the high words must be written.
        let window = 0x1_0000_0000u64;
        let Protocol::ApCtrlHs(p) = &d.protocol else {
            panic!()
        };
        assert_eq!(p.words[0], window as u32);
        assert_eq!(p.words[1], 1);
        assert_eq!(p.words[3], (window + 4096) as u32);
        assert_eq!(p.words[9], 5);
    }

    use super::super::Protocol;

    #[test]
    fn a_core_that_never_signals_done_times_out_and_is_reset() {
        for irq in [false, true] {
            let bus = FakeAxi::new(vadd_args(8, Some(0)), None, irq);
            let mut d = driver(bus, 8, 16, 30).unwrap();
            let mut out = [0u8; 8];
            let e = d.process(&[0; 16], &mut out).unwrap_err();
            assert!(
                matches!(e, CoreError::Timeout(t) if t == Duration::from_millis(30)),
                "{e}"
            );
            let s = d.stats();
            assert_eq!((s.timeouts, s.resets, s.jobs), (1, 1, 0));
        }
    }

    #[test]
    fn a_bus_without_dma_memory_or_too_little_is_refused() {
        let mut bus = FakeAxi::new(vadd_args(8, Some(0)), Some(0), false);
        bus.window.len = 8192;
        let e = driver(bus, 8, 16, 100).err().unwrap();
        assert!(
            matches!(
                e,
                CoreError::Setup(DriverError::WindowTooSmall {
                    need: 12288,
                    have: 8192
                })
            ),
            "{e}"
        );
        assert!(matches!(
            ApCtrlHs::new(&vadd_args(8, Some(0)), DmaWindow { base: 0, len: 8192 }),
            Err(DriverError::WindowTooSmall { need: 12288, .. })
        ));
        // The Avalon test bus reaches no host memory.
        let sim = super::super::avalon::tests::SimBus::new(
            CORE,
            8,
            super::super::avalon::tests::Behaviour::Works { latency: 0 },
            false,
        );
        let control = Control {
            protocol: ControlProtocol::ApCtrlHs,
            args: vadd_args(8, Some(0)),
        };
        let e = Driver::with_control(Box::new(sim), CORE, 16, 8, Some(&control), opts(10))
            .err()
            .unwrap();
        assert!(
            matches!(e, CoreError::Setup(DriverError::NoDmaWindow)),
            "{e}"
        );
    }
}

//! Seed 000 table 3.1, the Intel HLS agent's control/status registers:
//! write the input memory, write 1 to start (0x08), wait for done (bit 0 of
//! 0x18), read the output memory, write 1 to 0x18 to clear done.

use std::time::Instant;

use corefarm_smp::CoreInfo;

use super::Driver;
use crate::bus::{csr, Bus, BusError};
use crate::CoreError;

/// Where the core's memories are.
pub(super) struct Avalon {
    input: u64,
    output: u64,
}

impl Avalon {
    pub(super) fn new(core: CoreInfo) -> Avalon {
        Avalon {
            input: core.input as u64,
            output: core.output as u64,
        }
    }
}

pub(super) fn enable_interrupt(bus: &mut dyn Bus, control: u64) -> Result<(), BusError> {
    bus.write64(control + csr::INTERRUPT_ENABLE, 1)
}

pub(super) fn run(
    d: &mut Driver,
    deadline: Instant,
    input: &[u8],
    output: &mut [u8],
) -> Result<(), CoreError> {
    let super::Protocol::Avalon(Avalon {
        input: in_addr,
        output: out_addr,
    }) = d.protocol
    else {
        unreachable!("called for the Avalon protocol only")
    };
    let c = d.control;
    // A core still busy (previous job, power-up) cannot accept a start.
    let idle = d.wait_until(deadline, false, |d| {
        Ok(d.bus.read64(c + csr::BUSY)? & 1 == 0)
    })?;
    if !idle {
        return Err(d.timed_out("stayed busy"));
    }
    // A stale done bit would make the wait below return at once.
    let clear = d.wait_until(deadline, false, |d| {
        if d.bus.read64(c + csr::DONE)? & 1 == 0 {
            return Ok(true);
        }
        d.bus.write64(c + csr::DONE, 1)?;
        Ok(false)
    })?;
    if !clear {
        return Err(d.timed_out("kept its done bit set"));
    }

    d.bus.write_block(in_addr, input)?;
    d.bus.write64(c + csr::START, 1)?;
    let done = d.wait_until(deadline, true, |d| {
        if d.use_irq && d.bus.irq(c) == Some(false) {
            return Ok(false);
        }
        Ok(d.bus.read64(c + csr::DONE)? & 1 == 1)
    })?;
    if !done {
        return Err(d.timed_out("did not finish"));
    }
    d.bus.read_block(out_addr, output)?;
    d.bus.write64(c + csr::DONE, 1)?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::driver::DriverOptions;
    use crate::Core;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// Behaviour of the simulated core behind [`SimBus`].
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Behaviour {
        /// Finishes `latency` idle calls after start: output[i] = input[i] + 1.
        Works { latency: u32 },
        /// Accepts the start, never signals done.
        Stuck,
        /// Busy for the first `polls` idle calls, then behaves like Works.
        BusyAtStart { polls: u32 },
    }

    /// In-memory simulated bus with one core: 64-bit word memory, the CSR
    /// semantics of table 3.1, time advanced only by the wait hook.
    pub struct SimBus {
        pub mem: HashMap<u64, u64>,
        pub core: CoreInfo,
        pub behaviour: Behaviour,
        pub size: usize,
        pub countdown: Option<u32>,
        pub busy_polls: u32,
        pub log: Arc<Mutex<Vec<String>>>,
        pub irq_line: bool,
        pub resets: u32,
    }

    impl SimBus {
        pub fn new(core: CoreInfo, size: usize, behaviour: Behaviour, irq_line: bool) -> SimBus {
            let busy_polls = match behaviour {
                Behaviour::BusyAtStart { polls } => polls,
                _ => 0,
            };
            SimBus {
                mem: HashMap::new(),
                core,
                behaviour,
                size,
                countdown: None,
                busy_polls,
                log: Arc::default(),
                irq_line,
                resets: 0,
            }
        }
        fn reg(&self, off: u64) -> u64 {
            *self
                .mem
                .get(&(self.core.control as u64 + off))
                .unwrap_or(&0)
        }
        fn set_reg(&mut self, off: u64, v: u64) {
            self.mem.insert(self.core.control as u64 + off, v);
        }
        fn finish(&mut self) {
            let mut inp = vec![0u8; self.size];
            self.read_block(self.core.input as u64, &mut inp).unwrap();
            let out: Vec<u8> = inp.iter().map(|b| b.wrapping_add(1)).collect();
            self.write_block(self.core.output as u64, &out).unwrap();
            self.set_reg(csr::BUSY, 0);
            self.set_reg(csr::DONE, 1);
        }
    }

    impl Bus for SimBus {
        fn read64(&mut self, addr: u64) -> Result<u64, BusError> {
            if addr % 8 != 0 {
                return Err(BusError::Unaligned { addr });
            }
            if addr == self.core.control as u64 + csr::BUSY && self.busy_polls > 0 {
                return Ok(1);
            }
            Ok(*self.mem.get(&addr).unwrap_or(&0))
        }
        fn write64(&mut self, addr: u64, value: u64) -> Result<(), BusError> {
            let c = self.core.control as u64;
            if addr == c + csr::START {
                self.log.lock().unwrap().push("start".into());
                assert_eq!(self.busy_polls, 0, "driver started a busy core");
                if value & 1 == 1 && self.reg(csr::BUSY) == 0 {
                    self.set_reg(csr::BUSY, 1);
                    self.countdown = match self.behaviour {
                        Behaviour::Stuck => None,
                        Behaviour::Works { latency } => Some(latency),
                        Behaviour::BusyAtStart { .. } => Some(1),
                    };
                }
            } else if addr == c + csr::DONE {
                // Write 1 to clear.
                let v = self.reg(csr::DONE) & !value;
                self.set_reg(csr::DONE, v);
                self.log.lock().unwrap().push("clear".into());
            } else {
                self.mem.insert(addr, value);
            }
            Ok(())
        }
        fn idle(&mut self, _budget: Duration) {
            if self.busy_polls > 0 {
                self.busy_polls -= 1;
                return;
            }
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
                .then(|| self.reg(csr::DONE) & 1 == 1 && self.reg(csr::INTERRUPT_ENABLE) & 1 == 1)
        }
        fn reset(&mut self, _control: u64) -> bool {
            self.resets += 1;
            self.set_reg(csr::BUSY, 0);
            self.set_reg(csr::DONE, 0);
            self.countdown = None;
            true
        }
    }

    const CORE: CoreInfo = CoreInfo {
        control: 0xC000_0000,
        input: 0xC000_1000,
        output: 0xC000_2000,
    };

    fn opts(ms: u64) -> DriverOptions {
        DriverOptions {
            timeout: Duration::from_millis(ms),
            poll: Duration::from_micros(100),
        }
    }

    fn job(d: &mut Driver, n: usize) -> Result<Vec<u8>, CoreError> {
        let input: Vec<u8> = (0..n as u8).collect();
        let mut out = vec![0u8; n];
        d.process(&input, &mut out)?;
        Ok(out)
    }

    #[test]
    fn job_cycle_follows_table_3_1() {
        for irq in [false, true] {
            let bus = SimBus::new(CORE, 13, Behaviour::Works { latency: 3 }, irq);
            let log = bus.log.clone();
            let mut d = Driver::new(Box::new(bus), CORE, 13, 13, opts(5000)).unwrap();
            for _ in 0..3 {
                let out = job(&mut d, 13).unwrap();
                assert_eq!(out, (1..14).collect::<Vec<u8>>());
            }
            assert_eq!(d.stats().jobs, 3);
            assert_eq!(
                log.lock().unwrap().as_slice(),
                ["start", "clear", "start", "clear", "start", "clear"]
            );
        }
    }

    #[test]
    fn stuck_core_times_out_and_is_reset() {
        let bus = SimBus::new(CORE, 8, Behaviour::Stuck, false);
        let mut d = Driver::new(Box::new(bus), CORE, 8, 8, opts(30)).unwrap();
        let e = job(&mut d, 8).unwrap_err();
        assert!(
            matches!(e, CoreError::Timeout(t) if t == Duration::from_millis(30)),
            "{e}"
        );
        let s = d.stats();
        assert_eq!((s.timeouts, s.resets, s.jobs), (1, 1, 0));
    }

    #[test]
    fn busy_core_is_waited_for_before_start() {
        let bus = SimBus::new(CORE, 8, Behaviour::BusyAtStart { polls: 5 }, false);
        let mut d = Driver::new(Box::new(bus), CORE, 8, 8, opts(5000)).unwrap();
        // SimBus asserts that start is never written while busy.
        assert_eq!(job(&mut d, 8).unwrap(), (1..9).collect::<Vec<u8>>());
    }

    #[test]
    fn always_busy_core_times_out() {
        let bus = SimBus::new(CORE, 8, Behaviour::BusyAtStart { polls: u32::MAX }, false);
        let mut d = Driver::new(Box::new(bus), CORE, 8, 8, opts(20)).unwrap();
        assert!(matches!(job(&mut d, 8), Err(CoreError::Timeout(_))));
    }

    #[test]
    fn wrong_sizes_are_refused() {
        let bus = SimBus::new(CORE, 8, Behaviour::Works { latency: 0 }, false);
        let mut d = Driver::new(Box::new(bus), CORE, 8, 8, opts(100)).unwrap();
        let mut out = [0u8; 8];
        assert!(matches!(
            d.process(&[0; 7], &mut out),
            Err(CoreError::Failed(_))
        ));
    }
}

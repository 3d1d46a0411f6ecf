//! The one driver of every bus-attached core: it runs a job cycle over any
//! [`Bus`] in the control protocol the image's manifest names, one file
//! each:
//!
//! * [`avalon`]: seed 000 table 3.1, the Intel HLS agent: write the core's
//!   input memory, write 1 to start, wait for done, read its output memory.
//! * [`ap_ctrl_hs`]: the Vitis HLS `s_axi_control` register map: the core
//!   masters the bus itself, so the driver places its argument buffers in
//!   the bus's [`Bus::dma_window`], writes their addresses, starts the core
//!   and takes the result from the output buffer.
//!
//! Waiting is bounded in both: a core that never finishes (or never becomes
//! idle) yields [`CoreError::Timeout`] and is reset where the bus can,
//! instead of hanging the thread that runs its jobs. Where the bus has an
//! interrupt line the driver enables it and waits for it instead of reading
//! a status register on every poll.

use std::time::{Duration, Instant};

use corefarm_smp::CoreInfo;

use crate::bus::{Bus, BusError};
use crate::image::{Control, ControlProtocol};
use crate::{Core, CoreError, CoreStats};

pub mod ap_ctrl_hs;
pub mod avalon;

/// How long one job may take and how often to poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverOptions {
    /// Longest a core may stay busy (or fail to signal done) for one job.
    pub timeout: Duration,
    /// Longest single wait between two polls of the status register.
    pub poll: Duration,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            timeout: Duration::from_secs(10),
            poll: Duration::from_millis(1),
        }
    }
}

/// Why a driver cannot be set up for a core.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DriverError {
    /// An `ap_ctrl_hs` core masters the bus, but this bus reaches no memory
    /// it could master (no [`Bus::dma_window`]).
    #[error("the core reads and writes host memory through m_axi pointers, but this bus has no memory such a core can reach")]
    NoDmaWindow,
    /// The argument buffers do not fit the bus's DMA window.
    #[error("the core's m_axi buffers need {need} bytes but the memory it can reach holds {have}")]
    WindowTooSmall { need: u64, have: u64 },
    #[error("bus error: {0}")]
    Bus(#[from] BusError),
}

impl From<BusError> for CoreError {
    fn from(e: BusError) -> Self {
        CoreError::Failed(format!("bus error: {e}"))
    }
}

/// What the driver knows of the protocol in use.
enum Protocol {
    Avalon(avalon::Avalon),
    ApCtrlHs(ap_ctrl_hs::ApCtrlHs),
}

/// Drives one core over a bus.
pub struct Driver {
    bus: Box<dyn Bus>,
    control: u64,
    input_size: usize,
    output_size: usize,
    opts: DriverOptions,
    use_irq: bool,
    stats: CoreStats,
    protocol: Protocol,
}

impl Driver {
    /// A core with the Avalon CSR of table 3.1 at `core.control` and its
    /// memories at `core.input` / `core.output`.
    pub fn new(
        bus: Box<dyn Bus>,
        core: CoreInfo,
        input_size: u32,
        output_size: u32,
        opts: DriverOptions,
    ) -> Result<Driver, CoreError> {
        Self::with_control(bus, core, input_size, output_size, None, opts)
    }

    /// A core in the protocol `control` names (`None`: the Avalon CSR).
    pub fn with_control(
        mut bus: Box<dyn Bus>,
        core: CoreInfo,
        input_size: u32,
        output_size: u32,
        control: Option<&Control>,
        opts: DriverOptions,
    ) -> Result<Driver, CoreError> {
        let protocol = match control {
            Some(c) if c.protocol == ControlProtocol::ApCtrlHs => {
                let window = bus.dma_window().ok_or(DriverError::NoDmaWindow)?;
                Protocol::ApCtrlHs(ap_ctrl_hs::ApCtrlHs::new(&c.args, window)?)
            }
            _ => Protocol::Avalon(avalon::Avalon::new(core)),
        };
        let control = core.control as u64;
        // Interrupt-driven waiting only where the bus exposes the line.
        let use_irq = bus.irq(control).is_some();
        if use_irq {
            if let Protocol::Avalon(_) = protocol {
                avalon::enable_interrupt(bus.as_mut(), control)?;
            }
        }
        Ok(Driver {
            bus,
            control,
            input_size: input_size as usize,
            output_size: output_size as usize,
            opts,
            use_irq,
            stats: CoreStats::default(),
            protocol,
        })
    }

    /// Waits until `ready` holds, polling through the bus's wait hook, or
    /// sleeping on the core's interrupt where `irq` and the bus can.
    /// Returns false at the deadline.
    fn wait_until(
        &mut self,
        deadline: Instant,
        irq: bool,
        mut ready: impl FnMut(&mut Self) -> Result<bool, CoreError>,
    ) -> Result<bool, CoreError> {
        loop {
            if ready(self)? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                // One last look: the deadline may have passed while idling.
                return ready(self);
            }
            let left = deadline - now;
            if !(irq && self.use_irq && self.bus.wait_irq(self.control, left)) {
                self.bus.idle(self.opts.poll.min(left));
            }
        }
    }

    fn timed_out(&mut self, what: &str) -> CoreError {
        self.stats.timeouts += 1;
        let reset = self.bus.reset(self.control);
        if reset {
            self.stats.resets += 1;
        }
        tracing::warn!(
            control = format_args!("{:#x}", self.control),
            reset,
            "core {what} after {:?}",
            self.opts.timeout
        );
        CoreError::Timeout(self.opts.timeout)
    }

    fn run(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        crate::check_job_sizes(input, output, self.input_size, self.output_size)?;
        let started = Instant::now();
        let deadline = started + self.opts.timeout;
        let cycles0 = self.bus.cycles(self.control);
        match self.protocol {
            Protocol::Avalon(_) => avalon::run(self, deadline, input, output)?,
            Protocol::ApCtrlHs(_) => ap_ctrl_hs::run(self, deadline, input, output)?,
        }
        self.stats.jobs += 1;
        self.stats.busy += started.elapsed();
        if let (Some(a), Some(b)) = (cycles0, self.bus.cycles(self.control)) {
            self.stats.last_cycles = Some(b.saturating_sub(a));
            self.stats.cycles = Some(
                self.stats
                    .cycles
                    .unwrap_or(0)
                    .saturating_add(b.saturating_sub(a)),
            );
        }
        Ok(())
    }
}

impl Core for Driver {
    fn process(&mut self, input: &[u8], output: &mut [u8]) -> Result<(), CoreError> {
        self.run(input, output)
    }

    fn stats(&self) -> CoreStats {
        self.stats.clone()
    }
}

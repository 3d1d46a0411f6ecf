//! The bus a [`crate::driver::Driver`] talks to: 64-bit registers and byte
//! blocks at physical addresses, like the HPS-to-FPGA bridge of seed 000
//! §3.4.1.1. Each backend provides one (emulated CSR for native soft cores,
//! an address decoder over Verilator instances, an mmap of the real bridge),
//! so the job cycle itself exists once.

use std::time::Duration;

/// Control/status register offsets of seed 000 table 3.1 (HLS CSR).
pub mod csr {
    /// R: bit 0 busy.
    pub const BUSY: u64 = 0x00;
    /// W: write 1 to start.
    pub const START: u64 = 0x08;
    /// R/W: bit 0 interrupt enable.
    pub const INTERRUPT_ENABLE: u64 = 0x10;
    /// R/W1C: bit 0 done / interrupt status; write 1 to clear.
    pub const DONE: u64 = 0x18;
    /// Bytes the CSR block spans (four 64-bit registers).
    pub const SPAN: u64 = 0x20;
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum BusError {
    #[error("bus access at {addr:#x} (+{len} bytes) hits no mapped window")]
    Unmapped { addr: u64, len: usize },
    #[error("bus access at {addr:#x} is not 8-byte aligned")]
    Unaligned { addr: u64 },
    #[error("{0}")]
    Other(String),
}

/// A physical address space with one or more cores behind it.
pub trait Bus: Send {
    fn read64(&mut self, addr: u64) -> Result<u64, BusError>;
    fn write64(&mut self, addr: u64, value: u64) -> Result<(), BusError>;

    /// Reads `buf.len()` bytes starting at `addr` (8-byte aligned).
    /// The default goes word by word; buses with a faster path override it.
    fn read_block(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), BusError> {
        if addr % 8 != 0 {
            return Err(BusError::Unaligned { addr });
        }
        for (i, chunk) in buf.chunks_mut(8).enumerate() {
            let w = self.read64(addr + 8 * i as u64)?.to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
        Ok(())
    }

    /// Writes `data` starting at `addr` (8-byte aligned). A partial last
    /// word is read-modify-written so bytes past the end keep their value.
    fn write_block(&mut self, addr: u64, data: &[u8]) -> Result<(), BusError> {
        if addr % 8 != 0 {
            return Err(BusError::Unaligned { addr });
        }
        for (i, chunk) in data.chunks(8).enumerate() {
            let a = addr + 8 * i as u64;
            let mut w = if chunk.len() < 8 {
                self.read64(a)?.to_le_bytes()
            } else {
                [0; 8]
            };
            w[..chunk.len()].copy_from_slice(chunk);
            self.write64(a, u64::from_le_bytes(w))?;
        }
        Ok(())
    }

    /// The wait hook, called while the driver waits for a core: simulators
    /// advance time here, hardware sleeps or yields. May return early; must
    /// not block much longer than `budget`.
    fn idle(&mut self, budget: Duration);

    /// Level of the interrupt line of the core at `control`, if this bus
    /// has one. The driver then enables the interrupt and waits for the line
    /// instead of reading the done register on every poll.
    fn irq(&mut self, _control: u64) -> Option<bool> {
        None
    }

    /// Blocks until the interrupt of the core at `control` fires or
    /// `timeout` passes, on a bus that can sleep on the line (a UIO device's
    /// blocking read); the driver reads the done register after it returns.
    /// Returns false at once when the bus cannot: the driver then polls
    /// through [`Bus::idle`]. Called only while a job runs and [`Bus::irq`]
    /// is `Some`.
    fn wait_irq(&mut self, _control: u64, _timeout: Duration) -> bool {
        false
    }

    /// Resets the core whose CSR is at `control`. Returns false when the bus
    /// cannot (e.g. the FPGA bridge has no per-core reset).
    fn reset(&mut self, _control: u64) -> bool {
        false
    }

    /// Clock cycles simulated so far for the core at `control` (simulators only).
    fn cycles(&self, _control: u64) -> Option<u64> {
        None
    }

    /// Memory that a core mastering the bus (an AXI `m_axi` port, Vitis
    /// style) can reach, as a range of bus addresses; `None` when the bus has
    /// none. The driver places such a core's argument buffers inside it and
    /// moves their bytes with [`Bus::read_block`] and [`Bus::write_block`].
    fn dma_window(&self) -> Option<DmaWindow> {
        None
    }
}

/// A range of bus addresses backed by memory a bus-mastering core can reach
/// (a u-dma-buf region on a board, a host-memory model in simulation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaWindow {
    /// First bus address (what the core's pointer registers hold).
    pub base: u64,
    /// Bytes from `base`.
    pub len: u64,
}

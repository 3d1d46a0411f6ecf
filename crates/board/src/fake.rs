//! A fake board tree for tests: sysfs attributes as regular files, regular
//! files standing in for `/dev/uioN` and `/dev/udmabufN` maps, and one end
//! of a socket pair standing in for a UIO interrupt. A socket pair rather
//! than an eventfd or a pipe because the UIO descriptor is both written
//! (enable) and read (count) as 32-bit words: an eventfd reads 64 bits, and
//! a pipe would hand the waiter its own enables back.

use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{page_size, Root};

/// A temporary directory, removed when dropped.
#[derive(Debug)]
pub struct TempTree {
    dir: PathBuf,
}

impl Default for TempTree {
    fn default() -> Self {
        TempTree::new()
    }
}

fn write(path: &Path, contents: impl AsRef<[u8]>) {
    std::fs::create_dir_all(path.parent().expect("a file in a directory")).expect("fake tree");
    std::fs::write(path, contents).expect("fake tree");
}

impl TempTree {
    pub fn new() -> TempTree {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "corefarm-board-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        TempTree { dir }
    }

    pub fn root(&self) -> Root {
        Root::new(&self.dir)
    }

    /// An FPGA manager `name` in `state`, and `/lib/firmware`.
    pub fn fpga_manager(&self, name: &str, state: &str) {
        let d = self.root().path("/sys/class/fpga_manager").join(name);
        write(&d.join("firmware"), "");
        write(&d.join("flags"), "");
        write(&d.join("state"), format!("{state}\n"));
        std::fs::create_dir_all(self.root().path("/lib/firmware")).expect("fake tree");
    }

    /// The configfs overlay directory `name` whose status reads `status`.
    pub fn overlays(&self, name: &str, status: &str) {
        let d = self
            .root()
            .path("/sys/kernel/config/device-tree/overlays")
            .join(name);
        write(&d.join("status"), format!("{status}\n"));
        std::fs::create_dir_all(self.root().path("/lib/firmware")).expect("fake tree");
    }

    /// UIO device `index` named `name` with maps `(addr, size)`; returns the
    /// file standing in for `/dev/uio<index>` (map M at M pages).
    pub fn uio(&self, index: u32, name: &str, maps: &[(u64, u64)]) -> PathBuf {
        let sys = self.root().path(format!("/sys/class/uio/uio{index}"));
        write(&sys.join("name"), format!("{name}\n"));
        let mut len = 0;
        for (m, (addr, size)) in maps.iter().enumerate() {
            let d = sys.join(format!("maps/map{m}"));
            write(&d.join("addr"), format!("{addr:#010x}\n"));
            write(&d.join("size"), format!("{size:#010x}\n"));
            write(&d.join("offset"), "0x0\n");
            write(&d.join("name"), "\n");
            len = m as u64 * page_size() + size;
        }
        let dev = self.root().path(format!("/dev/uio{index}"));
        write(&dev, vec![0u8; len as usize]);
        dev
    }

    /// u-dma-buf buffer `index` at bus address `phys` of `size` bytes;
    /// returns the file standing in for `/dev/udmabuf<index>`.
    pub fn udmabuf(&self, index: u32, phys: u64, size: u64) -> PathBuf {
        let sys = self
            .root()
            .path(format!("/sys/class/u-dma-buf/udmabuf{index}"));
        write(&sys.join("phys_addr"), format!("{phys:#x}\n"));
        write(&sys.join("size"), format!("{size}\n"));
        write(&sys.join("sync_mode"), "1\n");
        let dev = self.root().path(format!("/dev/udmabuf{index}"));
        write(&dev, vec![0u8; size as usize]);
        dev
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The interrupt controller's side of a stand-in UIO interrupt.
#[derive(Debug)]
pub struct FakeInterrupt {
    sock: UnixStream,
    count: u32,
    enables: u32,
}

/// A stand-in interrupt: the descriptor for [`crate::Uio::set_interrupt`],
/// and the side that fires it.
pub fn interrupt() -> (OwnedFd, FakeInterrupt) {
    let (ours, theirs) = UnixStream::pair().expect("socket pair");
    theirs.set_nonblocking(true).expect("non-blocking socket");
    (
        OwnedFd::from(ours),
        FakeInterrupt {
            sock: theirs,
            count: 0,
            enables: 0,
        },
    )
}

impl FakeInterrupt {
    /// Fires the interrupt: the waiter's read returns the new count.
    pub fn fire(&mut self) -> std::io::Result<()> {
        // The enables the waiter wrote are read here, so that its writes
        // never fill the socket's buffer over a long run.
        self.enables()?;
        self.count = self.count.wrapping_add(1);
        self.sock.write_all(&self.count.to_ne_bytes())
    }

    /// Enables written by the waiter so far.
    pub fn enables(&mut self) -> std::io::Result<u32> {
        let mut b = [0u8; 256];
        loop {
            match self.sock.read(&mut b) {
                Ok(0) => break,
                Ok(n) => {
                    self.enables += b[..n]
                        .chunks(4)
                        .filter(|w| {
                            w.len() == 4 && u32::from_ne_bytes((*w).try_into().unwrap()) == 1
                        })
                        .count() as u32
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(self.enables)
    }
}

//! A fake board tree for tests: sysfs attributes as regular files, regular
//! files standing in for `/dev/uioN` and `/dev/udmabufN` maps, and a
//! socket standing in for a UIO interrupt. A socket rather than an eventfd
//! or a pipe because the UIO descriptor is both written (enable) and read
//! (count) as 32-bit words: an eventfd reads 64 bits, and a pipe would hand
//! the waiter its own enables back.

use std::io::{Read as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
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

    /// The tree as a [`Root::fake`].
    pub fn root(&self) -> Root {
        Root::fake(&self.dir)
    }

    /// An FPGA manager `name` in `state`, and `/lib/firmware`.
    pub fn fpga_manager(&self, name: &str, state: &str) {
        let d = self.root().path("/sys/class/fpga_manager").join(name);
        write(&d.join("firmware"), "");
        write(&d.join("flags"), "");
        write(&d.join("state"), format!("{state}\n"));
        std::fs::create_dir_all(self.root().path("/lib/firmware")).expect("fake tree");
    }

    /// The configfs overlay interface, empty, and `/lib/firmware`: an
    /// overlay directory the node creates there reports `applied`.
    pub fn configfs(&self) {
        std::fs::create_dir_all(self.root().path("/sys/kernel/config/device-tree/overlays"))
            .expect("fake tree");
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

/// The interrupt controller's side of a stand-in UIO interrupt: a socket
/// at `/dev/uioN.irq` that [`crate::Uio::open`] connects to under a
/// [`Root::fake`]. Each connection is one waiter, as each open of
/// `/dev/uioN` is.
#[derive(Debug)]
pub struct FakeInterrupt {
    listener: UnixListener,
    waiters: Vec<UnixStream>,
    count: u32,
    enables: u32,
}

impl FakeInterrupt {
    /// The interrupt of UIO device `index` under `root`.
    pub fn bind(root: &Root, index: u32) -> FakeInterrupt {
        let path = root.path(format!("/dev/uio{index}.irq"));
        std::fs::create_dir_all(path.parent().expect("in /dev")).expect("fake tree");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("interrupt socket");
        listener.set_nonblocking(true).expect("non-blocking socket");
        FakeInterrupt {
            listener,
            waiters: Vec::new(),
            count: 0,
            enables: 0,
        }
    }

    /// Takes the waiters connected since the last call, and reads the
    /// enables they wrote (so their writes never fill a socket's buffer
    /// over a long run).
    fn poll(&mut self) -> std::io::Result<()> {
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(true)?;
                    self.waiters.push(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        let mut b = [0u8; 256];
        for w in &mut self.waiters {
            loop {
                match w.read(&mut b) {
                    Ok(0) => break,
                    Ok(n) => {
                        self.enables += b[..n]
                            .chunks_exact(4)
                            .filter(|w| w == &1u32.to_ne_bytes())
                            .count() as u32
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Fires the interrupt: every waiter's read returns the new count.
    pub fn fire(&mut self) -> std::io::Result<()> {
        self.fire_if(true)
    }

    /// Fires when `fire`; either way takes new waiters and their enables.
    pub fn fire_if(&mut self, fire: bool) -> std::io::Result<()> {
        self.poll()?;
        if fire {
            self.count = self.count.wrapping_add(1);
            let c = self.count.to_ne_bytes();
            // A waiter that went away is dropped, as the kernel drops a
            // closed file's listener.
            self.waiters.retain_mut(|w| w.write_all(&c).is_ok());
        }
        Ok(())
    }

    /// Enables written by the waiters so far.
    pub fn enables(&mut self) -> std::io::Result<u32> {
        self.poll()?;
        Ok(self.enables)
    }

    /// Waiters connected so far (and still there at the last fire).
    pub fn waiters(&mut self) -> std::io::Result<usize> {
        self.poll()?;
        Ok(self.waiters.len())
    }
}

//! A UIO device (`uio_pdrv_genirq`): its register maps, listed under
//! `/sys/class/uio/uioN/maps/mapM` (`addr`, `size`, `offset`) and mapped
//! from `/dev/uioN` at M pages, and its interrupt: writing a 1 (a native
//! 32-bit word) to the device enables it, and a read of 32 bits blocks
//! until it fires and returns the count of interrupts so far. The kernel
//! masks the interrupt each time it fires, so a waiter enables it again
//! before every wait; a level interrupt still raised then fires at once,
//! so none is lost between the enable and the wait.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::mapping::Mapping;
use crate::{page_size, read_attr, read_number, require, BoardError, Piece, Result, Root};

/// One register map of a UIO device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapInfo {
    /// Index M of `maps/mapM`.
    pub index: u32,
    /// Physical address of the map.
    pub addr: u64,
    /// Bytes of the map.
    pub size: u64,
    /// Offset of the registers within the first page (`offset`, 0 when absent).
    pub offset: u64,
}

/// An opened UIO device.
#[derive(Debug)]
pub struct Uio {
    index: u32,
    name: String,
    maps: Vec<MapInfo>,
    sys: PathBuf,
    dev: PathBuf,
    file: File,
    irq: File,
}

/// `(N, name)` of every UIO device under `root`, in index order.
pub fn list(root: &Root) -> Result<Vec<(u32, String)>> {
    let class = root.path("/sys/class/uio");
    require(Piece::Uio, &class)?;
    let rd = std::fs::read_dir(&class).map_err(|e| BoardError::io(Piece::Uio, &class, e))?;
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let n = ent.file_name();
        let Some(i) = n.to_str().and_then(|s| s.strip_prefix("uio")?.parse().ok()) else {
            continue;
        };
        out.push((i, read_attr(Piece::Uio, &ent.path().join("name"))?));
    }
    out.sort();
    Ok(out)
}

/// The name and maps of UIO device `index`, from sysfs; refuses a device
/// without a `map0` (its device-tree node has no `reg`).
pub fn info(root: &Root, index: u32) -> Result<(String, Vec<MapInfo>)> {
    let sys = root.path(format!("/sys/class/uio/uio{index}"));
    require(Piece::Uio, &sys)?;
    let name = read_attr(Piece::Uio, &sys.join("name"))?;
    let mut maps = Vec::new();
    for m in 0.. {
        let dir = sys.join(format!("maps/map{m}"));
        if !dir.exists() {
            break;
        }
        let offset = dir.join("offset");
        maps.push(MapInfo {
            index: m,
            addr: read_number(Piece::Uio, &dir.join("addr"))?,
            size: read_number(Piece::Uio, &dir.join("size"))?,
            offset: if offset.exists() {
                read_number(Piece::Uio, &offset)?
            } else {
                0
            },
        });
    }
    if maps.is_empty() {
        return Err(BoardError::Missing {
            piece: Piece::Uio,
            path: sys.join("maps/map0"),
        });
    }
    Ok((name, maps))
}

impl Uio {
    /// Opens `/dev/uio<index>` after reading its maps from sysfs ([`info`]).
    pub fn open(root: &Root, index: u32) -> Result<Uio> {
        let sys = root.path(format!("/sys/class/uio/uio{index}"));
        let (name, maps) = info(root, index)?;
        let dev = root.path(format!("/dev/uio{index}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dev)
            .map_err(|e| BoardError::io(Piece::Uio, &dev, e))?;
        let irq = if root.has_fake_interrupts() {
            let sock = dev.with_extension("irq");
            let s = std::os::unix::net::UnixStream::connect(&sock)
                .map_err(|e| BoardError::io(Piece::Uio, &sock, e))?;
            File::from(OwnedFd::from(s))
        } else {
            file.try_clone()
                .map_err(|e| BoardError::io(Piece::Uio, &dev, e))?
        };
        Ok(Uio {
            index,
            name,
            maps,
            sys,
            dev,
            file,
            irq,
        })
    }

    /// Opens the device whose `name` is `name` (the device-tree node's name).
    pub fn open_named(root: &Root, name: &str) -> Result<Uio> {
        let all = list(root)?;
        match all.iter().find(|(_, n)| n == name) {
            Some((i, _)) => Uio::open(root, *i),
            None => Err(BoardError::NoUioNamed {
                name: name.to_string(),
                found: all.into_iter().map(|(_, n)| n).collect(),
            }),
        }
    }

    /// Opens the device one of whose maps covers the physical address
    /// `addr` (a core's control registers).
    pub fn open_covering(root: &Root, addr: u64) -> Result<Uio> {
        let mut found = Vec::new();
        for (i, name) in list(root)? {
            let (_, maps) = info(root, i)?;
            if maps
                .iter()
                .any(|m| addr >= m.addr && addr - m.addr < m.size)
            {
                return Uio::open(root, i);
            }
            for m in maps {
                found.push(format!("uio{i} {name} {:#x}+{:#x}", m.addr, m.size));
            }
        }
        Err(BoardError::NoUioAt { addr, found })
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn maps(&self) -> &[MapInfo] {
        &self.maps
    }

    pub fn path(&self) -> &Path {
        &self.dev
    }

    /// Maps register map `m` (the first page offset of its registers
    /// included: [`MapInfo::offset`] is where they start in it).
    pub fn map(&self, m: u32) -> Result<Mapping> {
        let info = self
            .maps
            .iter()
            .find(|i| i.index == m)
            .ok_or_else(|| BoardError::Missing {
                piece: Piece::Uio,
                path: self.sys.join(format!("maps/map{m}")),
            })?;
        Mapping::new(
            Piece::Uio,
            &self.file,
            &self.dev,
            u64::from(m) * page_size(),
            info.offset + info.size,
        )
    }

    fn irq_error(&self, e: std::io::Error) -> BoardError {
        BoardError::Io {
            piece: Piece::Uio,
            path: self.dev.clone(),
            source: e,
        }
    }

    /// Enables (unmasks) the interrupt.
    pub fn enable(&self) -> Result<()> {
        (&self.irq)
            .write_all(&1u32.to_ne_bytes())
            .map_err(|e| self.irq_error(e))
    }

    /// Disables (masks) the interrupt.
    pub fn disable(&self) -> Result<()> {
        (&self.irq)
            .write_all(&0u32.to_ne_bytes())
            .map_err(|e| self.irq_error(e))
    }

    /// Blocks until the interrupt fires or `timeout` passes (`None`: no
    /// limit). Returns the interrupt count, or `None` at the timeout.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut pfd = libc::pollfd {
            fd: self.irq.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    // Rounded up: a wait of 0 ms would spin until the deadline.
                    left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int
                }
            };
            // SAFETY: one valid pollfd, counted as 1.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r > 0 {
                break;
            }
            if r == 0 {
                return Ok(None);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(self.irq_error(e));
            }
        }
        let mut b = [0u8; 4];
        (&self.irq)
            .read_exact(&mut b)
            .map_err(|e| self.irq_error(e))?;
        Ok(Some(u32::from_ne_bytes(b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeInterrupt, TempTree};

    #[test]
    fn maps_are_read_from_sysfs_and_mapped_from_the_device() {
        let t = TempTree::new();
        t.uio(0, "vadd", &[(0x43c0_0000, 0x1_0000)]);
        t.uio(1, "mmult", &[(0x43c1_0000, 0x1000), (0x43d0_0000, 0x100)]);
        let r = t.root();
        let _irq = FakeInterrupt::bind(&r, 1);
        assert_eq!(list(&r).unwrap(), [(0, "vadd".into()), (1, "mmult".into())]);
        let u = Uio::open_named(&r, "mmult").unwrap();
        assert_eq!(u.index(), 1);
        assert_eq!(
            u.maps()[1],
            MapInfo {
                index: 1,
                addr: 0x43d0_0000,
                size: 0x100,
                offset: 0
            }
        );
        let m0 = u.map(0).unwrap();
        let m1 = u.map(1).unwrap();
        m1.write32(0x10, 7).unwrap();
        assert_eq!((m0.len(), m1.read32(0x10).unwrap()), (0x1000, 7));
        assert_eq!(m0.read32(0x10).unwrap(), 0, "map 1 lies a page further");
        assert_eq!(Uio::open_covering(&r, 0x43d0_00f8).unwrap().index(), 1);
        match Uio::open_covering(&r, 0x43d0_0100) {
            Err(BoardError::NoUioAt { addr, found }) => {
                assert_eq!(addr, 0x43d0_0100);
                assert_eq!(found.len(), 3);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_devices_and_maps_are_refused() {
        let t = TempTree::new();
        let r = t.root();
        assert!(matches!(
            Uio::open(&r, 0),
            Err(BoardError::Missing {
                piece: Piece::Uio,
                ..
            })
        ));
        t.uio(0, "vadd", &[(0x43c0_0000, 0x1000)]);
        match Uio::open_named(&r, "mmult") {
            Err(BoardError::NoUioNamed { found, .. }) => assert_eq!(found, ["vadd"]),
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(r.path("/sys/class/uio/uio0/maps")).unwrap();
        let e = Uio::open(&r, 0).unwrap_err();
        assert!(
            matches!(&e, BoardError::Missing { path, .. } if path.ends_with("maps/map0")),
            "{e}"
        );
        t.uio(0, "vadd", &[(0x43c0_0000, 0x1000)]);
        std::fs::remove_file(r.path("/dev/uio0")).unwrap();
        assert!(matches!(
            Uio::open(&r, 0),
            Err(BoardError::Missing { piece: Piece::Uio, path }) if path.ends_with("dev/uio0")
        ));
    }

    #[test]
    fn interrupts_are_enabled_and_waited_for() {
        let t = TempTree::new();
        t.uio(0, "vadd", &[(0x43c0_0000, 0x1000)]);
        let mut fake = FakeInterrupt::bind(&t.root(), 0);
        let u = Uio::open(&t.root(), 0).unwrap();
        u.enable().unwrap();
        // Nothing fired: the wait ends at its timeout.
        fake.fire_if(false).unwrap();
        assert_eq!(u.wait(Some(Duration::from_millis(1))).unwrap(), None);
        let h = std::thread::spawn(move || {
            fake.fire().unwrap();
            fake
        });
        assert_eq!(u.wait(None).unwrap(), Some(1));
        let mut fake = h.join().unwrap();
        u.enable().unwrap();
        fake.fire().unwrap();
        assert_eq!(u.wait(Some(Duration::from_secs(60))).unwrap(), Some(2));
        assert_eq!(fake.enables().unwrap(), 2);
        drop(fake);
        // The interrupt's source gone: a read error, not a hang.
        assert!(matches!(u.wait(None), Err(BoardError::Io { .. })));
    }
}

//! A u-dma-buf buffer: contiguous memory the kernel allocated for DMA,
//! mapped from `/dev/udmabufN`, with its bus address in
//! `/sys/class/u-dma-buf/udmabufN/phys_addr` and its length in `size`.
//! A bus-mastering core reads its input from and writes its output to it.
//! The device is opened with `O_SYNC`, which maps it uncached: the Zynq's
//! high-performance ports do not snoop the CPU's caches, so a cached
//! mapping would need a flush before every start and an invalidate after.

use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;

use crate::mapping::Mapping;
use crate::{read_number, BoardError, Piece, Result, Root};

/// An opened and mapped u-dma-buf buffer.
#[derive(Debug)]
pub struct UdmaBuf {
    name: String,
    phys_addr: u64,
    map: Mapping,
}

impl UdmaBuf {
    /// Opens `udmabuf<index>`; the sysfs class is `u-dma-buf` (or `udmabuf`
    /// for the driver's versions before 2.0).
    pub fn open(root: &Root, index: u32) -> Result<UdmaBuf> {
        UdmaBuf::open_named(root, &format!("udmabuf{index}"))
    }

    /// Opens the buffer named `name` (`udmabuf0`, or a device-tree
    /// `device-name`).
    pub fn open_named(root: &Root, name: &str) -> Result<UdmaBuf> {
        let sys = ["/sys/class/u-dma-buf", "/sys/class/udmabuf"]
            .iter()
            .map(|c| root.path(c).join(name))
            .find(|p| p.exists())
            .ok_or_else(|| BoardError::Missing {
                piece: Piece::UdmaBuf,
                path: root.path("/sys/class/u-dma-buf").join(name),
            })?;
        let phys_addr = read_number(Piece::UdmaBuf, &sys.join("phys_addr"))?;
        let size = read_number(Piece::UdmaBuf, &sys.join("size"))?;
        let dev: PathBuf = root.path("/dev").join(name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_SYNC)
            .open(&dev)
            .map_err(|e| BoardError::io(Piece::UdmaBuf, &dev, e))?;
        let map = Mapping::new(Piece::UdmaBuf, &file, &dev, 0, size)?;
        Ok(UdmaBuf {
            name: name.to_string(),
            phys_addr,
            map,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bus address of the buffer's first byte (what a core's pointer
    /// registers hold).
    pub fn phys_addr(&self) -> u64 {
        self.phys_addr
    }

    pub fn size(&self) -> u64 {
        self.map.len()
    }

    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// The mapping alone (it stays valid once the device is closed).
    pub fn into_mapping(self) -> Mapping {
        self.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::TempTree;

    #[test]
    fn the_buffer_is_mapped_with_its_bus_address() {
        let t = TempTree::new();
        t.udmabuf(0, 0x3f00_0000, 1 << 16);
        let b = UdmaBuf::open(&t.root(), 0).unwrap();
        assert_eq!((b.phys_addr(), b.size()), (0x3f00_0000, 1 << 16));
        b.mapping().write_bytes(0x100, b"abcde").unwrap();
        let back = std::fs::read(t.root().path("/dev/udmabuf0")).unwrap();
        assert_eq!(&back[0x100..0x105], b"abcde");
    }

    #[test]
    fn missing_buffer_is_refused_with_the_remedy() {
        let t = TempTree::new();
        let e = UdmaBuf::open(&t.root(), 0).unwrap_err();
        assert!(
            matches!(
                e,
                BoardError::Missing {
                    piece: Piece::UdmaBuf,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("insmod u-dma-buf.ko"), "{e}");
        t.udmabuf(0, 0x3f00_0000, 4096);
        std::fs::remove_file(t.root().path("/dev/udmabuf0")).unwrap();
        assert!(matches!(
            UdmaBuf::open(&t.root(), 0),
            Err(BoardError::Missing { piece: Piece::UdmaBuf, path }) if path.ends_with("dev/udmabuf0")
        ));
    }

    #[test]
    fn the_pre_2_0_class_name_is_found_too() {
        let t = TempTree::new();
        t.udmabuf(1, 0x1000_0000, 4096);
        let r = t.root();
        std::fs::rename(r.path("/sys/class/u-dma-buf"), r.path("/sys/class/udmabuf")).unwrap();
        assert_eq!(UdmaBuf::open(&r, 1).unwrap().phys_addr(), 0x1000_0000);
    }
}

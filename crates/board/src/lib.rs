//! The Linux interfaces of a real FPGA board, as a node uses them:
//!
//! - [`fpga_manager`]: programming a bitstream through the kernel's FPGA
//!   manager (`/sys/class/fpga_manager/fpga0` with `/lib/firmware`), or a
//!   device-tree overlay that names it;
//! - [`uio`]: a core's registers (`/dev/uioN`, the size and physical
//!   address of `maps/map0`) and its interrupt (write 1 to enable, a
//!   blocking read returns the interrupt count);
//! - [`udmabuf`]: memory a bus-mastering core can reach (`/dev/udmabufN`
//!   with its `phys_addr` and `size`).
//!
//! Every path is taken under a [`Root`] (`/` on a board), so the tests run
//! against a fake tree in a temporary directory ([`fake`]). Each piece is
//! checked when it is opened, and a missing one is refused with a
//! [`BoardError`] that names it and says what provides it, so a node
//! started on a board it cannot use says so at start.
//!
//! Nothing here is asynchronous: a core's handler thread blocks in
//! [`uio::Uio::wait`] while its core runs.

pub mod fake;
pub mod fpga_manager;
pub mod mapping;
pub mod udmabuf;
pub mod uio;

use std::path::{Path, PathBuf};

pub use fpga_manager::{FpgaManager, Overlay};
pub use mapping::Mapping;
pub use udmabuf::UdmaBuf;
pub use uio::Uio;

/// The directory the board's `/sys`, `/dev` and `/lib/firmware` are under:
/// `/` on a board, a temporary directory in tests ([`Root::fake`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    dir: PathBuf,
    fake_interrupts: bool,
}

impl Default for Root {
    fn default() -> Self {
        Root::new("/")
    }
}

impl Root {
    pub fn new(dir: impl Into<PathBuf>) -> Root {
        Root {
            dir: dir.into(),
            fake_interrupts: false,
        }
    }

    /// A fake tree ([`fake::TempTree`]): a UIO device's interrupt is a
    /// socket at `/dev/uioN.irq` ([`fake::FakeInterrupt`]), as a regular
    /// file standing in for `/dev/uioN` can hold its map, not its interrupt.
    pub fn fake(dir: impl Into<PathBuf>) -> Root {
        Root {
            dir: dir.into(),
            fake_interrupts: true,
        }
    }

    /// Whether interrupts are the stand-in sockets of a fake tree.
    pub fn has_fake_interrupts(&self) -> bool {
        self.fake_interrupts
    }

    /// `rel` (an absolute board path such as `/dev/uio0`) under this root.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        let rel = rel.as_ref();
        self.dir.join(rel.strip_prefix("/").unwrap_or(rel))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// A board interface a node depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// The kernel's FPGA manager (`/sys/class/fpga_manager/fpgaN`).
    FpgaManager,
    /// The firmware directory the FPGA manager loads from (`/lib/firmware`).
    Firmware,
    /// The configfs device-tree overlay interface.
    Overlay,
    /// A UIO device (`/dev/uioN` and `/sys/class/uio/uioN`).
    Uio,
    /// A u-dma-buf buffer (`/dev/udmabufN` and its sysfs attributes).
    UdmaBuf,
}

impl Piece {
    /// What provides the piece on a board.
    pub fn hint(self) -> &'static str {
        match self {
            Piece::FpgaManager => {
                "the kernel needs CONFIG_FPGA_MGR and the board's manager driver \
                 (Zynq-7000: CONFIG_FPGA_MGR_ZYNQ_FPGA, Zynq UltraScale+: \
                 CONFIG_FPGA_MGR_ZYNQMP_FPGA, Cyclone V: CONFIG_FPGA_MGR_SOCFPGA)"
            }
            Piece::Firmware => {
                "the FPGA manager loads bitstreams from /lib/firmware: create it, \
                 writable by the node's user"
            }
            Piece::Overlay => {
                "mount configfs (mount -t configfs none /sys/kernel/config) on a \
                 kernel with CONFIG_OF_OVERLAY and the configfs overlay interface"
            }
            Piece::Uio => {
                "give the core's device-tree node compatible = \"generic-uio\" and \
                 load uio_pdrv_genirq with of_id=generic-uio (modprobe \
                 uio_pdrv_genirq of_id=generic-uio); the device must be readable \
                 and writable by the node's user"
            }
            Piece::UdmaBuf => {
                "load the u-dma-buf module with a buffer (insmod u-dma-buf.ko \
                 udmabuf0=4194304) or declare one in the device tree; the device \
                 must be readable and writable by the node's user"
            }
        }
    }
}

impl std::fmt::Display for Piece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Piece::FpgaManager => "the FPGA manager",
            Piece::Firmware => "the firmware directory",
            Piece::Overlay => "the device-tree overlay interface",
            Piece::Uio => "UIO",
            Piece::UdmaBuf => "u-dma-buf",
        })
    }
}

/// Why a board interface cannot be used. (Display and Error by hand: the
/// crate keeps to std, libc and memmap2, as it is cross-built for its tests.)
#[derive(Debug)]
pub enum BoardError {
    /// A file or directory of the piece does not exist.
    Missing { piece: Piece, path: PathBuf },
    /// The node's user may not open it.
    Denied { piece: Piece, path: PathBuf },
    /// Any other failure to read, write or map it.
    Io {
        piece: Piece,
        path: PathBuf,
        source: std::io::Error,
    },
    /// An attribute that does not hold what the kernel writes there.
    Malformed {
        piece: Piece,
        path: PathBuf,
        value: String,
        expected: &'static str,
    },
    /// The FPGA manager is not operating (after programming, or at start).
    NotOperating { state: String },
    /// The overlay did not apply.
    OverlayNotApplied { status: String },
    /// No UIO device carries the name asked for.
    NoUioNamed { name: String, found: Vec<String> },
    /// No UIO device maps a core's registers.
    NoUioAt { addr: u64, found: Vec<String> },
    /// A regular file standing in for a device is shorter than its map.
    TooShort {
        piece: Piece,
        path: PathBuf,
        len: u64,
        need: u64,
    },
    /// An access outside a mapping, or not aligned to its width.
    OutOfRange { offset: u64, len: u64, size: u64 },
}

impl std::fmt::Display for BoardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BoardError::Missing { piece, path } => write!(
                f,
                "{piece} is missing: {} does not exist; {}",
                path.display(),
                piece.hint()
            ),
            BoardError::Denied { piece, path } => write!(
                f,
                "{piece}: permission denied on {}; {}",
                path.display(),
                piece.hint()
            ),
            BoardError::Io {
                piece,
                path,
                source,
            } => write!(f, "{piece}: {}: {source}", path.display()),
            BoardError::Malformed {
                piece,
                path,
                value,
                expected,
            } => write!(
                f,
                "{piece}: {} reads {value:?}, not a {expected}",
                path.display()
            ),
            BoardError::NotOperating { state } => write!(
                f,
                "the FPGA manager reports state {state:?}, expected \"operating\""
            ),
            BoardError::OverlayNotApplied { status } => write!(
                f,
                "the device-tree overlay reports status {status:?}, expected \"applied\""
            ),
            BoardError::NoUioNamed { name, found } => write!(
                f,
                "no UIO device is named {name:?} (there are {found:?}); {}",
                Piece::Uio.hint()
            ),
            BoardError::NoUioAt { addr, found } => write!(
                f,
                "no UIO device maps the registers at {addr:#x} (UIO maps: {found:?}); {}",
                Piece::Uio.hint()
            ),
            BoardError::TooShort {
                piece,
                path,
                len,
                need,
            } => write!(
                f,
                "{piece}: {} is {len} bytes, its map needs {need}",
                path.display()
            ),
            BoardError::OutOfRange { offset, len, size } => write!(
                f,
                "access of {len} bytes at offset {offset:#x} outside a {size:#x}-byte map or unaligned"
            ),
        }
    }
}

impl std::error::Error for BoardError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BoardError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

pub type Result<T, E = BoardError> = std::result::Result<T, E>;

impl BoardError {
    /// The piece an I/O error on `path` concerns, classified.
    pub(crate) fn io(piece: Piece, path: &Path, e: std::io::Error) -> BoardError {
        let path = path.to_path_buf();
        match e.kind() {
            std::io::ErrorKind::NotFound => BoardError::Missing { piece, path },
            std::io::ErrorKind::PermissionDenied => BoardError::Denied { piece, path },
            _ => BoardError::Io {
                piece,
                path,
                source: e,
            },
        }
    }

    /// The piece the error names, if any.
    pub fn piece(&self) -> Option<Piece> {
        match self {
            BoardError::Missing { piece, .. }
            | BoardError::Denied { piece, .. }
            | BoardError::Io { piece, .. }
            | BoardError::Malformed { piece, .. }
            | BoardError::TooShort { piece, .. } => Some(*piece),
            BoardError::NotOperating { .. } => Some(Piece::FpgaManager),
            BoardError::OverlayNotApplied { .. } => Some(Piece::Overlay),
            BoardError::NoUioNamed { .. } | BoardError::NoUioAt { .. } => Some(Piece::Uio),
            BoardError::OutOfRange { .. } => None,
        }
    }
}

/// Reads a sysfs attribute, trimmed.
pub(crate) fn read_attr(piece: Piece, path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| BoardError::io(piece, path, e))
}

/// Reads a numeric sysfs attribute: `0x`-hex (UIO, u-dma-buf's
/// `phys_addr`) or decimal (u-dma-buf's `size`).
pub(crate) fn read_number(piece: Piece, path: &Path) -> Result<u64> {
    let s = read_attr(piece, path)?;
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.map_err(|_| BoardError::Malformed {
        piece,
        path: path.to_path_buf(),
        value: s,
        expected: "number",
    })
}

/// Checks that `path` exists, else refuses with the missing piece.
pub(crate) fn require(piece: Piece, path: &Path) -> Result<()> {
    match path.try_exists() {
        Ok(true) => Ok(()),
        Ok(false) => Err(BoardError::Missing {
            piece,
            path: path.to_path_buf(),
        }),
        Err(e) => Err(BoardError::io(piece, path, e)),
    }
}

/// The system's page size (UIO maps map N at offset N pages).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_joins_board_paths() {
        let r = Root::new("/tmp/x");
        assert_eq!(r.path("/dev/uio0"), PathBuf::from("/tmp/x/dev/uio0"));
        assert_eq!(
            Root::default().path("/dev/uio0"),
            PathBuf::from("/dev/uio0")
        );
    }

    #[test]
    fn numbers_read_hex_and_decimal() {
        let t = fake::TempTree::new();
        let p = t.root().path("/a");
        std::fs::write(&p, "0x43c00000\n").unwrap();
        assert_eq!(read_number(Piece::Uio, &p).unwrap(), 0x43c0_0000);
        std::fs::write(&p, "4194304\n").unwrap();
        assert_eq!(read_number(Piece::UdmaBuf, &p).unwrap(), 4 << 20);
        std::fs::write(&p, "lots\n").unwrap();
        assert!(matches!(
            read_number(Piece::UdmaBuf, &p),
            Err(BoardError::Malformed {
                piece: Piece::UdmaBuf,
                ..
            })
        ));
    }

    #[test]
    fn errors_name_the_piece_and_the_remedy() {
        let e = BoardError::Missing {
            piece: Piece::Uio,
            path: "/dev/uio3".into(),
        };
        let s = e.to_string();
        assert!(s.contains("UIO is missing: /dev/uio3"), "{s}");
        assert!(s.contains("generic-uio"), "{s}");
        assert_eq!(e.piece(), Some(Piece::Uio));
    }
}

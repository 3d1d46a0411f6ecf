//! Programming the FPGA through the kernel's FPGA manager: the bitstream
//! goes into the firmware directory, its file name into the manager's
//! `firmware` attribute (the write returns once the manager has loaded it),
//! and the manager's `state` must then read `operating`. A device-tree
//! overlay that names the bitstream (`firmware-name`) does the same
//! through configfs and also adds the core's devices (UIO, u-dma-buf).

use std::path::{Path, PathBuf};

use crate::{read_attr, require, BoardError, Piece, Result, Root};

/// The kernel's FPGA manager `/sys/class/fpga_manager/<name>` and the
/// firmware directory it loads from.
#[derive(Debug, Clone)]
pub struct FpgaManager {
    dir: PathBuf,
    firmware_dir: PathBuf,
}

impl FpgaManager {
    /// Checks that the manager and the firmware directory exist and that
    /// the manager's state can be read.
    pub fn open(root: &Root, name: &str) -> Result<FpgaManager> {
        let dir = root.path("/sys/class/fpga_manager").join(name);
        FpgaManager::at(dir, root.path("/lib/firmware"))
    }

    /// A manager and firmware directory at explicit paths.
    pub fn at(dir: PathBuf, firmware_dir: PathBuf) -> Result<FpgaManager> {
        require(Piece::FpgaManager, &dir)?;
        require(Piece::FpgaManager, &dir.join("firmware"))?;
        require(Piece::Firmware, &firmware_dir)?;
        if !firmware_dir.is_dir() {
            return Err(BoardError::Missing {
                piece: Piece::Firmware,
                path: firmware_dir,
            });
        }
        let m = FpgaManager { dir, firmware_dir };
        m.state()?;
        Ok(m)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manager's state (`operating`, `unknown`, `write error`, ...).
    pub fn state(&self) -> Result<String> {
        read_attr(Piece::FpgaManager, &self.dir.join("state"))
    }

    /// Programs `bitstream` (a full one: `.bin` for AMD parts, `.rbf` for
    /// Intel ones) under `file_name` in the firmware directory. One file
    /// name rewritten for each bitstream: a file per bitstream would fill
    /// the board's card.
    pub fn program(&self, file_name: &str, bitstream: &[u8]) -> Result<()> {
        let fw = self.firmware_dir.join(file_name);
        std::fs::write(&fw, bitstream).map_err(|e| BoardError::io(Piece::Firmware, &fw, e))?;
        // Xilinx kernels take flags (0: a full bitstream) before the load.
        let flags = self.dir.join("flags");
        if flags.exists() {
            std::fs::write(&flags, "0")
                .map_err(|e| BoardError::io(Piece::FpgaManager, &flags, e))?;
        }
        let ctl = self.dir.join("firmware");
        std::fs::write(&ctl, file_name).map_err(|e| BoardError::io(Piece::FpgaManager, &ctl, e))?;
        let state = self.state()?;
        if state != "operating" {
            return Err(BoardError::NotOperating { state });
        }
        Ok(())
    }
}

/// A device-tree overlay applied through configfs
/// (`/sys/kernel/config/device-tree/overlays/<name>`).
#[derive(Debug, Clone)]
pub struct Overlay {
    dir: PathBuf,
    firmware_dir: PathBuf,
    /// Under a [`Root::fake`] tree, plain directories play configfs: the
    /// overlay's directory is removed with its attributes, and one the
    /// node creates reports `applied`, as the kernel's would.
    fake: bool,
}

impl Overlay {
    /// Checks that the overlay interface and the firmware directory exist.
    pub fn open(root: &Root, name: &str) -> Result<Overlay> {
        let overlays = root.path("/sys/kernel/config/device-tree/overlays");
        require(Piece::Overlay, &overlays)?;
        let firmware_dir = root.path("/lib/firmware");
        require(Piece::Firmware, &firmware_dir)?;
        Ok(Overlay {
            dir: overlays.join(name),
            firmware_dir,
            fake: root.has_fake_interrupts(),
        })
    }

    /// Whether the overlay is applied now (a previous configuration's).
    pub fn is_applied(&self) -> bool {
        read_attr(Piece::Overlay, &self.dir.join("status")).is_ok_and(|s| s == "applied")
    }

    /// Writes `bitstream` to the firmware directory as `bitstream_name`
    /// (the name the overlay's `firmware-name` gives), then applies `dtbo`
    /// ([`Overlay::apply`]): the kernel programs the FPGA and adds the
    /// overlay's devices.
    pub fn apply_with_bitstream(
        &self,
        bitstream_name: &str,
        bitstream: &[u8],
        file_name: &str,
        dtbo: &[u8],
    ) -> Result<()> {
        let fw = self.firmware_dir.join(bitstream_name);
        std::fs::write(&fw, bitstream).map_err(|e| BoardError::io(Piece::Firmware, &fw, e))?;
        self.apply(file_name, dtbo)
    }

    /// Applies `dtbo` (which names the bitstream in `firmware-name`; the
    /// bitstream must already be in the firmware directory): it is written
    /// there as `file_name`, the overlay directory created, the file name
    /// written to its `path`, and its `status` must read `applied`.
    pub fn apply(&self, file_name: &str, dtbo: &[u8]) -> Result<()> {
        let fw = self.firmware_dir.join(file_name);
        std::fs::write(&fw, dtbo).map_err(|e| BoardError::io(Piece::Firmware, &fw, e))?;
        if !self.dir.exists() {
            std::fs::create_dir(&self.dir)
                .map_err(|e| BoardError::io(Piece::Overlay, &self.dir, e))?;
            if self.fake {
                let status = self.dir.join("status");
                std::fs::write(&status, "applied\n")
                    .map_err(|e| BoardError::io(Piece::Overlay, &status, e))?;
            }
        }
        let path = self.dir.join("path");
        std::fs::write(&path, file_name).map_err(|e| BoardError::io(Piece::Overlay, &path, e))?;
        let status = read_attr(Piece::Overlay, &self.dir.join("status"))?;
        if status != "applied" {
            return Err(BoardError::OverlayNotApplied { status });
        }
        Ok(())
    }

    /// Removes the overlay (and the devices it added).
    pub fn remove(&self) -> Result<()> {
        let r = match self.fake {
            true => std::fs::remove_dir_all(&self.dir),
            false => std::fs::remove_dir(&self.dir),
        };
        match r {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(BoardError::io(Piece::Overlay, &self.dir, e))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::TempTree;

    #[test]
    fn programming_writes_the_file_then_its_name() {
        let t = TempTree::new();
        t.fpga_manager("fpga0", "operating");
        let m = FpgaManager::open(&t.root(), "fpga0").unwrap();
        m.program("corefarm.bin", b"bits").unwrap();
        let r = t.root();
        assert_eq!(
            std::fs::read(r.path("/lib/firmware/corefarm.bin")).unwrap(),
            b"bits"
        );
        let attr = r.path("/sys/class/fpga_manager/fpga0/firmware");
        assert_eq!(std::fs::read_to_string(attr).unwrap(), "corefarm.bin");
        let flags = r.path("/sys/class/fpga_manager/fpga0/flags");
        assert_eq!(std::fs::read_to_string(flags).unwrap(), "0");
    }

    #[test]
    fn a_manager_that_does_not_operate_is_reported() {
        let t = TempTree::new();
        t.fpga_manager("fpga0", "write error");
        let m = FpgaManager::open(&t.root(), "fpga0").unwrap();
        match m.program("x.bin", b"bits") {
            Err(BoardError::NotOperating { state }) => assert_eq!(state, "write error"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_manager_or_firmware_dir_is_refused_at_open() {
        let t = TempTree::new();
        let e = FpgaManager::open(&t.root(), "fpga0").unwrap_err();
        assert!(
            matches!(&e, BoardError::Missing { piece: Piece::FpgaManager, path } if path.ends_with("fpga0")),
            "{e}"
        );
        assert!(e.to_string().contains("CONFIG_FPGA_MGR"), "{e}");
        t.fpga_manager("fpga0", "operating");
        std::fs::remove_dir(t.root().path("/lib/firmware")).unwrap();
        let e = FpgaManager::open(&t.root(), "fpga0").unwrap_err();
        assert!(
            matches!(
                e,
                BoardError::Missing {
                    piece: Piece::Firmware,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn overlays_apply_through_configfs() {
        let t = TempTree::new();
        assert!(matches!(
            Overlay::open(&t.root(), "corefarm"),
            Err(BoardError::Missing {
                piece: Piece::Overlay,
                ..
            })
        ));
        t.overlays("corefarm", "applied");
        let o = Overlay::open(&t.root(), "corefarm").unwrap();
        o.apply("corefarm.dtbo", b"dtbo").unwrap();
        let dir = t
            .root()
            .path("/sys/kernel/config/device-tree/overlays/corefarm");
        assert_eq!(
            std::fs::read_to_string(dir.join("path")).unwrap(),
            "corefarm.dtbo"
        );
        t.overlays("corefarm", "unapplied");
        assert!(matches!(
            o.apply("corefarm.dtbo", b"dtbo"),
            Err(BoardError::OverlayNotApplied { .. })
        ));
    }
}

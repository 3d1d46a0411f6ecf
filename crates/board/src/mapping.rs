//! A mapped device region (a UIO register map, a u-dma-buf buffer),
//! accessed with volatile, naturally aligned loads and stores only: device
//! memory and uncached buffers may fault on the unaligned or paired
//! accesses an ordinary `memcpy` makes.

use std::fs::File;
use std::path::Path;

use memmap2::{MmapOptions, MmapRaw};

use crate::{BoardError, Piece, Result};

/// `len` bytes of a device mapped at some offset of its file.
#[derive(Debug)]
pub struct Mapping {
    map: MmapRaw,
    len: u64,
}

impl Mapping {
    /// Maps `len` bytes of `file` (opened from `path`) at `offset`. A
    /// regular file standing in for a device must cover the range, or an
    /// access past its end would raise SIGBUS.
    pub fn new(piece: Piece, file: &File, path: &Path, offset: u64, len: u64) -> Result<Mapping> {
        let meta = file
            .metadata()
            .map_err(|e| BoardError::io(piece, path, e))?;
        if meta.is_file() && meta.len() < offset + len {
            return Err(BoardError::TooShort {
                piece,
                path: path.to_path_buf(),
                len: meta.len(),
                need: offset + len,
            });
        }
        let n = usize::try_from(len).map_err(|_| BoardError::OutOfRange {
            offset,
            len,
            size: usize::MAX as u64,
        })?;
        let map = MmapOptions::new()
            .offset(offset)
            .len(n)
            .map_raw(file)
            .map_err(|e| BoardError::Io {
                piece,
                path: path.to_path_buf(),
                source: e,
            })?;
        Ok(Mapping { map, len })
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pointer to `len` bytes at `offset`, checked to lie within the map and
    /// to be aligned to `align`.
    fn ptr(&self, offset: u64, len: u64, align: u64) -> Result<*mut u8> {
        let bad = BoardError::OutOfRange {
            offset,
            len,
            size: self.len,
        };
        if offset.checked_add(len).map_or(true, |end| end > self.len) || offset % align != 0 {
            return Err(bad);
        }
        // SAFETY: offset + len <= self.len, the mapping's length.
        let p = unsafe { self.map.as_mut_ptr().add(offset as usize) };
        if p as usize % align as usize != 0 {
            return Err(bad);
        }
        Ok(p)
    }

    pub fn read32(&self, offset: u64) -> Result<u32> {
        let p = self.ptr(offset, 4, 4)?;
        // SAFETY: 4 aligned bytes within the mapping (checked by `ptr`).
        Ok(unsafe { std::ptr::read_volatile(p as *const u32) })
    }

    pub fn write32(&self, offset: u64, v: u32) -> Result<()> {
        let p = self.ptr(offset, 4, 4)?;
        // SAFETY: as in `read32`.
        unsafe { std::ptr::write_volatile(p as *mut u32, v) };
        Ok(())
    }

    pub fn read64(&self, offset: u64) -> Result<u64> {
        let p = self.ptr(offset, 8, 8)?;
        // SAFETY: 8 aligned bytes within the mapping (checked by `ptr`).
        Ok(unsafe { std::ptr::read_volatile(p as *const u64) })
    }

    pub fn write64(&self, offset: u64, v: u64) -> Result<()> {
        let p = self.ptr(offset, 8, 8)?;
        // SAFETY: as in `read64`.
        unsafe { std::ptr::write_volatile(p as *mut u64, v) };
        Ok(())
    }

    /// Copies `buf.len()` bytes from `offset` (4-byte aligned), a 32-bit
    /// word at a time: whole words are read, so the last one must be mapped.
    pub fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let words = buf.len().div_ceil(4) as u64;
        let p = self.ptr(offset, 4 * words, 4)? as *const u32;
        for (i, chunk) in buf.chunks_mut(4).enumerate() {
            // SAFETY: word i lies within the checked range; aligned.
            let w = unsafe { std::ptr::read_volatile(p.add(i)) };
            chunk.copy_from_slice(&w.to_le_bytes()[..chunk.len()]);
        }
        Ok(())
    }

    /// Copies `data` to `offset` (4-byte aligned), a 32-bit word at a time;
    /// a partial last word is read, merged and written back.
    pub fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<()> {
        let words = data.len().div_ceil(4) as u64;
        let p = self.ptr(offset, 4 * words, 4)? as *mut u32;
        for (i, chunk) in data.chunks(4).enumerate() {
            let mut w = [0u8; 4];
            if chunk.len() < 4 {
                // SAFETY: word i lies within the checked range; aligned.
                w = unsafe { std::ptr::read_volatile(p.add(i)) }.to_le_bytes();
            }
            w[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile(p.add(i), u32::from_le_bytes(w)) };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::TempTree;

    fn map(t: &TempTree, file_len: u64, len: u64) -> Result<Mapping> {
        let p = t.root().path("/mem0");
        std::fs::write(&p, vec![0u8; file_len as usize]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        Mapping::new(Piece::Uio, &f, &p, 0, len)
    }

    #[test]
    fn words_and_bytes_round_trip_within_bounds() {
        let t = TempTree::new();
        let m = map(&t, 4096, 64).unwrap();
        m.write32(4, 0xdead_beef).unwrap();
        assert_eq!(m.read32(4).unwrap(), 0xdead_beef);
        m.write64(8, u64::MAX - 1).unwrap();
        assert_eq!(m.read64(8).unwrap(), u64::MAX - 1);
        m.write_bytes(16, &[1, 2, 3, 4, 5, 6]).unwrap();
        m.write_bytes(20, &[9]).unwrap();
        let mut b = [0u8; 6];
        m.read_bytes(16, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4, 9, 6]);
        assert!(matches!(m.read32(64), Err(BoardError::OutOfRange { .. })));
        assert!(matches!(m.read32(2), Err(BoardError::OutOfRange { .. })));
        assert!(matches!(m.read64(60), Err(BoardError::OutOfRange { .. })));
        assert!(matches!(
            m.read_bytes(60, &mut [0; 5]),
            Err(BoardError::OutOfRange { .. })
        ));
    }

    #[test]
    fn a_short_stand_in_file_is_refused() {
        let t = TempTree::new();
        assert!(matches!(
            map(&t, 16, 64),
            Err(BoardError::TooShort { need: 64, .. })
        ));
    }
}

//! Resident named buffers of a group member (docs/collectives.md): data that stays on
//! the node between collectives and runs. Every buffer holds a reservation
//! of the node's memory guard for its bytes, so buffers, queued jobs and
//! unsent results share one bound; a buffer that does not fit is refused
//! ("full") instead of waiting. Dropping the set (the group ended) frees all.

use std::collections::HashMap;

use bytes::Bytes;
use corefarm_smp::DType;

use crate::guard::{MemoryGuard, Reservation};

/// Why a buffer operation was refused; the text goes back to the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BufError {
    #[error("buffer {name:?} of {size} bytes does not fit: the node's memory guard has {free} of {limit} bytes free")]
    Full {
        name: String,
        size: usize,
        free: usize,
        limit: usize,
    },
    #[error("no buffer named {0:?}")]
    Unknown(String),
    #[error("a buffer named {0:?} already exists")]
    Duplicate(String),
    #[error("buffer {name:?}: {reason}")]
    Mismatch { name: String, reason: String },
    #[error("a buffer name must not be empty")]
    EmptyName,
}

/// One resident buffer.
#[derive(Debug)]
pub struct Buffer {
    pub dtype: DType,
    pub data: Bytes,
    _mem: Reservation,
}

/// The buffers of one group member.
#[derive(Debug)]
pub struct Buffers {
    guard: MemoryGuard,
    map: HashMap<String, Buffer>,
}

impl Buffers {
    pub fn new(guard: MemoryGuard) -> Self {
        Buffers {
            guard,
            map: HashMap::new(),
        }
    }

    /// Creates `name`; refused if the name is taken, the data is not whole
    /// elements of `dtype`, or the memory guard has no room.
    pub fn put(&mut self, name: &str, dtype: DType, data: Bytes) -> Result<(), BufError> {
        self.check_new(name)?;
        if !data.len().is_multiple_of(dtype.size()) {
            return Err(BufError::Mismatch {
                name: name.into(),
                reason: format!(
                    "{} bytes is not a whole number of {dtype} elements",
                    data.len()
                ),
            });
        }
        let mem = self
            .guard
            .try_reserve(data.len())
            .ok_or_else(|| BufError::Full {
                name: name.into(),
                size: data.len(),
                free: self.guard.available(),
                limit: self.guard.limit(),
            })?;
        self.map.insert(
            name.to_string(),
            Buffer {
                dtype,
                data,
                _mem: mem,
            },
        );
        Ok(())
    }

    /// Refuses a name that is empty or taken (checked before a collective
    /// runs, so a bad destination fails before any data moves).
    pub fn check_new(&self, name: &str) -> Result<(), BufError> {
        if name.is_empty() {
            return Err(BufError::EmptyName);
        }
        if self.map.contains_key(name) {
            return Err(BufError::Duplicate(name.into()));
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Result<&Buffer, BufError> {
        self.map
            .get(name)
            .ok_or_else(|| BufError::Unknown(name.into()))
    }

    /// `name`'s data, checked to hold elements of `dtype` (`Bytes` accepts any).
    pub fn typed(&self, name: &str, dtype: DType) -> Result<Bytes, BufError> {
        let b = self.get(name)?;
        if dtype != DType::Bytes && b.dtype != dtype {
            return Err(BufError::Mismatch {
                name: name.into(),
                reason: format!("holds {} elements, the operation wants {dtype}", b.dtype),
            });
        }
        Ok(b.data.clone())
    }

    pub fn free(&mut self, name: &str) -> Result<(), BufError> {
        self.map
            .remove(name)
            .map(drop)
            .ok_or_else(|| BufError::Unknown(name.into()))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes held by every buffer.
    pub fn bytes(&self) -> usize {
        self.map.values().map(|b| b.data.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn put_get_free_and_errors() {
        let g = MemoryGuard::new(8 * 1024);
        let mut b = Buffers::new(g.clone());
        b.put("x", DType::I32, Bytes::from(vec![1u8; 4096]))
            .unwrap();
        assert_eq!(g.available(), 4 * 1024);
        assert_eq!(b.typed("x", DType::I32).unwrap().len(), 4096);
        assert!(matches!(
            b.typed("x", DType::F32),
            Err(BufError::Mismatch { .. })
        ));
        assert_eq!(
            b.put("x", DType::U8, Bytes::new()),
            Err(BufError::Duplicate("x".into()))
        );
        assert!(matches!(
            b.put("y", DType::I32, Bytes::from(vec![0u8; 6])),
            Err(BufError::Mismatch { .. })
        ));
        let e = b
            .put("big", DType::U8, Bytes::from(vec![0u8; 5000]))
            .unwrap_err();
        assert!(matches!(e, BufError::Full { .. }), "{e}");
        assert!(e.to_string().contains("does not fit"));
        assert_eq!(b.free("nope"), Err(BufError::Unknown("nope".into())));
        b.free("x").unwrap();
        assert_eq!(g.available(), 8 * 1024);
        b.put("big", DType::U8, Bytes::from(vec![0u8; 5000]))
            .unwrap();
        drop(b);
        assert_eq!(
            g.available(),
            8 * 1024,
            "dropping the set frees every buffer"
        );
    }
}

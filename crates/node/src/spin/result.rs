//! What a message's handlers emitted, as the result the server takes
//! (docs/streams.md, "Results"). A server that agreed `any-length` takes
//! the bytes as emitted, up to what one frame carries; any other server
//! takes count × output size bytes only, so the output is zero-padded to
//! that and a longer one fails the message.

use bytes::Bytes;
use corefarm_smp::ErrorCode;

use crate::guard::Reservation;

/// Why a message's handler result cannot go out; the text is the reason
/// the message fails with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResultError {
    #[error(
        "handler set {set}: emitted {len} bytes, more than one result message \
         carries on this link ({max} bytes)"
    )]
    OverFrame { set: String, len: usize, max: usize },
    #[error(
        "handler set {set}: emitted {len} bytes, more than this message's result of {count} \
         inputs × {output_size} bytes = {room} bytes (the server did not agree any-length)"
    )]
    OverOutputs {
        set: String,
        len: usize,
        count: usize,
        output_size: usize,
        room: usize,
    },
    #[error(
        "handler set {set}: a result of {len} bytes needs {more} bytes more than the \
         {room} reserved for its output ({count} × {output_size} bytes), and the node's memory \
         guard has {free} of its {limit} bytes free",
        more = len - room
    )]
    NoMemory {
        set: String,
        len: usize,
        room: usize,
        count: usize,
        output_size: usize,
        free: usize,
        limit: usize,
    },
}

impl ResultError {
    /// The SMP code the message fails with.
    pub fn code(&self) -> ErrorCode {
        match self {
            ResultError::OverFrame { .. } | ResultError::OverOutputs { .. } => {
                ErrorCode::CoreFailure
            }
            ResultError::NoMemory { .. } => ErrorCode::TooLarge,
        }
    }
}

/// What the link to the server allows a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultLink {
    /// Largest payload on the link (the node's limit, or the server's if smaller).
    pub limit: u32,
    /// The server agreed `any-length` in its hello.
    pub any_length: bool,
}

impl ResultLink {
    /// The contract for a configuration of `output_size`-byte outputs.
    pub fn shape(self, output_size: usize) -> ResultShape {
        ResultShape {
            output_size,
            any_length: self.any_length,
            max_data: (self.limit as usize).saturating_sub(corefarm_smp::DATA_ID_LEN),
        }
    }
}

/// The node's side of the result contract on its current link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultShape {
    /// Bytes of one output of the configuration.
    pub output_size: usize,
    /// The server agreed `any-length` in its hello.
    pub any_length: bool,
    /// Largest result data one frame carries on this link (the payload
    /// limit less the data message's id).
    pub max_data: usize,
}

impl ResultShape {
    /// The result of a message of `count` inputs whose handlers (of set
    /// `set`) emitted `emitted`; `Err` is why the message fails.
    pub fn emitted(
        &self,
        set: &str,
        count: usize,
        mut emitted: Vec<u8>,
    ) -> Result<Bytes, ResultError> {
        if self.any_length {
            if emitted.len() > self.max_data {
                return Err(ResultError::OverFrame {
                    set: set.to_string(),
                    len: emitted.len(),
                    max: self.max_data,
                });
            }
            return Ok(Bytes::from(emitted));
        }
        let room = count * self.output_size;
        if emitted.len() > room {
            return Err(ResultError::OverOutputs {
                set: set.to_string(),
                len: emitted.len(),
                count,
                output_size: self.output_size,
                room,
            });
        }
        emitted.resize(room, 0);
        Ok(Bytes::from(emitted))
    }

    /// Makes `reservation`, which holds count × output size bytes for the
    /// message's output, hold `len` bytes for it instead: a longer result
    /// (`any-length`) takes the difference from the memory guard before it
    /// is queued, so the guard counts all of it while it waits to be sent;
    /// a shorter one gives the difference back. `Err` is why the message
    /// fails (the guard cannot spare the difference now).
    ///
    /// Never waits: the lane thread calling this has messages queued
    /// behind it holding reservations, and its results wait in the sending
    /// task's queue holding theirs; memory that only they can give back
    /// may never come while this thread blocks.
    pub fn account(
        &self,
        set: &str,
        count: usize,
        len: usize,
        reservation: &mut Reservation,
    ) -> Result<(), ResultError> {
        let room = count * self.output_size;
        if len <= room {
            reservation.give_back(room - len);
            return Ok(());
        }
        reservation
            .try_grow(len - room)
            .map_err(|short| ResultError::NoMemory {
                set: set.to_string(),
                len,
                room,
                count,
                output_size: self.output_size,
                free: short.free,
                limit: short.limit,
            })
    }

    /// The result of a message the handlers dropped: empty, or zeros of
    /// the fixed size.
    pub fn dropped(&self, count: usize) -> Bytes {
        if self.any_length {
            Bytes::new()
        } else {
            Bytes::from(vec![0; count * self.output_size])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXED: ResultShape = ResultShape {
        output_size: 64,
        any_length: false,
        max_data: 1 << 20,
    };
    const ANY: ResultShape = ResultShape {
        any_length: true,
        max_data: 100,
        ..FIXED
    };

    #[test]
    fn the_link_leaves_room_for_the_id() {
        let link = ResultLink {
            limit: 1000,
            any_length: true,
        };
        assert_eq!(
            link.shape(64),
            ResultShape {
                output_size: 64,
                any_length: true,
                max_data: 996
            }
        );
    }

    #[test]
    fn without_any_length_the_output_is_padded_to_count_times_output_size() {
        let out = FIXED.emitted("sum", 2, vec![1, 2, 3]).unwrap();
        assert_eq!(out.len(), 128);
        assert_eq!(&out[..3], &[1, 2, 3]);
        assert!(out[3..].iter().all(|&b| b == 0));
        assert_eq!(FIXED.dropped(2), Bytes::from(vec![0u8; 128]));
    }

    #[test]
    fn without_any_length_a_longer_output_fails_the_message() {
        let why = FIXED.emitted("strided", 1, vec![0; 65]).unwrap_err();
        assert_eq!(
            why,
            ResultError::OverOutputs {
                set: "strided".into(),
                len: 65,
                count: 1,
                output_size: 64,
                room: 64
            }
        );
        assert_eq!(why.code(), ErrorCode::CoreFailure);
    }

    #[test]
    fn with_any_length_the_output_goes_as_emitted_and_a_drop_is_empty() {
        assert_eq!(&ANY.emitted("sum", 2, vec![9; 8]).unwrap()[..], &[9; 8]);
        // Longer than count × output size is fine up to the frame limit.
        assert_eq!(ANY.emitted("filter", 1, vec![5; 100]).unwrap().len(), 100);
        assert!(ANY.emitted("filter", 1, Vec::new()).unwrap().is_empty());
        assert!(ANY.dropped(3).is_empty());
    }

    #[test]
    fn with_any_length_an_output_beyond_one_frame_fails_with_the_limit() {
        let why = ANY.emitted("filter", 1, vec![0; 101]).unwrap_err();
        assert_eq!(
            why,
            ResultError::OverFrame {
                set: "filter".into(),
                len: 101,
                max: 100
            }
        );
    }
}

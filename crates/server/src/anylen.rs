//! Results of any length (hello feature `any-length`): a node
//! that agreed it may answer a data message with any number of bytes (a
//! streaming handler's sum or filter), up to the frame limit. What a user
//! gets depends on what it agreed; both sharing modes use [`for_user`].
//!
//! A user also bounds what it reads: a hello may announce its own
//! `max_message`, below the server's. A result it could not read fails by
//! id instead of reaching it ([`user_limit`], [`fixed_result_fits`]).

use bytes::{Bytes, BytesMut};
use corefarm_smp::{Hello, DATA_ID_LEN};

/// The largest payload (id included) this user reads: the server's own
/// limit, or the smaller one its hello announced. A seed-format user has
/// no hello and takes what the server takes.
pub(crate) fn user_limit(server_max: u32, hello: Option<&Hello>) -> u32 {
    hello
        .and_then(|h| h.max_message)
        .map_or(server_max, |m| m.min(server_max))
}

/// Why data message `id` of `count` inputs is refused on arrival, if it
/// is: its fixed-size result would not fit what the user reads. With
/// `any-length` agreed a result's length is known only when it comes back
/// (a handler's sum is shorter than its inputs' outputs) and [`for_user`]
/// checks it then. `.1`: the user can be told by id (it agreed `error`)
/// and keeps its session; else the session ends with the reason.
pub(crate) fn refuse_data(
    id: u32,
    count: u32,
    output_size: u32,
    limit: u32,
    agreed: Option<&Hello>,
) -> Option<(String, bool)> {
    use corefarm_smp::hello::features;
    // Arithmetic first: on the data path nearly every message fits.
    let why = fixed_result_fits(count, output_size, limit).err()?;
    if agreed.is_some_and(|h| h.has(features::ANY_LENGTH)) {
        return None;
    }
    let by_id = agreed.is_some_and(|h| h.has(features::ERROR));
    Some((format!("data id {id}: {why}"), by_id))
}

/// A result the user cannot be given; the message is the reason its data
/// message fails with, as the user reads it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unfit {
    /// Known on arrival: `count` inputs of `output_size` bytes make `len`.
    #[error(
        "its result ({count} × {output_size} bytes = {len}) would exceed the {limit}-byte \
         message limit this client announced (max_message, id included): send fewer \
         inputs per message or raise the client's limit"
    )]
    WouldExceed {
        count: u32,
        output_size: u32,
        len: u64,
        limit: u32,
    },
    /// A result (of a handler, whose length is known only now) beyond the
    /// user's limit.
    #[error(
        "the result of {len} bytes exceeds the {limit}-byte message limit this client \
         announced (max_message, id included)"
    )]
    Exceeds { len: usize, limit: u32 },
    /// Longer than a user without `any-length` expects.
    #[error(
        "the handlers' result of {len} bytes is longer than the {expect} bytes \
         (inputs × output size) this connection expects; a client that agrees \
         the any-length feature gets it whole"
    )]
    Longer { len: usize, expect: usize },
}

/// Whether the result of `count` inputs, `output_size` bytes each, fits
/// the user's `limit`; checked when the data arrives, so that a message
/// whose result the user could not read is never computed.
fn fixed_result_fits(count: u32, output_size: u32, limit: u32) -> Result<(), Unfit> {
    let len = u64::from(count) * u64::from(output_size);
    if len + DATA_ID_LEN as u64 <= u64::from(limit) {
        return Ok(());
    }
    Err(Unfit::WouldExceed {
        count,
        output_size,
        len,
        limit,
    })
}

/// Whether a node's result of `len` bytes is acceptable where `expect`
/// (count × output size) was asked for: always for a node that agreed
/// `any-length` (the frame limit already bounds it), else only exactly.
pub(crate) fn node_may_send(len: usize, expect: usize, any_length: bool) -> bool {
    len == expect || any_length
}

/// The result as the user takes it. A user that agreed `any-length` (or a
/// result of the expected size: the common path, no copy) gets the bytes
/// as they are. A user that did not keeps its contract of `expect` bytes: a
/// shorter result is padded with zeros; a longer one cannot be given to it,
/// and its message fails.
///
/// A result longer than the user's `limit` (a handler's, whose length is
/// known only now) fails the same way, whatever was agreed.
pub(crate) fn for_user(
    data: Bytes,
    expect: usize,
    user_agreed: bool,
    limit: u32,
) -> Result<Bytes, Unfit> {
    let len = data.len();
    if len + DATA_ID_LEN > limit as usize {
        return Err(Unfit::Exceeds { len, limit });
    }
    if data.len() == expect || user_agreed {
        return Ok(data);
    }
    if len > expect {
        return Err(Unfit::Longer { len, expect });
    }
    let mut padded = BytesMut::zeroed(expect);
    padded[..data.len()].copy_from_slice(&data);
    Ok(padded.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_without_the_feature_must_send_exactly_the_expected_size() {
        assert!(node_may_send(64, 64, false));
        assert!(!node_may_send(8, 64, false));
        assert!(!node_may_send(65, 64, false));
        assert!(node_may_send(8, 64, true));
        assert!(node_may_send(0, 64, true));
        assert!(node_may_send(6400, 64, true));
    }

    #[test]
    fn an_agreeing_user_gets_the_bytes_as_they_are() {
        let data = Bytes::from_static(b"abc");
        let out = for_user(data.clone(), 64, true, u32::MAX).unwrap();
        assert_eq!(out, data);
        // No copy: the same memory.
        assert_eq!(out.as_ptr(), data.as_ptr());
        let long = Bytes::from(vec![7u8; 100]);
        assert_eq!(for_user(long.clone(), 64, true, u32::MAX).unwrap(), long);
        assert!(for_user(Bytes::new(), 64, true, u32::MAX)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn the_expected_size_is_passed_on_without_a_copy() {
        let data = Bytes::from(vec![1u8; 64]);
        let out = for_user(data.clone(), 64, false, u32::MAX).unwrap();
        assert_eq!(out.as_ptr(), data.as_ptr());
    }

    #[test]
    fn a_shorter_result_is_padded_with_zeros_for_a_user_without_the_feature() {
        let out = for_user(Bytes::from_static(b"\x01\x02\x03"), 8, false, u32::MAX).unwrap();
        assert_eq!(&out[..], b"\x01\x02\x03\0\0\0\0\0");
        let empty = for_user(Bytes::new(), 4, false, u32::MAX).unwrap();
        assert_eq!(&empty[..], &[0u8; 4]);
    }

    #[test]
    fn a_longer_result_fails_for_a_user_without_the_feature_naming_both_lengths() {
        let why = for_user(Bytes::from(vec![0u8; 100]), 64, false, u32::MAX).unwrap_err();
        assert_eq!(
            why,
            Unfit::Longer {
                len: 100,
                expect: 64
            }
        );
        // The reason the user reads names both lengths.
        let why = why.to_string();
        assert!(
            why.contains("100 bytes") && why.contains("64 bytes"),
            "{why}"
        );
    }

    #[test]
    fn a_result_beyond_the_users_own_limit_fails_whatever_was_agreed() {
        let data = Bytes::from(vec![0u8; 100]);
        // 100 bytes + the 4-byte id: 104 fits exactly, 103 does not.
        assert!(for_user(data.clone(), 100, false, 104).is_ok());
        let why = for_user(data.clone(), 100, true, 103).unwrap_err();
        assert_eq!(
            why,
            Unfit::Exceeds {
                len: 100,
                limit: 103
            }
        );
        let why = why.to_string();
        assert!(
            why.contains("100 bytes") && why.contains("103-byte"),
            "{why}"
        );
        assert!(for_user(data, 64, true, 103).is_err());
    }

    #[test]
    fn the_user_limit_is_the_smaller_of_the_two_and_the_servers_without_one() {
        assert_eq!(user_limit(1 << 20, None), 1 << 20);
        let mut h = Hello::new("user");
        assert_eq!(user_limit(1 << 20, Some(&h)), 1 << 20);
        h.max_message = Some(4096);
        assert_eq!(user_limit(1 << 20, Some(&h)), 4096);
        h.max_message = Some(u32::MAX);
        assert_eq!(user_limit(1 << 20, Some(&h)), 1 << 20);
    }

    #[test]
    fn a_fixed_result_is_checked_with_its_id_and_without_overflow() {
        assert!(fixed_result_fits(4, 1020, 4084).is_ok());
        let why = fixed_result_fits(4, 1020, 4083).unwrap_err();
        assert!(matches!(why, Unfit::WouldExceed { len: 4080, .. }));
        let why = why.to_string();
        assert!(
            why.contains("4 × 1020 bytes = 4080") && why.contains("4083-byte"),
            "{why}"
        );
        assert!(fixed_result_fits(u32::MAX, u32::MAX, u32::MAX).is_err());
        assert!(fixed_result_fits(0, 16, 4).is_ok());
    }
}

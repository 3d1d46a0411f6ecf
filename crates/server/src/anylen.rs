//! Results of any length (issue 11, hello feature `any-length`): a node
//! that agreed it may answer a data message with any number of bytes (a
//! streaming handler's sum or filter), up to the frame limit. What a user
//! gets depends on what it agreed; both sharing modes use [`for_user`].

use bytes::{Bytes, BytesMut};

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
/// and the `Err` is the reason its message fails with.
pub(crate) fn for_user(data: Bytes, expect: usize, user_agreed: bool) -> Result<Bytes, String> {
    if data.len() == expect || user_agreed {
        return Ok(data);
    }
    if data.len() > expect {
        return Err(format!(
            "the handlers' result of {} bytes is longer than the {expect} bytes \
             (inputs × output size) this connection expects; a client that agrees \
             the any-length feature gets it whole",
            data.len()
        ));
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
        let out = for_user(data.clone(), 64, true).unwrap();
        assert_eq!(out, data);
        // No copy: the same memory.
        assert_eq!(out.as_ptr(), data.as_ptr());
        let long = Bytes::from(vec![7u8; 100]);
        assert_eq!(for_user(long.clone(), 64, true).unwrap(), long);
        assert!(for_user(Bytes::new(), 64, true).unwrap().is_empty());
    }

    #[test]
    fn the_expected_size_is_passed_on_without_a_copy() {
        let data = Bytes::from(vec![1u8; 64]);
        let out = for_user(data.clone(), 64, false).unwrap();
        assert_eq!(out.as_ptr(), data.as_ptr());
    }

    #[test]
    fn a_shorter_result_is_padded_with_zeros_for_a_user_without_the_feature() {
        let out = for_user(Bytes::from_static(b"\x01\x02\x03"), 8, false).unwrap();
        assert_eq!(&out[..], b"\x01\x02\x03\0\0\0\0\0");
        let empty = for_user(Bytes::new(), 4, false).unwrap();
        assert_eq!(&empty[..], &[0u8; 4]);
    }

    #[test]
    fn a_longer_result_fails_for_a_user_without_the_feature_naming_both_lengths() {
        let why = for_user(Bytes::from(vec![0u8; 100]), 64, false).unwrap_err();
        assert!(
            why.contains("100 bytes") && why.contains("64 bytes"),
            "{why}"
        );
    }
}

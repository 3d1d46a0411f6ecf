//! What a user session checks of a data message before it goes to a node
//! or a queue, the same in both sharing modes (the session calls it
//! whatever its placement): that it holds whole inputs of
//! the configuration, that a credit user had credit for it, and that its
//! result could reach the user.

use corefarm_smp::error::ErrorCode;
use corefarm_smp::hello::Hello;
use corefarm_smp::message::Configuration;

/// Why a data message is not taken.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The session ends with this error.
    End(u32, ErrorCode, String),
    /// An error for this id only (the user agreed to errors); the session
    /// goes on and the message's credit comes back with the next grant.
    ById(u32, ErrorCode, String),
}

/// The data message `id` of `len` bytes: its input count, or why it is
/// refused. `credit` is the user's credit if it agreed to credit (one is
/// taken); `result_limit` and `hello` are what the user can read back.
pub(crate) fn check(
    cfg: &Configuration,
    credit: Option<&mut u64>,
    result_limit: u32,
    hello: Option<&Hello>,
    id: u32,
    len: usize,
) -> Result<u32, Refused> {
    let count = cfg
        .count_inputs(len)
        .map_err(|e| Refused::End(id, e.code(), format!("data id {id}: {e}")))?;
    if let Some(credit) = credit {
        if *credit == 0 {
            let why = "data message sent without credit".to_string();
            return Err(Refused::End(id, ErrorCode::UnexpectedMessage, why));
        }
        *credit -= 1;
    }
    match crate::anylen::refuse_data(id, count, cfg.output_size, result_limit, hello) {
        Some((why, true)) => Err(Refused::ById(id, ErrorCode::TooLarge, why)),
        Some((why, false)) => Err(Refused::End(id, ErrorCode::TooLarge, why)),
        None => Ok(count),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corefarm_smp::hello::features;

    fn cfg(input_size: u32, output_size: u32) -> Configuration {
        Configuration {
            input_size,
            output_size,
            cores: Vec::new(),
            bitstream: bytes::Bytes::new(),
        }
    }

    #[test]
    fn whole_inputs_with_credit_pass_and_take_one_credit() {
        let mut credit = 2u64;
        let c = cfg(16, 16);
        assert_eq!(check(&c, Some(&mut credit), 1 << 20, None, 7, 48), Ok(3));
        assert_eq!(credit, 1);
        // Without credit agreed, nothing is counted.
        assert_eq!(check(&c, None, 1 << 20, None, 7, 16), Ok(1));
    }

    #[test]
    fn broken_messages_end_the_session_and_an_unreadable_result_is_refused_by_id() {
        let c = cfg(16, 16);
        let Err(Refused::End(7, _, why)) = check(&c, None, 1 << 20, None, 7, 20) else {
            panic!("a partial input must end the session");
        };
        assert!(why.starts_with("data id 7:"), "{why}");
        let mut none = 0u64;
        let got = check(&c, Some(&mut none), 1 << 20, None, 8, 16);
        assert!(matches!(
            got,
            Err(Refused::End(8, ErrorCode::UnexpectedMessage, _))
        ));
        // A result over the user's limit: by id if it takes errors.
        let mut h = Hello::new("user");
        assert!(matches!(
            check(&c, None, 20, Some(&h), 9, 32),
            Err(Refused::End(9, ErrorCode::TooLarge, _))
        ));
        h.features.push(features::ERROR.into());
        assert!(matches!(
            check(&c, None, 20, Some(&h), 9, 32),
            Err(Refused::ById(9, ErrorCode::TooLarge, _))
        ));
    }
}

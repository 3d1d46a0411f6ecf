//! Matching rules (seed 004 §3.2.1, FPsPIN's matching engine): a rule
//! looks at one 32-bit word of a message's first chunk, masks it and checks
//! that it lies in a range; a ruleset combines up to four rules with AND or
//! OR. Unlike FPsPIN, which matches network headers in network byte order,
//! corefarm matches the user's own data, so words are little-endian (what
//! a `uint32` array on x86 or ARM holds).

use serde::{Deserialize, Serialize};

/// Rules per ruleset (FPsPIN's matching units per ruleset).
pub const MAX_RULES: usize = 4;

/// `start <= (word[index] & mask) <= end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// Word index: bytes `4*index .. 4*index+4` of the message data.
    pub index: u32,
    pub mask: u32,
    pub start: u32,
    pub end: u32,
}

impl Rule {
    /// A rule that matches nothing (FPsPIN's RULE_FALSE: `1 <= x & 0 <= 0`).
    pub const FALSE: Rule = Rule {
        index: 0,
        mask: 0,
        start: 1,
        end: 0,
    };

    /// Whether the word at `index` of `data` satisfies the rule. A word
    /// beyond the data does not.
    pub fn matches(&self, data: &[u8]) -> bool {
        let at = self.index as usize * 4;
        let Some(w) = data.get(at..at + 4) else {
            return false;
        };
        let v = u32::from_le_bytes(w.try_into().expect("4 bytes")) & self.mask;
        self.start <= v && v <= self.end
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    And,
    Or,
}

/// Up to [`MAX_RULES`] rules and how they combine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ruleset {
    pub mode: Mode,
    pub rules: Vec<Rule>,
}

/// A ruleset over the limits a configuration may not exceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RulesetError {
    #[error("a ruleset needs at least one rule (Rule::FALSE to disable it)")]
    Empty,
    #[error("a ruleset has at most {MAX_RULES} rules, this one has {0}")]
    TooMany(usize),
}

impl Ruleset {
    /// Checks the limits a configuration may not exceed.
    pub fn validate(&self) -> Result<(), RulesetError> {
        if self.rules.is_empty() {
            return Err(RulesetError::Empty);
        }
        if self.rules.len() > MAX_RULES {
            return Err(RulesetError::TooMany(self.rules.len()));
        }
        Ok(())
    }

    pub fn matches(&self, data: &[u8]) -> bool {
        match self.mode {
            Mode::And => self.rules.iter().all(|r| r.matches(data)),
            Mode::Or => self.rules.iter().any(|r| r.matches(data)),
        }
    }
}

/// The first ruleset (execution context) matching `head`, if any.
pub fn select<'a, T>(contexts: &'a [(Ruleset, T)], head: &[u8]) -> Option<(usize, &'a T)> {
    contexts
        .iter()
        .enumerate()
        .find(|(_, (r, _))| r.matches(head))
        .map(|(i, (_, t))| (i, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[u32]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn a_rule_masks_and_checks_the_range() {
        let data = words(&[7, 0x1234_5678, 42]);
        let r = |index, mask, start, end| Rule {
            index,
            mask,
            start,
            end,
        };
        assert!(r(0, u32::MAX, 7, 7).matches(&data));
        assert!(!r(0, u32::MAX, 8, 9).matches(&data));
        assert!(r(1, 0xFFFF_0000, 0x1234_0000, 0x1234_0000).matches(&data));
        assert!(r(1, 0xFF, 0x70, 0x80).matches(&data));
        assert!(r(2, u32::MAX, 40, 50).matches(&data));
        // Beyond the data: no match, never a panic.
        assert!(!r(3, 0, 0, u32::MAX).matches(&data));
        assert!(!r(u32::MAX, 0, 0, u32::MAX).matches(&data));
        assert!(!Rule::FALSE.matches(&data));
    }

    #[test]
    fn rulesets_combine_with_and_or() {
        let data = words(&[1, 2]);
        let yes = Rule {
            index: 0,
            mask: u32::MAX,
            start: 1,
            end: 1,
        };
        let and = Ruleset {
            mode: Mode::And,
            rules: vec![yes, Rule::FALSE],
        };
        let or = Ruleset {
            mode: Mode::Or,
            rules: vec![yes, Rule::FALSE],
        };
        assert!(!and.matches(&data));
        assert!(or.matches(&data));
        let contexts = vec![(and, "a"), (or, "b")];
        assert_eq!(select(&contexts, &data), Some((1, &"b")));
        assert_eq!(select(&contexts, &[]), None);
    }

    #[test]
    fn limits() {
        let too_many = Ruleset {
            mode: Mode::Or,
            rules: vec![Rule::FALSE; MAX_RULES + 1],
        };
        assert_eq!(
            too_many.validate(),
            Err(RulesetError::TooMany(MAX_RULES + 1))
        );
        let empty = Ruleset {
            mode: Mode::And,
            rules: vec![],
        };
        assert_eq!(empty.validate(), Err(RulesetError::Empty));
    }
}

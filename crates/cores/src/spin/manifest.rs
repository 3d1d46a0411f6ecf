//! Handler sets in an image's manifest (docs/images.md, `handler_sets`):
//! per execution context, a ruleset and the name of a handler set whose
//! functions (`<name>_head/_payload/_tail`) are compiled into the image's
//! `spin-<arch>-linux` artifact, with the budgets it runs under. Checked
//! on parse, so a bad configuration is refused with a reason before any
//! code is loaded.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::engine::Budgets;
use super::rules::{Ruleset, MAX_RULES};

/// Execution contexts per image (FPsPIN has a handful per NIC).
pub const MAX_HANDLER_SETS: usize = 16;
/// Words a rule may look at: the first 64 KiB of a message.
pub const MAX_RULE_INDEX: u32 = 16 * 1024 - 1;
/// Caps on what an image may declare.
pub const MAX_SCRATCH: u32 = 16 << 20;
pub const MAX_SHARED: u64 = 256 << 20;
pub const MAX_COUNTERS: u32 = 4096;
pub const MAX_OUTPUT: u64 = 1 << 30;
pub const MAX_PER_CALL_MS: u64 = 60_000;
/// Bytes of one notification (spin.h says 4 KiB).
pub const NOTIFICATION: u32 = 4096;

/// Prefix of the artifact target that holds the handler sets' code.
pub const SPIN_TARGET_PREFIX: &str = "spin-";

/// `spin-<arch>-linux` for this machine.
pub fn spin_target() -> Option<String> {
    if cfg!(target_os = "linux") {
        crate::image::host_arch().map(|a| format!("spin-{a}-linux"))
    } else {
        None
    }
}

/// What a handler set may use, as the manifest declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetSpec {
    /// Per-message scratchpad bytes.
    pub scratch: u32,
    /// Shared handler memory bytes (kept across messages).
    pub shared: u64,
    /// 64-bit counters.
    pub counters: u32,
    /// Result bytes one message's handlers may emit.
    pub output: u64,
    /// Wall time of one handler call, in milliseconds; a call that runs
    /// longer is stopped and fails its message.
    pub per_call_ms: u64,
}

impl Default for BudgetSpec {
    fn default() -> Self {
        BudgetSpec {
            scratch: 64 * 1024,
            shared: 0,
            counters: 8,
            output: 16 << 20,
            per_call_ms: 1000,
        }
    }
}

impl BudgetSpec {
    pub fn budgets(&self) -> Budgets {
        Budgets {
            scratch: self.scratch,
            output: self.output,
            per_call: Duration::from_millis(self.per_call_ms),
            notification: NOTIFICATION,
        }
    }
}

/// One execution context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerSet {
    /// The C prefix of the handler functions.
    pub name: String,
    pub ruleset: Ruleset,
    #[serde(default)]
    pub budgets: BudgetSpec,
}

fn is_c_identifier(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
        && s.len() <= 64
}

/// What is wrong with a manifest's handler sets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerSetError {
    #[error("{0} handler sets, at most {MAX_HANDLER_SETS}")]
    TooMany(usize),
    #[error("handler set {index} ({name:?}): {problem}")]
    Set {
        index: usize,
        name: String,
        problem: SetProblem,
    },
}

/// What is wrong with one handler set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetProblem {
    #[error("the name must be a C identifier of at most 64 characters")]
    Name,
    #[error("the name is used twice")]
    Duplicate,
    #[error("a ruleset has 1 to {MAX_RULES} rules, this one has {0}")]
    RuleCount(usize),
    #[error(
        "rule {rule}: word index {index} is past the first {} bytes a rule may match",
        (MAX_RULE_INDEX as u64 + 1) * 4
    )]
    WordIndex { rule: usize, index: u32 },
    #[error(
        "rule {rule}: range start {start:#x} is above its end {end:#x} (use mask 0, start 1, \
         end 0 for a rule that matches nothing)"
    )]
    Range { rule: usize, start: u32, end: u32 },
    #[error(
        "rule {rule}: range start {start:#x} is above the mask {mask:#x}, so the rule never \
         matches"
    )]
    AboveMask { rule: usize, start: u32, mask: u32 },
    #[error("budget {what} = {value} exceeds the cap of {max}")]
    Budget {
        what: &'static str,
        value: u64,
        max: u64,
    },
    #[error("budget per_call_ms must be at least 1")]
    NoTime,
}

/// Checks the handler sets of a manifest; the error names the set.
pub fn check(sets: &[HandlerSet]) -> Result<(), HandlerSetError> {
    if sets.len() > MAX_HANDLER_SETS {
        return Err(HandlerSetError::TooMany(sets.len()));
    }
    for (index, s) in sets.iter().enumerate() {
        check_set(s, &sets[..index]).map_err(|problem| HandlerSetError::Set {
            index,
            name: s.name.clone(),
            problem,
        })?;
    }
    Ok(())
}

/// One set, after `before` in the manifest.
fn check_set(s: &HandlerSet, before: &[HandlerSet]) -> Result<(), SetProblem> {
    if !is_c_identifier(&s.name) {
        return Err(SetProblem::Name);
    }
    if before.iter().any(|o| o.name == s.name) {
        return Err(SetProblem::Duplicate);
    }
    if s.ruleset.rules.is_empty() || s.ruleset.rules.len() > MAX_RULES {
        return Err(SetProblem::RuleCount(s.ruleset.rules.len()));
    }
    for (rule, r) in s.ruleset.rules.iter().enumerate() {
        if r.index > MAX_RULE_INDEX {
            return Err(SetProblem::WordIndex {
                rule,
                index: r.index,
            });
        }
        // mask 0 with start > end is the documented "matches nothing".
        if r.mask != 0 && r.start > r.end {
            return Err(SetProblem::Range {
                rule,
                start: r.start,
                end: r.end,
            });
        }
        if r.mask != 0 && r.start > r.mask {
            return Err(SetProblem::AboveMask {
                rule,
                start: r.start,
                mask: r.mask,
            });
        }
    }
    let b = &s.budgets;
    for (what, value, max) in [
        ("scratch", b.scratch as u64, MAX_SCRATCH as u64),
        ("shared", b.shared, MAX_SHARED),
        ("counters", b.counters as u64, MAX_COUNTERS as u64),
        ("output", b.output, MAX_OUTPUT),
        ("per_call_ms", b.per_call_ms, MAX_PER_CALL_MS),
    ] {
        if value > max {
            return Err(SetProblem::Budget { what, value, max });
        }
    }
    if b.per_call_ms == 0 {
        return Err(SetProblem::NoTime);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spin::{Mode, Rule};

    fn set(name: &str, rules: Vec<Rule>) -> HandlerSet {
        HandlerSet {
            name: name.into(),
            ruleset: Ruleset {
                mode: Mode::Or,
                rules,
            },
            budgets: BudgetSpec::default(),
        }
    }

    fn rule(index: u32, mask: u32, start: u32, end: u32) -> Rule {
        Rule {
            index,
            mask,
            start,
            end,
        }
    }

    #[test]
    fn good_sets_pass_and_bad_ones_say_why() {
        let ok = set("sum", vec![rule(0, u32::MAX, 1, 1), Rule::FALSE]);
        check(std::slice::from_ref(&ok)).unwrap();
        let problem = |sets: &[HandlerSet]| match check(sets) {
            Err(HandlerSetError::Set { problem, .. }) => problem,
            other => panic!("{other:?}"),
        };
        let cases = [
            (vec![set("1sum", vec![Rule::FALSE])], SetProblem::Name),
            (vec![ok.clone(), ok.clone()], SetProblem::Duplicate),
            (vec![set("a", vec![])], SetProblem::RuleCount(0)),
            (
                vec![set("a", vec![Rule::FALSE; 5])],
                SetProblem::RuleCount(5),
            ),
            (
                vec![set("a", vec![rule(0, 0xFF, 9, 3)])],
                SetProblem::Range {
                    rule: 0,
                    start: 9,
                    end: 3,
                },
            ),
            (
                vec![set("a", vec![rule(0, 0xFF, 0x100, 0x200)])],
                SetProblem::AboveMask {
                    rule: 0,
                    start: 0x100,
                    mask: 0xFF,
                },
            ),
            (
                vec![set("a", vec![rule(1 << 20, 1, 0, 1)])],
                SetProblem::WordIndex {
                    rule: 0,
                    index: 1 << 20,
                },
            ),
        ];
        for (sets, why) in cases {
            assert_eq!(problem(&sets), why);
        }
        assert_eq!(
            check(&vec![ok.clone(); 17]),
            Err(HandlerSetError::TooMany(17))
        );
        let mut big = ok.clone();
        big.budgets.scratch = MAX_SCRATCH + 1;
        assert!(matches!(
            problem(&[big]),
            SetProblem::Budget {
                what: "scratch",
                ..
            }
        ));
        let mut zero = ok;
        zero.budgets.per_call_ms = 0;
        assert_eq!(problem(&[zero]), SetProblem::NoTime);
    }

    #[test]
    fn json_form() {
        let s: HandlerSet = serde_json::from_str(
            r#"{"name":"sum","ruleset":{"mode":"and","rules":[{"index":0,"mask":4294967295,"start":1,"end":1}]},"budgets":{"scratch":64}}"#,
        )
        .unwrap();
        assert_eq!(s.budgets.scratch, 64);
        assert_eq!(s.budgets.per_call_ms, 1000);
        assert!(serde_json::from_str::<HandlerSet>(
            r#"{"name":"x","ruleset":{"mode":"xor","rules":[]}}"#
        )
        .is_err());
    }

    fn image_with(manifest_json: &str) -> bytes::Bytes {
        use crate::image::{MAGIC, VERSION};
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(manifest_json.len() as u32).to_le_bytes());
        b.extend_from_slice(manifest_json.as_bytes());
        bytes::Bytes::from(b)
    }

    #[test]
    fn handler_sets_are_checked_on_parse() {
        let m = |sets: &str, target: &str| {
            let sha = "0".repeat(64);
            format!(
                r#"{{"name":"x","input_size":8,"output_size":4,"cores":[],"artifacts":[{{"target":"{target}","kind":"native","offset":0,"length":0,"sha256":"{sha}"}}],"handler_sets":{sets}}}"#
            )
        };
        let rule = r#"{"index":0,"mask":255,"start":1,"end":1}"#;
        let one = format!(r#"[{{"name":"sum","ruleset":{{"mode":"or","rules":[{rule}]}}}}]"#);
        let ok = crate::image::Image::parse(image_with(&m(&one, "spin-x86_64-linux"))).unwrap();
        assert_eq!(ok.manifest.handler_sets[0].name, "sum");
        let five = format!(
            r#"[{{"name":"sum","ruleset":{{"mode":"or","rules":[{rule},{rule},{rule},{rule},{rule}]}}}}]"#
        );
        for (json, target, why) in [
            (
                one.as_str(),
                "native-x86_64-linux",
                "no spin-<arch>-linux artifact",
            ),
            (
                five.as_str(),
                "spin-x86_64-linux",
                "1 to 4 rules, this one has 5",
            ),
        ] {
            let e = crate::image::Image::parse(image_with(&m(json, target)))
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{e}");
        }
    }
}

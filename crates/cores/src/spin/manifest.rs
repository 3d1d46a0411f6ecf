//! Handler sets in an image's manifest (docs/images.md, `handler_sets`):
//! per execution context, a ruleset and the name of a handler set whose
//! functions (`<name>_head/_payload/_tail`) are compiled into the image's
//! `spin-<arch>-linux` artifact, with the budgets it runs under and, when
//! it declares one, the type of its results. Checked on parse, so a bad
//! configuration is refused with a reason before any code is loaded.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::engine::Budgets;
use super::rules::{self, Ruleset, MAX_RULES};
use crate::dtype::{DataType, DataTypeError};

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
    /// Element type and shape of the set's results, in the form of an
    /// image's `--output-type` (`int64[1]`, `uint64[256]`), for clients:
    /// nodes do not look at it. Kept as text so that a bad one is refused
    /// by [`check`] naming the set, not by the JSON reader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_type: Option<String>,
}

impl HandlerSet {
    /// The declared result type, parsed.
    pub fn result_type(&self) -> Result<Option<DataType>, DataTypeError> {
        self.result_type.as_deref().map(str::parse).transpose()
    }
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
    #[error("result_type: {0}")]
    ResultType(DataTypeError),
    #[error(
        "result_type {ty} is {} bytes, more than the output budget of {budget} bytes its \
         handlers may emit (declare the type of one result, or raise budgets.output)",
        bytes.map_or("too many".to_string(), |b| b.to_string())
    )]
    ResultOverBudget {
        ty: String,
        bytes: Option<u64>,
        budget: u64,
    },
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
    if let Some(t) = s.result_type().map_err(SetProblem::ResultType)? {
        let bytes = t.bytes();
        if !bytes.is_some_and(|n| n <= b.output) {
            return Err(SetProblem::ResultOverBudget {
                ty: t.to_string(),
                bytes,
                budget: b.output,
            });
        }
    }
    Ok(())
}

/// The result type each handler set of an image declares, for a client to
/// type the result of each message it sends. It matches the message
/// against the image's rulesets with the node's own function
/// ([`rules::select`]): the first matching set handles the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultTypes {
    contexts: Vec<(Ruleset, Option<DataType>)>,
}

impl ResultTypes {
    /// From an image's handler sets, checked here (a parsed image's
    /// already are); `None` when no set declares a result type, so a
    /// client need not match its messages at all.
    pub fn of(sets: &[HandlerSet]) -> Result<Option<ResultTypes>, HandlerSetError> {
        check(sets)?;
        let contexts: Vec<_> = sets
            .iter()
            .map(|s| {
                let t = s.result_type().expect("checked above");
                (s.ruleset.clone(), t)
            })
            .collect();
        Ok(contexts
            .iter()
            .any(|(_, t)| t.is_some())
            .then_some(ResultTypes { contexts }))
    }

    /// Each set's declared type, in manifest order.
    pub fn declared(&self) -> impl Iterator<Item = Option<&DataType>> {
        self.contexts.iter().map(|(_, t)| t.as_ref())
    }

    /// Bytes at the start of a message that the rulesets look at: a
    /// client matches that much of each message, not all of it.
    pub fn head_len(&self) -> usize {
        self.contexts
            .iter()
            .flat_map(|(r, _)| &r.rules)
            .map(|r| (r.index as usize + 1) * 4)
            .max()
            .unwrap_or(0)
    }

    /// The set that handles a message starting with `head` (its index in
    /// the manifest) and the type it declares; `None` when no ruleset
    /// matches, so the cores answer. A node matches the message's first
    /// chunk, so rules that look past it (4 KiB by default) may disagree.
    pub fn select(&self, head: &[u8]) -> Option<(usize, Option<&DataType>)> {
        rules::select(&self.contexts, head).map(|(i, t)| (i, t.as_ref()))
    }
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
            result_type: None,
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

    #[test]
    fn a_result_type_is_the_text_of_an_output_type_and_checked_naming_the_set() {
        use crate::dtype::{Dtype, TypeSyntax};
        let sum: HandlerSet = serde_json::from_str(
            r#"{"name":"sum","ruleset":{"mode":"and","rules":[{"index":0,"mask":4294967295,"start":1,"end":1}]},"result_type":"int64[1]"}"#,
        )
        .unwrap();
        let t = sum.result_type().unwrap().unwrap();
        assert_eq!((t.dtype, t.shape.as_slice()), (Dtype::Int64, &[1][..]));
        check(std::slice::from_ref(&sum)).unwrap();
        // Written back as it was given; a set without one writes none.
        let json = serde_json::to_string(&sum).unwrap();
        assert!(json.contains(r#""result_type":"int64[1]""#), "{json}");
        let mut plain = sum.clone();
        plain.result_type = None;
        assert!(!serde_json::to_string(&plain)
            .unwrap()
            .contains("result_type"));

        let with = |t: &str, output: u64| {
            let mut s = sum.clone();
            s.result_type = Some(t.into());
            s.budgets.output = output;
            vec![
                plain.clone(),
                HandlerSet {
                    name: "sum2".into(),
                    ..s
                },
            ]
        };
        let syntax = |sets: Vec<HandlerSet>| match check(&sets) {
            Err(HandlerSetError::Set {
                index: 1,
                name,
                problem: SetProblem::ResultType(e),
            }) if name == "sum2" => e.why,
            other => panic!("{other:?}"),
        };
        assert_eq!(syntax(with("int64", 64)), TypeSyntax::NoShape);
        assert_eq!(syntax(with("int24[2]", 64)), TypeSyntax::UnknownElement);
        assert_eq!(
            syntax(with("int64[0]", 64)),
            TypeSyntax::Shape(crate::dtype::ShapeError::ZeroDimension)
        );
        assert_eq!(
            check(&with("uint64[256]", 1024)),
            Err(HandlerSetError::Set {
                index: 1,
                name: "sum2".into(),
                problem: SetProblem::ResultOverBudget {
                    ty: "uint64[256]".into(),
                    bytes: Some(2048),
                    budget: 1024,
                },
            })
        );
        let huge = check(&with(
            "float64[4294967295,4294967295,4294967295]",
            MAX_OUTPUT,
        ));
        assert!(
            matches!(
                &huge,
                Err(HandlerSetError::Set {
                    problem: SetProblem::ResultOverBudget { bytes: None, .. },
                    ..
                })
            ),
            "{huge:?}"
        );
        // What `corefarm image build` and a refusing node print: the set,
        // the field, the text and the form with the element types.
        let shown = check(&with("int24[2]", 64)).unwrap_err().to_string();
        for part in [
            r#"handler set 1 ("sum2")"#,
            "result_type",
            r#""int24[2]""#,
            "int32[64,64]",
            "uint64",
        ] {
            assert!(shown.contains(part), "{part}: {shown}");
        }
    }

    #[test]
    fn result_types_follow_the_first_matching_ruleset() {
        let word0 = |w: u32| rule(0, u32::MAX, w, w);
        let typed = |name: &str, w: u32, t: Option<&str>| HandlerSet {
            result_type: t.map(Into::into),
            ..set(name, vec![word0(w)])
        };
        // No set declares a type: nothing to match.
        assert_eq!(ResultTypes::of(&[typed("a", 1, None)]), Ok(None));
        let sets = [
            typed("sum", 1, Some("int64[1]")),
            typed("filter", 2, None),
            typed("histogram", 3, Some("uint64[256]")),
            // Never selected: "sum" matches word 0 = 1 first.
            typed("shadow", 1, Some("float32[1]")),
        ];
        let types = ResultTypes::of(&sets).unwrap().unwrap();
        let shown: Vec<_> = types.declared().map(|t| t.map(|t| t.to_string())).collect();
        assert_eq!(
            shown,
            [
                Some("int64[1]".into()),
                None,
                Some("uint64[256]".into()),
                Some("float32[1]".into())
            ]
        );
        let msg = |w: u32| [w.to_le_bytes(), [0; 4], [0; 4], [0; 4]].concat();
        let pick = |w| {
            types
                .select(&msg(w))
                .map(|(i, t)| (i, t.map(ToString::to_string)))
        };
        assert_eq!(pick(1), Some((0, Some("int64[1]".into()))));
        assert_eq!(pick(2), Some((1, None)));
        assert_eq!(pick(3), Some((2, Some("uint64[256]".into()))));
        assert_eq!(pick(9), None);
        assert_eq!(types.head_len(), 4);
        let far = HandlerSet {
            ruleset: Ruleset {
                mode: Mode::And,
                rules: vec![word0(1), rule(5, 0xFF, 0, 3)],
            },
            ..typed("far", 1, Some("int8[1]"))
        };
        assert_eq!(ResultTypes::of(&[far]).unwrap().unwrap().head_len(), 24);
        assert_eq!(types.select(&[]), None);
        // Unchecked sets are checked here.
        assert!(ResultTypes::of(&[typed("a", 1, Some("int64"))]).is_err());
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
        let typed = |t: &str| {
            format!(
                r#"[{{"name":"sum","ruleset":{{"mode":"or","rules":[{rule}]}},"result_type":"{t}"}}]"#
            )
        };
        let ok =
            crate::image::Image::parse(image_with(&m(&typed("int64[1]"), "spin-x86_64-linux")))
                .unwrap();
        assert_eq!(
            ok.manifest.handler_sets[0].result_type.as_deref(),
            Some("int64[1]")
        );
        let untyped = typed("int64");
        for (json, target, why) in [
            (
                untyped.as_str(),
                "spin-x86_64-linux",
                r#"handler set 0 ("sum"): result_type: "int64" is not a type like"#,
            ),
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

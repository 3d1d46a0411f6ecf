//! Deciding an image's input and output sizes (and types) from everything
//! that states them: the flags, the HLS source's memory arguments, the
//! Verilog top module's INPUT_SIZE/OUTPUT_SIZE parameters. All statements
//! must agree; a side nothing states is an error that says what to give.

use corefarm_cores::image::{DataType, Dtype};

use crate::hls_probe::{Element, MemoryArg};

/// Why an image's input or output size cannot be decided, or disagrees
/// with the core. `side` is "input" or "output".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// `--<side>-type` names more bytes than fit in memory.
    #[error("--{side}-type {dtype} does not fit in memory")]
    TypeTooLarge { side: &'static str, dtype: DataType },
    /// Nothing states the size; `why` says why each source could not.
    #[error("cannot tell the {side} size: {why}; give --{side}-size (or --{side}-type)")]
    Unknown { side: &'static str, why: String },
    /// Two statements of the size disagree (`first_at` says `first` bytes).
    #[error("{side} size: {first_at} says {first} bytes but {at} says {bytes} bytes")]
    Disagree {
        side: &'static str,
        first_at: String,
        first: u64,
        at: String,
        bytes: u64,
    },
    #[error("{side} size {bytes} bytes ({at}) exceeds 4 GiB")]
    TooLarge {
        side: &'static str,
        bytes: u64,
        at: String,
    },
    /// `--<side>-type`'s elements are not those the HLS source points to.
    #[error(
        "--{side}-type {dtype} has {} elements but {at} declares a pointer to {declared}",
        dtype.dtype.name()
    )]
    ElementType {
        side: &'static str,
        dtype: DataType,
        at: String,
        declared: &'static str,
    },
    /// The Verilog core's memory, probed through its bus, holds fewer or
    /// more words than the size needs.
    #[error(
        "{side} size: {size} bytes need {need} 64-bit words of {side} memory, but the \
         {side} memory of Verilog module {top} holds {words} words ({} bytes; probed \
         through its bus)",
        words * 8
    )]
    Memory {
        side: &'static str,
        size: u32,
        need: u64,
        top: String,
        words: u64,
    },
}

/// Everything known about one side (input or output) of the core.
#[derive(Debug, Clone, Default)]
pub(crate) struct Side {
    /// "input" or "output".
    pub name: &'static str,
    pub flag_size: Option<u32>,
    pub flag_type: Option<DataType>,
    /// Where the HLS source said it (e.g. "the first argument of saxpy in
    /// saxpy.cpp") and what it said.
    pub hls: Option<(String, MemoryArg)>,
    /// Where the Verilog said it and the byte count.
    pub verilog: Option<(String, u64)>,
    /// Why a source could not tell (shown when nothing does).
    pub unknown: Vec<String>,
}

/// The decided size and type of one side, with where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decided {
    pub size: u32,
    pub dtype: Option<DataType>,
    /// E.g. "input: 2056 bytes, `int32[514]` (from the first argument of
    /// saxpy in saxpy.cpp; --input-size)".
    pub note: String,
}

fn flag(side: &Side, what: &str) -> String {
    format!("--{}-{what}", side.name)
}

pub(crate) fn decide(side: &Side) -> Result<Decided, SizeError> {
    let mut claims: Vec<(String, u64)> = Vec::new();
    if let Some(n) = side.flag_size {
        claims.push((flag(side, "size"), u64::from(n)));
    }
    if let Some(t) = &side.flag_type {
        let bytes = t.bytes().ok_or_else(|| SizeError::TypeTooLarge {
            side: side.name,
            dtype: t.clone(),
        })?;
        claims.push((format!("{} {t}", flag(side, "type")), bytes));
    }
    if let Some((at, m)) = &side.hls {
        claims.push((at.clone(), m.bytes));
    }
    if let Some((at, n)) = &side.verilog {
        claims.push((at.clone(), *n));
    }
    let Some((first_at, first)) = claims.first().cloned() else {
        let mut why = side.unknown.join("; ");
        if why.is_empty() {
            why = "no source states it".into();
        }
        return Err(SizeError::Unknown {
            side: side.name,
            why,
        });
    };
    if let Some((at, n)) = claims.iter().find(|(_, n)| *n != first) {
        return Err(SizeError::Disagree {
            side: side.name,
            first_at,
            first,
            at: at.clone(),
            bytes: *n,
        });
    }
    let size = u32::try_from(first).map_err(|_| SizeError::TooLarge {
        side: side.name,
        bytes: first,
        at: first_at.clone(),
    })?;
    let dtype = match (&side.flag_type, &side.hls) {
        (Some(t), Some((at, m))) => {
            if let Element::Typed(d) = m.element {
                if d != t.dtype {
                    return Err(SizeError::ElementType {
                        side: side.name,
                        dtype: t.clone(),
                        at: at.clone(),
                        declared: d.name(),
                    });
                }
            }
            Some(t.clone())
        }
        (Some(t), None) => Some(t.clone()),
        (None, Some((_, m))) => derived(m),
        (None, None) => None,
    };
    let sources: Vec<&str> = claims.iter().map(|(at, _)| at.as_str()).collect();
    let shown = dtype.as_ref().map_or(String::new(), |t| format!(", {t}"));
    Ok(Decided {
        size,
        note: format!(
            "{}: {size} bytes{shown} (from {})",
            side.name,
            sources.join("; ")
        ),
        dtype,
    })
}

/// The type an HLS memory argument states: its element type (`uint8` for
/// plain bytes), the memory's bytes / element size elements (none for a
/// struct or a size that is not a whole number of elements).
fn derived(m: &MemoryArg) -> Option<DataType> {
    let d = match m.element {
        Element::Typed(d) => d,
        Element::Bytes => Dtype::Uint8,
        Element::Other => return None,
    };
    let n = m.bytes / u64::from(d.size());
    if n == 0 || m.bytes % u64::from(d.size()) != 0 {
        return None;
    }
    Some(DataType {
        dtype: d,
        shape: vec![u32::try_from(n).ok()?],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hls(bytes: u64, element: Element) -> Option<(String, MemoryArg)> {
        let element_size = match element {
            Element::Typed(d) => u64::from(d.size()),
            _ => 1,
        };
        Some((
            "the first argument of f in core.cpp".into(),
            MemoryArg {
                bytes,
                element,
                element_size,
            },
        ))
    }

    fn input() -> Side {
        Side {
            name: "input",
            ..Side::default()
        }
    }

    #[test]
    fn sizes_come_from_the_source_when_omitted() {
        let d = decide(&Side {
            hls: hls(2056, Element::Typed(Dtype::Int32)),
            ..input()
        })
        .unwrap();
        assert_eq!(
            (d.size, d.dtype.unwrap().to_string()),
            (2056, "int32[514]".into())
        );
        let d = decide(&Side {
            verilog: Some(("saxpy.v parameter INPUT_SIZE".into(), 1024)),
            ..input()
        })
        .unwrap();
        assert_eq!((d.size, d.dtype), (1024, None));
        assert!(
            d.note.contains("saxpy.v parameter INPUT_SIZE"),
            "{}",
            d.note
        );
        // Plain bytes are uint8; a struct memory carries no type.
        let d = decide(&Side {
            hls: hls(2048, Element::Bytes),
            ..input()
        })
        .unwrap();
        assert_eq!(
            (d.size, d.dtype.unwrap().to_string()),
            (2048, "uint8[2048]".into())
        );
        let d = decide(&Side {
            hls: hls(16, Element::Other),
            ..input()
        })
        .unwrap();
        assert_eq!((d.size, d.dtype), (16, None));
    }

    #[test]
    fn disagreeing_statements_are_refused_with_both_numbers() {
        let e = decide(&Side {
            flag_size: Some(2048),
            hls: hls(2056, Element::Typed(Dtype::Int32)),
            ..input()
        })
        .unwrap_err();
        assert_eq!(
            e,
            SizeError::Disagree {
                side: "input",
                first_at: "--input-size".into(),
                first: 2048,
                at: "the first argument of f in core.cpp".into(),
                bytes: 2056,
            }
        );
        // What `corefarm image build` prints.
        assert_eq!(
            e.to_string(),
            "input size: --input-size says 2048 bytes but the first argument of f in core.cpp says 2056 bytes"
        );
        let e = decide(&Side {
            flag_type: Some("int16[4127]".parse().unwrap()),
            verilog: Some(("t.v parameter INPUT_SIZE".into(), 8256)),
            ..input()
        })
        .unwrap_err();
        assert!(
            matches!(
                &e,
                SizeError::Disagree {
                    first: 8254,
                    bytes: 8256,
                    ..
                }
            ),
            "{e}"
        );
        let e = decide(&Side {
            flag_type: Some("int16[1028]".parse().unwrap()),
            hls: hls(2056, Element::Typed(Dtype::Int32)),
            ..input()
        })
        .unwrap_err();
        assert!(
            matches!(&e, SizeError::ElementType { dtype, declared: "int32", .. }
                if dtype.to_string() == "int16[1028]"),
            "{e}"
        );
        assert!(e.to_string().contains("int16 elements"), "{e}");
    }

    #[test]
    fn a_type_reshapes_or_retypes_a_byte_memory() {
        let d = decide(&Side {
            flag_type: Some("int32[2,64,64]".parse().unwrap()),
            hls: hls(32768, Element::Typed(Dtype::Int32)),
            ..input()
        })
        .unwrap();
        assert_eq!(d.dtype.unwrap().shape, vec![2, 64, 64]);
        let d = decide(&Side {
            flag_type: Some("int8[2048]".parse().unwrap()),
            hls: hls(2048, Element::Bytes),
            ..input()
        })
        .unwrap();
        assert_eq!(d.dtype.unwrap().to_string(), "int8[2048]");
    }

    #[test]
    fn nothing_stating_a_size_says_what_to_give() {
        let e = decide(&Side {
            unknown: vec!["t.v: the top module t declares no INPUT_SIZE parameter".into()],
            ..input()
        })
        .unwrap_err();
        assert!(
            matches!(&e, SizeError::Unknown { side: "input", .. }),
            "{e}"
        );
        let e = e.to_string();
        assert!(
            e.starts_with("cannot tell the input size: t.v: the top module")
                && e.ends_with("give --input-size (or --input-type)"),
            "{e}"
        );
    }
}

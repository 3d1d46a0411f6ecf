//! Element types and shapes of typed inputs and outputs (`int32[64,64]`),
//! as an image's manifest declares them and the Python client maps them to
//! numpy arrays.

use serde::{Deserialize, Serialize};

/// Element type of a typed input or output (little-endian, as numpy names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Int8,
    Int16,
    Int32,
    Int64,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Float32,
    Float64,
}

impl Dtype {
    pub const ALL: [Dtype; 10] = [
        Dtype::Int8,
        Dtype::Int16,
        Dtype::Int32,
        Dtype::Int64,
        Dtype::Uint8,
        Dtype::Uint16,
        Dtype::Uint32,
        Dtype::Uint64,
        Dtype::Float32,
        Dtype::Float64,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Int8 => "int8",
            Dtype::Int16 => "int16",
            Dtype::Int32 => "int32",
            Dtype::Int64 => "int64",
            Dtype::Uint8 => "uint8",
            Dtype::Uint16 => "uint16",
            Dtype::Uint32 => "uint32",
            Dtype::Uint64 => "uint64",
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
        }
    }

    /// Bytes of one element.
    pub fn size(self) -> u32 {
        match self {
            Dtype::Int8 | Dtype::Uint8 => 1,
            Dtype::Int16 | Dtype::Uint16 => 2,
            Dtype::Int32 | Dtype::Uint32 | Dtype::Float32 => 4,
            Dtype::Int64 | Dtype::Uint64 | Dtype::Float64 => 8,
        }
    }

    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }
}

/// Most dimensions a shape may have (numpy's own limit is 32 or 64).
pub const MAX_DIMS: usize = 16;

/// Element type and shape of one input or one output, e.g. `int32[64,64]`.
/// Bytes are little-endian, C order; the shape's byte count is the size.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DataType {
    pub dtype: Dtype,
    pub shape: Vec<u32>,
}

impl DataType {
    /// Number of elements, or `None` if it does not fit a u64.
    pub fn count(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(u64::from(d)))
    }

    /// Bytes of one value of this type, or `None` if it does not fit a u64.
    pub fn bytes(&self) -> Option<u64> {
        self.count()?.checked_mul(u64::from(self.dtype.size()))
    }

    pub(crate) fn check_shape(&self) -> Result<(), ShapeError> {
        if self.shape.is_empty() || self.shape.len() > MAX_DIMS {
            return Err(ShapeError::Dimensions);
        }
        if self.shape.contains(&0) {
            return Err(ShapeError::ZeroDimension);
        }
        Ok(())
    }
}

/// A shape no value can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("a shape has 1 to {MAX_DIMS} dimensions")]
    Dimensions,
    #[error("a shape has no zero dimension")]
    ZeroDimension,
}

/// Text that is not a [`DataType`]; the message (shown by `corefarm image`)
/// gives the form and the element types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a type like int16[4127] or int32[64,64]: {why} (element types: {})",
    Dtype::ALL.map(Dtype::name).join(", ")
)]
pub struct DataTypeError {
    pub text: String,
    pub why: TypeSyntax,
}

/// What is wrong with a [`DataTypeError`]'s text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TypeSyntax {
    #[error("no [shape]")]
    NoShape,
    #[error("no closing ]")]
    NoClosingBracket,
    #[error("unknown element type")]
    UnknownElement,
    #[error("dimensions are positive integers")]
    NotADimension,
    #[error("{0}")]
    Shape(ShapeError),
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[", self.dtype.name())?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl std::str::FromStr for DataType {
    type Err = DataTypeError;

    /// `dtype[d0,d1,...]`, e.g. `int16[4127]` or `float32[64, 64]`.
    fn from_str(s: &str) -> Result<DataType, DataTypeError> {
        let bad = |why: TypeSyntax| DataTypeError {
            text: s.to_string(),
            why,
        };
        let (name, rest) = s
            .trim()
            .split_once('[')
            .ok_or_else(|| bad(TypeSyntax::NoShape))?;
        let dims = rest
            .strip_suffix(']')
            .ok_or_else(|| bad(TypeSyntax::NoClosingBracket))?;
        let dtype = Dtype::from_name(name.trim()).ok_or_else(|| bad(TypeSyntax::UnknownElement))?;
        let shape = dims
            .split(',')
            .map(|d| d.trim().parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad(TypeSyntax::NotADimension))?;
        let t = DataType { dtype, shape };
        t.check_shape().map_err(|e| bad(TypeSyntax::Shape(e)))?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_types_parse_print_and_count_bytes() {
        let t: DataType = "int32[64, 64]".parse().unwrap();
        assert_eq!((t.dtype, t.shape.as_slice()), (Dtype::Int32, &[64, 64][..]));
        assert_eq!(
            (t.to_string(), t.bytes()),
            ("int32[64,64]".into(), Some(16384))
        );
        let t: DataType = "int16[4127]".parse().unwrap();
        assert_eq!(t.bytes(), Some(8254));
        for bad in [
            "int32",
            "int24[4]",
            "int32[]",
            "int32[0]",
            "int32[4",
            "int32[-1]",
        ] {
            let e = bad.parse::<DataType>().unwrap_err();
            assert_eq!(e.text, bad);
            // What `corefarm image` prints: the text and the element types.
            let shown = e.to_string();
            assert!(shown.contains(bad) && shown.contains("int16"), "{shown}");
        }
        let why = |s: &str| s.parse::<DataType>().unwrap_err().why;
        assert_eq!(why("int32"), TypeSyntax::NoShape);
        assert_eq!(why("int32[4"), TypeSyntax::NoClosingBracket);
        assert_eq!(why("int24[4]"), TypeSyntax::UnknownElement);
        assert_eq!(why("int32[-1]"), TypeSyntax::NotADimension);
        assert_eq!(
            why("int32[0]"),
            TypeSyntax::Shape(ShapeError::ZeroDimension)
        );
        let huge = DataType {
            dtype: Dtype::Float64,
            shape: vec![u32::MAX; 4],
        };
        assert_eq!(huge.bytes(), None);
    }
}

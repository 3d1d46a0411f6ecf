//! Element-wise reductions over little-endian arrays (seed 003: reduce
//! combines at every tree level). Integers wrap (two's complement), so sum
//! and product are associative and every tree gives the same result;
//! floating-point results depend on the combining order, as in MPI.

use corefarm_smp::{DType, ReduceOp};

/// Why two contributions cannot be combined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReduceError {
    #[error("{len} bytes is not a whole number of {dtype} elements")]
    Ragged { len: usize, dtype: DType },
    #[error("contributions of {a} and {b} bytes")]
    Lengths { a: usize, b: usize },
    #[error("{0} is not a reduction")]
    NoOp(ReduceOp),
}

/// Checks that `len` bytes are whole elements of `dtype`.
pub fn check(len: usize, dtype: DType, op: ReduceOp) -> Result<(), ReduceError> {
    if op == ReduceOp::None {
        return Err(ReduceError::NoOp(op));
    }
    if !len.is_multiple_of(dtype.size()) {
        return Err(ReduceError::Ragged { len, dtype });
    }
    Ok(())
}

macro_rules! int_ops {
    ($t:ty, $acc:expr, $other:expr, $op:expr) => {
        combine_with::<$t, { std::mem::size_of::<$t>() }>(
            $acc,
            $other,
            |a, b| match $op {
                ReduceOp::Sum => a.wrapping_add(b),
                ReduceOp::Prod => a.wrapping_mul(b),
                ReduceOp::Min => a.min(b),
                ReduceOp::Max => a.max(b),
                ReduceOp::None => a,
            },
            <$t>::from_le_bytes,
            <$t>::to_le_bytes,
        )
    };
}

macro_rules! float_ops {
    ($t:ty, $acc:expr, $other:expr, $op:expr) => {
        combine_with::<$t, { std::mem::size_of::<$t>() }>(
            $acc,
            $other,
            |a, b| match $op {
                ReduceOp::Sum => a + b,
                ReduceOp::Prod => a * b,
                ReduceOp::Min => a.min(b),
                ReduceOp::Max => a.max(b),
                ReduceOp::None => a,
            },
            <$t>::from_le_bytes,
            <$t>::to_le_bytes,
        )
    };
}

fn combine_with<T: Copy, const N: usize>(
    acc: &mut [u8],
    other: &[u8],
    f: impl Fn(T, T) -> T,
    from: fn([u8; N]) -> T,
    to: fn(T) -> [u8; N],
) {
    for (a, b) in acc.chunks_exact_mut(N).zip(other.chunks_exact(N)) {
        let x = from(a[..].try_into().expect("N bytes"));
        let y = from(b.try_into().expect("N bytes"));
        a.copy_from_slice(&to(f(x, y)));
    }
}

/// `acc[i] = acc[i] op other[i]` for every element.
pub fn combine(
    dtype: DType,
    op: ReduceOp,
    acc: &mut [u8],
    other: &[u8],
) -> Result<(), ReduceError> {
    check(acc.len(), dtype, op)?;
    if acc.len() != other.len() {
        return Err(ReduceError::Lengths {
            a: acc.len(),
            b: other.len(),
        });
    }
    match dtype {
        DType::Bytes | DType::U8 => int_ops!(u8, acc, other, op),
        DType::I8 => int_ops!(i8, acc, other, op),
        DType::I16 => int_ops!(i16, acc, other, op),
        DType::I32 => int_ops!(i32, acc, other, op),
        DType::I64 => int_ops!(i64, acc, other, op),
        DType::U16 => int_ops!(u16, acc, other, op),
        DType::U32 => int_ops!(u32, acc, other, op),
        DType::U64 => int_ops!(u64, acc, other, op),
        DType::F32 => float_ops!(f32, acc, other, op),
        DType::F64 => float_ops!(f64, acc, other, op),
    }
    Ok(())
}

/// Reduces every contribution in rank order: the local reference the tests
/// check collectives against.
pub fn reduce_all(dtype: DType, op: ReduceOp, parts: &[&[u8]]) -> Result<Vec<u8>, ReduceError> {
    let mut acc = parts.first().map(|p| p.to_vec()).unwrap_or_default();
    check(acc.len(), dtype, op)?;
    for p in &parts[1.min(parts.len())..] {
        combine(dtype, op, &mut acc, p)?;
    }
    Ok(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le<T: Copy, const N: usize>(v: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| to(x)).collect()
    }

    #[test]
    fn integer_ops_wrap_and_compare_signed() {
        let a = le(&[100i8, -5, 7], i8::to_le_bytes);
        let b = le(&[100i8, 3, -9], i8::to_le_bytes);
        let sum = reduce_all(DType::I8, ReduceOp::Sum, &[&a, &b]).unwrap();
        assert_eq!(sum, le(&[-56i8, -2, -2], i8::to_le_bytes));
        let min = reduce_all(DType::I8, ReduceOp::Min, &[&a, &b]).unwrap();
        assert_eq!(min, le(&[100i8, -5, -9], i8::to_le_bytes));
        let x = le(&[u64::MAX, 3], u64::to_le_bytes);
        let prod = reduce_all(DType::U64, ReduceOp::Prod, &[&x, &x]).unwrap();
        assert_eq!(prod, le(&[1u64, 9], u64::to_le_bytes));
    }

    #[test]
    fn floats_and_errors() {
        let a = le(&[1.5f64, -2.0], f64::to_le_bytes);
        let b = le(&[0.5f64, 8.0], f64::to_le_bytes);
        let m = reduce_all(DType::F64, ReduceOp::Max, &[&a, &b]).unwrap();
        assert_eq!(m, le(&[1.5f64, 8.0], f64::to_le_bytes));
        let p = reduce_all(
            DType::F32,
            ReduceOp::Prod,
            &[
                &le(&[3.0f32], f32::to_le_bytes),
                &le(&[0.5f32], f32::to_le_bytes),
            ],
        )
        .unwrap();
        assert_eq!(p, le(&[1.5f32], f32::to_le_bytes));
        assert!(matches!(
            combine(DType::I32, ReduceOp::Sum, &mut [0; 6], &[0; 6]),
            Err(ReduceError::Ragged { .. })
        ));
        assert!(matches!(
            combine(DType::I32, ReduceOp::Sum, &mut [0; 8], &[0; 4]),
            Err(ReduceError::Lengths { .. })
        ));
        assert!(reduce_all(DType::U8, ReduceOp::Sum, &[])
            .unwrap()
            .is_empty());
    }
}

//! The demo's workload (seed 000 §4.3): pairs of random 64×64 signed int32
//! matrices, and the software computation every result is checked against.

use rand::{Rng, SeedableRng};

/// Matrix dimension of the reference core.
pub const N: usize = 64;
/// A then B, row-major little-endian int32.
pub const INPUT_SIZE: usize = 2 * N * N * 4;
/// A·B, row-major little-endian int32.
pub const OUTPUT_SIZE: usize = N * N * 4;

/// Input `job` of a run: A and B with full-range entries (so products wrap),
/// derived from (seed, job) so it can be regenerated for checking.
pub fn input_for(seed: u64, job: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ job.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut v = vec![0u8; INPUT_SIZE];
    rng.fill(&mut v[..]);
    v
}

fn word(b: &[u8], i: usize) -> i32 {
    i32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

/// The software reference: naive A·B with wrapping i32 arithmetic, written
/// independently of the C++ and Verilog cores it checks.
pub fn reference(input: &[u8]) -> Vec<u8> {
    assert_eq!(input.len(), INPUT_SIZE);
    let a: Vec<i32> = (0..N * N).map(|i| word(input, i)).collect();
    let b: Vec<i32> = (0..N * N).map(|i| word(input, N * N + i)).collect();
    let mut c = vec![0i32; N * N];
    // i-k-j order: the same sums as the textbook i-j-k loop (addition mod
    // 2^32 is associative), but the inner loop vectorises.
    for i in 0..N {
        for k in 0..N {
            let aik = a[i * N + k];
            let (row, brow) = (&mut c[i * N..(i + 1) * N], &b[k * N..(k + 1) * N]);
            for (cij, bkj) in row.iter_mut().zip(brow) {
                *cij = cij.wrapping_add(aik.wrapping_mul(*bkj));
            }
        }
    }
    c.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// How a core's output differs from the reference (the demo reports the
/// first job's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("output is {0} bytes, expected {OUTPUT_SIZE}")]
    Length(usize),
    /// The first differing element of the product.
    #[error("C[{row}][{col}] = {got} but the software computation gives {want}")]
    Element {
        row: usize,
        col: usize,
        got: i32,
        want: i32,
    },
}

/// Compares a core's output with the reference; the error names the first
/// differing element.
pub fn check(input: &[u8], output: &[u8]) -> Result<(), Mismatch> {
    if output.len() != OUTPUT_SIZE {
        return Err(Mismatch::Length(output.len()));
    }
    let want = reference(input);
    match (0..N * N).find(|&i| word(output, i) != word(&want, i)) {
        None => Ok(()),
        Some(i) => Err(Mismatch::Element {
            row: i / N,
            col: i % N,
            got: word(output, i),
            want: word(&want, i),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrices(a: impl Fn(usize, usize) -> i32, b: impl Fn(usize, usize) -> i32) -> Vec<u8> {
        let mut v = Vec::with_capacity(INPUT_SIZE);
        for f in [&a as &dyn Fn(usize, usize) -> i32, &b] {
            for i in 0..N {
                for j in 0..N {
                    v.extend_from_slice(&f(i, j).to_le_bytes());
                }
            }
        }
        v
    }

    #[test]
    fn reference_multiplies_with_wrapping() {
        // Identity times B is B.
        let input = matrices(|i, j| (i == j) as i32, |i, j| (i * 1000 + j) as i32 - 7);
        let out = reference(&input);
        for i in 0..N {
            for j in 0..N {
                assert_eq!(word(&out, i * N + j), (i * 1000 + j) as i32 - 7);
            }
        }
        // A row of i32::MAX times a column of 2s: 64 · 2 · MAX wraps to -128.
        let input = matrices(|_, _| i32::MAX, |_, _| 2);
        assert_eq!(
            word(&reference(&input), 0),
            (64i64 * 2 * i32::MAX as i64) as i32
        );
        assert_eq!(word(&reference(&input), 0), -128);
        // A general entry against a direct i64 sum reduced mod 2^32.
        let input = input_for(7, 3);
        let out = reference(&input);
        let (i, j) = (5, 61);
        let sum: i128 = (0..N)
            .map(|k| word(&input, i * N + k) as i128 * word(&input, N * N + k * N + j) as i128)
            .sum();
        assert_eq!(word(&out, i * N + j), sum as i32);
    }

    #[test]
    fn check_names_the_first_wrong_element() {
        let input = input_for(1, 0);
        let mut out = reference(&input);
        assert_eq!(check(&input, &out), Ok(()));
        out[4 * (2 * N + 9)] ^= 1;
        out[4 * (40 * N)] ^= 0x80;
        let e = check(&input, &out).unwrap_err();
        assert!(
            matches!(e, Mismatch::Element { row: 2, col: 9, got, want } if got == want ^ 1),
            "{e}"
        );
        assert_eq!(check(&input, &out[..100]), Err(Mismatch::Length(100)));
    }

    #[test]
    fn inputs_are_reproducible_and_distinct() {
        assert_eq!(input_for(42, 9), input_for(42, 9));
        assert_ne!(input_for(42, 9), input_for(42, 10));
        assert_ne!(input_for(42, 9), input_for(43, 9));
        assert_eq!(input_for(0, 0).len(), INPUT_SIZE);
    }
}

//! Weighted linear least squares with non-negative coefficients, small
//! enough to solve by normal equations (a handful of parameters, tens to
//! hundreds of rows).
//!
//! Timing parameters are costs, so a negative coefficient is not physical:
//! it only means two features explain the same thing. The active-set loop
//! below fixes the most negative coefficient at zero and refits, the simple
//! form of Lawson–Hanson NNLS that suffices at this size.

const RIDGE: f64 = 1e-9;

/// Minimises Σ w_i² (x_i·β − y_i)² over β ≥ 0. Columns that are zero in every
/// row get a zero coefficient; columns the rows cannot separate share the
/// weight. `None` when there are no rows (or they are ragged).
pub fn nnls(rows: &[Vec<f64>], y: &[f64], w: &[f64]) -> Option<Vec<f64>> {
    let k = rows.first()?.len();
    if rows.len() != y.len() || rows.len() != w.len() || rows.iter().any(|r| r.len() != k) {
        return None;
    }
    let mut active: Vec<bool> = (0..k).map(|j| rows.iter().any(|r| r[j] != 0.0)).collect();
    loop {
        let cols: Vec<usize> = (0..k).filter(|&j| active[j]).collect();
        if cols.is_empty() {
            return None;
        }
        let beta = solve_normal(rows, y, w, &cols)?;
        let worst = beta
            .iter()
            .enumerate()
            .filter(|(_, &b)| b < 0.0)
            .min_by(|a, b| a.1.total_cmp(b.1));
        match worst {
            Some((i, _)) => active[cols[i]] = false,
            None => {
                let mut out = vec![0.0; k];
                for (i, &j) in cols.iter().enumerate() {
                    out[j] = beta[i];
                }
                return Some(out);
            }
        }
    }
}

/// Solves (XᵀW²X) β = XᵀW²y on the columns `cols` by Gaussian elimination
/// with partial pivoting. Columns are scaled to unit norm first, since the
/// features span many orders of magnitude (stages vs bytes).
fn solve_normal(rows: &[Vec<f64>], y: &[f64], w: &[f64], cols: &[usize]) -> Option<Vec<f64>> {
    let m = cols.len();
    let scale: Vec<f64> = cols
        .iter()
        .map(|&j| {
            let s = rows
                .iter()
                .zip(w)
                .map(|(r, w)| (r[j] * w).powi(2))
                .sum::<f64>()
                .sqrt();
            if s > 0.0 {
                s
            } else {
                1.0
            }
        })
        .collect();
    let mut a = vec![vec![0.0; m + 1]; m];
    for ((r, &t), &wi) in rows.iter().zip(y).zip(w) {
        let x: Vec<f64> = cols
            .iter()
            .zip(&scale)
            .map(|(&j, s)| r[j] * wi / s)
            .collect();
        for i in 0..m {
            for l in 0..m {
                a[i][l] += x[i] * x[l];
            }
            a[i][m] += x[i] * t * wi;
        }
    }
    // A faint ridge (on unit-norm columns) makes features that the samples
    // cannot tell apart share their weight instead of making the system
    // singular: a grid without, say, reduces still fits what it measured.
    for (i, row) in a.iter_mut().enumerate() {
        row[i] += RIDGE;
    }
    for c in 0..m {
        let p = (c..m).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        if a[p][c].abs() < RIDGE / 2.0 {
            return None;
        }
        a.swap(c, p);
        let pivot = a[c].clone();
        for (i, row) in a.iter_mut().enumerate() {
            if i != c {
                let f = row[c] / pivot[c];
                for (x, p) in row[c..].iter_mut().zip(&pivot[c..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..m).map(|i| a[i][m] / a[i][i] / scale[i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_exact_coefficients() {
        // y = 2 + 3a + 0.5b on a grid; weights do not matter for an exact fit.
        let mut rows = Vec::new();
        let mut y = Vec::new();
        for a in 0..5 {
            for b in 0..4 {
                let (a, b) = (f64::from(a), f64::from(b) * 1e6);
                rows.push(vec![1.0, a, b, 0.0]);
                y.push(2.0 + 3.0 * a + 0.5 * b);
            }
        }
        let w: Vec<f64> = y.iter().map(|t| 1.0 / t).collect();
        let b = nnls(&rows, &y, &w).unwrap();
        assert!(
            (b[0] - 2.0).abs() < 1e-6 && (b[1] - 3.0).abs() < 1e-6,
            "{b:?}"
        );
        assert!((b[2] - 0.5).abs() < 1e-9 && b[3] == 0.0, "{b:?}");
    }

    #[test]
    fn negative_coefficients_are_clamped() {
        // y = 1 + x exactly, but a second feature anti-correlated with noise
        // would get a negative weight; it must come out as zero.
        let rows = vec![
            vec![1.0, 1.0, 1.0],
            vec![1.0, 2.0, 0.5],
            vec![1.0, 3.0, 0.2],
            vec![1.0, 4.0, 0.1],
        ];
        let y = vec![1.9, 3.05, 4.0, 5.0];
        let w = vec![1.0; 4];
        let free = solve_normal(&rows, &y, &w, &[0, 1, 2]).unwrap();
        assert!(
            free[2] < 0.0,
            "the unconstrained fit must want a negative weight: {free:?}"
        );
        let b = nnls(&rows, &y, &w).unwrap();
        assert!(b.iter().all(|&c| c >= 0.0), "{b:?}");
        assert_eq!(b[2], 0.0);
    }

    #[test]
    fn degenerate_inputs() {
        assert!(nnls(&[], &[], &[]).is_none());
        // Two identical columns: they share the weight and still fit.
        let rows = vec![vec![1.0, 1.0], vec![2.0, 2.0]];
        let b = nnls(&rows, &[1.0, 2.0], &[1.0, 1.0]).unwrap();
        assert!(
            (b[0] - 0.5).abs() < 1e-6 && (b[1] - 0.5).abs() < 1e-6,
            "{b:?}"
        );
        // Ragged input.
        assert!(nnls(&[vec![1.0], vec![1.0, 2.0]], &[1.0, 2.0], &[1.0, 1.0]).is_none());
    }
}

//! Dense symmetric positive (semi-)definite solve for the N × N Newton system (N = classes, a few
//! hundred at most): Cholesky with a pivot floor, so a singular direction yields a long step that
//! the line search then shortens instead of a NaN.

/// Solves `h · x = rhs` in place of `rhs`; `h` is row-major n × n, symmetric, and is overwritten
/// by its Cholesky factor. Pivots below `floor_rel` × the original diagonal (or an absolute
/// 1e-300) are replaced by that floor.
pub(crate) fn cholesky_solve(h: &mut [f64], rhs: &mut [f64], n: usize, floor_rel: f64) {
    debug_assert_eq!(h.len(), n * n);
    debug_assert_eq!(rhs.len(), n);
    for i in 0..n {
        let original = h[i * n + i];
        let (done, rest) = h.split_at_mut(i * n);
        let row_i = &mut rest[..n];
        for jc in 0..i {
            let row_j = &done[jc * n..jc * n + n];
            let dot: f64 = row_i[..jc].iter().zip(&row_j[..jc]).map(|(a, b)| a * b).sum();
            row_i[jc] = (row_i[jc] - dot) / row_j[jc];
        }
        let sq: f64 = row_i[..i].iter().map(|v| v * v).sum();
        let pivot = row_i[i] - sq;
        let floor = (original.abs() * floor_rel).max(1e-300);
        row_i[i] = pivot.max(floor).sqrt();
    }
    // Forward substitution L z = rhs, then back substitution Lᵀ x = z.
    for i in 0..n {
        let row = &h[i * n..i * n + n];
        let dot: f64 = row[..i].iter().zip(&rhs[..i]).map(|(a, b)| a * b).sum();
        rhs[i] = (rhs[i] - dot) / row[i];
    }
    for i in (0..n).rev() {
        let mut acc = rhs[i];
        for k in i + 1..n {
            acc -= h[k * n + i] * rhs[k];
        }
        rhs[i] = acc / h[i * n + i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solves_small_spd_system() {
        let mut h = vec![4.0, 1.0, 0.0, 1.0, 3.0, 1.0, 0.0, 1.0, 2.0];
        let orig = h.clone();
        let mut x = vec![1.0, 2.0, 3.0];
        cholesky_solve(&mut h, &mut x, 3, 1e-12);
        for i in 0..3 {
            let r: f64 = (0..3).map(|j| orig[i * 3 + j] * x[j]).sum();
            assert!((r - [1.0, 2.0, 3.0][i]).abs() < 1e-12);
        }
    }
}

//! Dense symmetric positive (semi-)definite solve for the N × N Newton system (N = classes, a few
//! hundred at most): Cholesky with a pivot floor, so a singular direction yields a long step that
//! the line search then shortens instead of a NaN.

/// Solves `h · x = rhs` in place of `rhs`; `h` is row-major n × n and symmetric (it is used as
/// scratch). Pivots below `floor_rel` × the original diagonal (or an absolute 1e-300) are
/// replaced by that floor.
///
/// The Newton matrix couples only classes that share engines (a region's front ends, mostly), so
/// it is far from dense: the rows are reordered by reverse Cuthill–McKee and the factor is
/// computed within the envelope of the reordered matrix (entries left of a row's first non-zero
/// stay zero in the factor), which skips most of the n³/6 work of a dense factorisation.
pub(crate) fn cholesky_solve(h: &mut [f64], rhs: &mut [f64], n: usize, floor_rel: f64) {
    debug_assert_eq!(h.len(), n * n);
    debug_assert_eq!(rhs.len(), n);
    if n <= DENSE_UP_TO {
        return dense_cholesky_solve(h, rhs, n, floor_rel);
    }
    let perm = reverse_cuthill_mckee(h, n);
    // a = Pᵀ h P, b = Pᵀ rhs: row i of `a` is original row perm[i].
    let mut a = vec![0.0; n * n];
    let mut first = vec![0usize; n];
    for i in 0..n {
        let src = &h[perm[i] * n..perm[i] * n + n];
        let row = &mut a[i * n..i * n + n];
        for (j, &pj) in perm.iter().enumerate() {
            row[j] = src[pj];
        }
        first[i] = row[..i].iter().position(|&v| v != 0.0).unwrap_or(i);
    }
    let mut b: Vec<f64> = perm.iter().map(|&p| rhs[p]).collect();
    for i in 0..n {
        let original = a[i * n + i];
        let (done, rest) = a.split_at_mut(i * n);
        let row_i = &mut rest[..n];
        let fi = first[i];
        for jc in fi..i {
            let row_j = &done[jc * n..jc * n + n];
            let lo = fi.max(first[jc]);
            let d = if lo < jc { dot(&row_i[lo..jc], &row_j[lo..jc]) } else { 0.0 };
            row_i[jc] = (row_i[jc] - d) / row_j[jc];
        }
        let sq = dot(&row_i[fi..i], &row_i[fi..i]);
        let pivot = row_i[i] - sq;
        let floor = (original.abs() * floor_rel).max(1e-300);
        row_i[i] = pivot.max(floor).sqrt();
    }
    // Forward substitution L z = b, then back substitution Lᵀ x = z.
    for i in 0..n {
        let row = &a[i * n..i * n + n];
        let fi = first[i];
        let d = dot(&row[fi..i], &b[fi..i]);
        b[i] = (b[i] - d) / row[i];
    }
    for i in (0..n).rev() {
        let bi = b[i] / a[i * n + i];
        b[i] = bi;
        // Subtract column i of Lᵀ's contribution from the rows above (within their envelope).
        if bi != 0.0 {
            let row = &a[i * n..i * n + n];
            for k in first[i]..i {
                b[k] -= row[k] * bi;
            }
        }
    }
    for (i, &p) in perm.iter().enumerate() {
        rhs[p] = b[i];
    }
}

/// Below this size the reordering does not pay; the plain dense factorisation is used.
const DENSE_UP_TO: usize = 48;

/// The dense factorisation in the natural order (sequential sums), overwriting `h` by its factor.
fn dense_cholesky_solve(h: &mut [f64], rhs: &mut [f64], n: usize, floor_rel: f64) {
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

/// Dot product with four independent partial sums (the sequential sum is latency-bound).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let (mut s0, mut s1, mut s2, mut s3) = (0.0, 0.0, 0.0, 0.0);
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        s0 += x[0] * y[0];
        s1 += x[1] * y[1];
        s2 += x[2] * y[2];
        s3 += x[3] * y[3];
    }
    let mut rest = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        rest += x * y;
    }
    (s0 + s1) + (s2 + s3) + rest
}

/// Reverse Cuthill–McKee ordering of the non-zero pattern of symmetric `h`: breadth-first from a
/// lowest-degree vertex of each component, neighbours by ascending degree (ties by index), then
/// reversed. Returns `perm` with new position i holding original row perm[i].
fn reverse_cuthill_mckee(h: &[f64], n: usize) -> Vec<usize> {
    let mut adjacency: Vec<Vec<usize>> = vec![Vec::new(); n];
    for i in 0..n {
        for j in 0..i {
            if h[i * n + j] != 0.0 || h[j * n + i] != 0.0 {
                adjacency[i].push(j);
                adjacency[j].push(i);
            }
        }
    }
    let degree: Vec<usize> = adjacency.iter().map(Vec::len).collect();
    for list in &mut adjacency {
        list.sort_by_key(|&v| (degree[v], v));
    }
    let mut by_degree: Vec<usize> = (0..n).collect();
    by_degree.sort_by_key(|&v| (degree[v], v));
    let mut visited = vec![false; n];
    let mut order = Vec::with_capacity(n);
    for &root in &by_degree {
        if visited[root] {
            continue;
        }
        visited[root] = true;
        let mut head = order.len();
        order.push(root);
        while head < order.len() {
            let v = order[head];
            head += 1;
            for &w in &adjacency[v] {
                if !visited[w] {
                    visited[w] = true;
                    order.push(w);
                }
            }
        }
    }
    order.reverse();
    order
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

    #[test]
    fn solves_sparse_systems_in_any_order() {
        // Two blocks interleaved (0, 2, 4 | 1, 3), plus isolated rows: the reordering must
        // not change the answer.
        let n = 60;
        let mut h = vec![0.0; n * n];
        let mut set = |i: usize, j: usize, v: f64| {
            h[i * n + j] = v;
            h[j * n + i] = v;
        };
        for i in 0..n {
            set(i, i, [4.0, 5.0, 6.0, 3.0, 7.0, 2.0][i % 6]);
        }
        for i in 6..n - 7 {
            set(i, i + 7, 0.3);
        }
        set(0, 2, 1.0);
        set(2, 4, -2.0);
        set(1, 3, 0.5);
        let orig = h.clone();
        let rhs: Vec<f64> = (0..n).map(|i| (i as f64 * 0.7).sin()).collect();
        let mut x = rhs.clone();
        cholesky_solve(&mut h, &mut x, n, 1e-12);
        for i in 0..n {
            let r: f64 = (0..n).map(|j| orig[i * n + j] * x[j]).sum();
            assert!((r - rhs[i]).abs() < 1e-12, "row {i}: {r}");
        }
    }
}

//! Dense symmetric positive (semi-)definite solve for the N × N Newton system (N = classes, a few
//! hundred at most): Cholesky with a pivot floor, so a singular direction yields a long step that
//! the line search then shortens instead of a NaN.

/// [`Cholesky::solve`] with buffers of its own (tests).
#[cfg(test)]
pub(crate) fn cholesky_solve(h: &mut [f64], rhs: &mut [f64], n: usize, floor_rel: f64) {
    Cholesky::default().solve(h, rhs, n, floor_rel);
}

/// Reusable buffers of [`Cholesky::solve`]: a Newton loop factors one matrix per step, and
/// allocating (and zeroing) an n × n copy each time was a fair part of the coarse problem's cost.
#[derive(Default)]
pub(crate) struct Cholesky {
    /// The reordered matrix, then its factor; only each row's envelope is written or read.
    a: Vec<f64>,
    first: Vec<usize>,
    b: Vec<f64>,
    perm: Vec<usize>,
    position: Vec<usize>,
    /// The non-zero pattern (CSR, without the diagonal) and the breadth-first scratch.
    adjacency_start: Vec<usize>,
    adjacency: Vec<usize>,
    /// The pattern as first filled (by index), transposed into `adjacency` by degree.
    unsorted: Vec<usize>,
    /// The non-zero pairs (i, j), j < i, of the matrix's lower triangle.
    pairs: Vec<(usize, usize)>,
    degree: Vec<usize>,
    visited: Vec<bool>,
    by_degree: Vec<usize>,
}

impl Cholesky {
    /// Solves `h · x = rhs` in place of `rhs`; `h` is row-major n × n and symmetric (it is used
    /// as scratch). Pivots below `floor_rel` × the original diagonal (or an absolute 1e-300) are
    /// replaced by that floor.
    ///
    /// The Newton matrix couples only classes that share engines (a region's front ends,
    /// mostly), so it is far from dense: the rows are reordered by reverse Cuthill–McKee and the
    /// factor is computed within the envelope of the reordered matrix (entries left of a row's
    /// first non-zero stay zero in the factor), which skips most of the n³/6 work of a dense
    /// factorisation.
    pub fn solve(&mut self, h: &mut [f64], rhs: &mut [f64], n: usize, floor_rel: f64) {
        debug_assert_eq!(h.len(), n * n);
        debug_assert_eq!(rhs.len(), n);
        if n <= DENSE_UP_TO {
            return dense_cholesky_solve(h, rhs, n, floor_rel);
        }
        debug_assert!(
            (0..n).all(|i| (0..i).all(|j| h[i * n + j].to_bits() == h[j * n + i].to_bits())),
            "the matrix is not symmetric"
        );
        self.reverse_cuthill_mckee(h, n);
        let Cholesky { a, first, b, perm, position, adjacency_start, adjacency, .. } = self;
        // a = Pᵀ h P, b = Pᵀ rhs: row i of `a` is original row perm[i]. Only the envelope of each
        // row (from its first non-zero left of the diagonal) is filled: nothing reads the rest.
        position.clear();
        position.resize(n, 0);
        for (i, &p) in perm.iter().enumerate() {
            position[p] = i;
        }
        a.resize(n * n, 0.0);
        first.clear();
        for i in 0..n {
            let p = perm[i];
            let src = &h[p * n..p * n + n];
            let neighbours = &adjacency[adjacency_start[p]..adjacency_start[p + 1]];
            let fi = neighbours
                .iter()
                .filter(|&&w| position[w] < i && src[w] != 0.0)
                .map(|&w| position[w])
                .min()
                .unwrap_or(i);
            let row = &mut a[i * n..i * n + n];
            row[fi..i].fill(0.0);
            for &w in neighbours {
                let j = position[w];
                if j >= fi && j < i {
                    row[j] = src[w];
                }
            }
            row[i] = src[p];
            first.push(fi);
        }
        b.clear();
        b.extend(perm.iter().map(|&p| rhs[p]));
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

    /// Zeroes `h`, the n × n matrix last passed to `solve` (or any other of that size): the sparse
    /// path leaves it as it was, so only its diagonal and the pattern it found there can be
    /// non-zero. The Newton loop accumulates the next matrix into the same buffer, and clearing
    /// all n² entries each step was 2 % of a 200 × 20,000 cold solve (n = 200 groups in its coarse
    /// problem).
    pub fn clear(&self, h: &mut [f64], n: usize) {
        debug_assert_eq!(h.len(), n * n);
        if n <= DENSE_UP_TO || self.adjacency_start.len() != n + 1 {
            h.fill(0.0);
            return;
        }
        for i in 0..n {
            let row = &mut h[i * n..i * n + n];
            row[i] = 0.0;
            for &j in &self.adjacency[self.adjacency_start[i]..self.adjacency_start[i + 1]] {
                row[j] = 0.0;
            }
        }
    }

    /// Reverse Cuthill–McKee ordering of the non-zero pattern of symmetric `h` into `perm`:
    /// breadth-first from a lowest-degree vertex of each component, neighbours by ascending
    /// degree (ties by index), then reversed; new position i holds original row `perm[i]`. The
    /// pattern is kept in `adjacency` (CSR) for the reordering.
    fn reverse_cuthill_mckee(&mut self, h: &[f64], n: usize) {
        let Cholesky {
            adjacency_start, adjacency, unsorted, pairs, degree, visited, by_degree, perm, ..
        } = self;
        degree.clear();
        degree.resize(n, 0);
        // `h` is symmetric, so its lower triangle (read along rows) has the whole pattern; one
        // scan of it lists the non-zero pairs (row, then column, ascending).
        pairs.clear();
        for i in 0..n {
            for (j, &v) in h[i * n..i * n + i].iter().enumerate() {
                if v != 0.0 {
                    degree[i] += 1;
                    degree[j] += 1;
                    pairs.push((i, j));
                }
            }
        }
        adjacency_start.clear();
        adjacency_start.push(0);
        for i in 0..n {
            adjacency_start.push(adjacency_start[i] + degree[i]);
        }
        unsorted.clear();
        unsorted.resize(adjacency_start[n], 0);
        // Fill: `perm` is the per-row write cursor here.
        perm.clear();
        perm.extend_from_slice(&adjacency_start[..n]);
        for &(i, j) in pairs.iter() {
            unsorted[perm[i]] = j;
            perm[i] += 1;
            unsorted[perm[j]] = i;
            perm[j] += 1;
        }
        // Keys (degree, index) are distinct, so an unstable sort gives the one order.
        by_degree.clear();
        by_degree.extend(0..n);
        by_degree.sort_unstable_by_key(|&v| (degree[v], v));
        // Each row's neighbours by ascending (degree, index), without sorting them: the pattern is
        // symmetric, so walking the vertices in that order and appending each to its neighbours'
        // rows lists every row in that order (sorting the rows was 2 % of a large cold solve).
        adjacency.clear();
        adjacency.resize(adjacency_start[n], 0);
        perm.clear();
        perm.extend_from_slice(&adjacency_start[..n]);
        for &v in by_degree.iter() {
            for &w in &unsorted[adjacency_start[v]..adjacency_start[v + 1]] {
                adjacency[perm[w]] = v;
                perm[w] += 1;
            }
        }
        visited.clear();
        visited.resize(n, false);
        perm.clear();
        for &root in by_degree.iter() {
            if visited[root] {
                continue;
            }
            visited[root] = true;
            let mut head = perm.len();
            perm.push(root);
            while head < perm.len() {
                let v = perm[head];
                head += 1;
                for &w in &adjacency[adjacency_start[v]..adjacency_start[v + 1]] {
                    if !visited[w] {
                        visited[w] = true;
                        perm.push(w);
                    }
                }
            }
        }
        perm.reverse();
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

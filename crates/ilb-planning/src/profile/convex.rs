//! Projection of a piecewise-linear curve onto convex non-decreasing shapes: the weighted
//! least-squares closest values z at the same loads whose segment slopes are non-negative
//! and non-decreasing.
//!
//! Math: write z_i = z₀ + d₁·(x_i − x₀) + Σ_{k≥2} d_k·max(0, x_i − x_{k−1}). The slope of
//! segment j is d₁ + … + d_{j+1}, so "slopes ≥ 0 and non-decreasing" is exactly "d ≥ 0", and
//! every such curve has this form. Minimising Σ w_i (z_i − y_i)² is then a non-negative least
//! squares problem in d (after eliminating the free intercept z₀ by weighted centring), which
//! the Lawson–Hanson active-set method solves exactly in finitely many steps. Each step is a
//! small Householder least-squares solve, so a 32-knot curve takes well under a millisecond.

/// Projects `points` (load, latency) onto convex non-decreasing curves, all weights equal.
/// See [`project_convex_increasing_weighted`].
pub fn project_convex_increasing(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let weighted: Vec<(f64, f64, f64)> = points.iter().map(|&(x, y)| (x, y, 1.0)).collect();
    project_convex_increasing_weighted(&weighted)
}

/// Projects weighted points (load, latency, weight) onto convex non-decreasing curves.
/// Points with a non-finite coordinate or a non-positive weight are dropped; points with
/// equal loads are merged (weighted mean). Returns the knots sorted by load with the
/// projected latencies. Never panics.
pub fn project_convex_increasing_weighted(points: &[(f64, f64, f64)]) -> Vec<(f64, f64)> {
    let mut clean: Vec<(f64, f64, f64)> = points
        .iter()
        .copied()
        .filter(|(x, y, w)| x.is_finite() && y.is_finite() && w.is_finite() && *w > 0.0)
        .collect();
    clean.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut merged: Vec<(f64, f64, f64)> = Vec::with_capacity(clean.len());
    for (x, y, w) in clean {
        match merged.last_mut() {
            Some(last) if last.0 == x => {
                last.1 = (last.1 * last.2 + y * w) / (last.2 + w);
                last.2 += w;
            }
            _ => merged.push((x, y, w)),
        }
    }
    let n = merged.len();
    if n <= 1 {
        return merged.into_iter().map(|(x, y, _)| (x, y)).collect();
    }
    let xs: Vec<f64> = merged.iter().map(|p| p.0).collect();
    let ys: Vec<f64> = merged.iter().map(|p| p.1).collect();
    let ws: Vec<f64> = merged.iter().map(|p| p.2).collect();
    let total_weight: f64 = ws.iter().sum();
    let weighted_mean =
        |values: &[f64]| values.iter().zip(&ws).map(|(v, w)| v * w).sum::<f64>() / total_weight;

    // Basis columns φ_k evaluated at the knots, k = 1..n−1.
    let basis: Vec<Vec<f64>> = (0..n - 1)
        .map(|k| {
            let hinge = xs[k];
            xs.iter().map(|&x| (x - hinge).max(0.0)).collect()
        })
        .collect();
    let basis_means: Vec<f64> = basis.iter().map(|column| weighted_mean(column)).collect();
    let mean_y = weighted_mean(&ys);
    let sqrt_w: Vec<f64> = ws.iter().map(|w| w.sqrt()).collect();
    let centred: Vec<Vec<f64>> = basis
        .iter()
        .zip(&basis_means)
        .map(|(column, mean)| column.iter().zip(&sqrt_w).map(|(v, s)| (v - mean) * s).collect())
        .collect();
    let target: Vec<f64> = ys.iter().zip(&sqrt_w).map(|(y, s)| (y - mean_y) * s).collect();

    let increments = nnls(&centred, &target);
    let intercept = mean_y - increments.iter().zip(&basis_means).map(|(d, m)| d * m).sum::<f64>();
    (0..n)
        .map(|i| {
            let z = intercept + increments.iter().zip(&basis).map(|(d, column)| d * column[i]).sum::<f64>();
            (xs[i], z)
        })
        .collect()
}

/// Lawson–Hanson non-negative least squares: min ‖A d − b‖ subject to d ≥ 0, with A given
/// as columns. Iterations are capped, so degenerate input ends with a feasible (d ≥ 0) if
/// not perfectly optimal answer rather than looping.
fn nnls(columns: &[Vec<f64>], target: &[f64]) -> Vec<f64> {
    let m = columns.len();
    let mut solution = vec![0.0; m];
    let mut passive = vec![false; m];
    let scale = columns.iter().flatten().fold(0.0_f64, |acc, v| acc.max(v.abs()))
        * target.iter().fold(0.0_f64, |acc, v| acc.max(v.abs()))
        * target.len() as f64;
    let tolerance = 1e-12 * scale.max(f64::MIN_POSITIVE);
    for _ in 0..3 * m + 3 {
        let residual = residual(columns, &solution, target);
        let gradient: Vec<f64> =
            columns.iter().map(|column| column.iter().zip(&residual).map(|(a, r)| a * r).sum()).collect();
        let entering = (0..m)
            .filter(|&j| !passive[j] && gradient[j] > tolerance)
            .max_by(|&a, &b| gradient[a].total_cmp(&gradient[b]));
        let Some(entering) = entering else { break };
        passive[entering] = true;
        for _ in 0..3 * m + 3 {
            let active: Vec<usize> = (0..m).filter(|&j| passive[j]).collect();
            let Some(unconstrained) = least_squares(columns, &active, target) else {
                passive[entering] = false;
                break;
            };
            if unconstrained.iter().all(|&value| value > 0.0) {
                for (&j, &value) in active.iter().zip(&unconstrained) {
                    solution[j] = value;
                }
                break;
            }
            // Step from the feasible point towards the unconstrained one until the first
            // coefficient hits zero, then drop the coefficients that reached zero.
            let mut step = 1.0_f64;
            let mut blocking = None;
            for (&j, &value) in active.iter().zip(&unconstrained) {
                if value <= 0.0 {
                    let denominator = solution[j] - value;
                    let candidate = if denominator > 0.0 { solution[j] / denominator } else { 0.0 };
                    if candidate < step {
                        step = candidate;
                        blocking = Some(j);
                    }
                }
            }
            for (&j, &value) in active.iter().zip(&unconstrained) {
                solution[j] += step * (value - solution[j]);
                if Some(j) == blocking || solution[j] <= 0.0 {
                    solution[j] = 0.0;
                    passive[j] = false;
                }
            }
            if !passive.iter().any(|&p| p) {
                break;
            }
        }
    }
    for value in &mut solution {
        *value = value.max(0.0);
    }
    solution
}

fn residual(columns: &[Vec<f64>], solution: &[f64], target: &[f64]) -> Vec<f64> {
    let mut residual = target.to_vec();
    for (column, &coefficient) in columns.iter().zip(solution) {
        if coefficient != 0.0 {
            for (r, a) in residual.iter_mut().zip(column) {
                *r -= coefficient * a;
            }
        }
    }
    residual
}

/// Least squares on the columns listed in `active`, by Householder QR. `None` if the
/// columns are (numerically) linearly dependent.
fn least_squares(columns: &[Vec<f64>], active: &[usize], target: &[f64]) -> Option<Vec<f64>> {
    let rows = target.len();
    let p = active.len();
    if p > rows {
        return None;
    }
    let mut matrix: Vec<Vec<f64>> = active.iter().map(|&j| columns[j].clone()).collect();
    let mut rhs = target.to_vec();
    let norm_scale = matrix.iter().flatten().fold(0.0_f64, |acc, v| acc.max(v.abs()));
    for k in 0..p {
        let norm = matrix[k][k..].iter().map(|v| v * v).sum::<f64>().sqrt();
        if norm <= 1e-13 * norm_scale.max(f64::MIN_POSITIVE) {
            return None;
        }
        let alpha = if matrix[k][k] > 0.0 { -norm } else { norm };
        let mut householder: Vec<f64> = matrix[k][k..].to_vec();
        householder[0] -= alpha;
        let h_norm_sq: f64 = householder.iter().map(|v| v * v).sum();
        if h_norm_sq > 0.0 {
            for column in matrix.iter_mut().skip(k) {
                reflect(&householder, h_norm_sq, &mut column[k..]);
            }
            reflect(&householder, h_norm_sq, &mut rhs[k..]);
        }
    }
    let mut solution = vec![0.0; p];
    for k in (0..p).rev() {
        let tail: f64 = ((k + 1)..p).map(|j| matrix[j][k] * solution[j]).sum();
        solution[k] = (rhs[k] - tail) / matrix[k][k];
    }
    solution.iter().all(|v| v.is_finite()).then_some(solution)
}

fn reflect(householder: &[f64], h_norm_sq: f64, vector: &mut [f64]) {
    let dot: f64 = householder.iter().zip(vector.iter()).map(|(h, v)| h * v).sum();
    let factor = 2.0 * dot / h_norm_sq;
    for (v, h) in vector.iter_mut().zip(householder) {
        *v -= factor * h;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decreasing_pair_becomes_flat_at_the_mean() {
        let out = project_convex_increasing(&[(0.0, 10.0), (1.0, 6.0)]);
        assert_eq!(out.len(), 2);
        assert!((out[0].1 - 8.0).abs() < 1e-9 && (out[1].1 - 8.0).abs() < 1e-9);
    }

    #[test]
    fn concave_bump_is_flattened() {
        // A concave bump projects onto a line through the weighted data.
        let out = project_convex_increasing(&[(0.0, 0.0), (1.0, 2.0), (2.0, 2.0)]);
        let slopes: Vec<f64> = out.windows(2).map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0)).collect();
        assert!(slopes[0] >= -1e-9 && slopes[1] >= slopes[0] - 1e-9, "{out:?}");
        // Least-squares line through the points: slope 1, intercept 1/3.
        assert!((out[0].1 - 1.0 / 3.0).abs() < 1e-9, "{out:?}");
    }

    #[test]
    fn duplicates_and_non_finite_points_are_handled() {
        let out = project_convex_increasing(&[(1.0, 2.0), (f64::NAN, 1.0), (1.0, 4.0), (0.0, 1.0)]);
        assert_eq!(out.len(), 2);
        assert!((out[0].1 - 1.0).abs() < 1e-9 && (out[1].1 - 3.0).abs() < 1e-9);
        assert!(project_convex_increasing(&[]).is_empty());
    }

    #[test]
    fn least_squares_solves_square_system() {
        let columns = vec![vec![1.0, 0.0], vec![1.0, 1.0]];
        let x = least_squares(&columns, &[0, 1], &[3.0, 2.0]).unwrap();
        assert!((x[0] - 1.0).abs() < 1e-12 && (x[1] - 2.0).abs() < 1e-12);
    }
}

//! Projection of a piecewise-linear curve onto convex non-decreasing shapes: the weighted
//! least-squares closest values z at the same loads whose segment slopes are non-negative
//! and non-decreasing.
//!
//! Math: write z_i = z₀ + Σ_{j<n−1} d_j·max(0, x_i − x_j), d_j being how much the slope grows
//! at knot j (d₀ is the first slope). "Slopes ≥ 0 and non-decreasing" is exactly "d ≥ 0", and
//! every such curve has this form. Minimising Σ w_i (z_i − y_i)² is then a non-negative least
//! squares problem in d (the free intercept z₀ always taking its best value), which the
//! Lawson–Hanson active-set method solves exactly in finitely many steps. Each step's
//! unconstrained solve is a linear spline on the knots where the slope may grow, fitted on the
//! hat-function basis (tridiagonal normal equations), and the gradient is a suffix sum, so a
//! step is O(n) and a projection at most O(n²): the planner projects every engine's curve of
//! 60-odd knots on every solve.

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
    let data = Data { xs: &xs, ys: &ys, ws: &ws };
    let increments = data.nnls();
    xs.iter().copied().zip(data.values(&increments)).collect()
}

/// Sorted distinct loads with their latencies and positive weights.
struct Data<'a> {
    xs: &'a [f64],
    ys: &'a [f64],
    ws: &'a [f64],
}

impl Data<'_> {
    fn weighted_mean(&self, values: &[f64]) -> f64 {
        let total: f64 = self.ws.iter().sum();
        values.iter().zip(self.ws).map(|(v, w)| v * w).sum::<f64>() / total
    }

    /// The curve with slope increments `d` (d_j at knot j, j < n − 1) and the intercept that
    /// fits the data best, at every knot.
    fn values(&self, d: &[f64]) -> Vec<f64> {
        let mut values = Vec::with_capacity(self.xs.len());
        let (mut value, mut slope) = (0.0, 0.0);
        values.push(0.0);
        for (j, span) in self.xs.windows(2).enumerate() {
            slope += d[j];
            value += slope * (span[1] - span[0]);
            values.push(value);
        }
        let shift = self.weighted_mean(self.ys) - self.weighted_mean(&values);
        for v in &mut values {
            *v += shift;
        }
        values
    }

    /// The gradient of ½ Σ w (y − z)² with respect to each increment, negated:
    /// g_j = Σ_{i>j} w_i r_i (x_i − x_j) with r the residual of the curve `d`.
    fn gradient(&self, d: &[f64]) -> Vec<f64> {
        let z = self.values(d);
        let n = self.xs.len();
        let mut gradient = vec![0.0; n - 1];
        let (mut g, mut tail) = (0.0, 0.0);
        for j in (0..n - 1).rev() {
            tail += self.ws[j + 1] * (self.ys[j + 1] - z[j + 1]);
            g += (self.xs[j + 1] - self.xs[j]) * tail;
            gradient[j] = g;
        }
        gradient
    }

    /// Lawson–Hanson non-negative least squares over the slope increments. Iterations are
    /// capped, so degenerate input ends with a feasible (d ≥ 0) if not perfectly optimal
    /// answer rather than looping.
    fn nnls(&self) -> Vec<f64> {
        let m = self.xs.len() - 1;
        let mut solution = vec![0.0; m];
        let mut passive = vec![false; m];
        let mean_y = self.weighted_mean(self.ys);
        let root_w_max = self.ws.iter().fold(0.0_f64, |acc, w| acc.max(w.sqrt()));
        let target_max =
            self.ys.iter().zip(self.ws).fold(0.0_f64, |acc, (y, w)| acc.max(w.sqrt() * (y - mean_y).abs()));
        let scale = root_w_max * (self.xs[m] - self.xs[0]) * target_max * (m + 1) as f64;
        // A hinge between two close knots moves the fit by a lot for a small gradient: at
        // 1e-12 of this scale, a convex curve came back 4e-6 off its own values.
        let tolerance = 1e-15 * scale.max(f64::MIN_POSITIVE);
        for _ in 0..3 * m + 3 {
            let gradient = self.gradient(&solution);
            let entering = (0..m)
                .filter(|&j| !passive[j] && gradient[j] > tolerance)
                .max_by(|&a, &b| gradient[a].total_cmp(&gradient[b]));
            let Some(entering) = entering else { break };
            passive[entering] = true;
            for _ in 0..3 * m + 3 {
                let Some(unconstrained) = self.least_squares(&passive) else {
                    passive[entering] = false;
                    break;
                };
                let active: Vec<usize> = (0..m).filter(|&j| passive[j]).collect();
                if active.iter().all(|&j| unconstrained[j] > 0.0) {
                    solution = unconstrained;
                    break;
                }
                // Step from the feasible point towards the unconstrained one until the first
                // increment hits zero, then drop the increments that reached zero.
                let mut step = 1.0_f64;
                let mut blocking = None;
                for &j in &active {
                    let value = unconstrained[j];
                    if value <= 0.0 {
                        let denominator = solution[j] - value;
                        let candidate = if denominator > 0.0 { solution[j] / denominator } else { 0.0 };
                        if candidate < step {
                            step = candidate;
                            blocking = Some(j);
                        }
                    }
                }
                for &j in &active {
                    solution[j] += step * (unconstrained[j] - solution[j]);
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

    /// The least-squares curve whose slope may change only at the knots marked `passive`
    /// (knot 0: the curve may start sloped, else it starts flat), as its increments (zero off
    /// `passive`). Such a curve is linear between its breakpoints (the first and last knots
    /// and the passive ones), so it is fitted by its values there on the hat-function basis,
    /// whose normal equations are tridiagonal: O(n), where a dense least-squares solve on the
    /// hinge columns took O(n³). `None` if they are (numerically) singular.
    fn least_squares(&self, passive: &[bool]) -> Option<Vec<f64>> {
        let n = self.xs.len();
        let mut breaks = vec![0];
        breaks.extend((1..n - 1).filter(|&j| passive[j]));
        breaks.push(n - 1);
        // Breakpoint t's unknown: a flat start shares one value between the first two.
        let sloped_start = passive[0];
        let unknown = |t: usize| if sloped_start { t } else { t.saturating_sub(1) };
        let size = unknown(breaks.len() - 1) + 1;
        let (mut diagonal, mut off, mut rhs) = (vec![0.0; size], vec![0.0; size], vec![0.0; size]);
        for (t, segment) in breaks.windows(2).enumerate() {
            let (a, b) = (segment[0], segment[1]);
            let (p, q) = (unknown(t), unknown(t + 1));
            let last = if t + 2 == breaks.len() { b } else { b - 1 };
            for i in a..=last {
                let lambda = (self.xs[i] - self.xs[a]) / (self.xs[b] - self.xs[a]);
                let (w, y) = (self.ws[i], self.ys[i]);
                if p == q {
                    diagonal[p] += w;
                    rhs[p] += w * y;
                } else {
                    let (left, right) = (1.0 - lambda, lambda);
                    diagonal[p] += w * left * left;
                    diagonal[q] += w * right * right;
                    off[p] += w * left * right;
                    rhs[p] += w * left * y;
                    rhs[q] += w * right * y;
                }
            }
        }
        // LDLᵀ of the symmetric positive definite tridiagonal matrix.
        let floor = 1e-13 * diagonal.iter().fold(0.0_f64, |acc, v| acc.max(*v)).max(f64::MIN_POSITIVE);
        for k in 0..size {
            if k > 0 {
                let l = off[k - 1] / diagonal[k - 1];
                diagonal[k] -= l * off[k - 1];
                rhs[k] -= l * rhs[k - 1];
            }
            if !(diagonal[k].is_finite() && diagonal[k] > floor) {
                return None;
            }
        }
        let mut values = vec![0.0; size];
        for k in (0..size).rev() {
            let next = if k + 1 < size { off[k] * values[k + 1] } else { 0.0 };
            values[k] = (rhs[k] - next) / diagonal[k];
        }
        let mut increments = vec![0.0; n - 1];
        let mut previous_slope = 0.0;
        for (t, segment) in breaks.windows(2).enumerate() {
            let (a, b) = (segment[0], segment[1]);
            let slope = (values[unknown(t + 1)] - values[unknown(t)]) / (self.xs[b] - self.xs[a]);
            increments[a] = slope - previous_slope;
            previous_slope = slope;
        }
        increments.iter().all(|v| v.is_finite()).then_some(increments)
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
}

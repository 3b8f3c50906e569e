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
//! step is O(n) and a projection at most O(n²).
//!
//! The steps start from the data's own shape, not from the flat line: the slope may grow
//! where the data's lower convex hull, made non-decreasing, bends upwards, which for convex
//! data is every knot where the data's slope grows. The planner projects every engine's curve
//! of 60-odd knots, convex up to rounding, twice per control round; from the flat line each of
//! its knots entered one step at a time (~60 O(n) steps, ~0.1 ms), from its own shape it takes
//! one solve. Noisy data takes a few. The start changes the path, not the answer: it is a
//! feasible point, and the inner loop makes it the best fit on its knots before the usual
//! steps, so each later step still lowers the error strictly and no set of knots comes back.
//! The stopping rule is the same KKT test either way, and a step that changes nothing (a knot
//! whose gradient clears the tolerance by rounding enters and leaves at once) ends the search.

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
    projection(points, true).0
}

/// [`project_convex_increasing_weighted`], from the data's shape (`warm`) or from the flat
/// line, with the number of least-squares solves it took: the tests compare the two starts
/// and count the solves.
pub(crate) fn projection(points: &[(f64, f64, f64)], warm: bool) -> (Vec<(f64, f64)>, usize) {
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
        return (merged.into_iter().map(|(x, y, _)| (x, y)).collect(), 0);
    }
    let xs: Vec<f64> = merged.iter().map(|p| p.0).collect();
    let ys: Vec<f64> = merged.iter().map(|p| p.1).collect();
    let ws: Vec<f64> = merged.iter().map(|p| p.2).collect();
    let data = Data { xs: &xs, ys: &ys, ws: &ws };
    let (increments, solves) = data.nnls(warm);
    (xs.iter().copied().zip(data.values(&increments)).collect(), solves)
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

    /// Lawson–Hanson non-negative least squares over the slope increments, with the number
    /// of least-squares solves it took. `warm`, it starts from [`Self::warm_start`]; else
    /// from the flat line (d = 0). Iterations are capped, so degenerate input ends with a
    /// feasible (d ≥ 0) if not perfectly optimal answer rather than looping.
    fn nnls(&self, warm: bool) -> (Vec<f64>, usize) {
        let m = self.xs.len() - 1;
        let mut solution = vec![0.0; m];
        let mut passive = vec![false; m];
        let mut solves = 0;
        let mean_y = self.weighted_mean(self.ys);
        let root_w_max = self.ws.iter().fold(0.0_f64, |acc, w| acc.max(w.sqrt()));
        let target_max =
            self.ys.iter().zip(self.ws).fold(0.0_f64, |acc, (y, w)| acc.max(w.sqrt() * (y - mean_y).abs()));
        let scale = root_w_max * (self.xs[m] - self.xs[0]) * target_max * (m + 1) as f64;
        // A hinge between two close knots moves the fit by a lot for a small gradient: at
        // 1e-12 of this scale, a convex curve came back 4e-6 off its own values.
        let tolerance = 1e-15 * scale.max(f64::MIN_POSITIVE);
        if warm {
            self.warm_start(&mut solution, &mut passive);
            // The start is feasible but not yet the best curve with those hinges: one pass of
            // the inner loop makes it so, dropping the hinges the fit does not want. A singular
            // solve there leaves the cold start, which is always valid.
            if !self.settle(&mut solution, &mut passive, &mut solves) {
                solution.fill(0.0);
                passive.fill(false);
            }
        }
        let mut before = (Vec::with_capacity(m), Vec::with_capacity(m));
        for _ in 0..3 * m + 3 {
            let gradient = self.gradient(&solution);
            let entering = (0..m)
                .filter(|&j| !passive[j] && gradient[j] > tolerance)
                .max_by(|&a, &b| gradient[a].total_cmp(&gradient[b]));
            let Some(entering) = entering else { break };
            before.0.clone_from(&solution);
            before.1.clone_from(&passive);
            passive[entering] = true;
            if !self.settle(&mut solution, &mut passive, &mut solves) {
                passive[entering] = false;
            }
            // A knot whose gradient clears the tolerance by rounding only can enter and leave
            // at once (a zero step). The state is then what it was, so every later iteration
            // would repeat this one until the cap (511 solves on an engine's combined curve
            // of 85 knots, every round): stop, with the answer those iterations would give.
            if before.0 == solution && before.1 == passive {
                break;
            }
        }
        for value in &mut solution {
            *value = value.max(0.0);
        }
        (solution, solves)
    }

    /// A feasible start near the answer: the slope increments of the data's lower convex
    /// hull with its slopes clamped at zero, where they exceed a tiny threshold. `passive`
    /// marks those knots and `solution` holds the increments (zero elsewhere).
    ///
    /// On convex data the hull is the data and these are its own positive slope increments,
    /// so the first solve reproduces the data and nothing enters after it. On noise, about
    /// half the data's raw increments are positive and the inner loop would drop the spurious
    /// ones about one solve each (some 20 solves on average for random data of 20–70 knots, 3
    /// from the flat line), while the hull of noise has a handful of vertices (4 solves). The
    /// threshold, a billionth of the steepest slope between neighbours, keeps rounding-level
    /// kinks on a convex curve's straight stretches out: as hinges, the first solve gives them
    /// rounding-level increments of either sign and the negative ones leave one solve at a time
    /// (7.5 solves instead of 1 on a tabulated three-piece line).
    fn warm_start(&self, solution: &mut [f64], passive: &mut [bool]) {
        let slope = |a: usize, b: usize| (self.ys[b] - self.ys[a]) / (self.xs[b] - self.xs[a]);
        let steepest = (0..self.xs.len() - 1).fold(0.0_f64, |acc, i| acc.max(slope(i, i + 1).abs()));
        let threshold = 1e-9 * steepest;
        // Andrew's monotone chain over the sorted loads: a vertex stays only if the slope
        // grows there by more than the threshold.
        let mut hull: Vec<usize> = Vec::with_capacity(self.xs.len());
        for i in 0..self.xs.len() {
            while let [.., a, b] = hull[..] {
                if slope(b, i) - slope(a, b) > threshold {
                    break;
                }
                hull.pop();
            }
            hull.push(i);
        }
        // Clamping the slopes at zero keeps the start feasible (d₀ ≥ 0). Non-finite slopes
        // (loads or latencies near the ends of f64's range) leave knots out, at worst all of
        // them: the threshold is then infinite and the start the flat line.
        let mut previous = 0.0;
        for segment in hull.windows(2) {
            let rising = slope(segment[0], segment[1]).max(0.0);
            let increment = rising - previous;
            previous = rising;
            if increment.is_finite() && increment > threshold {
                solution[segment[0]] = increment;
                passive[segment[0]] = true;
            }
        }
    }

    /// Lawson–Hanson's inner loop: from the feasible `solution` (non-negative on `passive`,
    /// zero elsewhere), moves to the least-squares solution on a subset of `passive` that is
    /// positive there, dropping the increments that reach zero on the way. Adds its solves to
    /// `solves`. False if a solve was (numerically) singular, `solution` then still feasible.
    fn settle(&self, solution: &mut Vec<f64>, passive: &mut [bool], solves: &mut usize) -> bool {
        let m = passive.len();
        for _ in 0..3 * m + 3 {
            let Some(unconstrained) = self.least_squares(passive) else { return false };
            *solves += 1;
            let active: Vec<usize> = (0..m).filter(|&j| passive[j]).collect();
            if active.iter().all(|&j| unconstrained[j] > 0.0) {
                *solution = unconstrained;
                return true;
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
                return true;
            }
        }
        true
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
    use proptest::prelude::*;
    use proptest::test_runner::RngSeed;

    /// A knot that clears the tolerance by rounding enters and leaves at once; the loop used to
    /// repeat that until its cap (511 solves), on an engine's curve, every control round.
    #[test]
    fn a_rounding_level_gradient_ends_the_search() {
        let points: Vec<(f64, f64, f64)> =
            include_str!("../../tests/fixtures/combined-curve-rounding-kink.txt")
                .lines()
                .filter(|line| !line.starts_with('#'))
                .map(|line| {
                    let (x, y) = line.split_once(' ').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap(), 1.0)
                })
                .collect();
        let (warm, solves) = projection(&points, true);
        assert!(solves <= 5, "{solves} solves");
        let (cold, _) = projection(&points, false);
        let off = warm.iter().zip(&cold).map(|(a, b)| (a.1 - b.1).abs()).fold(0.0, f64::max);
        assert!(off <= 1e-9 * cold[cold.len() - 1].1, "{off} ms from the cold start's curve");
    }

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

    /// t0 + b·y/(c − y) on the planner's grid (60 loads up to 98% of c, denser near c), each
    /// latency times 1 + `noise` × a fixed pattern in [−1, 1].
    fn queueing_curve(noise: f64) -> Vec<(f64, f64, f64)> {
        let pattern: Vec<f64> = (0..60).map(|i| ((i * 7919) % 13) as f64 / 6.0 - 1.0).collect();
        noisy_queueing_curve(noise, &pattern, &[1.0; 60])
    }

    /// The same curve, latency i times 1 + `noise` × `pattern[i]`, with weight `weights[i]`.
    fn noisy_queueing_curve(noise: f64, pattern: &[f64], weights: &[f64]) -> Vec<(f64, f64, f64)> {
        let (t0, b, c) = (40.0, 12.0, 100.0);
        pattern
            .iter()
            .zip(weights)
            .enumerate()
            .map(|(i, (&p, &w))| {
                let remaining = 1.0 - i as f64 / (pattern.len() - 1) as f64;
                let load = 0.98 * c * (1.0 - remaining * remaining);
                (load, (t0 + b * load / (c - load)) * (1.0 + noise * p), w)
            })
            .collect()
    }

    #[test]
    fn convex_input_takes_one_solve_from_its_own_shape() {
        let exact = queueing_curve(0.0);
        let (out, solves) = projection(&exact, true);
        assert!(solves <= 2, "{solves} solves");
        for (&(_, y, _), &(_, z)) in exact.iter().zip(&out) {
            assert!((z - y).abs() <= 1e-9 * y, "{y} became {z}");
        }
        // From the flat line every knot enters on its own: what the count above rules out.
        let (_, flat) = projection(&exact, false);
        assert!(flat >= 59, "{flat} solves from the flat line");
        // Rounding-level noise leaves the curve convex; as many solves.
        let (_, solves) = projection(&queueing_curve(1e-12), true);
        assert!(solves <= 2, "{solves} solves with rounding noise");
        // A three-piece line tabulated on the same grid plus its two kinks: its straight
        // stretches have slope increments of rounding size, which must not become hinges.
        let kinks = [(0.0, 50.0), (30.0, 55.0), (70.0, 90.0), (100.0, 300.0)];
        let mut loads: Vec<f64> = exact.iter().map(|p| p.0).collect();
        loads.extend([30.0, 70.0]);
        let line: Vec<(f64, f64, f64)> = loads
            .into_iter()
            .map(|x| {
                let upper = kinks.partition_point(|k| k.0 < x).clamp(1, 3);
                let ((x0, y0), (x1, y1)) = (kinks[upper - 1], kinks[upper]);
                (x, y0 + (y1 - y0) * (x - x0) / (x1 - x0) + 3.0 * x / 7.0, 1.0)
            })
            .collect();
        let (_, solves) = projection(&line, true);
        assert!(solves <= 2, "{solves} solves on a tabulated line");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, rng_seed: RngSeed::Fixed(11), ..ProptestConfig::default() })]

        /// The start changes the path, not the answer: on noisy data both starts give the same
        /// curve; a convex curve (rounding-level noise) is its own projection and comes back in
        /// at most two solves. (`tests/projection.rs` checks the answer against Clarabel.)
        #[test]
        fn both_starts_reach_the_same_curve(
            convex in any::<bool>(),
            noise in 1e-4f64..0.3,
            pattern in proptest::collection::vec(-1.0f64..1.0, 3..60),
            log_weights in proptest::collection::vec(-2.0f64..2.0, 60),
        ) {
            let weights: Vec<f64> = log_weights.iter().map(|l| 10f64.powf(*l)).collect();
            let points = noisy_queueing_curve(if convex { 1e-12 } else { noise }, &pattern, &weights);
            let (warm, solves) = projection(&points, true);
            let (flat, _) = projection(&points, false);
            let scale = points.iter().map(|p| p.1.abs()).fold(1.0, f64::max);
            prop_assert_eq!(warm.len(), points.len());
            prop_assert_eq!(flat.len(), points.len());
            if convex {
                // Compared with the data, not with the flat start's answer: that one stops
                // within its tolerance of the data, up to 2e-6 of the scale on close knots.
                for (p, z) in points.iter().zip(&warm) {
                    prop_assert!((z.1 - p.1).abs() <= 1e-9 * scale, "{:?} became {:?}", p, z);
                }
                prop_assert!(solves <= 2, "{} solves on a convex curve", solves);
            } else {
                for (a, b) in warm.iter().zip(&flat) {
                    prop_assert!(a.0 == b.0 && (a.1 - b.1).abs() <= 1e-9 * scale, "{:?} vs {:?}", a, b);
                }
            }
        }
    }

    #[test]
    fn duplicates_and_non_finite_points_are_handled() {
        let out = project_convex_increasing(&[(1.0, 2.0), (f64::NAN, 1.0), (1.0, 4.0), (0.0, 1.0)]);
        assert_eq!(out.len(), 2);
        assert!((out[0].1 - 1.0).abs() < 1e-9 && (out[1].1 - 3.0).abs() < 1e-9);
        assert!(project_convex_increasing(&[]).is_empty());
    }
}

//! The convex projection against an independent solver: Clarabel, an interior-point solver,
//! given the same weighted least-squares problem as a quadratic program (the values at the
//! knots, the first slope non-negative and each slope at least the one before). The planner
//! projects every engine's curve on every solve with its own active-set method, O(n²) at
//! worst and started from the data's shape (`profile/convex.rs`); here both must reach the
//! same optimum on data of every kind: noise, convex curves with rounding-level noise (what
//! tabulating a fitted curve gives), queueing shapes with noise, and weights spread over four
//! orders of magnitude.

use clarabel::algebra::CscMatrix;
use clarabel::solver::{DefaultSettingsBuilder, DefaultSolver, IPSolver, SolverStatus, SupportedConeT};
use ilb_planning::profile::project_convex_increasing_weighted;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

/// Σ w (z − y)² over the points.
fn error(points: &[(f64, f64, f64)], z: &[f64]) -> f64 {
    points.iter().zip(z).map(|(&(_, y, w), z)| w * (z - y) * (z - y)).sum()
}

/// The optimal error by Clarabel. `points` sorted by distinct loads.
fn clarabel_error(points: &[(f64, f64, f64)]) -> f64 {
    let n = points.len();
    let p = CscMatrix::new_from_triplets(
        n,
        n,
        (0..n).collect(),
        (0..n).collect(),
        points.iter().map(|p| 2.0 * p.2).collect(),
    );
    let q: Vec<f64> = points.iter().map(|&(_, y, w)| -2.0 * w * y).collect();
    // Rows s = b − A z ≥ 0: the first slope, then each slope's growth, times the spans.
    let (mut rows, mut cols, mut vals) = (Vec::new(), Vec::new(), Vec::new());
    let mut push = |r: usize, c: usize, v: f64| {
        rows.push(r);
        cols.push(c);
        vals.push(v);
    };
    push(0, 0, 1.0);
    push(0, 1, -1.0);
    for i in 0..n - 2 {
        let (left, right) = (points[i + 1].0 - points[i].0, points[i + 2].0 - points[i + 1].0);
        // (z₂ − z₁)/right − (z₁ − z₀)/left ≥ 0, negated into A.
        push(i + 1, i, -1.0 / left);
        push(i + 1, i + 1, 1.0 / left + 1.0 / right);
        push(i + 1, i + 2, -1.0 / right);
    }
    let constraints = n - 1;
    let a = CscMatrix::new_from_triplets(constraints, n, rows, cols, vals);
    let b = vec![0.0; constraints];
    let cones = [SupportedConeT::NonnegativeConeT(constraints)];
    let settings = DefaultSettingsBuilder::default()
        .verbose(false)
        .tol_gap_abs(1e-12)
        .tol_gap_rel(1e-12)
        .tol_feas(1e-12)
        .max_iter(500)
        .build()
        .unwrap();
    let mut solver = DefaultSolver::new(&p, &q, &a, &b, &cones, settings).unwrap();
    solver.solve();
    assert!(
        matches!(solver.solution.status, SolverStatus::Solved | SolverStatus::AlmostSolved),
        "clarabel: {:?}",
        solver.solution.status
    );
    error(points, &solver.solution.x)
}

/// Sorted distinct loads; latencies of one of four kinds; weights from 0.01 to 100.
fn instance() -> impl Strategy<Value = Vec<(f64, f64, f64)>> {
    (0usize..4, proptest::collection::vec((0.01f64..10.0, 0.0f64..1.0, -2.0f64..2.0), 2..70)).prop_map(
        |(kind, steps)| {
            let mut load = 0.0;
            steps
                .into_iter()
                .map(|(gap, u, log_w)| {
                    load += gap;
                    let latency = match kind {
                        0 => 400.0 * u,
                        1 => 10.0 + load * load / 50.0 + 1e-9 * u,
                        2 => 30.0 + 5.0 * load / (400.0 - load).max(1.0) + 20.0 * u,
                        _ => 200.0 - load + 50.0 * u,
                    };
                    (load, latency, 10f64.powf(log_w))
                })
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, rng_seed: RngSeed::Fixed(7), ..ProptestConfig::default() })]

    #[test]
    fn the_projection_reaches_clarabels_optimum(points in instance()) {
        let projected = project_convex_increasing_weighted(&points);
        prop_assert_eq!(projected.len(), points.len());
        let z: Vec<f64> = projected.iter().map(|p| p.1).collect();
        let ours = error(&points, &z);
        let reference = clarabel_error(&points);
        // The scale: the error of the best flat line, which is feasible.
        let total: f64 = points.iter().map(|p| p.2).sum();
        let mean = points.iter().map(|p| p.1 * p.2).sum::<f64>() / total;
        let flat = error(&points, &vec![mean; points.len()]);
        // Never worse than Clarabel's; better only as far as Clarabel's own accuracy goes, and
        // then feasible (the slopes checked at a tolerance far below that accuracy).
        prop_assert!(ours <= reference + 1e-7 * flat + 1e-9, "ours {} clarabel {} (flat {})", ours, reference, flat);
        prop_assert!(ours >= reference - 1e-5 * flat - 1e-9, "ours {} clarabel {} (flat {})", ours, reference, flat);
        let slopes: Vec<f64> = projected.windows(2).map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0)).collect();
        let scale = points.iter().map(|p| p.1.abs()).fold(1.0, f64::max);
        for (i, s) in slopes.iter().enumerate() {
            let before = if i == 0 { 0.0 } else { slopes[i - 1] };
            prop_assert!(*s >= before - 1e-9 * scale, "slope {} after {} at {}", s, before, i);
        }
    }
}

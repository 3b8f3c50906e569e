//! Test helpers: an independent exact solve of the same convex problem with the interior-point
//! solver Clarabel (second-order cone form), and a checker of the published solution's
//! invariants.
#![allow(dead_code, clippy::needless_range_loop)]

use clarabel::algebra::CscMatrix;
use clarabel::solver::{
    DefaultSettingsBuilder, DefaultSolver, IPSolver, SolverStatus, SupportedConeT,
    SupportedConeT::{NonnegativeConeT, SecondOrderConeT, ZeroConeT},
};
use ilb_optimizer::{Curve, Problem, Solution};

pub struct Reference {
    pub objective: f64,
    pub loads: Vec<f64>,
}

/// Solves `problem` exactly with Clarabel:
/// min Σ n·x + Σ τ_j + Σ P·s with τ_j ≥ f_j(y_j) written as second-order cones.
pub fn clarabel_solve(problem: &Problem) -> Reference {
    let n = problem.classes.len();
    let m = problem.engines.len();
    let curves: Vec<Curve> =
        problem.engines.iter().map(|e| Curve::new(&e.latency, e.capacity_rps, problem.rho)).collect();
    let mut pairs = Vec::new(); // (class, engine)
    for k in 0..n {
        for j in 0..m {
            if problem.network_ms.get(k, j).is_some() && curves[j].cap() > 0.0 {
                pairs.push((k, j));
            }
        }
    }
    let nx = pairs.len();
    let (s0, y0, t0) = (nx, nx + n, nx + n + m);
    let nvar = nx + n + 2 * m;
    let mut q = vec![0.0; nvar];
    for (i, &(k, j)) in pairs.iter().enumerate() {
        q[i] = problem.network_ms.get(k, j).unwrap();
    }
    for k in 0..n {
        q[s0 + k] = problem.classes[k].shed_penalty_ms;
    }
    for j in 0..m {
        q[t0 + j] = 1.0;
    }
    let (mut rows, mut cols, mut vals, mut b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut row = 0;
    let push =
        |r: usize, c: usize, v: f64, rows: &mut Vec<usize>, cols: &mut Vec<usize>, vals: &mut Vec<f64>| {
            rows.push(r);
            cols.push(c);
            vals.push(v);
        };
    let mut cones: Vec<SupportedConeT<f64>> = Vec::new();
    // Demand: Σ_j x_kj + s_k = d_k.
    for k in 0..n {
        for (i, &(kk, _)) in pairs.iter().enumerate() {
            if kk == k {
                push(row + k, i, 1.0, &mut rows, &mut cols, &mut vals);
            }
        }
        push(row + k, s0 + k, 1.0, &mut rows, &mut cols, &mut vals);
        b.push(problem.classes[k].demand_rps);
    }
    row += n;
    // Loads: y_j − Σ_k x_kj = 0.
    for j in 0..m {
        push(row + j, y0 + j, 1.0, &mut rows, &mut cols, &mut vals);
        for (i, &(_, jj)) in pairs.iter().enumerate() {
            if jj == j {
                push(row + j, i, -1.0, &mut rows, &mut cols, &mut vals);
            }
        }
        b.push(0.0);
    }
    row += m;
    cones.push(ZeroConeT(n + m));
    // x, s, y ≥ 0 and y ≤ cap.
    for v in 0..nx + n + m {
        push(row, v, -1.0, &mut rows, &mut cols, &mut vals);
        b.push(0.0);
        row += 1;
    }
    for j in 0..m {
        push(row, y0 + j, 1.0, &mut rows, &mut cols, &mut vals);
        b.push(curves[j].cap());
        row += 1;
    }
    cones.push(NonnegativeConeT(nx + n + 2 * m));
    for (j, curve) in curves.iter().enumerate() {
        let (y, t) = (y0 + j, t0 + j);
        if let Some((t0_ms, b_ms, c)) = curve.queueing_params() {
            // τ ≥ t0·y + b·w with y² ≤ w·(c − y): cone (w + c − y, 2y, w − c + y), and τ = t0 y + b w
            // folded by using w directly: τ_j here is b·w + t0·y, so scale: w = (τ − t0 y)/b.
            // (τ − t0 y)/b + c − y, 2y, (τ − t0 y)/b − c + y
            push(row, t, -1.0 / b_ms, &mut rows, &mut cols, &mut vals);
            push(row, y, t0_ms / b_ms + 1.0, &mut rows, &mut cols, &mut vals);
            b.push(c);
            push(row + 1, y, -2.0, &mut rows, &mut cols, &mut vals);
            b.push(0.0);
            push(row + 2, t, -1.0 / b_ms, &mut rows, &mut cols, &mut vals);
            push(row + 2, y, t0_ms / b_ms - 1.0, &mut rows, &mut cols, &mut vals);
            b.push(-c);
            row += 3;
            cones.push(SecondOrderConeT(3));
        } else if let Some(lines) = curve.envelope_lines() {
            for (a, s) in lines {
                // s·y² ≤ τ − a·y: cone (v + 1, 2√s·y, v − 1) with v = τ − a·y.
                push(row, t, -1.0, &mut rows, &mut cols, &mut vals);
                push(row, y, a, &mut rows, &mut cols, &mut vals);
                b.push(1.0);
                push(row + 1, y, -2.0 * s.sqrt(), &mut rows, &mut cols, &mut vals);
                b.push(0.0);
                push(row + 2, t, -1.0, &mut rows, &mut cols, &mut vals);
                push(row + 2, y, a, &mut rows, &mut cols, &mut vals);
                b.push(-1.0);
                row += 3;
                cones.push(SecondOrderConeT(3));
            }
        }
    }
    let a = CscMatrix::new_from_triplets(row, nvar, rows, cols, vals);
    let p = CscMatrix::zeros((nvar, nvar));
    let settings = DefaultSettingsBuilder::default()
        .verbose(false)
        .tol_gap_abs(1e-9)
        .tol_gap_rel(1e-10)
        .max_iter(500)
        .build()
        .unwrap();
    let mut solver = DefaultSolver::new(&p, &q, &a, &b, &cones, settings).unwrap();
    solver.solve();
    let status = solver.solution.status;
    assert!(
        matches!(status, SolverStatus::Solved | SolverStatus::AlmostSolved),
        "clarabel did not solve: {status:?}"
    );
    let x = &solver.solution.x;
    Reference { objective: solver.solution.obj_val, loads: (0..m).map(|j| x[y0 + j]).collect() }
}

/// Checks the invariants every published solution must satisfy.
pub fn check_invariants(problem: &Problem, solution: &Solution) {
    let n = problem.classes.len();
    let m = problem.engines.len();
    let mut routed = vec![0.0; n];
    let mut weight_sum = vec![0.0; n];
    let mut load = vec![0.0; m];
    for r in &solution.routes {
        // A route may carry only headroom (weight 0) where a class holds its previous weights.
        assert!(
            r.rps >= 0.0 && r.weight >= 0.0 && r.rps + r.weight > 0.0 && r.weight <= 1.0 + 1e-12,
            "{r:?}"
        );
        assert!(problem.network_ms.get(r.class, r.engine).is_some(), "forbidden pair used: {r:?}");
        routed[r.class] += r.rps;
        weight_sum[r.class] += r.weight;
        load[r.engine] += r.rps;
    }
    for k in 0..n {
        let d = problem.classes[k].demand_rps;
        let s = solution.shed_rps[k];
        assert!(s >= 0.0 && s <= d * (1.0 + 1e-12) + 1e-12, "class {k}: shed {s} of {d}");
        assert!((routed[k] + s - d).abs() <= 1e-9 * d.max(1.0), "class {k}: {} + {s} != {d}", routed[k]);
        if routed[k] > 0.0 {
            assert!((weight_sum[k] - 1.0).abs() < 1e-9, "class {k}: weights sum to {}", weight_sum[k]);
        }
        // The weights send what is expected of the class (its demand without the headroom)
        // where its routes plan it; only the headroom may be planned elsewhere.
        let expected = (routed[k] - problem.classes[k].headroom_rps).max(0.0);
        for r in solution.class_routes(k) {
            assert!(
                r.rps >= r.weight * expected - 1e-9 * d.max(1.0),
                "class {k}: {r:?} below its weight of {expected}"
            );
        }
    }
    for j in 0..m {
        let cap = problem.rho * problem.engines[j].capacity_rps;
        assert!(load[j] <= cap * (1.0 + 1e-12) + 1e-12, "engine {j}: load {} > {cap}", load[j]);
        assert!((load[j] - solution.engines[j].load_rps).abs() <= 1e-9 * cap.max(1.0));
    }
    assert!(solution.lower_bound <= solution.objective * (1.0 + 1e-12) + 1e-9);
}

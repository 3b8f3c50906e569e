//! The solver's tuning knobs, shared by the solve (`solver`), the Newton continuation
//! (`newton`) and the coarse start (`coarse`).

/// Tuning knobs; the defaults meet the bar of the crate README.
#[derive(Clone, Debug, PartialEq)]
pub struct SolverOptions {
    /// Stop once the certified relative gap is at most this (default 5e-4, half the 0.1 % bar).
    pub gap_target: f64,
    /// Upper bound on Newton steps; the best certified solution so far is returned.
    pub max_newton_steps: usize,
    /// Routes below this fraction of their class demand are dropped (and re-placed) by the repair.
    pub min_route_fraction: f64,
    /// Centre the smoothing term at the previous routes (sticky ties); on by default.
    pub proximal: bool,
    /// Stability strength: the cost, in ms of latency per request moved, that a new split must
    /// save before a [`Solver`](crate::Solver) moves traffic (0 = always publish the optimum;
    /// see `stability`).
    pub stability_ms: f64,
    /// Relative stability tolerance: a [`Solver`](crate::Solver) also keeps a class's previous
    /// weights while the published split's cost on the new problem stays within this fraction
    /// of the new solution's cost, so that differences as small as the solve's own certified gap
    /// do not move traffic (0 = off; see `stability`).
    pub stability_tolerance: f64,
}

impl Default for SolverOptions {
    fn default() -> Self {
        SolverOptions {
            gap_target: 5e-4,
            max_newton_steps: 400,
            min_route_fraction: 1e-6,
            proximal: true,
            stability_ms: 0.0,
            stability_tolerance: 0.0,
        }
    }
}

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

/// Smallest ε, relative to the price scale, at which a warm re-solve starts. Centred at the
/// previous routes, the smoothing costs a warm re-solve little (1e-6 of the objective on the
/// fleet's 100 × 5,000 against the 5e-4 target), while a cold solve may have had to go down to
/// ~8e-4 × scale to certify; at that ε an engine takes c_j/ε req/s per ms a class's price passes
/// its water level, and the first warm steps were cut to 5–12 % as classes flooded engines they
/// had not used (fleet 100 × 5,000: 6 Newton steps, 9 passes; from 2e-3 × scale: 3 and 4, 50.3 M →
/// 31.2 M instructions per re-solve; 200 × 20,000 fleet 141.4 M → 128.3 M; the noisy instances,
/// whose ε is about this large already, within 1 %). 1.5e-3 took 4 steps, 3e-3 and 5e-3 as many
/// as 2e-3 on longer candidate lists.
pub(crate) const WARM_MIN_EPSILON: f64 = 2e-3;

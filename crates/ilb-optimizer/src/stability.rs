//! Hysteresis between solves: moving traffic has a cost the objective does not see (a moved
//! conversation loses its engine's prefix cache, and its next turns pay the prefill again). With
//! a stability strength of S ms per moved request, a [`crate::Solver`] keeps its previous split
//! unless the new one saves more than S ms for every request per second it moves:
//!
//! ```text
//! keep if  cost(previous split on the new problem) − cost(new split) ≤ S · moved + τ · cost(new split),
//! ```
//!
//! where τ is the relative tolerance (a saving within the solve's own certified gap is not
//! worth moving anyone for, and demand noise mostly moves the optimum by less than that), costs are Σ n·x + Σ f(y) (shedding follows the new solve either way) and moved is the
//! req/s that change engine. The previous split must still be feasible: every pair allowed, no
//! engine above its usable capacity, with each class's weights applied to what the new solve
//! serves of it. The kept solution carries the new solve's lower bound, so its gap says what the
//! stability costs.

use crate::certify::relative_gap;
use crate::curve::Curve;
use crate::problem::Problem;
use crate::solution::{EnginePlan, Route, Solution};

/// The solution last returned, with the ids its indices refer to.
#[derive(Clone, Debug)]
pub(crate) struct Previous {
    class_ids: Vec<String>,
    engine_ids: Vec<String>,
    solution: Solution,
}

impl Previous {
    pub fn new(problem: &Problem, solution: &Solution) -> Self {
        Previous {
            class_ids: problem.classes.iter().map(|c| c.id.clone()).collect(),
            engine_ids: problem.engines.iter().map(|e| e.id.clone()).collect(),
            solution: solution.clone(),
        }
    }

    fn matches(&self, problem: &Problem) -> bool {
        self.class_ids.len() == problem.classes.len()
            && self.engine_ids.len() == problem.engines.len()
            && self.class_ids.iter().zip(&problem.classes).all(|(a, b)| *a == b.id)
            && self.engine_ids.iter().zip(&problem.engines).all(|(a, b)| *a == b.id)
    }
}

/// The previous split re-evaluated on `problem`, if keeping it is worth it (see the module
/// documentation); None when the new solution should be published.
pub(crate) fn keep_previous(
    problem: &Problem,
    new: &Solution,
    previous: &Previous,
    strength_ms: f64,
    tolerance: f64,
) -> Option<Solution> {
    if !previous.matches(problem) || new.shed_rps.len() != problem.classes.len() {
        return None;
    }
    let curves: Vec<Curve> =
        problem.engines.iter().map(|e| Curve::new(&e.latency, e.capacity_rps, problem.rho)).collect();
    let old = &previous.solution;
    let mut routes = Vec::with_capacity(old.routes.len());
    let mut load = vec![0.0; curves.len()];
    for r in &old.routes {
        let served = (problem.classes[r.class].demand_rps - new.shed_rps[r.class]).max(0.0);
        let rps = r.weight * served;
        if rps > 0.0 {
            problem.network_ms.get(r.class, r.engine)?; // forbidden now
            load[r.engine] += rps;
            routes.push(Route { class: r.class, engine: r.engine, rps, weight: r.weight });
        }
    }
    // Every class the new solve serves must be fully routed by the old weights.
    let mut routed = vec![0.0; problem.classes.len()];
    for r in &routes {
        routed[r.class] += r.weight;
    }
    for (k, class) in problem.classes.iter().enumerate() {
        if class.demand_rps - new.shed_rps[k] > 1e-9 * class.demand_rps.max(1.0) && routed[k] < 1.0 - 1e-9 {
            return None;
        }
    }
    if load.iter().zip(&curves).any(|(y, c)| *y > c.cap() * (1.0 + 1e-9)) {
        return None;
    }
    let routing_cost = |routes: &[Route], load: &[f64]| -> f64 {
        let network: f64 =
            routes.iter().map(|r| r.rps * problem.network_ms.get(r.class, r.engine).unwrap_or(0.0)).sum();
        network + load.iter().zip(&curves).map(|(y, c)| c.cost(*y)).sum::<f64>()
    };
    let new_load = new.engine_load_rps();
    let kept_cost = routing_cost(&routes, &load);
    let new_cost = routing_cost(&new.routes, &new_load);
    let moved = moved_rps(&routes, &new.routes);
    if kept_cost - new_cost > strength_ms * moved + tolerance * new_cost.abs() {
        return None;
    }
    let shed_cost: f64 = new.shed_rps.iter().zip(&problem.classes).map(|(s, c)| s * c.shed_penalty_ms).sum();
    let objective = kept_cost + shed_cost;
    let total = problem.total_demand_rps();
    let old_total: f64 = old.routes.iter().map(|r| r.rps).sum::<f64>() + old.shed_rps.iter().sum::<f64>();
    Some(Solution {
        engines: load
            .iter()
            .zip(&curves)
            .map(|(&y, c)| EnginePlan {
                load_rps: y,
                expected_latency_ms: c.latency(y),
                marginal_price_ms: c.marginal(y.min(c.cap())),
                capacity_binds: y >= c.cap() * (1.0 - 1e-9),
            })
            .collect(),
        traffic_moved: (old_total > 0.0 && total > 0.0).then(|| moved_rps(&routes, &old.routes) / total),
        routes,
        shed_rps: new.shed_rps.clone(),
        objective,
        lower_bound: new.lower_bound,
        gap: relative_gap(objective, new.lower_bound),
        mean_latency_ms: if total > 0.0 { objective / total } else { 0.0 },
        newton_steps: new.newton_steps,
        passes: new.passes,
        rebuilds: new.rebuilds,
        epsilon: new.epsilon,
        coarse_engines: new.coarse_engines,
    })
}

/// Σ |a − b| / 2 over (class, engine) of two route lists sorted by class, then engine.
fn moved_rps(a: &[Route], b: &[Route]) -> f64 {
    let (mut i, mut j, mut sum) = (0, 0, 0.0);
    while i < a.len() || j < b.len() {
        let key = |r: &Route| (r.class, r.engine);
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if key(x) == key(y) => {
                sum += (x.rps - y.rps).abs();
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if key(x) < key(y) => {
                sum += x.rps;
                i += 1;
            }
            (Some(x), None) => {
                sum += x.rps;
                i += 1;
            }
            (_, Some(y)) => {
                sum += y.rps;
                j += 1;
            }
            (None, None) => break,
        }
    }
    sum / 2.0
}

//! The solve: where it starts (the previous solve's prices, with the proximal centre at its
//! routes for stability; the coarse start; or cold prices), the Newton continuation (`newton`)
//! from there, and the per-class solution and warm start it returns. `Solver` keeps the warm
//! start and the previous split from one solve to the next.

use std::sync::Arc;

use crate::aggregate::Aggregation;
use crate::coarse;
use crate::disaggregate::{disaggregate, RunSummary};
use crate::newton::{Run, Travel};
use crate::options::{SolverOptions, WARM_MIN_EPSILON};
use crate::pass::{EngineCurves, Model, PrevRoutes};
use crate::problem::{Problem, ProblemError};
use crate::solution::{CurveCache, Ids, KeptLists, ListCache, Solution, WarmStart};
use crate::stability::{keep_previous, Previous};
use crate::warm::{cold_prices, map_warm_start};

/// A solver that remembers its previous answer and warm-starts from it. One per model.
#[derive(Clone, Debug, Default)]
pub struct Solver {
    pub options: SolverOptions,
    warm: Option<WarmStart>,
    /// The solution last returned, kept only with a stability strength or tolerance.
    previous: Option<Previous>,
}

impl Solver {
    pub fn new(options: SolverOptions) -> Self {
        Solver { options, warm: None, previous: None }
    }

    /// Solves `problem`, warm-started from the previous solve if there was one, and remembers
    /// the result for the next call. With a stability strength or tolerance, classes keep their
    /// previous weights (re-evaluated on `problem`) while moving them would not pay for itself.
    pub fn solve(&mut self, problem: &Problem) -> Result<Solution, ProblemError> {
        let (solution, warm) = solve(problem, self.warm.as_ref(), &self.options)?;
        // The warm start follows the optimum either way, so that the next solve tracks it.
        self.warm = Some(warm);
        let positive = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
        let (strength, tolerance) =
            (positive(self.options.stability_ms), positive(self.options.stability_tolerance));
        if strength == 0.0 && tolerance == 0.0 {
            return Ok(solution);
        }
        let solution = self
            .previous
            .as_ref()
            .and_then(|previous| keep_previous(problem, &solution, previous, strength, tolerance))
            .unwrap_or(solution);
        self.previous = Some(Previous::new(problem, &solution));
        Ok(solution)
    }

    /// Forgets the previous solution: the next solve is cold.
    pub fn reset(&mut self) {
        self.warm = None;
        self.previous = None;
    }

    pub fn warm_start(&self) -> Option<&WarmStart> {
        self.warm.as_ref()
    }
}

/// Stateless solve: the solution and the state to warm-start the next solve from.
pub fn solve(
    problem: &Problem,
    warm: Option<&WarmStart>,
    options: &SolverOptions,
) -> Result<(Solution, WarmStart), ProblemError> {
    let same_ids = warm.is_some_and(|w| {
        w.class_ids.len() == problem.classes.len()
            && w.engine_ids.len() == problem.engines.len()
            && w.class_ids.iter().zip(&problem.classes).all(|(a, b)| *a == b.id)
            && w.engine_ids.iter().zip(&problem.engines).all(|(a, b)| *a == b.id)
    });
    problem.validate_with(!same_ids)?;
    let same_classes = warm.is_some_and(|w| {
        w.class_ids.len() == problem.classes.len()
            && w.class_ids.iter().zip(&problem.classes).all(|(a, b)| *a == b.id)
    });
    let hint = warm.filter(|_| same_classes).map(|w| &w.class_group[..]);
    let groups = Aggregation::new(problem, hint);
    let curves = EngineCurves::for_problem(problem, warm.and_then(|w| w.curves.0.as_ref()));
    let model = Model::new(problem, &groups, &curves);
    let scale = price_scale(&model);
    let mapped = warm.map(|w| map_warm_start(problem, &model, &groups, w));
    // The coarse problem's engines and grouped classes, when a cold solve started from one.
    let mut coarse = None;
    let mut bounds = None;
    let (u, prev, eps_start, lost) = match mapped {
        Some(m) => {
            let prev = if options.proximal { m.prev } else { PrevRoutes::default() };
            // No smaller than `WARM_MIN_EPSILON` (see there).
            let eps = m.epsilon.max(WARM_MIN_EPSILON * scale);
            (m.prices, prev, eps.clamp(1e-7 * scale, 0.05 * scale), Some(m.old))
        }
        None => match coarse::start(&model, options, scale) {
            Some(c) => {
                coarse = Some((c.clusters, c.classes));
                bounds = c.bounds;
                let prev = if options.proximal { c.prev } else { PrevRoutes::default() };
                (c.prices, prev, c.epsilon.clamp(1e-7 * scale, 0.05 * scale), None)
            }
            None => (cold_prices(&model), PrevRoutes::default(), 0.2 * scale, None),
        },
    };
    let mut run = Run::new(&model, options, scale, prev);
    if coarse.is_some() {
        run.travel = Travel::Coarse;
        run.bounds = bounds;
    }
    if let Some(w) = warm.filter(|_| lost.is_some()) {
        resume(&mut run, w, problem, &groups, &model, same_ids);
    }
    let (repaired, eps) = run.solve(u, eps_start);
    let lists = ListCache(Some(Arc::new(KeptLists {
        network: problem.network_ms.shared_values(),
        class_group: groups.class_group.clone(),
        class_on: model.class_on.clone(),
        engine_on: model.engine_on.clone(),
        lists: run.kept.take(),
    })));
    let summary = RunSummary {
        cand: &run.cand,
        q: &run.pass.q,
        steps: run.steps,
        passes: run.passes,
        rebuilds: run.rebuilds,
        epsilon: eps,
        coarse,
    };
    let (solution, routes) = disaggregate(problem, &groups, &model, summary, &repaired, lost.as_ref());
    let warm = WarmStart {
        class_ids: match warm.filter(|_| same_classes) {
            Some(w) => w.class_ids.clone(),
            None => Ids(Arc::new(problem.classes.iter().map(|c| c.id.clone()).collect())),
        },
        engine_ids: match warm.filter(|_| same_ids) {
            Some(w) => w.engine_ids.clone(),
            None => Ids(Arc::new(problem.engines.iter().map(|e| e.id.clone()).collect())),
        },
        prices: groups
            .class_group
            .iter()
            .enumerate()
            .map(|(k, &g)| {
                let p = run.u[g as usize];
                (problem.classes[k].demand_rps > 0.0 && p.is_finite()).then_some(p)
            })
            .collect(),
        class_group: routes.class_group,
        share: routes.share,
        routes: routes.routes,
        epsilon: eps,
        engine_prices: run.pass.q.clone(),
        after_cold: warm.is_none(),
        curves: CurveCache(Some(curves)),
        lists,
    };
    Ok((solution, warm))
}

/// What a warm re-solve takes over from the state `w` of the last solve: the engines' prices (when
/// `same_ids`: the same engines in the same order), how far prices travel, and the kept lists.
fn resume(
    run: &mut Run,
    w: &WarmStart,
    problem: &Problem,
    groups: &Aggregation,
    model: &Model,
    same_ids: bool,
) {
    // The same engines in the same order: their roots start from their last prices (without
    // them, a warm solve's first pass started every engine's root from its bracket's end).
    if same_ids && w.engine_prices.len() == problem.engines.len() {
        run.pass.q.clone_from(&w.engine_prices);
    }
    run.travel = if w.after_cold { Travel::FirstWarm } else { Travel::SteadyWarm };
    // The kept lists hold for the same matrix, grouping, groups with demand and engines on.
    // Wider lists are built to be kept unless the matrix changed since the last solve (a
    // matrix that changes every solve would pay for them and never use them).
    match w.lists.0.as_ref() {
        Some(k) if problem.network_ms.same_values(&k.network) => {
            let same = k.class_group == groups.class_group
                && k.class_on == model.class_on
                && k.engine_on == model.engine_on;
            run.kept = k.lists.as_ref().filter(|_| same).map(Arc::clone);
        }
        Some(_) => run.keep_lists = false,
        None => {}
    }
}

/// Typical engine base latency: the unit for ε and the drift budget.
fn price_scale(model: &Model) -> f64 {
    let (mut sum, mut count) = (0.0, 0.0);
    for (curve, on) in model.curves.iter().zip(&model.engine_on) {
        if *on {
            sum += curve.base_price();
            count += 1.0;
        }
    }
    if count > 0.0 {
        (sum / count).max(1.0)
    } else {
        1.0
    }
}

//! Hysteresis between solves: moving traffic has a cost the objective does not see (a moved
//! conversation loses its engine's prefix cache, and its next turns pay the prefill again). With a
//! stability strength of S ms per moved request and a relative tolerance τ, a [`crate::Solver`]
//! publishes a mix of the new split and the previous one: a class keeps its previous weights
//! (applied to what the new solve serves of it) as long as the mix satisfies
//!
//! ```text
//! cost(mix) − cost(new split) ≤ S · avoided + τ · cost(new split),
//! ```
//!
//! where avoided is the req/s that the classes keeping their weights would have moved, and costs
//! are Σ n·x + Σ f(y) on the new problem (shedding follows the new solve either way). A saving
//! within τ, the order of the solve's own certified gap, is not worth moving anyone for; demand
//! noise mostly moves the optimum by less than that. The whole previous split is tried first; if it
//! does not pass, the classes are tried one at a time, cheapest first (the least cost per req/s of
//! movement avoided, each on its own against the new split), and such a partial mix may spend
//! only half of τ (`PARTIAL_SHARE`). The mix must be feasible: every kept
//! pair still allowed, no engine above its usable capacity. A class whose previous weights
//! overflow an engine only because a class that moves anyway spilled onto it gets the room
//! back: the moving class takes what its new split added there to the engines with room where
//! that costs it least, which never makes it move more (otherwise a noise step of one class's
//! demand, spilling off its full engine, releases a class the rule had been holding). A class
//! holding its weights need only fit its engines without half its headroom
//! (`Class::headroom_rps`, the margin the planner adds above the demand it expects;
//! [`HELD_HEADROOM_SHARE`]): what its weights would put of that half beyond an engine's usable
//! capacity is planned on the engines with room where it costs least, and its published weights
//! stay, so a noise step of the demand estimate on a full engine moves nothing. The weights then
//! send the mean demand where the plan puts it; a burst towards the top of the band goes by them
//! too, beyond that engine's usable capacity (ρ), as any demand above the plan does. Because
//! every solve compares with the new optimum, what the stability costs never accumulates from
//! solve to solve: the kept solution carries the new solve's lower bound, so its gap says what it
//! costs.

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

/// The previous split re-evaluated on `problem`, as far as keeping it is worth it (see the
/// module documentation); None when the new solution should be published as it is.
///
/// First the whole previous split is tried. If it does not pay (typically because a few classes
/// must move: their demand grew, or an engine filled up), the classes are tried one at a time,
/// cheapest first, each keeping its previous weights if the mix still passes the rule. So a
/// class whose new split differs from its previous one only along an (almost) equal-cost
/// direction, such as twin engines that a neighbour's spill tips one way or the other, keeps its
/// weights while the classes that must move do.
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
    let mut mix = Mix::new(problem, &curves, new);
    // Each class's previous weights applied to what the new solve serves of it, where they
    // still apply (every pair allowed, the weights routing all of it).
    let mut whole = true;
    let mut reverts = Vec::new();
    for k in 0..problem.classes.len() {
        match previous_routes(problem, old, k, new.shed_rps[k]) {
            Some(routes) => {
                let moved = moved_rps(&routes, new.class_routes(k));
                mix.previous[k] = Some(routes.clone());
                reverts.push(Revert { class: k, routes, moved });
            }
            None => whole = false,
        }
    }
    reverts.retain(|r| r.moved > 0.0);
    if reverts.is_empty() {
        return None;
    }
    let slack = tolerance * mix.new_cost.abs();
    let budget = |avoided: f64| strength_ms * avoided + slack;
    // A partial mix keeps only half the tolerance for itself, so that the next solve's noise has
    // the other half before it undoes the mix (which would then move the held classes after all).
    let partial = |avoided: f64| strength_ms * avoided + PARTIAL_SHARE * slack;
    if !(whole && mix.try_revert(&reverts, budget)) {
        // Cheapest first: the classes whose previous weights cost the least per req/s of
        // movement they avoid (each on its own against the new split).
        let mut order: Vec<(f64, &Revert)> = reverts
            .iter()
            .filter_map(|r| {
                let applied = mix.apply(std::slice::from_ref(r))?;
                Some(((applied.cost - mix.new_cost) / r.moved, r))
            })
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.class.cmp(&b.1.class)));
        for (_, revert) in order {
            mix.try_revert(std::slice::from_ref(revert), partial);
        }
        // A class whose previous weights no longer fit only because a moving class's new
        // routes took the room they need keeps them if the moving class can take that traffic
        // elsewhere: the largest movements avoided first.
        let mut blocked: Vec<&Revert> = reverts.iter().filter(|r| !mix.kept[r.class]).collect();
        blocked.sort_by(|a, b| b.moved.total_cmp(&a.moved).then(a.class.cmp(&b.class)));
        for revert in blocked {
            mix.try_revert_making_room(revert, partial);
        }
    }
    if mix.avoided == 0.0 {
        return None;
    }
    let routes: Vec<Route> = mix.routes.into_iter().flatten().collect();
    let load = mix.load;
    let kept_cost = mix.cost;
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
        traffic_moved: (old_total > 0.0 && total > 0.0)
            .then(|| moved_rps(&published(&routes), &published(&old.routes)) / total),
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
        coarse_classes: new.coarse_classes,
    })
}

/// The share of its headroom that a class holding its weights need not fit. The control plane
/// plans a class at the top of a band that follows the running maximum of its measured demand:
/// at steady demand that top sits about half a band above the mean (the band is 3 σ wide; the
/// maximum of a few dozen independent measurements is 1.5–2 σ above their mean). So held weights
/// must still carry the mean within the engines' usable capacity, and only the noise
/// excursions above it may go unplanned on them. With all of the headroom (share 1), `ilb demo`
/// held cluster b on its full engine while b's band rose at start-up, and the fleet's mean
/// end-to-end latency over those 50 s was 1.7 % higher.
const HELD_HEADROOM_SHARE: f64 = 0.5;

/// The share of the tolerance that a partial mix (some classes keeping their weights, others
/// moving) may spend.
const PARTIAL_SHARE: f64 = 0.5;

/// Class `k`'s previous weights applied to what the new solve serves of it (demand less
/// `shed`); None where they no longer apply: a pair forbidden now, or weights that do not route
/// all of it.
fn previous_routes(problem: &Problem, old: &Solution, k: usize, shed: f64) -> Option<Vec<Route>> {
    let served = (problem.classes[k].demand_rps - shed).max(0.0);
    let mut routes = Vec::new();
    let mut weight = 0.0;
    for r in old.class_routes(k) {
        problem.network_ms.get(k, r.engine)?; // forbidden now
        weight += r.weight;
        let rps = r.weight * served;
        if rps > 0.0 {
            routes.push(Route { class: k, engine: r.engine, rps, weight: r.weight });
        }
    }
    let unrouted = served > 1e-9 * problem.classes[k].demand_rps.max(1.0) && weight < 1.0 - 1e-9;
    (!unrouted).then_some(routes)
}

/// A class's previous routes, and the req/s its new split moves away from them.
struct Revert {
    class: usize,
    routes: Vec<Route>,
    moved: f64,
}

/// The new solution with some classes' routes replaced by their previous weights.
struct Mix<'a> {
    problem: &'a Problem,
    curves: &'a [Curve],
    /// Routes per class, each sorted by engine.
    routes: Vec<Vec<Route>>,
    load: Vec<f64>,
    /// Σ n·x + Σ f(y) of the mix, and of the new solution.
    cost: f64,
    new_cost: f64,
    /// Req/s that the reverted classes would have moved.
    avoided: f64,
    /// Per class: whether it holds its previous weights.
    kept: Vec<bool>,
    /// Per class: its previous routes re-evaluated on the new problem, where they still apply.
    previous: Vec<Option<Vec<Route>>>,
}

impl<'a> Mix<'a> {
    fn new(problem: &'a Problem, curves: &'a [Curve], new: &Solution) -> Self {
        let routes: Vec<Vec<Route>> =
            (0..problem.classes.len()).map(|k| new.class_routes(k).to_vec()).collect();
        let load = new.engine_load_rps();
        let cost = total_cost(problem, curves, &new.routes, &load);
        let n = problem.classes.len();
        Mix {
            problem,
            curves,
            routes,
            load,
            cost,
            new_cost: cost,
            avoided: 0.0,
            kept: vec![false; n],
            previous: vec![None; n],
        }
    }

    /// Gives each class of `reverts` (class, routes, req/s its new split moves) its previous
    /// weights if the mix then stays within every engine's capacity and
    /// cost(mix) − cost(new) ≤ budget(req/s the reverted classes would have moved).
    fn try_revert(&mut self, reverts: &[Revert], budget: impl Fn(f64) -> f64) -> bool {
        let Some(applied) = self.apply(reverts) else { return false };
        let avoided = self.avoided + reverts.iter().map(|r| r.moved).sum::<f64>();
        if applied.cost - self.new_cost > budget(avoided) {
            return false;
        }
        for (r, routes) in reverts.iter().zip(applied.routes) {
            self.routes[r.class] = routes;
            self.kept[r.class] = true;
        }
        self.load = applied.load;
        self.cost = applied.cost;
        self.avoided = avoided;
        true
    }

    /// As [`Mix::try_revert`] for one class whose previous routes overflow some engines: the
    /// classes that move anyway give up what their new split added on those engines, to the
    /// engines with room where it costs them least (network plus the engine's marginal cost).
    /// What those classes move in all never grows: they only take back traffic the new split
    /// moved onto the full engines.
    fn try_revert_making_room(&mut self, revert: &Revert, budget: impl Fn(f64) -> f64) -> bool {
        let (mut routes, mut load, mut kept) = (self.routes.clone(), self.load.clone(), self.kept.clone());
        routes[revert.class] = self.swap_in(revert, &mut load);
        kept[revert.class] = true;
        for j in 0..load.len() {
            let cap = self.curves[j].cap();
            let over = |load: &[f64]| load[j] - cap;
            if over(&load) <= cap * 1e-9 {
                continue;
            }
            self.offload_headroom(revert, &mut routes[revert.class], j, &mut load);
            for k in 0..routes.len() {
                if kept[k] || over(&load) <= cap * 1e-9 {
                    continue;
                }
                let on = |routes: &[Route]| routes.iter().find(|r| r.engine == j).map_or(0.0, |r| r.rps);
                let added = (on(&routes[k]) - self.previous[k].as_deref().map_or(0.0, on)).max(0.0);
                self.offload(&mut routes[k], k, j, added.min(over(&load)), &mut load, true);
            }
            if over(&load) > cap * 1e-9 {
                return false;
            }
        }
        let cost = total_cost(self.problem, self.curves, routes.iter().flatten(), &load);
        let avoided = self.avoided + revert.moved;
        if cost - self.new_cost > budget(avoided) {
            return false;
        }
        (self.routes, self.load, self.kept, self.cost, self.avoided) = (routes, load, kept, cost, avoided);
        true
    }

    /// The mix with `reverts` applied; None if an engine they add load to would go above its
    /// usable capacity even with the headroom they need not fit planned on engines with room.
    fn apply(&self, reverts: &[Revert]) -> Option<Applied> {
        let mut load = self.load.clone();
        let mut routes: Vec<Vec<Route>> = reverts.iter().map(|r| self.swap_in(r, &mut load)).collect();
        for j in 0..load.len() {
            let cap = self.curves[j].cap();
            let over = |load: &[f64]| load[j] - cap;
            if load[j] <= self.load[j] || over(&load) <= cap * 1e-9 {
                continue;
            }
            for (revert, routes) in reverts.iter().zip(&mut routes) {
                self.offload_headroom(revert, routes, j, &mut load);
            }
            if over(&load) > cap * 1e-9 {
                return None;
            }
        }
        let network = |r: &Route| r.rps * self.problem.network_ms.get(r.class, r.engine).unwrap_or(0.0);
        let mut cost = self.cost;
        for (revert, routes) in reverts.iter().zip(&routes) {
            cost += routes.iter().map(network).sum::<f64>()
                - self.routes[revert.class].iter().map(network).sum::<f64>();
        }
        for (j, curve) in self.curves.iter().enumerate() {
            if load[j] != self.load[j] {
                load[j] = load[j].max(0.0);
                cost += curve.cost(load[j]) - curve.cost(self.load[j]);
            }
        }
        Some(Applied { routes, load, cost })
    }

    /// `revert`'s class's previous routes in place of its routes in the mix, in `load`; returns
    /// them.
    fn swap_in(&self, revert: &Revert, load: &mut [f64]) -> Vec<Route> {
        for r in &self.routes[revert.class] {
            load[r.engine] -= r.rps;
        }
        for r in &revert.routes {
            load[r.engine] += r.rps;
        }
        revert.routes.clone()
    }

    /// Moves off engine `j`, as far as it overflows, the part of the headroom that `revert`'s
    /// previous routes put there and need not fit ([`HELD_HEADROOM_SHARE`]); `routes` are the
    /// class's routes in the making, whose weights stay.
    fn offload_headroom(&self, revert: &Revert, routes: &mut Vec<Route>, j: usize, load: &mut [f64]) {
        let served: f64 = revert.routes.iter().map(|r| r.rps).sum();
        let weight = revert.routes.iter().find(|r| r.engine == j).map_or(0.0, |r| r.weight);
        let headroom = self.problem.classes[revert.class].headroom_rps.clamp(0.0, served);
        let own = (HELD_HEADROOM_SHARE * headroom * weight).min(load[j] - self.curves[j].cap());
        self.offload(routes, revert.class, j, own, load, false);
    }

    /// Moves up to `rps` of class `k`'s `routes` off engine `j` to the engines with room where
    /// it costs least (network plus the engine's marginal cost), updating `load`. With
    /// `reweigh`, the class's weights follow its routes (a class that moves anyway); without,
    /// they stay (a class holding its weights, whose headroom this is).
    fn offload(
        &self,
        routes: &mut Vec<Route>,
        k: usize,
        j: usize,
        rps: f64,
        load: &mut [f64],
        reweigh: bool,
    ) {
        let mut left = rps;
        while left > 0.0 {
            let room = |i: usize| self.curves[i].cap() - load[i];
            let cheapest = (0..load.len())
                .filter(|&i| i != j && room(i) > self.curves[i].cap() * 1e-9)
                .filter_map(|i| {
                    Some((self.problem.network_ms.get(k, i)? + self.curves[i].marginal(load[i]), i))
                })
                .min_by(|a, b| a.0.total_cmp(&b.0));
            let Some((_, i)) = cheapest else { return };
            let shift = left.min(room(i));
            shift_route(routes, k, j, i, shift, reweigh);
            load[j] -= shift;
            load[i] += shift;
            left -= shift;
        }
    }
}

/// A class's routes and the engines' load and cost with some reverts applied.
struct Applied {
    /// Per revert, in order: the class's routes.
    routes: Vec<Vec<Route>>,
    load: Vec<f64>,
    cost: f64,
}

/// Σ n·x over `routes` + Σ f(y) over the engines' `load`: the cost the rule compares.
fn total_cost<'r>(
    problem: &Problem,
    curves: &[Curve],
    routes: impl IntoIterator<Item = &'r Route>,
    load: &[f64],
) -> f64 {
    let network: f64 =
        routes.into_iter().map(|r| r.rps * problem.network_ms.get(r.class, r.engine).unwrap_or(0.0)).sum();
    network + load.iter().zip(curves).map(|(y, c)| c.cost(y.max(0.0))).sum::<f64>()
}

/// Moves `rps` of class `k`'s routes (sorted by engine) from engine `from` to engine `to`;
/// with `reweigh`, the weights follow the routes.
fn shift_route(routes: &mut Vec<Route>, k: usize, from: usize, to: usize, rps: f64, reweigh: bool) {
    if let Some(r) = routes.iter_mut().find(|r| r.engine == from) {
        r.rps = (r.rps - rps).max(0.0);
    }
    match routes.iter_mut().find(|r| r.engine == to) {
        Some(r) => r.rps += rps,
        None => {
            let at = routes.partition_point(|r| r.engine < to);
            routes.insert(at, Route { class: k, engine: to, rps, weight: 0.0 });
        }
    }
    if reweigh {
        routes.retain(|r| r.rps > 0.0);
        let total: f64 = routes.iter().map(|r| r.rps).sum();
        for r in routes.iter_mut() {
            r.weight = if total > 0.0 { r.rps / total } else { 0.0 };
        }
    }
}

/// `routes` (sorted by class) as the data planes see them: each class's admitted req/s spread by
/// its weights (a class holding its weights may plan part of its headroom elsewhere).
fn published(routes: &[Route]) -> Vec<Route> {
    let mut out = Vec::with_capacity(routes.len());
    for class in routes.chunk_by(|a, b| a.class == b.class) {
        let admitted: f64 = class.iter().map(|r| r.rps).sum();
        out.extend(class.iter().filter(|r| r.weight > 0.0).map(|r| Route { rps: r.weight * admitted, ..*r }));
    }
    out
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

//! From the certified group routing back to the per-class solution (the reverse of `aggregate`),
//! its flows turned into each class's routes: each group's shedding
//! goes to its members cheapest penalty first (equal penalties in proportion to demand), and its
//! per-engine flows are split among the members in proportion to what each member has served.
//! Every member of a group therefore gets the same weights, which keeps the split as stable as
//! the group routing itself. Also builds the engine-major group routes the next warm start needs.

use crate::aggregate::Aggregation;
use crate::certify::Repaired;
use crate::pass::{Candidates, Model};
use crate::problem::Problem;
use crate::solution::{EnginePlan, Route, Solution};
use crate::warm::OldRoutes;

/// What `disaggregate` needs from the run besides the repaired routing.
pub(crate) struct RunSummary<'r> {
    pub cand: &'r Candidates,
    /// Engine prices q_j.
    pub q: &'r [f64],
    pub steps: usize,
    pub passes: usize,
    pub rebuilds: usize,
    pub epsilon: f64,
    /// The coarse problem's engines and grouped classes (`Solution::coarse_engines` and
    /// `coarse_classes`).
    pub coarse: Option<(usize, Option<usize>)>,
}

/// The per-class solution and the engine-major group routes (group, engine, rps) for the warm
/// start.
pub(crate) fn disaggregate(
    problem: &Problem,
    groups: &Aggregation,
    model: &Model,
    run: RunSummary,
    repaired: &Repaired,
    previous: Option<&OldRoutes>,
) -> (Solution, WarmRoutes) {
    let m = model.n_engines();
    let cand = run.cand;
    let g_routes = GroupRoutes::new(cand, &repaired.x, model.n_classes(), m);
    let (shed_rps, share) = member_shed_and_share(problem, groups, &repaired.shed);
    let routes = class_routes(groups, &g_routes, &share);
    // Group routes engine-major for the next warm start.
    // Branch-free (which entries carry flow is data): each entry is written, the length only
    // advances past those with flow.
    let mut engine_major = vec![(0u32, 0u32, 0.0f64); cand.class.len()];
    let mut len = 0;
    for j in 0..m {
        for e in cand.start[j]..cand.start[j + 1] {
            engine_major[len] = (cand.class[e], j as u32, repaired.x[e]);
            len += usize::from(repaired.x[e] > 0.0);
        }
    }
    engine_major.truncate(len);
    let engines = engine_plans(model, run.q, &repaired.load);
    let total: f64 = model.demand.iter().sum();
    let traffic_moved = previous.map(|old| traffic_moved(old, groups, &g_routes, &share, total));
    let solution = Solution {
        routes,
        shed_rps,
        engines,
        objective: repaired.objective,
        lower_bound: repaired.lower_bound,
        gap: repaired.gap(),
        mean_latency_ms: if total > 0.0 { repaired.objective / total } else { 0.0 },
        traffic_moved,
        newton_steps: run.steps,
        passes: run.passes,
        rebuilds: run.rebuilds,
        epsilon: run.epsilon,
        coarse_engines: run.coarse.map(|c| c.0),
        coarse_classes: run.coarse.and_then(|c| c.1),
    };
    let warm = WarmRoutes { class_group: groups.class_group.clone(), share, routes: engine_major };
    (solution, warm)
}

/// Each group's routes (engine, rps) with positive flow, engines ascending (CSR over groups).
struct GroupRoutes {
    start: Vec<usize>,
    routes: Vec<(u32, f64)>,
}

impl GroupRoutes {
    /// Group routes by group, engines ascending (counting sort of the engine-major entries).
    fn new(cand: &Candidates, x: &[f64], g_count: usize, m: usize) -> GroupRoutes {
        let mut g_start = vec![0usize; g_count + 1];
        // Branch-free here and below: which entries carry flow is data.
        for e in 0..cand.class.len() {
            g_start[cand.class[e] as usize + 1] += usize::from(x[e] > 0.0);
        }
        for g in 0..g_count {
            g_start[g + 1] += g_start[g];
        }
        let mut fill = g_start.clone();
        // One slot more, past the routes: entries without flow are written there.
        let spare = g_start[g_count];
        let mut g_routes = vec![(0u32, 0.0f64); spare + 1];
        for j in 0..m {
            for e in cand.start[j]..cand.start[j + 1] {
                let (g, flows) = (cand.class[e] as usize, x[e] > 0.0);
                g_routes[if flows { fill[g] } else { spare }] = (j as u32, x[e]);
                fill[g] += usize::from(flows);
            }
        }
        g_routes.truncate(spare);
        GroupRoutes { start: g_start, routes: g_routes }
    }

    /// Group `g`'s routes.
    fn of(&self, g: usize) -> &[(u32, f64)] {
        &self.routes[self.start[g]..self.start[g + 1]]
    }
}

/// Members' shed (cheapest first) and served share of their group, per class.
fn member_shed_and_share(
    problem: &Problem,
    groups: &Aggregation,
    group_shed: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let n = problem.classes.len();
    let mut shed_rps = vec![0.0; n];
    let mut share = vec![0.0; n];
    let mut order: Vec<usize> = Vec::new();
    for g in 0..group_shed.len() {
        let members = groups.members(g);
        if members.len() == 1 {
            let k = members[0] as usize;
            shed_rps[k] = group_shed[g];
            share[k] = 1.0;
            continue;
        }
        order.clear();
        order.extend(members.iter().map(|&k| k as usize));
        let penalty = |k: usize| problem.classes[k].shed_penalty_ms;
        order.sort_by(|&a, &b| penalty(a).total_cmp(&penalty(b)).then(a.cmp(&b)));
        let mut left = group_shed[g];
        let mut i = 0;
        while i < order.len() {
            let mut end = i + 1;
            while end < order.len() && penalty(order[end]) == penalty(order[i]) {
                end += 1;
            }
            let tier: f64 = order[i..end].iter().map(|&k| problem.classes[k].demand_rps).sum();
            let take = left.min(tier).max(0.0);
            for &k in &order[i..end] {
                let d = problem.classes[k].demand_rps;
                shed_rps[k] = if tier > 0.0 { (take * d / tier).min(d) } else { 0.0 };
            }
            left -= take;
            i = end;
        }
        let served: f64 =
            members.iter().map(|&k| problem.classes[k as usize].demand_rps - shed_rps[k as usize]).sum();
        for &k in members {
            let k = k as usize;
            share[k] =
                if served > 0.0 { (problem.classes[k].demand_rps - shed_rps[k]) / served } else { 0.0 };
        }
    }
    (shed_rps, share)
}

/// Each class's routes: its group's flows times its share, weighted as its group's.
fn class_routes(groups: &Aggregation, g_routes: &GroupRoutes, share: &[f64]) -> Vec<Route> {
    let n = share.len();
    let count: usize = (0..n)
        .filter(|&k| share[k] > 0.0)
        .map(|k| {
            let g = groups.class_group[k] as usize;
            g_routes.of(g).len()
        })
        .sum();
    let mut routes = Vec::with_capacity(count);
    for k in 0..n {
        let g = groups.class_group[k] as usize;
        if share[k] <= 0.0 {
            continue;
        }
        let entries = g_routes.of(g);
        let total: f64 = entries.iter().map(|r| r.1).sum();
        for &(j, rps) in entries {
            let x = rps * share[k];
            if x > 0.0 {
                routes.push(Route { class: k, engine: j as usize, rps: x, weight: rps / total });
            }
        }
    }
    routes
}

/// Each engine's load, latency and marginal price at the repaired routing (`q` the engine prices).
fn engine_plans(model: &Model, q: &[f64], load: &[f64]) -> Vec<EnginePlan> {
    (0..model.n_engines())
        .map(|j| {
            let load = load[j];
            let curve = &model.curves[j];
            EnginePlan {
                load_rps: load,
                expected_latency_ms: curve.latency(load),
                marginal_price_ms: if model.engine_on[j] { q[j] } else { curve.base_price() },
                capacity_binds: model.engine_on[j] && load >= curve.cap() * (1.0 - 1e-6),
            }
        })
        .collect()
}

/// The share of the total demand `total` whose engine changed since the previous routes.
fn traffic_moved(
    old: &OldRoutes,
    groups: &Aggregation,
    g_routes: &GroupRoutes,
    share: &[f64],
    total: f64,
) -> f64 {
    let mut moved = old.lost_rps;
    for k in 0..share.len() {
        let g = groups.class_group[k] as usize;
        let new = g_routes.of(g);
        let (h, old_share) = match old.of_class[k] {
            Some((h, share)) => (h as usize, share),
            None => {
                moved += share[k] * new.iter().map(|r| r.1).sum::<f64>();
                continue;
            }
        };
        let (engines, rps) =
            (&old.engine[old.start[h]..old.start[h + 1]], &old.rps[old.start[h]..old.start[h + 1]]);
        moved += moved_between(new, share[k], engines, rps, old_share);
    }
    if total > 0.0 {
        moved / 2.0 / total
    } else {
        0.0
    }
}

/// What the next warm start needs from the routing.
pub(crate) struct WarmRoutes {
    pub class_group: Vec<u32>,
    pub share: Vec<f64>,
    /// Group routes (group, engine, rps), engine-major.
    pub routes: Vec<(u32, u32, f64)>,
}

/// Σ_j |a·x_j − b·y_j| over the union of two engine-ascending route lists.
fn moved_between(new: &[(u32, f64)], a: f64, engines: &[u32], rps: &[f64], b: f64) -> f64 {
    let (mut i, mut p, mut moved) = (0, 0, 0.0);
    while i < new.len() || p < engines.len() {
        let je = if i < new.len() { new[i].0 } else { u32::MAX };
        let jp = if p < engines.len() { engines[p] } else { u32::MAX };
        if je == jp {
            moved += (a * new[i].1 - b * rps[p]).abs();
            i += 1;
            p += 1;
        } else if je < jp {
            moved += a * new[i].1;
            i += 1;
        } else {
            moved += b * rps[p];
            p += 1;
        }
    }
    moved
}

//! Where a solve starts: cold prices from one common engine price level, or the previous
//! solve's prices and routes matched by class and engine id; and the traffic moved between the
//! previous routes and the new ones.

use crate::aggregate::Aggregation;
use crate::pass::{Model, PrevRoutes};
use crate::problem::Problem;
use crate::solution::WarmStart;

/// Cold start: one common engine price p0 where supply meets demand: engines supply
/// Σ_j y_j(p0) (their best responses), and the classes that would rather pay n_k + p0 than shed
/// (P_k ≥ nearest n_kj + p0) demand their d_k. Then u_k = min(P_k, nearest n_kj + p0). Under
/// overload this puts p0 near the shed penalty of the marginal priority, where it belongs.
pub(crate) fn cold_prices(model: &Model) -> Vec<f64> {
    let n = model.n_classes();
    let mut nearest = vec![f64::INFINITY; n];
    for j in 0..model.n_engines() {
        if !model.engine_on[j] {
            continue;
        }
        let column = model.network.engine_column(j);
        for k in 0..n {
            nearest[k] = nearest[k].min(column[k]);
        }
    }
    let supply = |p: f64| -> f64 { model.curves.iter().map(|c| c.response(p).0).sum() };
    let demand = |p: f64| -> f64 {
        (0..n).filter(|&k| model.class_on[k]).map(|k| model.willing(k, nearest[k] + p)).sum::<f64>() * 1.05
        // aim a little above: engines near full are priced steeply
    };
    let mut lo = model.curves.iter().map(|c| c.base_price()).fold(f64::INFINITY, f64::min);
    let mut p0 = 0.0;
    if lo.is_finite() {
        let mut hi = lo.max(1.0) * 2.0;
        for _ in 0..200 {
            if supply(hi) >= demand(hi) {
                break;
            }
            lo = hi;
            hi *= 2.0;
        }
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            if supply(mid) < demand(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        p0 = hi;
    }
    (0..n)
        .map(|k| if model.class_on[k] { model.penalty[k].min(nearest[k] + p0) } else { f64::NEG_INFINITY })
        .collect()
}

/// A warm start translated to the indices of the new problem.
pub(crate) struct MappedWarm {
    /// Group prices.
    pub prices: Vec<f64>,
    /// Previous routes per group: the proximal centre.
    pub prev: PrevRoutes,
    /// Previous routes per class (in new indices), for the traffic moved.
    pub prev_classes: PrevRoutes,
    pub epsilon: f64,
    /// Previous rps on classes or engines that no longer exist (it has to move).
    pub lost_rps: f64,
}

fn index_map<'a>(old: &'a [String], new: impl Iterator<Item = &'a str>) -> Vec<Option<usize>> {
    let mut sorted: Vec<(&str, usize)> = new.enumerate().map(|(i, id)| (id, i)).collect();
    sorted.sort_unstable();
    old.iter()
        .map(|id| sorted.binary_search_by(|(s, _)| (*s).cmp(id.as_str())).ok().map(|pos| sorted[pos].1))
        .collect()
}

pub(crate) fn map_warm_start(
    problem: &Problem,
    model: &Model,
    groups: &Aggregation,
    warm: &WarmStart,
) -> MappedWarm {
    let same_classes = warm.class_ids.len() == problem.classes.len()
        && warm.class_ids.iter().zip(&problem.classes).all(|(a, b)| *a == b.id);
    let same_engines = warm.engine_ids.len() == problem.engines.len()
        && warm.engine_ids.iter().zip(&problem.engines).all(|(a, b)| *a == b.id);
    let class_map: Vec<Option<usize>> = if same_classes {
        (0..warm.class_ids.len()).map(Some).collect()
    } else {
        index_map(&warm.class_ids, problem.classes.iter().map(|c| c.id.as_str()))
    };
    let engine_map: Vec<Option<usize>> = if same_engines {
        (0..warm.engine_ids.len()).map(Some).collect()
    } else {
        index_map(&warm.engine_ids, problem.engines.iter().map(|e| e.id.as_str()))
    };
    let group_map: Vec<Option<usize>> =
        class_map.iter().map(|k| k.map(|k| groups.class_group[k] as usize)).collect();
    let mut prices = cold_prices_if_needed(model, warm, &group_map);
    let mut priced = vec![false; model.n_classes()];
    for (old, new) in group_map.iter().enumerate() {
        if let (Some(g), Some(Some(p))) = (new, warm.prices.get(old)) {
            // Members of one group had one price when they were grouped the same way before;
            // otherwise the highest is a fine start.
            if model.class_on[*g] && (!priced[*g] || *p > prices[*g]) {
                prices[*g] = *p;
                priced[*g] = true;
            }
        }
    }
    let mut triples: Vec<(usize, usize, f64)> = Vec::with_capacity(warm.routes.len());
    let mut lost_rps = 0.0;
    for &(k, j, rps) in &warm.routes {
        match (class_map.get(k as usize).copied().flatten(), engine_map.get(j as usize).copied().flatten()) {
            (Some(k), Some(j)) => triples.push((j, k, rps)),
            _ => lost_rps += rps,
        }
    }
    if !(same_classes && same_engines) {
        triples.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    }
    let m = model.n_engines();
    let mut prev_classes = PrevRoutes { start: vec![0; m + 1], class: Vec::new(), rps: Vec::new() };
    for &(j, k, rps) in &triples {
        prev_classes.start[j + 1] += 1;
        prev_classes.class.push(k as u32);
        prev_classes.rps.push(rps);
    }
    for j in 0..m {
        prev_classes.start[j + 1] += prev_classes.start[j];
    }
    let prev = group_routes(&prev_classes, groups);
    MappedWarm { prices, prev, prev_classes, epsilon: warm.epsilon, lost_rps }
}

/// Sums class routes into group routes, engine by engine (groups ascending within an engine).
fn group_routes(classes: &PrevRoutes, groups: &Aggregation) -> PrevRoutes {
    let m = classes.start.len() - 1;
    let mut out = PrevRoutes { start: Vec::with_capacity(m + 1), class: Vec::new(), rps: Vec::new() };
    out.start.push(0);
    let mut scratch: Vec<(u32, f64)> = Vec::new();
    for j in 0..m {
        scratch.clear();
        for p in classes.start[j]..classes.start[j + 1] {
            scratch.push((groups.class_group[classes.class[p] as usize], classes.rps[p]));
        }
        scratch.sort_by_key(|e| e.0);
        for &(g, rps) in &scratch {
            if out.class.len() > out.start[j] && out.class.last() == Some(&g) {
                if let Some(last) = out.rps.last_mut() {
                    *last += rps;
                }
            } else {
                out.class.push(g);
                out.rps.push(rps);
            }
        }
        out.start.push(out.class.len());
    }
    out
}

/// Cold prices for the new problem, computed only when some active class has no old price.
fn cold_prices_if_needed(model: &Model, warm: &WarmStart, class_map: &[Option<usize>]) -> Vec<f64> {
    let n = model.n_classes();
    let mut has_price = vec![false; n];
    for (old, new) in class_map.iter().enumerate() {
        if let (Some(k), Some(Some(_))) = (new, warm.prices.get(old)) {
            has_price[*k] = true;
        }
    }
    if (0..n).all(|k| has_price[k] || !model.class_on[k]) {
        (0..n).map(|_| f64::NEG_INFINITY).collect()
    } else {
        cold_prices(model)
    }
}

/// Σ|x − x_prev| / 2 / Σd, merging two engine-major class route lists (classes ascending within
/// an engine).
pub(crate) fn traffic_moved(new: &PrevRoutes, prev: &PrevRoutes, lost: f64, total_demand: f64) -> f64 {
    if total_demand <= 0.0 {
        return 0.0;
    }
    let mut moved = lost;
    for j in 0..new.start.len() - 1 {
        let (mut e, e_end) = (new.start[j], new.start[j + 1]);
        let (mut p, p_end) = (prev.start[j], prev.start[j + 1]);
        while e < e_end || p < p_end {
            let ke = if e < e_end { new.class[e] } else { u32::MAX };
            let kp = if p < p_end { prev.class[p] } else { u32::MAX };
            if ke == kp {
                moved += (new.rps[e] - prev.rps[p]).abs();
                e += 1;
                p += 1;
            } else if ke < kp {
                moved += new.rps[e];
                e += 1;
            } else {
                moved += prev.rps[p];
                p += 1;
            }
        }
    }
    moved / 2.0 / total_demand
}

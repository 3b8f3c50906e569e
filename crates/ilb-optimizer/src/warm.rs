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
        // A starting point only: 1e-4 relative is far below what the first stage corrects.
        for _ in 0..60 {
            if hi - lo <= 1e-4 * hi {
                break;
            }
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
    /// Previous routes of each class, for the traffic moved.
    pub old: OldRoutes,
    pub epsilon: f64,
}

/// The previous solve's class routes in the new indices: class k sent share⁰_k × X⁰_hj to engine
/// j, h its old group.
pub(crate) struct OldRoutes {
    /// Old group routes by old group (CSR), new engine indices ascending.
    pub start: Vec<usize>,
    pub engine: Vec<u32>,
    pub rps: Vec<f64>,
    /// For each new class: its old group and share, if it existed.
    pub of_class: Vec<Option<(u32, f64)>>,
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

/// Translates the previous solve's warm start to the indices of the new problem, matching
/// classes and engines by id.
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
    let prices = warm_prices(model, warm, &group_map);
    let pairs = GroupPairs::new(problem, groups, warm, &class_map);
    let Translated { mut centre, mut old_routes, lost_rps } = translate_routes(warm, &engine_map, &pairs);
    if same_engines {
        // Engine-major already; only the groups within an engine may be out of order.
        let mut lo = 0;
        while lo < centre.len() {
            let mut hi = lo + 1;
            while hi < centre.len() && centre[hi].0 == centre[lo].0 {
                hi += 1;
            }
            if centre[lo..hi].windows(2).any(|w| w[0].1 > w[1].1) {
                centre[lo..hi].sort_by_key(|c| c.1);
            }
            lo = hi;
        }
    } else {
        centre.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        old_routes.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    }
    let prev = prev_routes(&centre, model.n_engines());
    let old = old_routes_by_group(&old_routes, pairs.old_groups, pairs.of_class, lost_rps);
    MappedWarm { prices, prev, old, epsilon: warm.epsilon }
}

/// The old prices by new group (the cold ones where a group had none).
fn warm_prices(model: &Model, warm: &WarmStart, group_map: &[Option<usize>]) -> Vec<f64> {
    let mut prices = cold_prices_if_needed(model, warm, group_map);
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
    prices
}

/// How much of each old group's routes goes to each new group.
struct GroupPairs {
    old_groups: usize,
    /// (old group, new group, Σ shares), by old group (CSR: `pair_start`).
    pairs: Vec<(u32, u32, f64)>,
    pair_start: Vec<usize>,
    /// Σ shares of each old group's classes, and of those that still exist.
    total_share: Vec<f64>,
    kept_share: Vec<f64>,
    /// For each new class: its old group and share, if it existed.
    of_class: Vec<Option<(u32, f64)>>,
}

impl GroupPairs {
    fn new(
        problem: &Problem,
        groups: &Aggregation,
        warm: &WarmStart,
        class_map: &[Option<usize>],
    ) -> GroupPairs {
        let old_groups =
            warm.class_group.iter().filter(|&&h| h != u32::MAX).map(|&h| h as usize + 1).max().unwrap_or(0);
        let mut total_share = vec![0.0; old_groups];
        let mut pairs: Vec<(u32, u32, f64)> = Vec::new();
        let mut of_class = vec![None; problem.classes.len()];
        for (old, new) in class_map.iter().enumerate() {
            let (h, share) = match (warm.class_group.get(old), warm.share.get(old)) {
                (Some(&h), Some(&share)) if h != u32::MAX && share > 0.0 => (h, share),
                _ => continue,
            };
            total_share[h as usize] += share;
            if let Some(k) = new {
                pairs.push((h, groups.class_group[*k], share));
                of_class[*k] = Some((h, share));
            }
        }
        pairs.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        pairs.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0 && later.1 == earlier.1;
            if same {
                earlier.2 += later.2;
            }
            same
        });
        let mut pair_start = vec![0usize; old_groups + 1];
        for p in &pairs {
            pair_start[p.0 as usize + 1] += 1;
        }
        for h in 0..old_groups {
            pair_start[h + 1] += pair_start[h];
        }
        let mut kept_share = vec![0.0; old_groups];
        for p in &pairs {
            kept_share[p.0 as usize] += p.2;
        }
        GroupPairs { old_groups, pairs, pair_start, total_share, kept_share, of_class }
    }
}

/// The previous routes in new engine indices.
struct Translated {
    /// The group-level proximal centre (engine, new group, rps).
    centre: Vec<(u32, u32, f64)>,
    /// The old group routes (old group, engine, rps).
    old_routes: Vec<(u32, u32, f64)>,
    /// Previous rps on classes or engines that no longer exist.
    lost_rps: f64,
}

fn translate_routes(warm: &WarmStart, engine_map: &[Option<usize>], pairs: &GroupPairs) -> Translated {
    let GroupPairs { old_groups, total_share, kept_share, pair_start, .. } = pairs;
    let mut centre: Vec<(u32, u32, f64)> = Vec::with_capacity(warm.routes.len());
    let mut old_routes: Vec<(u32, u32, f64)> = Vec::with_capacity(warm.routes.len());
    let mut lost_rps = 0.0;
    for &(h, j, rps) in &warm.routes {
        let h = h as usize;
        if h >= *old_groups {
            continue;
        }
        match engine_map.get(j as usize).copied().flatten() {
            Some(j) => {
                lost_rps += rps * (total_share[h] - kept_share[h]).max(0.0);
                old_routes.push((h as u32, j as u32, rps));
                for &(_, g, w) in &pairs.pairs[pair_start[h]..pair_start[h + 1]] {
                    centre.push((j as u32, g, rps * w));
                }
            }
            None => lost_rps += rps * total_share[h],
        }
    }
    Translated { centre, old_routes, lost_rps }
}

/// The proximal centre from the engine-major group-level centre (j, g, rps).
fn prev_routes(centre: &[(u32, u32, f64)], m: usize) -> PrevRoutes {
    let mut prev = PrevRoutes {
        start: vec![0; m + 1],
        class: Vec::with_capacity(centre.len()),
        rps: Vec::with_capacity(centre.len()),
    };
    let mut current = usize::MAX;
    for &(j, g, rps) in centre {
        let j = j as usize;
        if j == current && prev.class.last() == Some(&g) {
            if let Some(last) = prev.rps.last_mut() {
                *last += rps;
            }
            continue;
        }
        current = j;
        prev.class.push(g);
        prev.rps.push(rps);
        prev.start[j + 1] += 1;
    }
    for j in 0..m {
        prev.start[j + 1] += prev.start[j];
    }
    prev
}

/// Old routes (h, j, rps) by old group (stable counting sort keeps engines ascending).
fn old_routes_by_group(
    old_routes: &[(u32, u32, f64)],
    old_groups: usize,
    of_class: Vec<Option<(u32, f64)>>,
    lost_rps: f64,
) -> OldRoutes {
    let mut start = vec![0usize; old_groups + 1];
    for r in old_routes {
        start[r.0 as usize + 1] += 1;
    }
    for h in 0..old_groups {
        start[h + 1] += start[h];
    }
    let mut fill = start.clone();
    let mut engine = vec![0u32; old_routes.len()];
    let mut rps = vec![0.0; old_routes.len()];
    for r in old_routes {
        let i = &mut fill[r.0 as usize];
        engine[*i] = r.1;
        rps[*i] = r.2;
        *i += 1;
    }
    OldRoutes { start, engine, rps, of_class, lost_rps }
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

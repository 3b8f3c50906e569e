//! Turning the dual iterate into a published answer: repair the primal (demand met exactly,
//! capacity respected, any remainder shed), evaluate its true objective, and compute the
//! Lagrangian lower bound at the engine prices, which certifies the gap.

use crate::pass::{Candidates, Model, Pass};

/// A feasible routing in candidate-entry form.
pub(crate) struct Repaired {
    /// Flow of each candidate entry.
    pub x: Vec<f64>,
    pub shed: Vec<f64>,
    pub load: Vec<f64>,
    pub objective: f64,
    pub lower_bound: f64,
}

impl Repaired {
    pub fn gap(&self) -> f64 {
        relative_gap(self.objective, self.lower_bound)
    }
}

pub(crate) fn relative_gap(objective: f64, lower_bound: f64) -> f64 {
    if objective <= 0.0 {
        0.0
    } else {
        ((objective - lower_bound) / objective).max(0.0)
    }
}

/// Repairs the pass's flows into a feasible routing and certifies it.
///
/// Flows below `min_fraction` of their class demand are dropped first (a control plane does not
/// want 1e-9 weights). Then a class that receives too much is scaled down; a class short of its
/// demand is topped up on its candidate engines in order of n_kj + q_j while they have spare
/// capacity, and shed beyond that.
pub(crate) fn repair(
    model: &Model,
    cand: &Candidates,
    pass: &Pass,
    u: &[f64],
    eps: f64,
    min_fraction: f64,
) -> Repaired {
    let mut x = pass.x.clone();
    let mut shed = pass.shed.clone();
    let mut flow = drop_small_flows(model, cand, &mut x, min_fraction);
    let scale = scale_down_classes(model, &flow, &mut shed);
    let mut load = fit_engines(model, cand, &mut x, &scale, &mut flow);
    let missing = top_up_used_engines(model, cand, pass, &mut x, &shed, &mut flow, &mut load);
    top_up_or_shed(model, cand, pass, &mut x, &mut shed, &mut load, &missing);
    let objective = objective(model, cand, &x, &load, &shed);
    let lower_bound = lower_bound(model, cand, pass, u, eps);
    Repaired { x, shed, load, objective, lower_bound }
}

/// Drops the flows below `min_fraction` of their class demand; returns each class's flow.
fn drop_small_flows(model: &Model, cand: &Candidates, x: &mut [f64], min_fraction: f64) -> Vec<f64> {
    let mut flow = vec![0.0; model.n_classes()];
    // The loops of the repair walk the entries' slices together (indexing each array per entry
    // was a third of the repair).
    let drop_below: Vec<f64> = model.demand.iter().map(|&d| min_fraction * d).collect();
    for (v, &k) in x.iter_mut().zip(&cand.class) {
        let k = k as usize;
        // A select, not a branch: most entries carry no flow, which ones is data.
        *v = if *v < drop_below[k] { 0.0 } else { *v };
        flow[k] += *v;
    }
    flow
}

/// Scales down classes that receive more than their demand (flow and shed): returns each
/// class's factor, with its shed scaled already.
fn scale_down_classes(model: &Model, flow: &[f64], shed: &mut [f64]) -> Vec<f64> {
    let n = model.n_classes();
    let mut scale = vec![1.0; n];
    for k in 0..n {
        let d = model.demand[k];
        if !model.class_on[k] {
            shed[k] = 0.0;
            continue;
        }
        shed[k] = shed[k].min(d);
        let total = flow[k] + shed[k];
        if total > d {
            scale[k] = d / total;
            shed[k] *= scale[k];
        }
    }
    scale
}

/// Applies the classes' `scale`, then shrinks engines above their usable capacity (by rounding
/// in the per-engine solve); recomputes `flow` and returns each engine's load.
fn fit_engines(model: &Model, cand: &Candidates, x: &mut [f64], scale: &[f64], flow: &mut [f64]) -> Vec<f64> {
    let m = model.n_engines();
    let mut load = vec![0.0; m];
    flow.iter_mut().for_each(|f| *f = 0.0);
    for j in 0..m {
        let (lo, hi) = (cand.start[j], cand.start[j + 1]);
        let (xs, classes) = (&mut x[lo..hi], &cand.class[lo..hi]);
        let mut engine_load = 0.0;
        for (v, &k) in xs.iter_mut().zip(classes) {
            *v *= scale[k as usize];
            engine_load += *v;
        }
        let cap = model.curves[j].cap();
        if engine_load > cap {
            let shrink = cap / engine_load;
            engine_load = 0.0;
            for v in xs.iter_mut() {
                *v = (*v * shrink).min(cap - engine_load).max(0.0);
                engine_load += *v;
            }
        }
        for (v, &k) in xs.iter().zip(classes) {
            flow[k as usize] += *v;
        }
        load[j] = engine_load;
    }
    load
}

/// Tops up short classes first on the engines they already use (at near-optimal prices those
/// all cost about u_k, so their order hardly matters): one pass, no sorting. Returns what each
/// class still misses.
fn top_up_used_engines(
    model: &Model,
    cand: &Candidates,
    pass: &Pass,
    x: &mut [f64],
    shed: &[f64],
    flow: &mut [f64],
    load: &mut [f64],
) -> Vec<f64> {
    let n = model.n_classes();
    let mut missing: Vec<f64> =
        (0..n).map(|k| if model.class_on[k] { model.demand[k] - flow[k] - shed[k] } else { 0.0 }).collect();
    if missing.iter().any(|&v| v > 0.0) {
        for j in 0..model.n_engines() {
            let cap = model.curves[j].cap();
            // A full engine takes nothing (its load only grows below): under overload most are.
            if load[j] < cap {
                let (lo, hi) = (cand.start[j], cand.start[j + 1]);
                let mut engine_load = load[j];
                for ((v, &k), &net) in x[lo..hi].iter_mut().zip(&cand.class[lo..hi]).zip(&cand.net[lo..hi]) {
                    let k = k as usize;
                    if missing[k] > 0.0 && *v > 0.0 && engine_load < cap {
                        let price = net + pass.q[j];
                        if price < model.marginal_penalty(k, shed[k] + missing[k]) {
                            let add = missing[k].min(cap - engine_load);
                            *v += add;
                            engine_load += add;
                            flow[k] += add;
                            missing[k] -= add;
                        }
                    }
                }
                load[j] = engine_load;
            }
        }
    }
    missing
}

/// Tops up the classes still short on their cheapest candidate engines with spare capacity
/// while that costs less than shedding, and sheds the rest.
fn top_up_or_shed(
    model: &Model,
    cand: &Candidates,
    pass: &Pass,
    x: &mut [f64],
    shed: &mut [f64],
    load: &mut [f64],
    missing: &[f64],
) {
    let n = model.n_classes();
    let short: Vec<usize> = (0..n).filter(|&k| model.class_on[k] && missing[k] > 0.0).collect();
    if short.is_empty() {
        return;
    }
    // Class → entries index, only needed when some class is short.
    let mut by_class: Vec<Vec<(f64, usize, usize)>> = vec![Vec::new(); n];
    // Only entries cheaper than the largest marginal penalty a class can reach (the one at
    // its current shortfall; topping up only lowers it) and with spare capacity can be used.
    let mut threshold = vec![f64::NEG_INFINITY; n];
    for &k in &short {
        threshold[k] = model.marginal_penalty(k, shed[k] + missing[k]);
    }
    for j in 0..model.n_engines() {
        if load[j] >= model.curves[j].cap() {
            continue;
        }
        for e in cand.start[j]..cand.start[j + 1] {
            let k = cand.class[e] as usize;
            let price = cand.net[e] + pass.q[j];
            if price < threshold[k] {
                by_class[k].push((price, j, e));
            }
        }
    }
    for &k in &short {
        let mut missing = missing[k];
        by_class[k].sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for &(price, j, e) in &by_class[k] {
            if missing <= 0.0 || price >= model.marginal_penalty(k, shed[k] + missing) {
                break;
            }
            let add = missing.min(model.curves[j].cap() - load[j]).max(0.0);
            x[e] += add;
            load[j] += add;
            missing -= add;
        }
        shed[k] += missing.max(0.0);
    }
}

/// The true objective of a routing: Σ n·x + Σ_j cost_j(load_j) + Σ_k shed cost.
fn objective(model: &Model, cand: &Candidates, x: &[f64], load: &[f64], shed: &[f64]) -> f64 {
    let mut objective = 0.0;
    for j in 0..model.n_engines() {
        let (lo, hi) = (cand.start[j], cand.start[j + 1]);
        for (&net, &v) in cand.net[lo..hi].iter().zip(&x[lo..hi]) {
            objective += net * v;
        }
        objective += model.curves[j].cost(load[j]);
    }
    for k in 0..model.n_classes() {
        objective += model.shed_cost(k, shed[k]);
    }
    objective
}

/// The Lagrangian bound at engine prices p = q:
/// Σ_k d_k·min(P_k, min_j (n_kj + p_j)) − Σ_j f_j*(p_j), valid for any p.
///
/// The inner minimum is taken over candidate engines only; every other engine has
/// n_kj + q_j ≥ u_k + width − δ − ερ (crate README; δ the spread of the price changes since the
/// lists were built, `Candidates::drift`), so that number, when it is smaller, is used instead and
/// the bound stays valid.
fn lower_bound(model: &Model, cand: &Candidates, pass: &Pass, u: &[f64], eps: f64) -> f64 {
    let outside_margin = cand.width - cand.drift(u) - eps * model.rho;
    let best_route = pass.best_routes(model, cand);
    let mut bound = 0.0;
    for k in 0..model.n_classes() {
        if !model.class_on[k] {
            continue;
        }
        let outside = u[k] + outside_margin;
        bound += model.bound_term(k, best_route[k].min(outside));
    }
    for j in 0..model.n_engines() {
        if model.engine_on[j] {
            bound += model.curves[j].neg_conjugate(pass.q[j]);
        }
    }
    bound
}

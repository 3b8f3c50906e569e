//! One pass of the dual method over the engines: given class prices u, every engine's best
//! response in closed form (a water-filling of its candidate classes against its marginal cost),
//! the smoothed dual value, its gradient and the Newton matrix.
//!
//! Candidate lists keep a pass from scanning the whole N × M matrix: an engine only looks at the
//! classes whose reduced cost u_k − n_kj was within `width` of its best one when the lists were
//! built at prices `base_u`. While no price has moved by more than `(width − 2ερ)/2` since, no
//! other class can receive flow (proof in the crate README), so the pass is exact.

use crate::aggregate::Aggregation;
use crate::curve::Curve;
use crate::problem::{NetworkMatrix, Problem};

/// Previous routes, engine-major with classes sorted within an engine: the proximal centre.
#[derive(Clone, Debug, Default)]
pub(crate) struct PrevRoutes {
    pub start: Vec<usize>,
    pub class: Vec<u32>,
    pub rps: Vec<f64>,
}

/// The fixed data of one solve, in group space: "class" below means a group of merged classes
/// (see `aggregate`), which is one class when nothing merges.
pub(crate) struct Model<'a> {
    /// Group × engine network latency.
    pub network: &'a NetworkMatrix,
    pub curves: Vec<Curve>,
    /// Group demand: the sum of its members'.
    pub demand: Vec<f64>,
    /// Largest shed penalty among a group's members.
    pub penalty: Vec<f64>,
    /// Members' (shed penalty, demand), penalty ascending, per group (CSR).
    pub tier_start: Vec<usize>,
    pub tiers: Vec<(f64, f64)>,
    /// Groups with positive demand: the only ones with a price.
    pub class_on: Vec<bool>,
    /// Engines with positive capacity: the only ones that take load.
    pub engine_on: Vec<bool>,
    /// c_j, the scale of engine j's smoothing term ε/(2c_j)·Σ_k (x_kj − x⁰_kj)².
    pub capacity: Vec<f64>,
    pub rho: f64,
}

impl<'a> Model<'a> {
    pub fn new(problem: &Problem, groups: &'a Aggregation) -> Self {
        let curves: Vec<Curve> =
            problem.engines.iter().map(|e| Curve::new(&e.latency, e.capacity_rps, problem.rho)).collect();
        let engine_on = curves.iter().map(|c| c.cap() > 0.0).collect();
        let g_count = groups.n_groups();
        let mut tier_start = Vec::with_capacity(g_count + 1);
        let mut tiers = Vec::with_capacity(problem.classes.len());
        tier_start.push(0);
        for g in 0..g_count {
            let first = tiers.len();
            for &k in groups.members(g) {
                let class = &problem.classes[k as usize];
                tiers.push((class.shed_penalty_ms, class.demand_rps));
            }
            tiers[first..].sort_by(|a, b| a.0.total_cmp(&b.0));
            tier_start.push(tiers.len());
        }
        let demand: Vec<f64> =
            (0..g_count).map(|g| tiers[tier_start[g]..tier_start[g + 1]].iter().map(|t| t.1).sum()).collect();
        Model {
            network: &groups.network,
            penalty: (0..g_count).map(|g| tiers[tier_start[g + 1] - 1].0).collect(),
            class_on: demand.iter().map(|&d| d > 0.0).collect(),
            demand,
            tier_start,
            tiers,
            engine_on,
            capacity: problem.engines.iter().map(|e| e.capacity_rps).collect(),
            curves,
            rho: problem.rho,
        }
    }

    pub fn n_classes(&self) -> usize {
        self.demand.len()
    }

    pub fn n_engines(&self) -> usize {
        self.curves.len()
    }

    fn tiers(&self, k: usize) -> &[(f64, f64)] {
        &self.tiers[self.tier_start[k]..self.tier_start[k + 1]]
    }

    /// Smoothed shedding of group k at price u: member i sheds s_i = argmax over [0, d_i] of
    /// (u − P_i)·s − ε·s²/(2d_i), i.e. d_i·(u − P_i)₊/ε capped at d_i. The cap is what makes the
    /// group exact (a member cannot shed more than its demand); the top member is left uncapped,
    /// as a lone class is, so that over-shedding shows in the gradient and pulls u back. Returns
    /// the shed rate, the smoothing conjugate Σ_i max_s (…) and d(shed)/du.
    /// The fourth value is the smoothing part alone, ε·s_i²/(2d_i) summed.
    pub fn shed(&self, k: usize, u: f64, eps: f64) -> (f64, f64, f64, f64) {
        let (mut shed, mut value, mut slope, mut smoothing) = (0.0, 0.0, 0.0, 0.0);
        let tiers = self.tiers(k);
        for (i, &(p, d)) in tiers.iter().enumerate() {
            if u <= p {
                break;
            }
            let over = u - p;
            if over >= eps && i + 1 < tiers.len() {
                shed += d;
                value += d * (over - 0.5 * eps);
                smoothing += 0.5 * eps * d;
            } else {
                shed += d * over / eps;
                value += 0.5 * d * over * over / eps;
                smoothing += 0.5 * d * over * over / eps;
                slope += d / eps;
            }
        }
        (shed, value, slope, smoothing)
    }

    /// Demand of group k's members that would rather pay `price` than be shed.
    pub fn willing(&self, k: usize, price: f64) -> f64 {
        self.tiers(k).iter().filter(|t| t.0 >= price).map(|t| t.1).sum()
    }

    /// Φ_k(s): the cost of shedding s req/s of group k, cheapest members first.
    pub fn shed_cost(&self, k: usize, s: f64) -> f64 {
        let (mut left, mut cost) = (s, 0.0);
        for &(p, d) in self.tiers(k) {
            let take = left.min(d);
            cost += p * take;
            left -= take;
            if left <= 0.0 {
                break;
            }
        }
        // Rounding beyond the total demand is charged at the top penalty.
        cost + left.max(0.0) * self.penalty[k]
    }

    /// The penalty of the last unit when s req/s of group k are shed cheapest first.
    pub fn marginal_penalty(&self, k: usize, s: f64) -> f64 {
        let mut cumulative = 0.0;
        for &(p, d) in self.tiers(k) {
            cumulative += d;
            if cumulative >= s {
                return p;
            }
        }
        self.penalty[k]
    }

    /// Σ_i d_i·min(P_i, price): group k's term of the Lagrangian bound at route price `price`.
    pub fn bound_term(&self, k: usize, price: f64) -> f64 {
        self.tiers(k).iter().map(|&(p, d)| d * p.min(price)).sum()
    }

    /// The smallest member shed penalty above u (+∞ if none): the next kink of the dual in u_k.
    pub fn next_penalty(&self, k: usize, u: f64) -> f64 {
        self.tiers(k).iter().map(|t| t.0).find(|&p| p > u).unwrap_or(f64::INFINITY)
    }
}

/// Per-engine candidate classes (CSR), valid around `base_u`.
#[derive(Default)]
pub(crate) struct Candidates {
    pub start: Vec<usize>,
    pub class: Vec<u32>,
    pub net: Vec<f64>,
    /// Proximal centre x⁰ of each entry (0 when cold).
    pub prev: Vec<f64>,
    pub base_u: Vec<f64>,
    pub width: f64,
}

impl Candidates {
    /// Rebuilds the lists around prices `u`: one full scan of the network matrix.
    pub fn rebuild(&mut self, model: &Model, u: &[f64], width: f64, prev: &PrevRoutes) {
        self.start.clear();
        self.class.clear();
        self.net.clear();
        self.prev.clear();
        self.base_u.clear();
        self.base_u.extend_from_slice(u);
        self.width = width;
        let n = model.n_classes();
        let have_prev = !prev.start.is_empty();
        self.start.push(0);
        for j in 0..model.n_engines() {
            if model.engine_on[j] && n > 0 {
                let column = model.network.engine_column(j);
                // Forbidden pairs are +∞ and classes without demand have u = −∞.
                let threshold = best_reduced_cost(u, column) - width;
                let (p_lo, p_hi) = if have_prev { (prev.start[j], prev.start[j + 1]) } else { (0, 0) };
                let allowed = |k: usize| column[k].is_finite() && model.class_on[k];
                if p_lo == p_hi {
                    // Hot: one compare per pair, the few that pass are checked.
                    for k in 0..n {
                        if u[k] - column[k] >= threshold && allowed(k) {
                            self.class.push(k as u32);
                            self.net.push(column[k]);
                            self.prev.push(0.0);
                        }
                    }
                } else {
                    // Merge the pairs within the window with the previous routes (both by class).
                    let mut p = p_lo;
                    let emit = |cand: &mut Self, k: usize, x_prev: f64| {
                        if allowed(k) {
                            cand.class.push(k as u32);
                            cand.net.push(column[k]);
                            cand.prev.push(x_prev);
                        }
                    };
                    for k in 0..n {
                        if u[k] - column[k] < threshold {
                            continue;
                        }
                        while p < p_hi && (prev.class[p] as usize) < k {
                            if prev.rps[p] > 0.0 {
                                emit(self, prev.class[p] as usize, prev.rps[p]);
                            }
                            p += 1;
                        }
                        let mut x_prev = 0.0;
                        if p < p_hi && prev.class[p] as usize == k {
                            x_prev = prev.rps[p];
                            p += 1;
                        }
                        emit(self, k, x_prev);
                    }
                    for p in p..p_hi {
                        if prev.rps[p] > 0.0 {
                            emit(self, prev.class[p] as usize, prev.rps[p]);
                        }
                    }
                }
            }
            self.start.push(self.class.len());
        }
    }

    /// Largest price move since the lists were built.
    pub fn drift(&self, u: &[f64]) -> f64 {
        u.iter()
            .zip(&self.base_u)
            .filter(|(a, _)| a.is_finite())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max)
    }
}

/// max_k (u_k − n_kj) over one engine's column (exact: a maximum does not round, so the
/// four-lane order gives the same value as a sequential scan).
fn best_reduced_cost(u: &[f64], column: &[f64]) -> f64 {
    let mut lanes = [f64::NEG_INFINITY; 4];
    let (cu, cc) = (u.chunks_exact(4), column.chunks_exact(4));
    let (ru, rc) = (cu.remainder(), cc.remainder());
    for (a, b) in cu.zip(cc) {
        for i in 0..4 {
            let r = a[i] - b[i];
            lanes[i] = if r > lanes[i] { r } else { lanes[i] };
        }
    }
    let mut best = lanes[0].max(lanes[1]).max(lanes[2].max(lanes[3]));
    for (a, b) in ru.iter().zip(rc) {
        best = best.max(a - b);
    }
    best
}

/// Everything one pass computes.
#[derive(Default)]
pub(crate) struct Pass {
    /// Flow of each candidate entry.
    pub x: Vec<f64>,
    /// Engine price q_j = marginal cost at its load (its base price when idle).
    pub q: Vec<f64>,
    pub load: Vec<f64>,
    /// dy/dq of the engine's best response at q_j (0 when capacity binds).
    pub slope: Vec<f64>,
    pub flow: Vec<f64>,
    pub shed: Vec<f64>,
    pub grad: Vec<f64>,
    /// min over candidate engines of n_kj + q_j (for the bound and for idle classes).
    pub best_route: Vec<f64>,
    /// Smoothed dual value.
    pub dual: f64,
    /// Σ_k |grad_k| / Σ_k d_k.
    pub residual: f64,
    /// The smoothing terms at the pass's flows: Σ_j ε/(2c_j)·Σ_k (x_kj − x⁰_kj)² plus shedding's.
    /// At the smoothed optimum this bounds how far smoothing keeps the routing from optimal.
    pub smoothing: f64,
    scratch: Vec<f64>,
}

impl Pass {
    pub fn run(&mut self, model: &Model, cand: &Candidates, u: &[f64], eps: f64) {
        let (n, m) = (model.n_classes(), model.n_engines());
        self.x.clear();
        self.x.resize(cand.class.len(), 0.0);
        self.q.resize(m, 0.0);
        self.load.clear();
        self.load.resize(m, 0.0);
        self.slope.clear();
        self.slope.resize(m, 0.0);
        self.flow.clear();
        self.flow.resize(n, 0.0);
        self.best_route.clear();
        self.best_route.resize(n, f64::INFINITY);
        let mut engines_value = 0.0;
        let mut smoothing = 0.0;
        for j in 0..m {
            if !model.engine_on[j] {
                continue;
            }
            let (lo, hi) = (cand.start[j], cand.start[j + 1]);
            let curve = &model.curves[j];
            let k_j = model.capacity[j] / eps;
            let (q, slope) = solve_engine(
                curve,
                k_j,
                u,
                &cand.class[lo..hi],
                &cand.net[lo..hi],
                &cand.prev[lo..hi],
                self.q[j],
                &mut self.scratch,
            );
            let mut load = 0.0;
            let mut value = 0.0;
            let mut quad = 0.0;
            for e in lo..hi {
                let k = cand.class[e] as usize;
                let r = u[k] - cand.net[e];
                let x = (k_j * (r + cand.prev[e] / k_j - q)).max(0.0);
                self.x[e] = x;
                load += x;
                self.flow[k] += x;
                let d = x - cand.prev[e];
                value += r * x;
                quad += d * d;
                self.best_route[k] = self.best_route[k].min(cand.net[e] + q);
            }
            value -= curve.cost(load) + 0.5 * quad / k_j;
            smoothing += 0.5 * quad / k_j;
            engines_value += value;
            self.q[j] = q;
            self.load[j] = load;
            self.slope[j] = slope;
        }
        self.shed.clear();
        self.shed.resize(n, 0.0);
        self.grad.clear();
        self.grad.resize(n, 0.0);
        let mut classes_value = 0.0;
        let mut abs_grad = 0.0;
        let mut total = 0.0;
        for k in 0..n {
            if !model.class_on[k] {
                continue;
            }
            let d = model.demand[k];
            let (shed, conjugate, _, shed_smoothing) = model.shed(k, u[k], eps);
            self.shed[k] = shed;
            classes_value += d * u[k] - conjugate;
            smoothing += shed_smoothing;
            self.grad[k] = d - self.shed[k] - self.flow[k];
            abs_grad += self.grad[k].abs();
            total += d;
        }
        self.dual = classes_value - engines_value;
        self.smoothing = smoothing;
        self.residual = if total > 0.0 { abs_grad / total } else { 0.0 };
    }

    /// Adds −∇²(smoothed dual) to `h` (n × n, row-major, zeroed by the caller).
    pub fn add_hessian(&self, model: &Model, cand: &Candidates, u: &[f64], eps: f64, h: &mut [f64]) {
        let n = model.n_classes();
        let mut active: Vec<usize> = Vec::new();
        for j in 0..model.n_engines() {
            if self.load[j] <= 0.0 {
                continue;
            }
            active.clear();
            active.extend(
                (cand.start[j]..cand.start[j + 1])
                    .filter(|&e| self.x[e] > 0.0)
                    .map(|e| cand.class[e] as usize),
            );
            let k_j = model.capacity[j] / eps;
            // Derivative of the water-filling: dx_a/du_b = k_j (δ_ab − α), α = 1/(|A| + γ/k_j).
            let alpha = 1.0 / (active.len() as f64 + self.slope[j] / k_j);
            let off = k_j * alpha;
            for &a in &active {
                h[a * n + a] += k_j;
                for &b in &active {
                    h[a * n + b] -= off;
                }
            }
        }
        for k in 0..n {
            if model.class_on[k] {
                h[k * n + k] += model.shed(k, u[k], eps).2;
            }
        }
    }
}

/// Solves engine j's water-filling for its price q: load(q) = k_j·Σ_i (r'_i − q)₊ with
/// r'_i = u_k − n_kj + x⁰_i/k_j, where load(q) is the engine's best response. The reduced costs
/// are sorted once; the active count is found by walking the breakpoints, and the smooth
/// equation on that piece is solved by Newton's method kept inside its bracket (O(1) per step
/// thanks to the prefix sum).
#[allow(clippy::too_many_arguments)] // one engine's slices of the candidate lists
fn solve_engine(
    curve: &Curve,
    k_j: f64,
    u: &[f64],
    class: &[u32],
    net: &[f64],
    prev: &[f64],
    hint: f64,
    scratch: &mut Vec<f64>,
) -> (f64, f64) {
    let base = curve.base_price();
    scratch.clear();
    scratch.extend((0..class.len()).map(|i| u[class[i] as usize] - net[i] + prev[i] / k_j));
    let top = scratch.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if top <= base {
        return (base, curve.response(base).1);
    }
    // Only classes within cap/k_j (= ερ) of the best can get flow: x_top = k_j (top − q) ≤ cap.
    // Dropping the rest first keeps the sort short when many classes tie at an engine's window.
    let floor = (top - curve.cap() / k_j).max(base);
    scratch.retain(|&r| r > floor);
    scratch.sort_unstable_by(|a, b| b.total_cmp(a));
    // Find m ≥ 1 with the root in [max(r_m, base), r_{m−1}] (r sorted descending, r_len = −∞).
    // φ(q) = Y(q) − k_j·Σ_{i<m}(r_i − q) is increasing, so the piece is found by walking the
    // breakpoints; the walk starts at the hint's piece (the previous pass's price), where the
    // root usually still is, instead of at the top: one curve evaluation instead of one per class.
    let phi = |q: f64, m: usize, sum: f64| curve.response(q).0 - k_j * (sum - m as f64 * q);
    let (mut m, mut sum) = (1, scratch[0]);
    // The curve at the hint, kept for Newton's first iterate (usually the hint itself).
    let mut at_hint = None;
    if hint > base && hint < scratch[0] {
        while m < scratch.len() && scratch[m] > hint {
            sum += scratch[m];
            m += 1;
        }
        let response = curve.response(hint);
        at_hint = Some(response);
        if response.0 - k_j * (sum - m as f64 * hint) > 0.0 {
            while m < scratch.len() && scratch[m] > base && phi(scratch[m], m, sum) > 0.0 {
                sum += scratch[m];
                m += 1;
            }
        } else {
            while m > 1 && phi(scratch[m - 1], m, sum) < 0.0 {
                m -= 1;
                sum -= scratch[m];
            }
        }
    } else {
        while m < scratch.len() && scratch[m] > base && phi(scratch[m], m, sum) > 0.0 {
            sum += scratch[m];
            m += 1;
        }
    }
    let count = m as f64;
    let mut lo = if m < scratch.len() { scratch[m].max(base) } else { base };
    let mut hi = scratch[m - 1];
    let mut q = if hint > lo && hint < hi { hint } else { lo };
    let tolerance = 1e-12 * curve.cap().max(1e-9);
    for _ in 0..100 {
        let (y, dy) = match at_hint.take() {
            Some(response) if q == hint => response,
            _ => curve.response(q),
        };
        let value = y - k_j * (sum - count * q);
        if value.abs() <= tolerance {
            return (q, dy);
        }
        if value < 0.0 {
            lo = q;
        } else {
            hi = q;
        }
        let newton = q - value / (dy + k_j * count);
        q = if newton > lo && newton < hi { newton } else { 0.5 * (lo + hi) };
        if hi - lo <= 1e-14 * hi.abs().max(1.0) {
            break;
        }
    }
    (q, curve.response(q).1)
}

//! One pass of the dual method over the engines: given class prices u, every engine's best
//! response in closed form (a water-filling of its candidate classes against its marginal cost),
//! the smoothed dual value, its gradient and the Newton matrix.
//!
//! Candidate lists keep a pass from scanning the whole N × M matrix: an engine only looks at the
//! classes whose reduced cost u_k − n_kj was within `width` of its best one when the lists were
//! built at prices `base_u`. While the spread of the price changes since then (the largest
//! change less the smallest, [`Candidates::drift`]) stays below `width − ερ`, no other class can
//! receive flow (proof in the crate README), so the pass is exact.

use std::sync::Arc;

use crate::aggregate::Aggregation;
use crate::curve::Curve;
use crate::problem::{Latency, NetworkMatrix, Problem, PREFETCH_AHEAD};

/// The engines' processed curves with the inputs they were built from (ρ, and each engine's
/// capacity and latency, as bits). A warm start keeps them, and the next solve reuses them when
/// its engines are the same bit for bit: building 5,000 curves (convex envelopes of the fitted
/// points) was a twelfth of a warm re-solve.
#[derive(Debug)]
pub(crate) struct EngineCurves {
    inputs: Vec<u64>,
    pub curves: Arc<Vec<Curve>>,
}

impl EngineCurves {
    /// The curves of `problem`'s engines: `previous` ones if they were built from the same input.
    pub fn for_problem(problem: &Problem, previous: Option<&Arc<EngineCurves>>) -> Arc<EngineCurves> {
        let inputs = encode_inputs(problem, previous.map_or(0, |p| p.inputs.len()));
        if let Some(previous) = previous.filter(|p| p.inputs == inputs) {
            return Arc::clone(previous);
        }
        let curves =
            problem.engines.iter().map(|e| Curve::new(&e.latency, e.capacity_rps, problem.rho)).collect();
        Arc::new(EngineCurves { inputs, curves: Arc::new(curves) })
    }
}

/// Everything the curves are built from, as bits: ρ, then per engine its capacity and either
/// (0, t0, b) or (1, point count, the points).
fn encode_inputs(problem: &Problem, capacity: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(capacity.max(1 + 4 * problem.engines.len()));
    out.push(problem.rho.to_bits());
    for e in &problem.engines {
        out.push(e.capacity_rps.to_bits());
        match &e.latency {
            Latency::Queueing { t0_ms, b_ms } => out.extend([0, t0_ms.to_bits(), b_ms.to_bits()]),
            Latency::Piecewise(points) => {
                out.extend([1, points.len() as u64]);
                out.extend(points.iter().flat_map(|p| [p[0].to_bits(), p[1].to_bits()]));
            }
        }
    }
    out
}

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
    pub curves: Arc<Vec<Curve>>,
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
    pub fn new(problem: &Problem, groups: &'a Aggregation, curves: &EngineCurves) -> Self {
        let g_count = groups.n_groups();
        let mut tier_start = Vec::with_capacity(g_count + 1);
        let mut tiers = Vec::with_capacity(problem.classes.len());
        tier_start.push(0);
        for g in 0..g_count {
            let members = groups.members(g).iter().map(|&k| &problem.classes[k as usize]);
            tiers.extend(members.map(|class| (class.shed_penalty_ms, class.demand_rps)));
            tier_start.push(tiers.len());
        }
        let capacity = problem.engines.iter().map(|e| e.capacity_rps).collect();
        Model::from_tiers(
            &groups.network,
            Arc::clone(&curves.curves),
            tier_start,
            tiers,
            capacity,
            problem.rho,
        )
    }

    /// The model of the groups whose members are `tiers` (shed penalty, demand; CSR by
    /// `tier_start`), sorted here by penalty within each group; a group's demand, top penalty
    /// and whether it has a price follow from them, and which engines take load from `curves`.
    pub fn from_tiers(
        network: &'a NetworkMatrix,
        curves: Arc<Vec<Curve>>,
        tier_start: Vec<usize>,
        mut tiers: Vec<(f64, f64)>,
        capacity: Vec<f64>,
        rho: f64,
    ) -> Self {
        let g_count = tier_start.len() - 1;
        for g in 0..g_count {
            tiers[tier_start[g]..tier_start[g + 1]].sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let demand: Vec<f64> =
            (0..g_count).map(|g| tiers[tier_start[g]..tier_start[g + 1]].iter().map(|t| t.1).sum()).collect();
        Model {
            network,
            penalty: (0..g_count).map(|g| tiers[tier_start[g + 1] - 1].0).collect(),
            class_on: demand.iter().map(|&d| d > 0.0).collect(),
            engine_on: curves.iter().map(|c| c.cap() > 0.0).collect(),
            demand,
            tier_start,
            tiers,
            capacity,
            curves,
            rho,
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

    /// ∂(shed)/∂ε of group k at price u: −s_i/ε summed over the members whose smoothed shed is
    /// not capped at their demand (the capped ones do not move with ε).
    pub fn shed_eps_slope(&self, k: usize, u: f64, eps: f64) -> f64 {
        let tiers = self.tiers(k);
        let mut slope = 0.0;
        for (i, &(p, d)) in tiers.iter().enumerate() {
            if u <= p {
                break;
            }
            let over = u - p;
            if !(over >= eps && i + 1 < tiers.len()) {
                slope -= d * over / (eps * eps);
            }
        }
        slope
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
    /// Scratch for one engine's window during a rebuild.
    window: Vec<u32>,
    /// Scratch: the largest reduced cost of each block of eight classes of one engine.
    blocks: Vec<f64>,
}

/// Bounds on the network columns of clustered engines that let a rebuild skip most classes
/// (from the fitted coarse start, `coarse::nearest_clusters`). Engine j of cluster S has
/// n_kj − b_j within [lo_kS, hi_kS] (hi_kS = +∞ unless every member allows k). At prices u its
/// best reduced cost is then at least max_l (u_l − hi_lS) − b_j =: LB_S − b_j, and a class k
/// can be within W of it only if u_k − lo_kS ≥ LB_S − W: per cluster, one pass over the classes
/// finds those (`possible`), and its engines scan only them. The lists are those of a full scan.
pub(crate) struct ListBounds {
    /// Each engine's cluster (u32::MAX: none; its column is scanned in full).
    pub cluster_of: Vec<u32>,
    /// Per cluster (cluster-major, n classes each): lo_kS and hi_kS.
    pub lo: Vec<f64>,
    pub hi: Vec<f64>,
    /// Each cluster's possible classes at the last rebuild's prices (CSR, ascending).
    possible_start: Vec<usize>,
    possible: Vec<u32>,
}

impl ListBounds {
    pub fn new(cluster_of: Vec<u32>, lo: Vec<f64>, hi: Vec<f64>) -> Self {
        ListBounds { cluster_of, lo, hi, possible_start: Vec::new(), possible: Vec::new() }
    }

    /// Per cluster, the classes k with u_k − lo_kS ≥ LB_S − `width` (less a margin for the
    /// rounding of the reduced costs), ascending, into `possible` (CSR).
    #[inline(never)]
    fn find_possible(&mut self, u: &[f64], width: f64) {
        let (start, classes) = (&mut self.possible_start, &mut self.possible);
        let n = u.len();
        start.clear();
        classes.clear();
        start.push(0);
        if n == 0 {
            return;
        }
        // The rounding of a reduced cost scales with the prices.
        let size = u.iter().filter(|v| v.is_finite()).fold(0.0f64, |a, v| a.max(v.abs()));
        for (lo, hi) in self.lo.chunks_exact(n).zip(self.hi.chunks_exact(n)) {
            let mut lb = f64::NEG_INFINITY;
            for (&uk, &h) in u.iter().zip(hi) {
                let v = uk - h;
                lb = if v > lb { v } else { lb };
            }
            // The bound is a rounding away from the reduced costs it bounds: a class it keeps
            // in vain is only scanned.
            let floor = lb - width - 1e-9 * (1.0 + lb.abs() + width + size);
            for (k, (&uk, &l)) in u.iter().zip(lo).enumerate() {
                // Unordered (a NaN) keeps the class: scanned, never wrongly left out.
                if (uk - l).partial_cmp(&floor) != Some(std::cmp::Ordering::Less) {
                    classes.push(k as u32);
                }
            }
            start.push(classes.len());
        }
    }
}

impl Candidates {
    /// Empties the lists for a build around prices `u` with window `width`.
    fn reset(&mut self, u: &[f64], width: f64) {
        self.start.clear();
        self.class.clear();
        self.net.clear();
        self.prev.clear();
        self.base_u.clear();
        self.base_u.extend_from_slice(u);
        self.width = width;
    }

    /// Rebuilds the lists around prices `u`: one full scan of the network matrix, or with
    /// `bounds` (engines grouped into clusters with bounds on their columns, see `ListBounds`)
    /// a scan of only the classes each cluster's bounds leave possible, the same lists.
    pub fn rebuild(
        &mut self,
        model: &Model,
        u: &[f64],
        width: f64,
        prev: &PrevRoutes,
        mut bounds: Option<&mut ListBounds>,
    ) {
        self.reset(u, width);
        if let Some(b) = bounds.as_deref_mut() {
            b.find_possible(u, width);
        }
        let bounds = bounds.as_deref();
        let n = model.n_classes();
        let have_prev = !prev.start.is_empty();
        // A few classes per engine are typical: reserving avoids most regrowth (and its copies).
        // Only for the first 32nd of the engines at first, if the estimate below follows: growing
        // a full-size guess there copied all of it (realloc does not know how much is used).
        let m = model.n_engines();
        let expected = prev.class.len() + 4 * m;
        let expected = if m >= 64 { expected / 32 + 64 } else { expected };
        self.start.reserve(m + 1);
        self.class.reserve(expected);
        self.net.reserve(expected);
        self.prev.reserve(expected);
        self.start.push(0);
        for j in 0..m {
            if j == m / 32 && j > 0 {
                // Extrapolate from the first engines (plus an eighth) and reserve once more.
                let estimate = self.class.len() * m / j + self.class.len() * m / j / 8;
                let extra = estimate.saturating_sub(self.class.len());
                self.class.reserve(extra);
                self.net.reserve(extra);
                self.prev.reserve(extra);
            }
            // `PREFETCH_AHEAD` engines ahead: a rebuild takes about as long per engine as memory
            // takes to answer (200 × 20,000 fleet cold, wall clock ~-7 %).
            model.network.prefetch_column(j + PREFETCH_AHEAD);
            if model.engine_on[j] && n > 0 {
                let column = model.network.engine_column(j);
                let (p_lo, p_hi) = if have_prev { (prev.start[j], prev.start[j + 1]) } else { (0, 0) };
                let allowed = |k: usize| column[k].is_finite() && model.class_on[k];
                match bounds.map(|b| b.cluster_of[j]).filter(|&c| c != u32::MAX) {
                    Some(c) => {
                        // Only the classes the cluster's bounds leave possible: the engine's
                        // best class and every class within `width` of it are among them
                        // (`ListBounds`), ascending, so the window is the full scan's.
                        let c = c as usize;
                        let b = bounds.expect("a cluster comes with bounds");
                        let classes = &b.possible[b.possible_start[c]..b.possible_start[c + 1]];
                        bounded_window(u, column, classes, width, &mut self.blocks, &mut self.window);
                        #[cfg(debug_assertions)]
                        {
                            // The full scan's window, to check the bounds against (tests).
                            let (mut blocks, mut window) = (Vec::new(), Vec::new());
                            let threshold = best_reduced_cost(u, column, &mut blocks) - width;
                            window_classes(u, column, threshold, &blocks, &mut window);
                            debug_assert_eq!(window, self.window, "engine {j}: bounded window differs");
                        }
                    }
                    None => {
                        // Forbidden pairs are +∞ and classes without demand have u = −∞.
                        let threshold = best_reduced_cost(u, column, &mut self.blocks) - width;
                        // The classes within the window, ascending (one compare per pair, the
                        // few that pass are checked).
                        window_classes(u, column, threshold, &self.blocks, &mut self.window);
                    }
                }
                self.emit_window(column, allowed, prev, p_lo, p_hi);
            }
            self.start.push(self.class.len());
        }
    }

    /// Appends one engine's entries: the classes in `self.window` (ascending) merged with the
    /// engine's previous routes `prev.class[p_lo..p_hi]` (those with flow), each if `allowed`.
    fn emit_window(
        &mut self,
        column: &[f64],
        allowed: impl Fn(usize) -> bool,
        prev: &PrevRoutes,
        p_lo: usize,
        p_hi: usize,
    ) {
        if p_lo == p_hi {
            for &k in &self.window {
                let k = k as usize;
                if allowed(k) {
                    self.class.push(k as u32);
                    self.net.push(column[k]);
                    self.prev.push(0.0);
                }
            }
        } else {
            // Merge the pairs within the window with the previous routes (both by class).
            let mut p = p_lo;
            let window = std::mem::take(&mut self.window);
            let emit = |cand: &mut Self, k: usize, x_prev: f64| {
                if allowed(k) {
                    cand.class.push(k as u32);
                    cand.net.push(column[k]);
                    cand.prev.push(x_prev);
                }
            };
            for &k in &window {
                let k = k as usize;
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
            self.window = window;
        }
    }

    /// Whether `extract` may build the lists of width `width` at prices `u` from these (wider)
    /// lists: every class within `width` of an engine's best at `u` is within `self.width` of it
    /// at `self.base_u` while the drift since is below the difference (the argument of the crate
    /// README, with the difference in the role of W); a millionth of the width is kept for the
    /// rounding of the reduced costs.
    pub fn covers(&self, u: &[f64], width: f64) -> bool {
        !self.start.is_empty()
            && self.base_u.len() == u.len()
            && self.drift(u) < (self.width - width) - 1e-6 * self.width
    }

    /// The lists `rebuild(model, u, width, prev)` would build, bit for bit, from `wide`, lists
    /// of the same model that `covers(u, width)`: each engine's window is filtered out of its
    /// wide entries (its best class is one of them, and the max is exact) instead of a scan of
    /// its column.
    pub fn extract(&mut self, model: &Model, wide: &Candidates, u: &[f64], width: f64, prev: &PrevRoutes) {
        debug_assert!(wide.covers(u, width));
        self.reset(u, width);
        let n = model.n_classes();
        let have_prev = !prev.start.is_empty();
        let m = model.n_engines();
        // Reserved for the largest possible size (a window is part of the wide entries; every
        // previous route may be added).
        let most = wide.class.len() + prev.class.len();
        self.start.reserve(m + 1);
        self.class.reserve(most);
        self.net.reserve(most);
        self.prev.reserve(most);
        let (class, net, x0) = (&mut self.class, &mut self.net, &mut self.prev);
        let (reduced, window) = (&mut self.blocks, &mut self.window);
        self.start.push(0);
        for j in 0..m {
            if model.engine_on[j] && n > 0 {
                let (lo, hi) = (wide.start[j], wide.start[j + 1]);
                let (classes, nets) = (&wide.class[lo..hi], &wide.net[lo..hi]);
                // As `best_reduced_cost` computes it (a max does not round).
                reduced.clear();
                let mut best = f64::NEG_INFINITY;
                for (&k, &n_kj) in classes.iter().zip(nets) {
                    let r = u[k as usize] - n_kj;
                    reduced.push(r);
                    best = if r > best { r } else { best };
                }
                let threshold = best - width;
                select_into(window, reduced.iter().enumerate().map(|(i, &r)| (i as u32, r >= threshold)));
                let column = model.network.engine_column(j);
                let allowed = |k: usize| column[k].is_finite() && model.class_on[k];
                let (mut p, p_hi) = if have_prev { (prev.start[j], prev.start[j + 1]) } else { (0, 0) };
                // The window (wide entries are allowed: same model) merged with the previous
                // routes with flow, by class, as `emit_window` merges them.
                for &i in window.iter() {
                    let (k, n_kj) = (classes[i as usize], nets[i as usize]);
                    while p < p_hi && prev.class[p] < k {
                        let kp = prev.class[p] as usize;
                        if prev.rps[p] > 0.0 && allowed(kp) {
                            class.push(kp as u32);
                            net.push(column[kp]);
                            x0.push(prev.rps[p]);
                        }
                        p += 1;
                    }
                    let mut x_prev = 0.0;
                    if p < p_hi && prev.class[p] == k {
                        x_prev = prev.rps[p];
                        p += 1;
                    }
                    class.push(k);
                    net.push(n_kj);
                    x0.push(x_prev);
                }
                for p in p..p_hi {
                    let kp = prev.class[p] as usize;
                    if prev.rps[p] > 0.0 && allowed(kp) {
                        class.push(kp as u32);
                        net.push(column[kp]);
                        x0.push(prev.rps[p]);
                    }
                }
            }
            self.start.push(class.len());
        }
    }

    /// A copy of the lists (not of the scratch).
    pub fn clone_lists(&self) -> Candidates {
        Candidates {
            start: self.start.clone(),
            class: self.class.clone(),
            net: self.net.clone(),
            prev: self.prev.clone(),
            base_u: self.base_u.clone(),
            width: self.width,
            window: Vec::new(),
            blocks: Vec::new(),
        }
    }

    /// δ = max_k Δ_k − min_k Δ_k, the spread of the price changes Δ_k = u_k − u⁰_k since the
    /// lists were built. An engine's outside class k moves up by Δ_k ≤ max Δ and its best class at
    /// the build by at least min Δ, so this is what the lists' validity and the certificate's
    /// bound for engines outside them depend on. A common move of every price costs nothing (the
    /// full solve after a coarse start lowers most prices by 1–2 ms together), and δ is never
    /// above the largest rise plus the largest fall.
    pub fn drift(&self, u: &[f64]) -> f64 {
        let (mut high, mut low) = (f64::NEG_INFINITY, f64::INFINITY);
        for (a, b) in u.iter().zip(&self.base_u) {
            if a.is_finite() {
                let change = a - b;
                high = high.max(change);
                low = low.min(change);
            }
        }
        if high >= low {
            high - low
        } else {
            0.0
        }
    }
}

/// The classes of `classes` (ascending, among them the column's best and every class within
/// `width` of it) with u_k − n_kj ≥ that best − `width`, ascending, into `out` (`reduced`:
/// scratch). Out of line: inlined, it changed how the compiler laid out the passes.
#[inline(never)]
fn bounded_window(
    u: &[f64],
    column: &[f64],
    classes: &[u32],
    width: f64,
    reduced: &mut Vec<f64>,
    out: &mut Vec<u32>,
) {
    // The reduced costs into a scratch sized once (pushing cost as much as the rest of the scan).
    if reduced.len() < classes.len() {
        reduced.resize(classes.len(), 0.0);
    }
    let reduced = &mut reduced[..classes.len()];
    let n = u.len();
    let column = &column[..n];
    let mut best = f64::NEG_INFINITY;
    for (r, &k) in reduced.iter_mut().zip(classes) {
        let v = u[k as usize] - column[k as usize];
        *r = v;
        best = if v > best { v } else { best };
    }
    let threshold = best - width;
    select_into(out, classes.iter().zip(reduced.iter()).map(|(&k, &r)| (k, r >= threshold)));
}

/// The items marked `true`, in order, into `out` (cleared first), without a branch per item: each
/// is written and the length advances past those kept. Where which items pass is data (a window's
/// few classes among the scanned ones), a branch on each was mispredicted often enough to cost
/// more than the writes (100 × 5,000 fleet cold ~-8 % wall clock with the passes' and rebuilds'
/// filters so written, for 5 % more instructions).
pub(crate) fn select_into<T: Copy + Default>(
    out: &mut Vec<T>,
    items: impl ExactSizeIterator<Item = (T, bool)>,
) {
    out.clear();
    out.resize(items.len(), T::default());
    let mut len = 0;
    for (item, keep) in items {
        out[len] = item;
        len += usize::from(keep);
    }
    out.truncate(len);
}

/// The classes k with u_k − n_kj ≥ `threshold` in one engine's column, ascending, into `out`.
/// `blocks` holds the largest u_k − n_kj of each full block of eight classes, as
/// `best_reduced_cost` leaves it (the shorter remainder has none and is always scanned): a block
/// below the threshold has no class in the window and is skipped (in a warm re-solve most are:
/// a window holds a few classes of a region, 60 % of the blocks none). In the others eight compares form a mask (branch-free, so the compiler can
/// vectorise them) and only the set bits are visited.
fn window_classes(u: &[f64], column: &[f64], threshold: f64, blocks: &[f64], out: &mut Vec<u32>) {
    out.clear();
    let (cu, cc) = (u.chunks_exact(8), column.chunks_exact(8));
    let (ru, rc) = (cu.remainder(), cc.remainder());
    // A shorter `blocks` would silently drop the blocks past its end.
    debug_assert_eq!(blocks.len(), cu.len(), "blocks are from another column");
    for (chunk, ((a, b), &block)) in cu.zip(cc).zip(blocks).enumerate() {
        if block < threshold {
            continue;
        }
        let mut mask = 0u32;
        for i in 0..8 {
            mask |= ((a[i] - b[i] >= threshold) as u32) << i;
        }
        while mask != 0 {
            out.push((chunk * 8) as u32 + mask.trailing_zeros());
            mask &= mask - 1;
        }
    }
    let tail = u.len() - ru.len();
    for (i, (a, b)) in ru.iter().zip(rc).enumerate() {
        if a - b >= threshold {
            out.push((tail + i) as u32);
        }
    }
}

/// max_k (u_k − n_kj) over one engine's column, and into `blocks` the same maximum over each
/// block of eight classes (the last block, if shorter, is not included). Exact: a maximum does
/// not round, so the lanes' order gives the same value as a sequential scan; and the
/// reduced costs are computed as `window_classes` computes them, so a block whose maximum is
/// below a threshold has no entry at or above it.
fn best_reduced_cost(u: &[f64], column: &[f64], blocks: &mut Vec<f64>) -> f64 {
    let max = |x: f64, y: f64| if x > y { x } else { y };
    let mut lanes = [f64::NEG_INFINITY; 4];
    let (cu, cc) = (u.chunks_exact(8), column.chunks_exact(8));
    let (ru, rc) = (cu.remainder(), cc.remainder());
    // Written in place (pushing cost more than the maxima).
    blocks.resize(cu.len(), 0.0);
    for ((a, b), block) in cu.zip(cc).zip(blocks.iter_mut()) {
        let mut pair = [0.0; 4];
        for i in 0..4 {
            pair[i] = max(a[i] - b[i], a[i + 4] - b[i + 4]);
            lanes[i] = max(pair[i], lanes[i]);
        }
        *block = max(max(pair[0], pair[2]), max(pair[1], pair[3]));
    }
    let mut best = max(max(lanes[0], lanes[1]), max(lanes[2], lanes[3]));
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
    /// The engine's best response (y, dy/dq) at the price its last root ended at in this buffer,
    /// keyed by that price: the next pass starts the engine's root at the price it left (`q`),
    /// and this spares evaluating the response there again (a third of a warm pass's responses).
    /// It is the response the root computed (`Curve::response`, or `Curve::queueing_root`'s,
    /// which equals it to rounding), so results stay a function of the inputs.
    at_price: Vec<(f64, f64, f64)>,
    pub flow: Vec<f64>,
    pub shed: Vec<f64>,
    pub grad: Vec<f64>,
    /// Smoothed dual value.
    pub dual: f64,
    /// Σ_k |grad_k| / Σ_k d_k.
    pub residual: f64,
    /// The smoothing terms at the pass's flows: Σ_j ε/(2c_j)·Σ_k (x_kj − x⁰_kj)² plus shedding's.
    /// At the smoothed optimum this bounds how far smoothing keeps the routing from optimal.
    pub smoothing: f64,
    /// The entries with positive flow, engine by engine (CSR over engines): the Newton matrix
    /// needs only these, and they are a small fraction of the candidate lists.
    active_start: Vec<usize>,
    active: Vec<u32>,
    /// r'_i of one engine's candidate entries (see `solve_engine`), reused within the engine's
    /// solve. Per engine, not per entry: an array over all entries was one more 1.3 MB
    /// (200 × 20,000 warm) to zero and stream per solve and pass buffer.
    reduced: Vec<f64>,
    /// One engine's classes that can receive flow: (r'_i, entry), r' descending once sorted.
    scratch: Vec<(f64, u32)>,
}

impl Pass {
    /// Starts each engine's next root where `other` left it, with the responses it has there.
    /// The responses are moved, not copied (copying them was 2 % of a warm re-solve's
    /// instructions): `other` keeps this buffer's, which are keyed by their prices and so are
    /// only used where they still apply.
    pub fn start_from(&mut self, other: &mut Pass) {
        self.q.clone_from(&other.q);
        std::mem::swap(&mut self.at_price, &mut other.at_price);
    }

    pub fn run(&mut self, model: &Model, cand: &Candidates, u: &[f64], eps: f64) {
        let (n, m) = (model.n_classes(), model.n_engines());
        let entries = cand.class.len();
        // Zeroed engine by engine below, while the engine's entries are in cache: a separate
        // zeroing pass streamed the whole array (7 MB for 200 × 20,000) through memory once more.
        self.x.resize(entries, 0.0);
        self.q.resize(m, 0.0);
        // Every engine's load and slope is written below (clearing them first was two more
        // streams per pass).
        self.load.resize(m, 0.0);
        self.slope.resize(m, 0.0);
        // NaN matches no price: a new buffer has no responses to reuse.
        self.at_price.resize(m, (f64::NAN, 0.0, 0.0));
        self.flow.clear();
        self.flow.resize(n, 0.0);
        self.active.clear();
        // At most one active entry per candidate entry: reserved once per pass buffer (growing it
        // by pushes copied it a dozen times in each solve's first pass).
        self.active.reserve(entries);
        self.active_start.clear();
        self.active_start.reserve(m + 1);
        self.active_start.push(0);
        let mut engines_value = 0.0;
        let mut smoothing = 0.0;
        for j in 0..m {
            if !model.engine_on[j] {
                self.x[cand.start[j]..cand.start[j + 1]].fill(0.0);
                self.active_start.push(self.active.len());
                self.load[j] = 0.0;
                self.slope[j] = 0.0;
                continue;
            }
            let (value, engine_smoothing) = self.engine(model, cand, u, eps, j);
            smoothing += engine_smoothing;
            engines_value += value;
        }
        self.classes(model, u, eps, engines_value, smoothing);
    }

    /// Engine `j`'s best response to the prices `u` (it is on): its flows, price, load, slope
    /// and active entries. Returns its term of the dual value and its smoothing term.
    fn engine(&mut self, model: &Model, cand: &Candidates, u: &[f64], eps: f64, j: usize) -> (f64, f64) {
        let (lo, hi) = (cand.start[j], cand.start[j + 1]);
        let curve = &model.curves[j];
        let k_j = model.capacity[j] / eps;
        let inv_k = eps / model.capacity[j];
        // r'_i = u_k − n_kj + x⁰_i/k_j for every entry, their top, and Σ (x⁰_i)².
        let (class, net, prev) = (&cand.class[lo..hi], &cand.net[lo..hi], &cand.prev[lo..hi]);
        if self.reduced.len() < hi - lo {
            self.reduced.resize(hi - lo, 0.0);
        }
        let reduced = &mut self.reduced[..hi - lo];
        // The engine's flows are zeroed here too (a separate fill called memset per engine).
        let flows = &mut self.x[lo..hi];
        let (mut top, mut prev_sq) = (f64::NEG_INFINITY, 0.0);
        for i in 0..class.len() {
            let r = u[class[i] as usize] - net[i] + prev[i] * inv_k;
            reduced[i] = r;
            flows[i] = 0.0;
            top = if r > top { r } else { top };
            prev_sq += prev[i] * prev[i];
        }
        let base = curve.base_price();
        // Only classes within cap/k_j (= ερ) of the best can get flow: x_top = k_j (top − q) ≤ cap.
        // The rest keep x = 0 and are not looked at again in this pass.
        self.scratch.clear();
        let (at, y_at, dy_at) = self.at_price[j];
        let known = (at == self.q[j]).then_some((y_at, dy_at));
        let (q, (y, slope)) = if top <= base {
            (base, curve.response(base))
        } else {
            let floor = (top - curve.cap() * inv_k).max(base);
            select_into(
                &mut self.scratch,
                reduced.iter().enumerate().map(|(i, &r)| ((r, (lo + i) as u32), r > floor)),
            );
            let below = if self.scratch.len() > CUT_ABOVE {
                cut_below_root(curve, k_j, &mut self.scratch, top, floor, self.q[j])
            } else {
                f64::NEG_INFINITY
            };
            sort_descending(&mut self.scratch);
            solve_engine(curve, k_j, &self.scratch, self.q[j], known, below)
        };
        self.at_price[j] = (q, y, slope);
        let mut load = 0.0;
        let mut value = 0.0;
        // Σ (x − x⁰)² = Σ (x⁰)² + Σ over flows of (x² − 2·x·x⁰).
        let mut quad = prev_sq;
        for &(r, e) in &self.scratch {
            let x = k_j * (r - q);
            if x > 0.0 {
                let e = e as usize;
                let k = cand.class[e] as usize;
                self.x[e] = x;
                load += x;
                self.flow[k] += x;
                value += (u[k] - cand.net[e]) * x;
                quad += x * (x - 2.0 * cand.prev[e]);
                self.active.push(e as u32);
            }
        }
        self.active_start.push(self.active.len());
        let quad = quad.max(0.0);
        value -= curve.cost(load) + 0.5 * quad / k_j;
        self.q[j] = q;
        self.load[j] = load;
        self.slope[j] = slope;
        (value, 0.5 * quad / k_j)
    }

    /// The classes' shedding and demand gradient at the prices `u`, and the pass's dual value,
    /// smoothing and residual from the engines' sums.
    fn classes(&mut self, model: &Model, u: &[f64], eps: f64, engines_value: f64, mut smoothing: f64) {
        let n = model.n_classes();
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

    /// min over candidate engines of n_kj + q_j, per class (for the bound).
    pub fn best_routes(&self, model: &Model, cand: &Candidates) -> Vec<f64> {
        let mut best = vec![f64::INFINITY; model.n_classes()];
        for j in 0..model.n_engines() {
            if !model.engine_on[j] {
                continue;
            }
            let q = self.q[j];
            let (lo, hi) = (cand.start[j], cand.start[j + 1]);
            for (&k, &net) in cand.class[lo..hi].iter().zip(&cand.net[lo..hi]) {
                // `min` without its NaN handling (`best` starts at +∞ and never holds a NaN, so a
                // NaN sum is skipped either way), and without a branch: which engine is a class's
                // best is data.
                let (v, b) = (net + q, &mut best[k as usize]);
                *b = if v < *b { v } else { *b };
            }
        }
        best
    }

    /// The engines with active entries: (engine, its active entries, k_j = c_j/ε,
    /// α_j = 1/(|A| + γ_j/k_j)), as the Newton matrix and the predictor use them.
    fn active_engines<'a>(
        &'a self,
        model: &'a Model,
        eps: f64,
    ) -> impl Iterator<Item = (usize, &'a [u32], f64, f64)> + 'a {
        (0..model.n_engines()).filter_map(move |j| {
            let active = &self.active[self.active_start[j]..self.active_start[j + 1]];
            if active.is_empty() {
                return None;
            }
            let k_j = model.capacity[j] / eps;
            Some((j, active, k_j, 1.0 / (active.len() as f64 + self.slope[j] / k_j)))
        })
    }

    /// ∂∇g/∂ε at fixed prices: how the demand residual moves with the smoothing (for the
    /// continuation's predictor). On engine j with active entries A, r'_i = u_k − n_kj + x⁰_i·ε/c_j
    /// and x_i = (c_j/ε)(r'_i − q_j) with Σ_A x_i = Y_j(q_j), so
    /// dx_i/dε = (x⁰_i − x_i + α_j·(Y_j − Σ_A x⁰))/ε with α_j as in the Newton matrix; a shedding
    /// member's smoothed shed d·(u − P)/ε moves by −s/ε.
    pub fn eps_derivative(&self, model: &Model, cand: &Candidates, u: &[f64], eps: f64) -> Vec<f64> {
        let n = model.n_classes();
        let mut b = vec![0.0; n];
        for (j, active, _, alpha) in self.active_engines(model, eps) {
            let prev_total: f64 = active.iter().map(|&e| cand.prev[e as usize]).sum();
            let common = alpha * (self.load[j] - prev_total);
            for &e in active {
                let e = e as usize;
                b[cand.class[e] as usize] -= (cand.prev[e] - self.x[e] + common) / eps;
            }
        }
        for k in 0..n {
            if model.class_on[k] {
                b[k] -= model.shed_eps_slope(k, u[k], eps);
            }
        }
        b
    }

    /// Adds −∇²(smoothed dual) to `h` (n × n, row-major, zeroed by the caller).
    pub fn add_hessian(&self, model: &Model, cand: &Candidates, u: &[f64], eps: f64, h: &mut [f64]) {
        let n = model.n_classes();
        // Derivative of the water-filling: dx_a/du_b = k_j (δ_ab − α), α = 1/(|A| + γ/k_j).
        for (_, active, k_j, alpha) in self.active_engines(model, eps) {
            let off = k_j * alpha;
            for &ea in active {
                let a = cand.class[ea as usize] as usize;
                h[a * n + a] += k_j;
                for &eb in active {
                    h[a * n + cand.class[eb as usize] as usize] -= off;
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

/// Sorts one engine's (r', entry) pairs by r' descending (`f64::total_cmp`), as
/// `sort_unstable_by` did: up to 20 elements the standard library sorts by insertion, which is
/// stable, and so is this insertion sort (the same order, ties included); longer lists still go to
/// the standard sort. Most lists hold one or two pairs, for which the library's call was ~85
/// instructions.
fn sort_descending(v: &mut [(f64, u32)]) {
    if v.len() > 20 {
        v.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
        return;
    }
    for i in 1..v.len() {
        let item = v[i];
        let mut j = i;
        while j > 0 && item.0.total_cmp(&v[j - 1].0) == std::cmp::Ordering::Greater {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = item;
    }
}

/// An engine with more candidates than this that can take flow (a coarse problem's cluster serves
/// tens of classes) first drops those below a lower bound of its price (`cut_below_root`): sorting
/// them all was ~5 % of a 200 × 20,000 fleet cold solve (its coarse problem's clusters keep ~19 of
/// ~45 that way).
const CUT_ABOVE: usize = 20;

/// Drops from `entries` (one engine's unsorted (r'_i, entry) pairs above `floor`, the largest
/// `top`) the pairs at or below a lower bound L of the engine's price q, which get no flow, and
/// returns the largest r' dropped (−∞ if none), the low end of `solve_engine`'s last bracket.
/// φ(q) = Y(q) − k_j·Σ_i (r'_i − q)₊ increases in q and q is its root, so any L with φ(L) < 0 is
/// one. L is the hint (the previous pass's price) when φ is negative there, else twice a Newton
/// step below it (a lower bound already where φ is concave, as for the queueing shape); it is
/// used only when φ(L) is negative beyond the rounding of `solve_engine`'s prefix sums, so that
/// its walk over the shorter list stops on the same piece as over the whole one (and the result
/// is the same, up to the order of exactly equal r'). Otherwise nothing is dropped.
fn cut_below_root(
    curve: &Curve,
    k_j: f64,
    entries: &mut Vec<(f64, u32)>,
    top: f64,
    floor: f64,
    hint: f64,
) -> f64 {
    if !(hint > floor && hint < top) {
        return f64::NEG_INFINITY;
    }
    // φ(q), its slope from the right and the margin its sign must clear.
    let phi = |q: f64| {
        let (mut sum, mut count, mut size) = (0.0, 0.0, 0.0);
        for &(r, _) in entries.iter() {
            if r > q {
                sum += r - q;
                count += 1.0;
                size += r.abs();
            }
        }
        let (y, dy) = curve.response(q);
        (y - k_j * sum, dy + k_j * count, 1e-10 * (y + k_j * (size + count * q.abs())))
    };
    let (value, slope, margin) = phi(hint);
    let bound = if value < -margin {
        hint
    } else {
        let lower = hint - 2.0 * (value + margin) / slope;
        if lower.is_nan() || lower <= floor {
            return f64::NEG_INFINITY;
        }
        let (value, _, margin) = phi(lower);
        if value >= -margin {
            return f64::NEG_INFINITY;
        }
        lower
    };
    let mut below = f64::NEG_INFINITY;
    entries.retain(|&(r, _)| {
        if r > bound {
            return true;
        }
        below = if r > below { r } else { below };
        false
    });
    below
}

/// Solves engine j's water-filling for its price q: load(q) = k_j·Σ_i (r'_i − q)₊ with
/// r'_i = u_k − n_kj + x⁰_i/k_j, where load(q) is the engine's best response. `sorted` holds the
/// r'_i that can receive flow, descending (at least one, above the base price); the active count
/// is found by walking the breakpoints, and the smooth equation on that piece is solved by
/// Newton's method kept inside its bracket (O(1) per step thanks to the prefix sum). `below` is
/// the largest r' left out of `sorted` although above the floor (−∞ if none, see
/// `cut_below_root`): the low end of the last piece's bracket. `known` is the curve's response at
/// `hint` when the caller has it. Returns the price and the response there.
fn solve_engine(
    curve: &Curve,
    k_j: f64,
    sorted: &[(f64, u32)],
    hint: f64,
    known: Option<(f64, f64)>,
    below: f64,
) -> (f64, (f64, f64)) {
    let base = curve.base_price();
    let r = |i: usize| sorted[i].0;
    let len = sorted.len();
    // Find m ≥ 1 with the root in [max(r_m, base), r_{m−1}] (r sorted descending, r_len = −∞).
    // φ(q) = Y(q) − k_j·Σ_{i<m}(r_i − q) is increasing, so the piece is found by walking the
    // breakpoints; the walk starts at the hint's piece (the previous pass's price), where the
    // root usually still is, instead of at the top: one curve evaluation instead of one per class.
    let phi = |q: f64, m: usize, sum: f64| curve.response(q).0 - k_j * (sum - m as f64 * q);
    let (mut m, mut sum) = (1, r(0));
    // The curve at the hint, kept for Newton's first iterate (usually the hint itself).
    let mut at_hint = None;
    if hint > base && hint < r(0) {
        while m < len && r(m) > hint {
            sum += r(m);
            m += 1;
        }
        let response = known.unwrap_or_else(|| curve.response(hint));
        at_hint = Some(response);
        if response.0 - k_j * (sum - m as f64 * hint) > 0.0 {
            while m < len && r(m) > base && phi(r(m), m, sum) > 0.0 {
                sum += r(m);
                m += 1;
            }
        } else {
            while m > 1 && phi(r(m - 1), m, sum) < 0.0 {
                m -= 1;
                sum -= r(m);
            }
        }
    } else {
        while m < len && r(m) > base && phi(r(m), m, sum) > 0.0 {
            sum += r(m);
            m += 1;
        }
    }
    let count = m as f64;
    // On this piece φ(q) ≤ cap − k_j·(sum − m·q) (the engine full), so the root is at least
    // that line's zero; where the engine is full there, that is the root (φ is linear there).
    let q_full = (sum - curve.cap() / k_j) / count;
    let mut lo = (if m < len { r(m) } else { below }).max(base);
    let mut hi = r(m - 1);
    if q_full > lo {
        lo = q_full.min(hi);
    }
    // Without a hint inside the bracket, start from its low end (from the left, Newton on the
    // concave queueing response does not overshoot), or its middle if that is the base price,
    // where the response has no slope to follow.
    let mut q = if hint > lo && hint < hi {
        hint
    } else if lo > base {
        lo
    } else {
        0.5 * (lo + hi)
    };
    // The residual is computed to about 1e-15 × k_j·(|sum| + m·|q|) (prices near a shed
    // penalty are thousands of ms): below that, further steps only bounce on rounding.
    let rounding = 1e-15 * k_j * (sum.abs() + count * hi.abs());
    // `max` without its NaN handling, the same value: the curve's floor is never NaN (and a NaN
    // rounding level yields the floor either way).
    let least = curve.load_tolerance();
    let tolerance = if rounding > least { rounding } else { least };
    // From the previous pass's price, where the root often still is (the response there is
    // known), the queueing shape's root is found in w = √(q − t0 + b), where a step costs a
    // division instead of a response and a division (`queueing_root`, which also places a full
    // engine's root without a step); a root outside this piece, or one that method leaves, is
    // found by the bracketed steps below.
    if q == hint {
        if let Some((y, dy)) = at_hint {
            if (y - k_j * (sum - count * q)).abs() <= tolerance {
                return (q, (y, dy));
            }
        }
        if let Some((root, response)) = curve.queueing_root(k_j * count, k_j * sum, q, tolerance) {
            if root >= lo && root <= hi {
                return (root, response);
            }
        }
    }
    for _ in 0..100 {
        let (y, dy) = match at_hint.take() {
            Some(response) if q == hint => response,
            _ => curve.response(q),
        };
        let value = y - k_j * (sum - count * q);
        if value.abs() <= tolerance {
            return (q, (y, dy));
        }
        if value < 0.0 {
            lo = q;
        } else {
            hi = q;
        }
        let newton = q - value / (dy + k_j * count);
        // The ends of the bracket count: where the engine is full φ is linear, and Newton lands
        // exactly on the root `q_full`, which may be the low end.
        q = if newton >= lo && newton <= hi && newton != q { newton } else { 0.5 * (lo + hi) };
        if hi - lo <= 1e-14 * hi.abs().max(1.0) {
            break;
        }
    }
    (q, curve.response(q))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(12), ..ProptestConfig::default() })]

        /// The masked scan (skipping blocks by their maxima) finds exactly the classes a plain
        /// filter finds, in ascending order, forbidden pairs (+∞) and classes without a price (−∞)
        /// included; the maximum is the sequential one.
        #[test]
        fn window_classes_is_a_filter(
            values in proptest::collection::vec((-50.0f64..50.0, 0.0f64..60.0, 0u8..10), 0..70),
            threshold in -60.0f64..60.0,
        ) {
            let u: Vec<f64> = values.iter().map(|v| if v.2 == 0 { f64::NEG_INFINITY } else { v.0 }).collect();
            let column: Vec<f64> = values.iter().map(|v| if v.2 == 1 { f64::INFINITY } else { v.1 }).collect();
            let mut out = vec![7];
            let mut blocks = vec![1.0];
            let best = best_reduced_cost(&u, &column, &mut blocks);
            window_classes(&u, &column, threshold, &blocks, &mut out);
            let expected: Vec<u32> = (0..u.len()).filter(|&k| u[k] - column[k] >= threshold).map(|k| k as u32).collect();
            prop_assert_eq!(out, expected);
            let sequential = (0..u.len()).map(|k| u[k] - column[k]).fold(f64::NEG_INFINITY, f64::max);
            prop_assert_eq!(best, sequential);
        }
    }
}

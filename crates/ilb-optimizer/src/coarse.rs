//! Cold start from a coarse problem. Engines whose network columns differ only by a constant b_j
//! (the engines of one region, seen from every front end) are interchangeable up to that
//! constant: at engine prices q_j = Q − b_j they cost every class the same, so together they act
//! as one engine whose load at price Q is Σ_j Y_j(Q − b_j). The coarse problem (groups ×
//! clusters, ~30 × 16 for 200 × 20,000) is solved by the same method; its prices, and its flows
//! split over each cluster's engines in proportion to their loads at those prices, are an almost
//! optimal dual and primal point of the full problem. The full solve then starts like a warm one,
//! with the proximal centre at that split, and needs a few Newton steps instead of tens.
//!
//! Where columns do not line up (every engine its own cluster) nothing is gained and the plain
//! cold start is used.
//!
//! A coarse problem of fitted clusters is started the same way one level up (`grouped_prices`):
//! its classes grouped where their rows differ by about a constant, a grouped problem solved
//! loosely, each class priced at its group's price plus its offset.

use crate::curve::Curve;
use crate::newton::Run;
use crate::options::{SolverOptions, WARM_MIN_EPSILON};
use crate::pass::{ListBounds, Model, PrevRoutes};
use crate::problem::{NetworkMatrix, PREFETCH_AHEAD};
use crate::warm::cold_prices;

/// Engines whose normalised columns agree within this many ms share a cluster: measured
/// round-trip times jitter by this much, and the full solve corrects the difference.
const TOLERANCE_MS: f64 = 0.5;

/// Clustering gives up beyond this many clusters (bounds its cost on unstructured matrices).
const MAX_CLUSTERS: usize = 256;

/// Price samples of each cluster's response curve, spaced geometrically above its base price
/// (the response rises steeply there and flattens towards saturation).
const SAMPLES: usize = 48;

/// Re-solves of the coarse problem centred on its own routes (see `start`).
const PROXIMAL_ROUNDS: usize = 1;

/// Gap to which a coarse problem of fitted (not exact) clusters is solved.
const APPROXIMATE_GAP: f64 = 5e-4;

/// Starting ε of a coarse problem of fitted clusters, relative to the price scale. Its first
/// stage takes most of the coarse solve's Newton steps (70–90 damped ones from the plain cold
/// start); over five noisy instances at 72 % load (100 × 5,000 seeds 1, 3, 4; 200 × 20,000
/// seeds 1, 3) 0.1 instead of 0.05 took 7–26 % fewer instructions per cold solve on four and
/// 1.4 % more on one; over five at 108 % (seeds 2, 3, 4; 2, 3) 6–15 % more on four and 30 % fewer
/// on one (200 × 20,000 seed 2); 9 % fewer in total. Not a law: the number of damped steps is
/// erratic in this parameter.
const FITTED_EPSILON: f64 = 0.1;

/// Classes of a fitted coarse problem share a group of the grouped start (`grouped_prices`) when
/// their rows, each less its own mean, agree within this many ms wherever both allow the
/// cluster: front ends of one region (sites ±2° apart, 0–3 ms of noise on every pair, averaged
/// over each cluster's engines). Over ten cold solves (100 × 5,000 and 200 × 20,000; fleet,
/// noisy, 72 % and 108 %) 4, 7 and 10 ms took 1–2 % more instructions than 5; at 3 ms the
/// 100 × 5,000 fleet's classes did not group twofold.
const GROUP_TOLERANCE_MS: f64 = 5.0;

/// ...and differ in whether they may use a cluster at no more than this fraction of the clusters
/// (a small cluster that scattered exclusions make forbidden for one front end and not its
/// neighbour); in the grouped problem a group may use a cluster that most of its members may.
const GROUP_MISMATCH: f64 = 0.1;

/// The grouped start is used only when it shrinks the classes at least this much.
const MIN_GROUP_REDUCTION: usize = 2;

/// Gap to which the grouped problem is solved: its prices are only a start, off by the fit.
const GROUPED_GAP: f64 = 5e-3;

/// Starting ε, relative to the price scale, of a coarse problem that starts from grouped prices.
/// From the common price its first stage (at `FITTED_EPSILON`) took 20–41 Newton steps; from
/// grouped prices, 1–3 ms off its optimum, 6–7, and the stages after it as many as before, so
/// starting lower skips one. Over the twenty cold solves 0.05 took 4,126 + 4,456 M instructions,
/// 0.1 took 4,618 + 4,538 M and 0.03 4,237 M on the first ten (against 5,451 + 5,333 M from the
/// common price).
const GROUPED_EPSILON: f64 = 0.05;

/// Smallest ε, relative to the price scale, at which the full solve starts from fitted clusters.
const FITTED_MIN_EPSILON: f64 = 1e-3;

/// Largest ε, relative to the price scale, at which the full solve starts from fitted clusters.
/// Under overload the coarse problem certifies at a large ε (shedding dominates the objective, so
/// the smoothing's share of it stays small), the full solve then certified where it started, and
/// every warm re-solve after it inherited that ε, with candidate lists up to twice as long: after
/// the grouped start 6.6e-3 × scale on the 100 × 5,000 fleet at 108 % (3.6 → 4.0 ms per warm
/// re-solve). Capped, thirteen cold and warm solves at 108 % (fleet and noisy, 100 × 5,000 and
/// 200 × 20,000) took 3,271 M instructions instead of 3,401 M.
const FITTED_MAX_EPSILON: f64 = 4e-3;

/// Smallest spacing of the samples, relative to the cluster's price range.
const FIRST_SAMPLE: f64 = 1e-4;

/// The coarse start is used only when it shrinks the engine count at least this much...
const MIN_REDUCTION: usize = 4;
/// ...and the problem is large enough for the plain cold start to be slow.
const MIN_ENGINES: usize = 64;

/// Where the full solve starts.
pub(crate) struct CoarseStart {
    /// Group prices.
    pub prices: Vec<f64>,
    /// The coarse flows split over the engines: the proximal centre.
    pub prev: PrevRoutes,
    /// The smoothing at which the coarse problem was certified.
    pub epsilon: f64,
    /// Engines of the coarse problem.
    pub clusters: usize,
    /// Classes of the grouped problem the coarse problem started from, if it did.
    pub classes: Option<usize>,
    /// Bounds on the fitted clusters' columns, for the full solve's list rebuilds.
    pub bounds: Option<ListBounds>,
}

/// Engines grouped by normalised column (CSR), with each engine's offset b_j and each
/// cluster's column a_kS (engine-major, groups × clusters): n_kj ≈ a_kS + b_j.
struct Clusters {
    start: Vec<usize>,
    engine: Vec<u32>,
    offset: Vec<f64>,
    values: Vec<f64>,
    /// The columns agree within `TOLERANCE_MS` (else they were fitted, see `nearest_clusters`).
    exact: bool,
    /// Fitted clusters: per cluster (cluster-major, n classes each) the least and the largest
    /// n_kj − b_j over its members (+∞ where a member forbids k), for `ListBounds`.
    bounds: Option<(Vec<f64>, Vec<f64>)>,
}

impl Clusters {
    fn len(&self) -> usize {
        self.start.len() - 1
    }

    fn members(&self, s: usize) -> &[u32] {
        &self.engine[self.start[s]..self.start[s + 1]]
    }
}

/// Solves the coarse problem; None when the engines do not cluster well enough to pay off.
pub(crate) fn start(model: &Model, options: &SolverOptions, scale: f64) -> Option<CoarseStart> {
    let mut clusters = exact_clusters(model).or_else(|| nearest_clusters(model))?;
    let n = model.n_classes();
    let mut curves = Vec::with_capacity(clusters.len());
    let mut capacity = Vec::with_capacity(clusters.len());
    for s in 0..clusters.len() {
        let members = clusters.members(s);
        curves.push(cluster_curve(model, members, &clusters.offset)?);
        capacity.push(members.iter().map(|&j| model.capacity[j as usize]).sum());
    }
    let network = NetworkMatrix::from_engine_major(n, clusters.len(), std::mem::take(&mut clusters.values));
    let coarse = Model {
        network: &network,
        curves: std::sync::Arc::new(curves),
        demand: model.demand.clone(),
        penalty: model.penalty.clone(),
        tier_start: model.tier_start.clone(),
        tiers: model.tiers.clone(),
        class_on: model.class_on.clone(),
        engine_on: vec![true; clusters.len()],
        capacity,
        rho: model.rho,
    };
    // Fitted clusters are only a starting point: the full solve corrects far more than the
    // re-centring would, so the coarse problem is not re-centred.
    let loose;
    // Their coarse problem has about one engine per group; starting it at a smaller ε saves
    // continuation stages.
    let (coarse_options, rounds, eps_start) = if clusters.exact {
        (options, PROXIMAL_ROUNDS, 0.2 * scale)
    } else {
        loose = SolverOptions { gap_target: APPROXIMATE_GAP.max(options.gap_target), ..options.clone() };
        (&loose, 0, FITTED_EPSILON * scale)
    };
    // A fitted coarse problem starts from the prices of a smaller one that groups its classes
    // (`grouped_prices`) where that groups them at least twofold, else from one common price.
    let grouped = if clusters.exact { None } else { grouped_prices(&coarse, options, scale) };
    let (prices, eps_start, classes) = match grouped {
        Some((prices, groups)) => (prices, GROUPED_EPSILON * scale, Some(groups)),
        None => (cold_prices(&coarse), eps_start, None),
    };
    let mut run = Run::new(&coarse, coarse_options, scale, PrevRoutes::default());
    if !clusters.exact {
        run.idle_reach_per_eps = crate::newton::IDLE_REACH_PER_EPS;
    }
    let (mut repaired, mut epsilon) = run.solve(prices, eps_start);
    // The cold coarse solution's prices carry the smoothing's spread between the classes an
    // engine serves (u_k − n_k − q = ε·x_k/c, centre zero). Re-solved once with its own routes as
    // the proximal centre, the spread vanishes where routes stay put, so the split below is
    // (nearly) a fixed point of the full problem centred on it.
    for _ in 0..rounds {
        let prev = centre(run.cand.start.len() - 1, &run.cand, &repaired.x, |s| Some((s, 1.0)));
        let u = std::mem::take(&mut run.u);
        run = Run::new(&coarse, options, scale, prev);
        let (r, e) = run.solve(u, epsilon);
        repaired = r;
        epsilon = e;
    }
    if !repaired.gap().is_finite() {
        return None;
    }

    // Each cluster's flows, split over its members in proportion to their loads at the
    // cluster's price (their capacities if none would take load there).
    let m = model.n_engines();
    let mut share = vec![0.0; m];
    let mut cluster_of = vec![u32::MAX; m];
    for s in 0..clusters.len() {
        let members = clusters.members(s);
        let price = run.pass.q[s];
        let mut total = 0.0;
        for &j in members {
            let j = j as usize;
            share[j] = model.curves[j].response(price - clusters.offset[j]).0;
            total += share[j];
            cluster_of[j] = s as u32;
        }
        if total <= 0.0 {
            total = 0.0;
            for &j in members {
                share[j as usize] = model.curves[j as usize].cap();
                total += share[j as usize];
            }
        }
        for &j in members {
            share[j as usize] /= total;
        }
    }
    let prev = split(model, &clusters, &run.cand, &repaired.x, &share, &cluster_of);
    // A fitted coarse problem whose continuation went far below the fit's precision (at a kink of
    // its dual) would hand the full solve an ε at which its prices, off by the fit's error, take
    // hundreds of Newton steps: start no lower than `FITTED_MIN_EPSILON`.
    // The full problem's gap at the coarse problem's final ε was 5–8e-4 on every fitted instance
    // measured (the fit's error puts the centre further from the optimum than the coarse
    // problem's own smoothing shows), so the full continuation certified there, failed and
    // halved ε: start at half of it instead, but no lower than a warm re-solve would
    // (`WARM_MIN_EPSILON`; the fit leaves prices 1–2 ms off, which at a smaller ε takes damped
    // steps) unless the coarse problem itself ended lower; and no higher than
    // `FITTED_MAX_EPSILON`.
    let epsilon = if clusters.exact {
        epsilon
    } else {
        (0.5 * epsilon)
            .max(WARM_MIN_EPSILON * scale)
            .min(epsilon)
            .max(FITTED_MIN_EPSILON * scale)
            .min(FITTED_MAX_EPSILON * scale)
    };
    let bounds = clusters.bounds.take().map(|(lo, hi)| ListBounds::new(cluster_of, lo, hi));
    Some(CoarseStart { prices: run.u, prev, epsilon, clusters: clusters.len(), classes, bounds })
}

/// The proximal centre of the full problem: each coarse entry's flow (class k, cluster S) split
/// over S's members by `share`, renormalised over the members that allow k (all of them, and the
/// share unchanged, unless the fit let a few forbidden pairs into the cluster).
fn split(
    model: &Model,
    clusters: &Clusters,
    cand: &crate::pass::Candidates,
    x: &[f64],
    share: &[f64],
    cluster_of: &[u32],
) -> PrevRoutes {
    // Per cluster (CSR), its coarse entries with flow: the only ones that give routes (walking
    // all its candidates for each of its engines was 2.5 % of a 200 × 20,000 fleet cold solve).
    let mut flowing_start = Vec::with_capacity(clusters.len() + 1);
    let mut flowing = Vec::new();
    flowing_start.push(0);
    for s in 0..clusters.len() {
        flowing.extend((cand.start[s]..cand.start[s + 1]).filter(|&e| x[e] > 0.0));
        flowing_start.push(flowing.len());
    }
    // Per coarse entry: the share of the cluster that allows its class (1 when all do).
    let mut allowed = vec![1.0; x.len()];
    for s in 0..clusters.len() {
        let members = clusters.members(s);
        for &e in &flowing[flowing_start[s]..flowing_start[s + 1]] {
            let k = cand.class[e] as usize;
            if members.iter().any(|&j| model.network.engine_column(j as usize)[k].is_infinite()) {
                allowed[e] = members
                    .iter()
                    .filter(|&&j| model.network.engine_column(j as usize)[k].is_finite())
                    .map(|&j| share[j as usize])
                    .sum();
            }
        }
    }
    let m = model.n_engines();
    let mut prev = PrevRoutes { start: Vec::with_capacity(m + 1), class: Vec::new(), rps: Vec::new() };
    prev.start.push(0);
    for j in 0..m {
        model.network.prefetch_column(j + PREFETCH_AHEAD);
        if cluster_of[j] != u32::MAX {
            let (row, column) = (cluster_of[j] as usize, model.network.engine_column(j));
            for &e in &flowing[flowing_start[row]..flowing_start[row + 1]] {
                let k = cand.class[e] as usize;
                if !(column[k].is_finite() && allowed[e] > 0.0) {
                    continue;
                }
                let rps = if allowed[e] == 1.0 { x[e] * share[j] } else { x[e] * share[j] / allowed[e] };
                if rps > 0.0 {
                    prev.class.push(k as u32);
                    prev.rps.push(rps);
                }
            }
        }
        prev.start.push(prev.class.len());
    }
    prev
}

/// A proximal centre for `n_engines` engines from candidate-entry flows `x`: engine j takes the
/// flows of candidate row `source(j) = (row, scale)` times `scale` (none if `None`). Entries are
/// engine-major with classes ascending, as the centre wants them.
fn centre(
    n_engines: usize,
    cand: &crate::pass::Candidates,
    x: &[f64],
    source: impl Fn(usize) -> Option<(usize, f64)>,
) -> PrevRoutes {
    let mut prev =
        PrevRoutes { start: Vec::with_capacity(n_engines + 1), class: Vec::new(), rps: Vec::new() };
    prev.start.push(0);
    for j in 0..n_engines {
        if let Some((row, scale)) = source(j) {
            for e in cand.start[row]..cand.start[row + 1] {
                let rps = x[e] * scale;
                if rps > 0.0 {
                    prev.class.push(cand.class[e]);
                    prev.rps.push(rps);
                }
            }
        }
        prev.start.push(prev.class.len());
    }
    prev
}

/// Groups the engines that take load by network column minus its smallest entry (over groups
/// with demand): an engine joins the first cluster whose first member's normalised column is
/// within `TOLERANCE_MS` everywhere (and forbidden at the same groups), else starts a new one.
/// None when that leaves too many clusters.
fn exact_clusters(model: &Model) -> Option<Clusters> {
    let m = model.n_engines();
    let active: Vec<usize> = (0..model.n_classes()).filter(|&k| model.class_on[k]).collect();
    let mut offset = vec![0.0; m];
    let mut heads: Vec<usize> = Vec::new();
    let mut of_engine: Vec<(u32, u32)> = Vec::with_capacity(m); // (cluster, engine)
    for j in 0..m {
        if !model.engine_on[j] {
            continue;
        }
        let column = model.network.engine_column(j);
        let b = active.iter().map(|&k| column[k]).fold(f64::INFINITY, f64::min);
        if !b.is_finite() {
            continue; // no class may use it
        }
        offset[j] = b;
        let close = |&h: &usize| {
            let (head, bh) = (model.network.engine_column(h), offset[h]);
            active.iter().all(|&k| {
                let (v, w) = (column[k], head[k]);
                // Equal infinities (both forbidden) subtract to NaN: compare finiteness first.
                v.is_finite() == w.is_finite()
                    && (!v.is_finite() || ((v - b) - (w - bh)).abs() <= TOLERANCE_MS)
            })
        };
        let s = match heads.iter().position(close) {
            Some(s) => s,
            None if heads.len() < MAX_CLUSTERS => {
                heads.push(j);
                heads.len() - 1
            }
            None => return None,
        };
        of_engine.push((s as u32, j as u32));
    }
    if of_engine.len() < MIN_ENGINES || heads.len() * MIN_REDUCTION > of_engine.len() {
        return None;
    }
    // Stable by cluster, engines ascending within one; the head is each cluster's first member.
    of_engine.sort_unstable();
    let mut start = vec![0usize; heads.len() + 1];
    for &(s, _) in &of_engine {
        start[s as usize + 1] += 1;
    }
    for s in 0..heads.len() {
        start[s + 1] += start[s];
    }
    let engine: Vec<u32> = of_engine.into_iter().map(|(_, j)| j).collect();
    let n = model.n_classes();
    let mut values = Vec::with_capacity(n * heads.len());
    for s in 0..heads.len() {
        let first = engine[start[s]] as usize;
        let b = offset[first];
        values.extend(model.network.engine_column(first).iter().map(|&v| (v - b).max(0.0)));
    }
    Some(Clusters { start, engine, offset, values, exact: true, bounds: None })
}

/// One engine's column of the network matrix over the `active` groups (all `n_classes` of
/// them, or some): its nearest group (the first at the minimum), the hash of the groups that may
/// not use it, and its mean over the groups that may; `None` when no active group may use it.
fn scan_column(column: &[f64], active: &[usize], n_classes: usize) -> Option<(u32, u64, f64)> {
    let (mut nearest, mut best) = (u32::MAX, f64::INFINITY);
    let (mut hash, mut sum, mut count) = (FORBIDDEN_HASH_SEED, 0.0, 0.0);
    if active.len() == n_classes {
        // Every group has demand (the usual case): one plain scan of the column, the same
        // sums, minimum and hash (entries are finite and non-negative, or +∞ where forbidden;
        // the nearest group is the first at the minimum, as below).
        let mut finite = 0usize;
        for (k, &v) in column.iter().enumerate() {
            best = if v < best { v } else { best };
            if v < f64::INFINITY {
                sum += v;
                finite += 1;
            } else {
                hash = (hash.rotate_left(23) ^ k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            }
        }
        if finite > 0 {
            nearest = column.iter().position(|&v| v == best).map_or(u32::MAX, |k| k as u32);
        }
        count = finite as f64;
    } else {
        for &k in active {
            let v = column[k];
            if v.is_finite() {
                if v < best {
                    best = v;
                    nearest = k as u32;
                }
                sum += v;
                count += 1.0;
            } else {
                hash = (hash.rotate_left(23) ^ k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            }
        }
    }
    if nearest == u32::MAX {
        return None;
    }
    Some((nearest, hash, sum / count))
}

/// Approximate clusters for matrices that do not cluster exactly (measured round-trip times:
/// sites spread around a region's centre, jitter on every pair): engines grouped by their
/// nearest group (the front end with the smallest n_kj) and, within that, by the groups that
/// split them (forbidden at some members and allowed at others, see `SPLITTING`), so at most
/// about one cluster per group. Pairs forbidden at only a few members (scattered exclusions)
/// do not split a cluster: the fit uses the members that allow them, and the split of the
/// coarse flows gives those members nothing (`start`). Within a cluster the columns are fitted
/// as n_kj ≈ a_kS + b_j (b_j the engine's mean over its allowed groups, less the cluster's
/// smallest; a_kS the mean of n_kj − b_j over the members that allow k, +∞ where at least half
/// forbid it). The coarse solution is then only a starting point: the full solve corrects what
/// the fit leaves out.
fn nearest_clusters(model: &Model) -> Option<Clusters> {
    let (n, m) = (model.n_classes(), model.n_engines());
    let active: Vec<usize> = (0..n).filter(|&k| model.class_on[k]).collect();
    let mut offset = vec![0.0; m];
    // (nearest group, hash of the groups that may not use it, engine)
    let mut keyed: Vec<(u32, u64, u32)> = Vec::with_capacity(m);
    let mut forbidden_hash = vec![0u64; m];
    for j in 0..m {
        model.network.prefetch_column(j + PREFETCH_AHEAD);
        if !model.engine_on[j] {
            continue;
        }
        let Some((nearest, hash, mean)) = scan_column(model.network.engine_column(j), &active, n) else {
            continue; // no class may use it
        };
        offset[j] = mean;
        forbidden_hash[j] = hash;
        keyed.push((nearest, hash, j as u32));
    }
    keyed.sort_unstable();
    if keyed.len() < MIN_ENGINES {
        return None;
    }
    let keyed = split_by_forbidden(model, &active, keyed);
    let mut start = vec![0usize];
    for w in 1..keyed.len() {
        if (keyed[w].0, keyed[w].1) != (keyed[w - 1].0, keyed[w - 1].1) {
            start.push(w);
        }
    }
    start.push(keyed.len());
    let clusters = start.len() - 1;
    // About one cluster per group, more where residency splits them: the coarse problem's size
    // follows the group count (its cost is linear here, unlike `exact_clusters`'s search).
    if clusters * MIN_REDUCTION > keyed.len() || clusters > MAX_CLUSTERS.max(2 * active.len()) {
        return None;
    }
    let engine: Vec<u32> = keyed.into_iter().map(|(_, _, j)| j).collect();
    let mut values = vec![0.0; n * clusters];
    let (mut lo, mut hi) = (vec![f64::INFINITY; n * clusters], vec![f64::NEG_INFINITY; n * clusters]);
    let mut allowed = vec![0u32; n];
    for s in 0..clusters {
        let members = &engine[start[s]..start[s + 1]];
        let low = members.iter().map(|&j| offset[j as usize]).fold(f64::INFINITY, f64::min);
        for &j in members {
            offset[j as usize] -= low;
        }
        let column = &mut values[s * n..(s + 1) * n];
        let (low_s, high_s) = (&mut lo[s * n..(s + 1) * n], &mut hi[s * n..(s + 1) * n]);
        let first_hash = forbidden_hash[members[0] as usize];
        if members.iter().all(|&j| forbidden_hash[j as usize] == first_hash) {
            // Every member forbids the same groups: +∞ stays +∞, the rest is a plain mean.
            for (i, &j) in members.iter().enumerate() {
                prefetch_member(model, members, i + PREFETCH_AHEAD);
                let b = offset[j as usize];
                // Slices of one length, indexed: the compiler vectorises this form.
                let values = &model.network.engine_column(j as usize)[..n];
                let (a, l, h) = (&mut column[..n], &mut low_s[..n], &mut high_s[..n]);
                for k in 0..n {
                    let d = values[k] - b;
                    a[k] += d;
                    l[k] = if d < l[k] { d } else { l[k] };
                    h[k] = if d > h[k] { d } else { h[k] };
                }
            }
            let count = members.len() as f64;
            for a in column.iter_mut() {
                *a = (*a / count).max(0.0);
            }
            continue;
        }
        allowed.fill(0);
        for (i, &j) in members.iter().enumerate() {
            prefetch_member(model, members, i + PREFETCH_AHEAD);
            let b = offset[j as usize];
            let values = &model.network.engine_column(j as usize)[..n];
            let (a, c, l, h) = (&mut column[..n], &mut allowed[..n], &mut low_s[..n], &mut high_s[..n]);
            for k in 0..n {
                // Branch-free: adding 0.0 leaves the sum as it was; +∞ (forbidden) leaves the
                // low bound as it was and makes the high one +∞. Indexed slices of one length:
                // the compiler vectorises this form.
                let v = values[k];
                let allowed = v.is_finite();
                let d = v - b;
                a[k] += if allowed { d } else { 0.0 };
                c[k] += u32::from(allowed);
                l[k] = if d < l[k] { d } else { l[k] };
                h[k] = if d > h[k] { d } else { h[k] };
            }
        }
        for (a, &c) in column.iter_mut().zip(&allowed) {
            *a = if 2 * c as usize > members.len() { (*a / c as f64).max(0.0) } else { f64::INFINITY };
        }
    }
    Some(Clusters { start, engine, offset, values, exact: false, bounds: Some((lo, hi)) })
}

/// Prefetches the column of `members[i]`, if any (`NetworkMatrix::prefetch_column`): a cluster's
/// members are spread over the matrix.
fn prefetch_member(model: &Model, members: &[u32], i: usize) {
    if let Some(&j) = members.get(i) {
        model.network.prefetch_column(j as usize);
    }
}

/// A group splits a bucket of engines (same nearest group) when it is forbidden at more than this
/// fraction of the members (and at least two) and allowed at more than this fraction: a
/// residency rule or a sovereign subset rather than scattered exclusions.
const SPLITTING: f64 = 0.1;

/// Fewer splitting groups than this are scattered exclusions too: the bucket stays whole.
const MIN_SPLITTING: usize = 4;

/// Seed of the hash of the groups an engine forbids.
const FORBIDDEN_HASH_SEED: u64 = 0x243F_6A88_85A3_08D3;

/// The engines keyed by (nearest group, hash of the groups they forbid, engine), sorted, re-keyed
/// by (nearest group, sub-cluster, engine), sorted. A bucket (one nearest group) whose members all
/// forbid the same groups is one sub-cluster. Otherwise an engine's pattern is the set of
/// splitting groups it forbids, and it joins the first sub-cluster whose first member's pattern
/// differs in at most a quarter of the splitting groups (scattered exclusions of a splitting group
/// do not make a sub-cluster of their own; a rule that forbids many groups at some members does),
/// else starts one.
fn split_by_forbidden(
    model: &Model,
    active: &[usize],
    mut keyed: Vec<(u32, u64, u32)>,
) -> Vec<(u32, u64, u32)> {
    let mut forbidden = vec![0u32; model.n_classes()];
    let mut splitting = Vec::new();
    let mut patterns: Vec<bool> = Vec::new(); // the heads' patterns, one after the other
    for bucket in keyed.chunk_by_mut(|a, b| a.0 == b.0) {
        if bucket.first().map(|e| e.1) == bucket.last().map(|e| e.1) {
            // Sorted by hash within the bucket: first and last agree, so all do.
            bucket.iter_mut().for_each(|e| e.1 = 0);
            continue;
        }
        bucket.sort_unstable_by_key(|e| e.2); // heads in engine order
        forbidden.fill(0);
        // Over every group, not only those with demand (`splitting` looks at those only): a
        // plain zip, which the compiler vectorises, where gathering through `active` was five
        // times the instructions (5.5 M of a 100 x 5,000 fleet cold solve).
        for (i, &(_, _, j)) in bucket.iter().enumerate() {
            if let Some(ahead) = bucket.get(i + PREFETCH_AHEAD) {
                model.network.prefetch_column(ahead.2 as usize);
            }
            let column = model.network.engine_column(j as usize);
            for (count, &v) in forbidden.iter_mut().zip(column) {
                *count += u32::from(!v.is_finite());
            }
        }
        let size = bucket.len() as f64;
        splitting.clear();
        splitting.extend(active.iter().copied().filter(|&k| {
            let f = forbidden[k] as f64;
            f >= 2.0 && f > SPLITTING * size && size - f > SPLITTING * size
        }));
        if splitting.len() < MIN_SPLITTING {
            splitting.clear();
        }
        let tolerance = splitting.len() / 4;
        patterns.clear();
        for entry in bucket.iter_mut() {
            let column = model.network.engine_column(entry.2 as usize);
            let pattern = splitting.iter().map(|&k| !column[k].is_finite());
            let heads = patterns.len() / splitting.len().max(1);
            let sub = (0..heads).find(|&h| {
                let head = &patterns[h * splitting.len()..(h + 1) * splitting.len()];
                head.iter().zip(pattern.clone()).filter(|(a, b)| **a != *b).count() <= tolerance
            });
            let sub = sub.unwrap_or_else(|| {
                patterns.extend(pattern);
                heads
            });
            entry.1 = sub as u64;
        }
    }
    keyed.sort_unstable();
    keyed
}

/// The cluster as one engine: its marginal cost tabulated at prices from the cheapest member's
/// base price to where every member is saturated, load Σ_j Y_j(Q − b_j).
fn cluster_curve(model: &Model, members: &[u32], offset: &[f64]) -> Option<Curve> {
    let (mut base, mut top, mut cap) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    for &j in members {
        let (curve, b) = (&model.curves[j as usize], offset[j as usize]);
        base = base.min(curve.base_price() + b);
        top = top.max(curve.marginal(curve.cap()) + b);
        cap += curve.cap();
    }
    let range = top - base;
    if !(range > 0.0 && range.is_finite()) {
        return None;
    }
    let growth = (1.0 / FIRST_SAMPLE).ln();
    let prices: Vec<f64> = (1..SAMPLES)
        .map(|i| {
            base + range * ((growth * i as f64 / SAMPLES as f64).exp() - 1.0) / (1.0 / FIRST_SAMPLE - 1.0)
        })
        .collect();
    // Member by member (each sample's sum still in member order): a member's curve is read
    // once, and its samples past saturation cost nothing.
    let mut loads = vec![0.0; prices.len()];
    for &j in members {
        model.curves[j as usize].add_responses(&prices, offset[j as usize], &mut loads);
    }
    let mut points = Vec::with_capacity(SAMPLES + 1);
    points.push((base, 0.0));
    points.extend(prices.iter().copied().zip(loads));
    points.push((top, cap));
    Curve::from_marginal_table(&points)
}

/// Prices for a fitted coarse problem from a smaller one whose classes are grouped the way
/// `nearest_clusters` groups engines: a class's row over the clusters less its mean α_k
/// (over the clusters it may use) is compared with each group's first member's, and it joins the
/// first within `GROUP_TOLERANCE_MS` (and `GROUP_MISMATCH`), else starts a group. Then
/// a_kS ≈ A_GS + α_k, with A_GS the mean of a_kS − α_k over the members that may use S (+∞ where
/// at most half may), and a group whose price is U stands for members priced U + α_k: it sheds a
/// member's tier (P, d) where U > P − α_k. Returns the coarse classes' prices U_G + α_k (−∞ for
/// classes without demand) and the number of groups; None when the classes do not group at least
/// `MIN_GROUP_REDUCTION`-fold or the grouped problem cannot be certified.
///
/// The coarse problem's first stage prices regions that lack capacity above those that have it,
/// which one common price knows nothing about: from that start it took 20–41 Newton steps, each
/// factoring a 200 × 200 matrix on 200 × 20,000. The grouped problem (~25 groups) takes about as
/// many on a 25 × 25 one, and leaves the coarse problem 1–3 ms from its optimum.
fn grouped_prices(coarse: &Model, options: &SolverOptions, scale: f64) -> Option<(Vec<f64>, usize)> {
    let ClassGroups { group_of, offset: alpha, values, groups } = group_classes(coarse)?;
    let (n, s_count) = (coarse.n_classes(), coarse.n_engines());
    let mut tier_start = Vec::with_capacity(groups + 1);
    let mut tiers = Vec::new();
    tier_start.push(0);
    for g in 0..groups as u32 {
        for k in (0..n).filter(|&k| group_of[k] == g) {
            let member = &coarse.tiers[coarse.tier_start[k]..coarse.tier_start[k + 1]];
            tiers.extend(member.iter().map(|&(p, d)| (p - alpha[k], d)));
        }
        tier_start.push(tiers.len());
    }
    let network = NetworkMatrix::from_engine_major(groups, s_count, values);
    let curves = std::sync::Arc::clone(&coarse.curves);
    let grouped = Model::from_tiers(&network, curves, tier_start, tiers, coarse.capacity.clone(), coarse.rho);
    let loose = SolverOptions { gap_target: GROUPED_GAP.max(options.gap_target), ..options.clone() };
    let mut run = Run::new(&grouped, &loose, scale, PrevRoutes::default());
    run.idle_reach_per_eps = crate::newton::IDLE_REACH_PER_EPS;
    let (repaired, _) = run.solve(cold_prices(&grouped), FITTED_EPSILON * scale);
    if !repaired.gap().is_finite() {
        return None;
    }
    let prices = (0..n)
        .map(|k| match group_of[k] {
            u32::MAX => f64::NEG_INFINITY,
            g => run.u[g as usize] + alpha[k],
        })
        .collect();
    Some((prices, groups))
}

/// The classes of a fitted coarse problem grouped by the shape of their rows (`grouped_prices`).
struct ClassGroups {
    /// Each class's group (`u32::MAX`: no demand).
    group_of: Vec<u32>,
    /// α_k, with a_kS ≈ A_GS + α_k.
    offset: Vec<f64>,
    /// A_GS, cluster-major (`groups` per cluster), each group's row starting at zero.
    values: Vec<f64>,
    groups: usize,
}

/// Groups the classes of a fitted coarse problem (see `grouped_prices`); None when they do not
/// group at least `MIN_GROUP_REDUCTION`-fold.
fn group_classes(coarse: &Model) -> Option<ClassGroups> {
    let (n, s_count) = (coarse.n_classes(), coarse.n_engines());
    // Class-major rows (the matrix is cluster-major): each class is compared whole below.
    let mut rows = vec![0.0; n * s_count];
    for s in 0..s_count {
        for (k, &v) in coarse.network.engine_column(s).iter().enumerate() {
            rows[k * s_count + s] = v;
        }
    }
    let row = |k: usize| &rows[k * s_count..(k + 1) * s_count];
    let mut alpha = vec![0.0; n];
    let mut group_of = vec![u32::MAX; n];
    let mut heads: Vec<usize> = Vec::new();
    let max_mismatched = (GROUP_MISMATCH * s_count as f64) as usize;
    let mut active = 0;
    for k in 0..n {
        if !coarse.class_on[k] {
            continue;
        }
        active += 1;
        let (sum, count) =
            row(k).iter().filter(|v| v.is_finite()).fold((0.0, 0.0), |(s, c), v| (s + v, c + 1.0));
        if count == 0.0 {
            return None; // no cluster may serve it: left to the common-price start
        }
        alpha[k] = sum / count;
        let close = |&h: &usize| {
            let mut mismatched = 0;
            row(k).iter().zip(row(h)).all(|(&v, &w)| {
                if v.is_finite() != w.is_finite() {
                    mismatched += 1;
                    return mismatched <= max_mismatched;
                }
                !v.is_finite() || ((v - alpha[k]) - (w - alpha[h])).abs() <= GROUP_TOLERANCE_MS
            })
        };
        let g = heads.iter().position(close).unwrap_or_else(|| {
            heads.push(k);
            heads.len() - 1
        });
        group_of[k] = g as u32;
    }
    let groups = heads.len();
    if groups * MIN_GROUP_REDUCTION > active {
        return None;
    }
    // A_GS: sums and counts of the members that may use S, then the means, each group's row
    // shifted to start at zero (its members' offsets take the shift).
    let mut values = vec![0.0; groups * s_count];
    let mut allowed = vec![0u32; groups * s_count];
    let mut members = vec![0u32; groups];
    for k in (0..n).filter(|&k| group_of[k] != u32::MAX) {
        let g = group_of[k] as usize;
        members[g] += 1;
        for (s, &v) in row(k).iter().enumerate() {
            if v.is_finite() {
                values[s * groups + g] += v - alpha[k];
                allowed[s * groups + g] += 1;
            }
        }
    }
    let mut low = vec![f64::INFINITY; groups];
    for (i, (v, &a)) in values.iter_mut().zip(&allowed).enumerate() {
        let g = i % groups;
        *v = if 2 * a > members[g] { *v / a as f64 } else { f64::INFINITY };
        low[g] = low[g].min(*v);
    }
    if low.iter().any(|l| !l.is_finite()) {
        return None;
    }
    for (i, v) in values.iter_mut().enumerate() {
        *v = (*v - low[i % groups]).max(0.0);
    }
    for k in (0..n).filter(|&k| group_of[k] != u32::MAX) {
        alpha[k] += low[group_of[k] as usize];
    }
    Some(ClassGroups { group_of, offset: alpha, values, groups })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Latency;

    /// Twelve classes in three groups over six engines, rows exactly A_GS + α_k: the grouped
    /// start finds the three groups, and its prices are those of the ungrouped problem solved
    /// tightly, up to the grouped problem's looser gap (a member priced U − α_k instead of
    /// U + α_k would be 2α_k off, up to 16 ms here).
    #[test]
    fn grouped_prices_are_the_ungrouped_optimum() {
        let (groups, members, engines) = (3, 4, 6);
        let n = groups * members;
        let a = |g: usize, s: usize| {
            [[5.0, 30.0, 60.0], [40.0, 8.0, 35.0], [70.0, 45.0, 6.0]][g][s % 3] + s as f64
        };
        let alpha = |k: usize| (k * 37 % 17) as f64 * 0.5;
        let values: Vec<f64> =
            (0..engines).flat_map(|s| (0..n).map(move |k| a(k / members, s) + alpha(k))).collect();
        let network = NetworkMatrix::from_engine_major(n, engines, values);
        let capacity: Vec<f64> = (0..engines).map(|s| 40.0 + 15.0 * s as f64).collect();
        let curves = capacity
            .iter()
            .map(|&c| Curve::new(&Latency::Queueing { t0_ms: 50.0, b_ms: 20.0 }, c, 0.95))
            .collect();
        let tiers = (0..n).map(|k| (5_000.0, 8.0 + (k * 7 % 5) as f64 * 3.0)).collect();
        let model = Model::from_tiers(
            &network,
            std::sync::Arc::new(curves),
            (0..=n).collect(),
            tiers,
            capacity,
            0.95,
        );
        let options = SolverOptions { gap_target: 1e-6, ..SolverOptions::default() };
        let scale = 50.0;
        let (prices, found) = grouped_prices(&model, &options, scale).expect("the classes group");
        assert_eq!(found, groups);
        let mut run = Run::new(&model, &options, scale, PrevRoutes::default());
        let (repaired, _) = run.solve(cold_prices(&model), 0.2 * scale);
        assert!(repaired.gap() <= 1e-6, "gap {}", repaired.gap());
        for k in 0..n {
            assert!((prices[k] - run.u[k]).abs() <= 1.0, "class {k}: {} against {}", prices[k], run.u[k]);
        }
    }
}

//! What a solve returns: routes, shed traffic, engine loads and prices, the objective with its
//! certified lower bound, and how much traffic moved since the previous solution; plus the
//! warm-start state that the next solve resumes from.

use serde::{Deserialize, Serialize};

/// One route: class `class` sends `rps` to engine `engine` (indices into the problem's lists).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Route {
    pub class: usize,
    pub engine: usize,
    pub rps: f64,
    /// The published weight: rps / (demand − shed) of the class, except where a class keeps its
    /// previous weights and part of its headroom (`Class::headroom_rps`) is planned on engines
    /// the weights do not send it to. Weights of a class sum to 1.
    pub weight: f64,
}

/// Why an engine carries the load it carries: what the control plane shows next to a weight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnginePlan {
    pub load_rps: f64,
    /// L_j(load): the engine latency expected at the planned load (ms).
    pub expected_latency_ms: f64,
    /// Marginal price q_j (ms): the cost of one more req/s here, f'_j(load) or the capacity
    /// multiplier on top of it when capacity binds.
    pub marginal_price_ms: f64,
    /// Load is at the usable capacity ρ·c_j.
    pub capacity_binds: bool,
}

/// The result of one solve. Indices refer to the solved [`crate::Problem`]'s lists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Solution {
    /// Sorted by class, then engine; only positive flows.
    pub routes: Vec<Route>,
    /// Shed req/s per class.
    pub shed_rps: Vec<f64>,
    pub engines: Vec<EnginePlan>,
    /// Σ n·x + Σ y·L(y) + Σ P·s of the published routing (ms·req/s).
    pub objective: f64,
    /// Certified lower bound on the optimal objective (Lagrangian dual).
    pub lower_bound: f64,
    /// (objective − lower_bound) / objective.
    pub gap: f64,
    /// objective / total demand (ms); 0 without demand.
    pub mean_latency_ms: f64,
    /// Σ|x − x_prev| / 2 / Σ d against the warm-start routes; `None` on a cold solve. For a
    /// split the stability rule kept in part, against the split published before, both as the
    /// data planes see them (admitted req/s spread by the weights).
    pub traffic_moved: Option<f64>,
    /// Newton steps taken on the full problem (diagnostics).
    pub newton_steps: usize,
    /// Passes over the engines (diagnostics).
    pub passes: usize,
    /// Full scans of the network matrix (diagnostics).
    pub rebuilds: usize,
    /// Final smoothing ε (ms).
    pub epsilon: f64,
    /// Engines of the coarse problem a cold solve started from (clusters of engines whose
    /// network columns differ by a constant); `None` when it did not use one (diagnostics).
    pub coarse_engines: Option<usize>,
    /// Classes of the grouped problem the coarse problem started from (groups of classes whose
    /// rows over the clusters differ by about a constant); `None` when it started from one
    /// common price or there was no coarse problem (diagnostics).
    pub coarse_classes: Option<usize>,
}

impl Solution {
    pub fn engine_load_rps(&self) -> Vec<f64> {
        self.engines.iter().map(|e| e.load_rps).collect()
    }

    /// Routes of one class (a slice of `routes`).
    pub fn class_routes(&self, class_idx: usize) -> &[Route] {
        let lo = self.routes.partition_point(|r| r.class < class_idx);
        let hi = self.routes.partition_point(|r| r.class <= class_idx);
        &self.routes[lo..hi]
    }
}

/// State carried from one solve to the next, matched by class and engine id so that classes and
/// engines may come and go between solves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WarmStart {
    pub(crate) class_ids: Ids,
    pub(crate) engine_ids: Ids,
    /// Class prices u_k (`None` for classes without demand).
    pub(crate) prices: Vec<Option<f64>>,
    /// Group of each class in that solve (classes with identical network rows are merged).
    pub(crate) class_group: Vec<u32>,
    /// Each class's fraction of its group's routes: its route to engine j was share × X_gj.
    pub(crate) share: Vec<f64>,
    /// Group routes as (group, engine_idx, rps), sorted by engine then group.
    pub(crate) routes: Vec<(u32, u32, f64)>,
    pub(crate) epsilon: f64,
    /// Each engine's price q_j at that solve's end, by engine index: a re-solve of the same
    /// engines starts each engine's root there (empty in older serialised states). Kept in the
    /// serialised state, so that a re-solve from it gives the same result as from the original.
    #[serde(default)]
    pub(crate) engine_prices: Vec<f64>,
    /// This state came from a cold solve: the next re-solve's prices move further than later
    /// ones' (it gets the wider candidate lists; absent in older serialised states: false).
    #[serde(default)]
    pub(crate) after_cold: bool,
    /// The engines' processed curves (a cache: not serialised, and ignored by `==`).
    #[serde(skip)]
    pub(crate) curves: CurveCache,
    /// The candidate lists a warm re-solve kept, with what they are valid for (a cache: not
    /// serialised, and ignored by `==`; the lists extracted from them are those a rebuild builds).
    #[serde(skip)]
    pub(crate) lists: ListCache,
}

/// Class or engine ids, shared: a warm re-solve of a problem with the same ids shares the previous
/// state's instead of copying them (copying 20,000 engine ids and freeing the old ones was a few
/// per cent of a warm re-solve). Serialised as the plain list.
#[derive(Clone, Debug, PartialEq, Default)]
pub(crate) struct Ids(pub(crate) std::sync::Arc<Vec<String>>);

impl std::ops::Deref for Ids {
    type Target = Vec<String>;

    fn deref(&self) -> &Vec<String> {
        &self.0
    }
}

impl Serialize for Ids {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Ids {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<String>::deserialize(deserializer).map(|ids| Ids(std::sync::Arc::new(ids)))
    }
}

/// [`WarmStart`]'s cache of the engines' curves (see `pass::EngineCurves`).
#[derive(Clone, Debug, Default)]
pub(crate) struct CurveCache(pub(crate) Option<std::sync::Arc<crate::pass::EngineCurves>>);

impl PartialEq for CurveCache {
    /// A cache does not change what the state means.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// [`WarmStart`]'s cache of candidate lists (see `Run::kept`), with the inputs they were built
/// from: the problem's network matrix (shared, or compared bit for bit), the grouping, and which
/// groups have demand and which engines capacity.
#[derive(Clone, Default)]
pub(crate) struct ListCache(pub(crate) Option<std::sync::Arc<KeptLists>>);

pub(crate) struct KeptLists {
    pub network: std::sync::Arc<Vec<f64>>,
    pub class_group: Vec<u32>,
    pub class_on: Vec<bool>,
    pub engine_on: Vec<bool>,
    /// None when the solve kept none (a cold one, or the matrix had changed).
    pub lists: Option<std::sync::Arc<crate::pass::Candidates>>,
}

impl std::fmt::Debug for ListCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(kept) => write!(f, "ListCache({:?} entries)", kept.lists.as_ref().map(|l| l.class.len())),
            None => write!(f, "ListCache(None)"),
        }
    }
}

impl PartialEq for ListCache {
    /// A cache does not change what the state means.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl WarmStart {
    /// Class prices (ms) of the solve this state came from, by class index of that problem.
    pub fn class_prices(&self) -> &[Option<f64>] {
        &self.prices
    }
}

//! A validated snapshot compiled into an immutable routing table, and the pick itself.
//!
//! Compilation happens off the request path (when a snapshot arrives); the result is shared
//! read-only by every request. Each class gets a [`SlotTable`] built from the previous table's
//! class of the same id, so a weight change moves the least traffic possible.

use crate::affinity::{affinity_tag, AffinityTable};
use crate::ids::{ClassId, ClusterId, EngineId, ModelName, SnapshotVersion};
use crate::slots::SlotTable;
use crate::snapshot::{EngineEntry, Snapshot, SnapshotError};
use std::collections::HashMap;

/// Probes of the slot table before falling back to a scan of all candidates.
pub const MAX_PROBES: u32 = 24;

/// An engine may hold up to (1 + ε) times its weighted share e of its class's in-flight
/// requests, plus `LOAD_SLACK`·√e, before keys walk on to the next candidate (consistent hashing
/// with bounded loads).
pub const LOAD_BOUND: f64 = 1.25;

/// Standard deviations of an in-flight count's chance fluctuation (≈ √e for Poisson arrivals)
/// the bound tolerates on top of `LOAD_BOUND`: keys move only for an imbalance chance alone
/// would rarely produce. A purely relative bound trips far more often for an engine with a
/// small share (its count fluctuates more relative to its mean), and every trip breaks a
/// conversation's cache affinity and moves its request to a larger neighbour: in the fleet
/// simulator that put the local engine of an overflowing region 2–3 % above its planned load,
/// where the latency curve is steepest; on `global-day` the slack alone took the `feedback`
/// policy's mean end-to-end latency from 5,398 to 3,506 ms.
pub const LOAD_SLACK: f64 = 3.0;

/// How much more loaded per unit of weight than its hash pick a conversation's engine may be,
/// counting the request on either, before the conversation leaves it when keys are placed by
/// load ([`ClassTable::select`]). With equal weights a follow-up leaves only an engine with
/// two or more others in flight for an idle hash pick (four or more for a pick with one), and
/// an idle engine keeps its conversations while its weight is at least half of their hash
/// pick's divided by the pick's load plus one. Leaving costs the conversation its cached
/// prefix: on the fleet simulator's `few-slots` scenario (2-slot engines, long prefixes) this
/// ratio costs 0.8–1.8 points of hit rate against blind hashing and 4 gave the same hit rate
/// and lower TTFT; but with 4, after a grey engine recovered, the conversations that had left
/// it came back too slowly (the grey-engine test missed its regain in 4 of 8 runs against
/// none in 12 with 2). The data plane's overload test (one affinity key for every request, 2×
/// capacity) once served only 67–71 of 123 req/s with this rule, which kept placing by load
/// off by default; since the data plane's admission moved to `ilb_core::admission` it serves
/// 26.1 of 26.5 req/s with it (three runs under two busy loops), and placing by load is the
/// default.
pub const AFFINITY_KEEP_RATIO: f64 = 2.0;

/// Whether a candidate with `in_flight` requests and normalised `weight` is within its load
/// bound for one more request of a class with `class_in_flight` in flight. Hot path.
#[inline]
pub fn within_load_bound(in_flight: f64, weight: f64, class_in_flight: f64) -> bool {
    let expected = weight * (class_in_flight + 1.0);
    in_flight < (LOAD_BOUND * expected + LOAD_SLACK * expected.sqrt()).ceil()
}

/// Each candidate's share of its class's requests in flight (see [`Candidate::load_share`]).
fn load_shares(weights: &[crate::snapshot::EngineWeight]) -> Vec<f64> {
    let total: f64 = weights.iter().map(|w| w.weight).sum();
    let in_flight: Option<Vec<f64>> = weights
        .iter()
        .map(|w| if w.weight > 0.0 { w.in_flight_ms.map(|ms| w.weight * ms) } else { Some(0.0) })
        .collect();
    match in_flight {
        Some(v) if v.iter().sum::<f64>() > 0.0 => {
            let sum: f64 = v.iter().sum();
            v.into_iter().map(|x| x / sum).collect()
        }
        _ => weights.iter().map(|w| w.weight / total).collect(),
    }
}

/// The immutable routing table for one cluster.
#[derive(Debug)]
pub struct RoutingTable {
    pub version: SnapshotVersion,
    pub cluster: ClusterId,
    pub created_unix_ms: u64,
    pub utilisation: f64,
    pub engines: Vec<EngineEntry>,
    models: HashMap<Box<str>, ModelTable>,
    model_names: Vec<ModelName>,
    n_classes: usize,
}

#[derive(Debug)]
pub struct ModelTable {
    pub name: ModelName,
    pub classes: Vec<ClassTable>,
    /// The class for requests without constraints, or that no class matches exactly.
    pub default_class: usize,
}

#[derive(Debug)]
pub struct ClassTable {
    pub id: ClassId,
    /// Dense index of this class across all models of the table (0..n_classes), so callers
    /// can keep per-class state in a plain vector.
    pub seq: usize,
    /// Sorted, deduplicated.
    pub require: Vec<String>,
    pub residency: Option<String>,
    pub candidates: Vec<Candidate>,
    pub shed_fraction: f64,
    pub slots: SlotTable,
    candidate_ids: Vec<EngineId>,
    /// Per candidate: its engine's [`affinity_tag`].
    affinity_tags: Vec<u32>,
    /// (affinity tag, candidate), sorted: the way back from a remembered engine.
    by_affinity_tag: Vec<(u32, u32)>,
}

#[derive(Clone, Debug)]
pub struct Candidate {
    /// Index into [`RoutingTable::engines`].
    pub engine_idx: usize,
    /// Normalised: the weights of a class sum to one.
    pub weight: f64,
    pub expected_latency_ms: Option<f64>,
    pub network_ms: Option<f64>,
    /// The candidate's expected share of its class's requests in flight: weight × in-flight
    /// time, normalised over the class, when every weighted candidate has an in-flight time
    /// (`EngineWeight::in_flight_ms`), else the weight. The load bound and placement by load
    /// compare in-flight counts with it.
    pub load_share: f64,
}

/// What a request asks of the engine that serves it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Constraints<'a> {
    /// Required capabilities, sorted and deduplicated.
    pub require: &'a [&'a str],
    pub residency: Option<&'a str>,
}

impl Constraints<'_> {
    pub fn is_empty(&self) -> bool {
        self.require.is_empty() && self.residency.is_none()
    }

    /// Whether `engine` can serve a request with these constraints.
    pub fn allow(&self, engine: &EngineEntry) -> bool {
        crate::constraint::satisfies(self.require, self.residency, &engine.capabilities, &engine.residency)
    }
}

/// Where a pick landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Picked {
    /// Index into the class's candidates.
    pub candidate: usize,
    /// Slot-table probes made (1 when the key's own slot was usable).
    pub probes: u32,
    /// True when no probe succeeded and a scan over all candidates found it.
    pub fallback: bool,
}

impl RoutingTable {
    /// Validates `snapshot` and compiles it, carrying slot layouts over from `previous`.
    pub fn compile(
        snapshot: &Snapshot,
        previous: Option<&RoutingTable>,
    ) -> Result<RoutingTable, SnapshotError> {
        snapshot.validate()?;
        let engine_index: HashMap<&str, usize> =
            snapshot.engines.iter().enumerate().map(|(i, e)| (e.id.as_str(), i)).collect();
        let mut models = HashMap::with_capacity(snapshot.models.len());
        let mut n_classes = 0usize;
        for routes in &snapshot.models {
            let prev_model = previous.and_then(|p| p.model(routes.model.as_str()));
            let classes: Vec<ClassTable> = routes
                .classes
                .iter()
                .map(|class| {
                    let total: f64 = class.weights.iter().map(|w| w.weight).sum();
                    let shares = load_shares(&class.weights);
                    let candidates: Vec<Candidate> = class
                        .weights
                        .iter()
                        .zip(shares)
                        .map(|(w, load_share)| Candidate {
                            engine_idx: engine_index[w.engine.as_str()],
                            weight: w.weight / total,
                            expected_latency_ms: w.expected_latency_ms,
                            network_ms: w.network_ms,
                            load_share,
                        })
                        .collect();
                    let candidate_ids: Vec<EngineId> =
                        class.weights.iter().map(|w| w.engine.clone()).collect();
                    let weights: Vec<f64> = candidates.iter().map(|c| c.weight).collect();
                    let prev_class = prev_model.and_then(|m| m.classes.iter().find(|c| c.id == class.id));
                    // Unchanged candidates and weights (the plan was kept): the same table, shared.
                    let slots = match prev_class {
                        Some(prev) if prev.has_weights(&candidate_ids, &weights) => prev.slots.clone(),
                        _ => SlotTable::build(
                            &weights,
                            &candidate_ids,
                            prev_class.map(|c| (&c.slots, c.candidate_ids.as_slice())),
                        ),
                    };
                    let affinity_tags: Vec<u32> =
                        candidate_ids.iter().map(|id| affinity_tag(id.as_str())).collect();
                    let mut by_affinity_tag: Vec<(u32, u32)> =
                        affinity_tags.iter().enumerate().map(|(i, &tag)| (tag, i as u32)).collect();
                    by_affinity_tag.sort_unstable();
                    let mut require = class.require.clone();
                    require.sort();
                    require.dedup();
                    n_classes += 1;
                    ClassTable {
                        id: class.id.clone(),
                        seq: n_classes - 1,
                        require,
                        residency: class.residency.clone(),
                        candidates,
                        shed_fraction: class.shed_fraction,
                        slots,
                        candidate_ids,
                        affinity_tags,
                        by_affinity_tag,
                    }
                })
                .collect();
            let default_class =
                classes.iter().position(|c| c.require.is_empty() && c.residency.is_none()).unwrap_or(0);
            models.insert(
                routes.model.0.clone().into_boxed_str(),
                ModelTable { name: routes.model.clone(), classes, default_class },
            );
        }
        let mut model_names: Vec<ModelName> = snapshot.models.iter().map(|m| m.model.clone()).collect();
        model_names.sort();
        Ok(RoutingTable {
            version: snapshot.version,
            cluster: snapshot.cluster.clone(),
            created_unix_ms: snapshot.created_unix_ms,
            utilisation: snapshot.utilisation,
            engines: snapshot.engines.clone(),
            models,
            model_names,
            n_classes,
        })
    }

    /// Hot path: one hash-map lookup.
    #[inline]
    pub fn model(&self, name: &str) -> Option<&ModelTable> {
        self.models.get(name)
    }

    /// Number of classes over all models; [`ClassTable::seq`] is below it.
    pub fn n_classes(&self) -> usize {
        self.n_classes
    }

    /// Every model's table, sorted by model name.
    pub fn models(&self) -> impl Iterator<Item = &ModelTable> {
        self.model_names.iter().filter_map(|n| self.models.get(n.as_str()))
    }

    /// Served models, sorted by name.
    pub fn model_names(&self) -> &[ModelName] {
        &self.model_names
    }
}

impl ModelTable {
    /// The class a request with `constraints` belongs to: the class with exactly these
    /// constraints, else the default class (whose candidates the caller then filters).
    pub fn class_for(&self, constraints: &Constraints<'_>) -> &ClassTable {
        if !constraints.is_empty() {
            let exact = self.classes.iter().find(|c| {
                c.residency.as_deref() == constraints.residency
                    && c.require.len() == constraints.require.len()
                    && c.require.iter().zip(constraints.require).all(|(a, b)| a == b)
            });
            if let Some(class) = exact {
                return class;
            }
        }
        &self.classes[self.default_class]
    }
}

impl ClassTable {
    /// Picks a candidate for `key_hash` by weighted consistent hashing. `admit` says whether a
    /// candidate may take the request (constraints, guard, bounded load); refused candidates
    /// are walked past deterministically, so among the admitted the split still follows the
    /// weights. Zero-weight candidates are reached only by the final scan. Hot path.
    pub fn pick(&self, key_hash: u64, mut admit: impl FnMut(usize) -> bool) -> Option<Picked> {
        let n = self.candidates.len();
        let mut last_refused = usize::MAX;
        for attempt in 0..MAX_PROBES {
            let candidate = self.slots.probe(key_hash, attempt);
            if candidate >= n || candidate == last_refused {
                continue;
            }
            if admit(candidate) {
                return Some(Picked { candidate, probes: attempt + 1, fallback: false });
            }
            last_refused = candidate;
        }
        let start = (key_hash % n as u64) as usize;
        (0..n).map(|i| (start + i) % n).find(|&candidate| admit(candidate)).map(|candidate| Picked {
            candidate,
            probes: MAX_PROBES,
            fallback: true,
        })
    }

    pub fn candidate_ids(&self) -> &[EngineId] {
        &self.candidate_ids
    }

    /// Whether this class has exactly these candidates with exactly these (normalised) weights,
    /// so that its slot table would be rebuilt unchanged.
    fn has_weights(&self, ids: &[EngineId], weights: &[f64]) -> bool {
        self.candidate_ids == ids
            && self.candidates.iter().zip(weights).all(|(c, w)| c.weight.to_bits() == w.to_bits())
    }

    /// The data plane's selection (the proxy and the fleet simulator both call it): the
    /// candidate `affinity` remembers for the key if `bounded` admits it (and, with
    /// `new_by_load`, it is not far more loaded per unit of weight than the key's hash pick:
    /// [`AFFINITY_KEEP_RATIO`]); else hashing within
    /// the load bound — or, with `new_by_load` and for a key the table has never seen (a new
    /// conversation), the less loaded relative to its weight (`new_by_load` gives the class's
    /// requests in flight on a candidate) of the first two candidates hashing admits within
    /// the bound, counting the request being placed ([`ClassTable::pick_by_load`]); else
    /// hashing admitting `usable` (without the bound). Hot path.
    #[inline]
    pub fn select(
        &self,
        key_hash: u64,
        affinity: &AffinityTable,
        now_s: u32,
        bounded: impl Fn(usize) -> bool,
        usable: impl FnMut(usize) -> bool,
        new_by_load: Option<&dyn Fn(usize) -> f64>,
    ) -> Option<usize> {
        if let Some(c) = self.remembered(affinity, key_hash, now_s).filter(|&c| bounded(c)) {
            let leaves_for = new_by_load.and_then(|load| self.leaves_for(key_hash, c, &bounded, load));
            return Some(leaves_for.unwrap_or(c));
        }
        // The table is read again only when new keys are placed by load.
        let within = match new_by_load {
            Some(load) if affinity.get(key_hash, now_s).is_none() => {
                self.pick_by_load(key_hash, &bounded, load)
            }
            // A conversation that must move goes to its hash home, as before it had one: so a
            // plan that gives an engine its weight back gets its keys back too.
            _ => self.pick(key_hash, &bounded).map(|p| p.candidate),
        };
        within.or_else(|| self.pick(key_hash, usable).map(|p| p.candidate))
    }

    /// Where a follow-up on `remembered` goes when keys are placed by load: to the key's hash
    /// pick (within the bound) if, with it, `remembered` would carry more than
    /// [`AFFINITY_KEEP_RATIO`] times the load per unit of weight that the hash pick would with
    /// it; `None` when it stays. The load bound alone cannot see an engine the plan has cut to
    /// a sliver: an idle engine passes it whatever its weight, so conversations that live there
    /// keep coming back long after their engine was slowed and penalised (in the grey-engine
    /// test 3–5 % of the traffic stayed on an engine weighted 1 %, 20 s after the penalty).
    /// With loads in proportion to the weights the ratio is near one and every follow-up stays.
    fn leaves_for(
        &self,
        key_hash: u64,
        remembered: usize,
        bounded: impl Fn(usize) -> bool,
        load: &dyn Fn(usize) -> f64,
    ) -> Option<usize> {
        let home = self.pick(key_hash, bounded).filter(|p| !p.fallback)?.candidate;
        let (wr, wh) = (self.candidates[remembered].load_share, self.candidates[home].load_share);
        let stays = home == remembered
            || (load(remembered) + 1.0) * wh <= AFFINITY_KEEP_RATIO * (load(home) + 1.0) * wr;
        (!stays).then_some(home)
    }

    /// Weighted power of two choices on the hash: the first two distinct candidates the key's
    /// probe sequence reaches that `admit` accepts (each drawn in proportion to its weight), the
    /// hash's pick `a` and the runner-up `b`; the key goes to `b` only if `b`, with this
    /// request added, would carry no more `load` per unit of weight than `a` already does:
    /// (load(b) + 1) / w(b) ≤ load(a) / w(a). So with nothing in flight (or loads in
    /// proportion to the weights) the pick is plain consistent hashing and shares follow the
    /// weights; with equal weights it is the classic rule (the less loaded, on a tie the
    /// hash's); and a diversion never leaves the most loaded of the two, per unit of weight,
    /// more loaded than the hash's pick would have.
    ///
    /// With a few requests per engine the hash alone puts two concurrent conversations on one
    /// engine half the time while another idles; comparing two choices keeps each engine's
    /// load near its share, and drawing them by weight keeps the shares the plan's.
    ///
    /// Counting the request being placed matters for small weights. Comparing load(b) / w(b)
    /// alone makes an idle engine look free whatever its weight: an engine cut to 2 % of its
    /// class, idle while the others hold two requests each, took 6.2 % of new keys (every one
    /// whose runner-up it was), and in the grey-engine test (an engine slowed 3× and penalised
    /// to 1 %) those conversations then stayed with it, since an idle engine passes the load
    /// bound whatever its weight. The price: at a few requests in flight an engine with a small
    /// weight gets a little less than its share (2.5 % for a 3 % weight at 8 in flight: while
    /// it holds one request, four times its share, the keys it hashes go elsewhere).
    pub fn pick_by_load(
        &self,
        key_hash: u64,
        admit: impl Fn(usize) -> bool,
        load: impl Fn(usize) -> f64,
    ) -> Option<usize> {
        let first = self.pick(key_hash, &admit)?;
        if first.fallback {
            return Some(first.candidate);
        }
        let n = self.candidates.len();
        let a = first.candidate;
        for attempt in first.probes..MAX_PROBES {
            let b = self.slots.probe(key_hash, attempt);
            if b < n && b != a && admit(b) {
                let (wa, wb) = (self.candidates[a].load_share, self.candidates[b].load_share);
                // (load(b) + 1) / w(b) ≤ load(a) / w(a), without dividing by a zero weight.
                let better = wb > 0.0 && (load(b) + 1.0) * wa <= load(a) * wb;
                return Some(if better { b } else { a });
            }
        }
        Some(a)
    }

    /// The candidate `affinity` remembers for `key_hash` (the engine that served it last), if
    /// that engine is still a candidate with a positive weight. Hot path: one atomic load and a
    /// binary search.
    #[inline]
    pub fn remembered(&self, affinity: &AffinityTable, key_hash: u64, now_s: u32) -> Option<usize> {
        let candidate = self.stored_at(affinity, key_hash, now_s)?;
        (self.candidates[candidate].weight > 0.0).then_some(candidate)
    }

    /// The candidate `table` names for `key_hash`, whatever its weight: for state that lives on
    /// one engine only (a response the engine stored). Hot path: one atomic load and a binary
    /// search.
    #[inline]
    pub fn stored_at(&self, table: &AffinityTable, key_hash: u64, now_s: u32) -> Option<usize> {
        let tag = table.get(key_hash, now_s)?;
        let at = self.by_affinity_tag.binary_search_by_key(&tag, |&(t, _)| t).ok()?;
        Some(self.by_affinity_tag[at].1 as usize)
    }

    /// The tag under which `candidate` is remembered ([`crate::affinity::affinity_tag`]).
    pub fn affinity_tag(&self, candidate: usize) -> u32 {
        self.affinity_tags.get(candidate).copied().unwrap_or(0)
    }

    /// Records that `candidate` serves `key_hash` now. Hot path: one atomic store.
    #[inline]
    pub fn remember(&self, affinity: &AffinityTable, key_hash: u64, candidate: usize, now_s: u32) {
        if let Some(&tag) = self.affinity_tags.get(candidate) {
            affinity.put(key_hash, tag, now_s);
        }
    }
}

#[cfg(test)]
mod tests;

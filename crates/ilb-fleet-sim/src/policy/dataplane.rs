//! The simulated data planes of snapshot-driven policies (`feedback`, `ilb`): snapshots arrive
//! one pull after they are published, are compiled with the real
//! [`RoutingTable::compile`] (slot layouts carried over from the previous table), and requests
//! are picked with the data plane's own
//! [`ClassTable::select`](ilb_core::table::ClassTable::select): the engine the key's
//! [`AffinityTable`](ilb_core::affinity::AffinityTable) remembers, else for a new key the less loaded of the hash's first two
//! candidates (with `[control] place_new_keys_by_load`), else weighted consistent
//! hashing under the bounded-load rule. Planned shedding is the data plane's own
//! ([`ilb_core::admission`]): each class's per-priority arrival rates, re-planned every
//! [`SHED_PLAN_PERIOD`], turn its `shed_fraction` into shed probabilities, lowest priority first.
//!
//! A cluster may run several data planes (`super::replicas`): they share its installed tables
//! and its shedding (each real one sheds by its own arrivals, which a uniform split makes the
//! same rates in proportion), and each has its own affinity table and in-flight counts.

use super::replicas::Replicas;
use super::{Arrival, Decision, Load, Topology};
use ilb_core::admission::{self, ClassShedding, SHED_PLAN_PERIOD};
use ilb_core::priority::PerPriority;
use ilb_core::snapshot::Snapshot;
use ilb_core::table::{Constraints, RoutingTable};
use ilb_engine_sim::Nanos;
use rand::Rng;
use rand_pcg::Pcg64Mcg;
use std::collections::{BTreeMap, HashMap, VecDeque};

struct Installed {
    table: RoutingTable,
    /// Table engine index → simulator engine index.
    engine_map: Vec<usize>,
    /// Per stream (of this cluster): index of its class in the model's classes.
    stream_class: Vec<Option<usize>>,
}

/// Every cluster's data plane.
pub struct DataPlanes {
    installed: Vec<Option<Installed>>,
    pending: VecDeque<(Nanos, BTreeMap<String, Snapshot>)>,
    engine_index: HashMap<String, usize>,
    /// Snapshots that failed to compile (kept out, as a data plane keeps its last good one).
    pub rejected: u64,
    /// Per cluster and data plane: its memory of which engine served each key, and what the
    /// cluster's other data planes told it.
    replicas: Replicas,
    /// Per stream: its traffic class (cluster, model, class), an index into `shedding`.
    stream_group: Vec<usize>,
    shedding: Vec<Shedding>,
}

/// A class's planned shedding, as the data plane's background task keeps it.
struct Shedding {
    arrivals: PerPriority<u64>,
    state: ClassShedding,
    probability: PerPriority<f64>,
    next_plan: Nanos,
}

/// After this many shedding periods without an arrival the rates start from zero again
/// (the data plane's task would have decayed them to nearly that).
const IDLE_PERIODS: u32 = 64;

impl DataPlanes {
    pub fn new(topology: &Topology) -> DataPlanes {
        let mut groups: Vec<(usize, &str, &str)> = Vec::new();
        let stream_group = (0..topology.stream_cluster.len())
            .map(|s| {
                let key = (
                    topology.stream_cluster[s],
                    topology.stream_model[s].as_str(),
                    topology.stream_class[s].as_str(),
                );
                groups.iter().position(|g| *g == key).unwrap_or_else(|| {
                    groups.push(key);
                    groups.len() - 1
                })
            })
            .collect();
        DataPlanes {
            installed: (0..topology.n_clusters).map(|_| None).collect(),
            pending: VecDeque::new(),
            engine_index: topology
                .engine_entries
                .iter()
                .enumerate()
                .map(|(j, e)| (e.id.to_string(), j))
                .collect(),
            rejected: 0,
            replicas: Replicas::new(topology),
            stream_group,
            shedding: (0..groups.len())
                .map(|_| Shedding {
                    arrivals: PerPriority::default(),
                    state: ClassShedding::new(PerPriority::default()),
                    probability: PerPriority::default(),
                    next_plan: SHED_PLAN_PERIOD.as_nanos() as Nanos,
                })
                .collect(),
        }
    }

    /// Counts one arrival of `stream` in its class and says whether the data plane's planned
    /// shedding sheds it: the class's shed probabilities are re-planned every
    /// [`SHED_PLAN_PERIOD`] from its arrivals, as the data plane's background task does.
    fn shed(
        &mut self,
        now: Nanos,
        topology: &Topology,
        stream: usize,
        shed_fraction: f64,
        rng: &mut Pcg64Mcg,
    ) -> bool {
        let period = SHED_PLAN_PERIOD.as_nanos() as Nanos;
        let s = &mut self.shedding[self.stream_group[stream]];
        if now >= s.next_plan {
            let periods = (now - s.next_plan) / period + 1;
            if periods > Nanos::from(IDLE_PERIODS) {
                s.state = ClassShedding::new(s.arrivals);
                s.probability = admission::shed_probabilities(shed_fraction, s.state.rates());
            } else {
                for _ in 0..periods {
                    s.probability = s.state.plan(s.arrivals, shed_fraction);
                }
            }
            s.next_plan += periods * period;
        }
        let priority = topology.stream_priority[stream];
        s.arrivals[priority] += 1;
        // The draw only when shedding is planned, so runs without it keep their random streams.
        let p = s.probability[priority];
        p > 0.0 && admission::shed(p, rng.gen::<f64>())
    }

    /// Snapshots published now, installed by data planes at `at`.
    pub fn publish(&mut self, at: Nanos, snapshots: BTreeMap<String, Snapshot>) {
        self.pending.push_back((at, snapshots));
    }

    /// Installs every publication due at `now`.
    pub fn install_due(&mut self, now: Nanos, topology: &Topology) {
        while self.pending.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, snapshots)) = self.pending.pop_front() {
                self.install(&snapshots, topology);
            }
        }
    }

    /// Compiles each cluster's snapshot against its previous table. Off the request path.
    pub fn install(&mut self, snapshots: &BTreeMap<String, Snapshot>, topology: &Topology) {
        for (c, cluster) in topology.cluster_ids.iter().enumerate() {
            let Some(snapshot) = snapshots.get(cluster) else { continue };
            let previous = self.installed[c].as_ref().map(|i| &i.table);
            let table = match RoutingTable::compile(snapshot, previous) {
                Ok(table) => table,
                Err(_) => {
                    self.rejected += 1;
                    continue;
                }
            };
            let engine_map = table
                .engines
                .iter()
                .map(|e| self.engine_index.get(e.id.as_str()).copied().unwrap_or(0))
                .collect();
            let stream_class = (0..topology.stream_cluster.len())
                .map(|s| {
                    if topology.stream_cluster[s] != c {
                        return None;
                    }
                    let model = table.model(&topology.stream_model[s])?;
                    let require: Vec<&str> = topology.stream_require[s].iter().map(String::as_str).collect();
                    let constraints =
                        Constraints { require: &require, residency: topology.stream_residency[s].as_deref() };
                    let class = model.class_for(&constraints);
                    model.classes.iter().position(|c| c.seq == class.seq)
                })
                .collect();
            self.installed[c] = Some(Installed { table, engine_map, stream_class });
        }
    }

    /// Picks an engine for one request with the data plane's own `ClassTable::select`, as
    /// `ilb_dataplane::pick::choose` does with its defaults: the engine that served the key
    /// last while it is within its load bound, else (a new key, with `place_new_keys_by_load`)
    /// the less loaded per unit of weight of the hash's first two candidates, else hashing
    /// within `ilb_core::table::within_load_bound` (the stream's in-flight count on each), then
    /// without the bound. The table and the counts are those of the data plane the request
    /// reached, its counts plus what the others of its cluster last said they have in flight.
    /// Candidates that are down or violate the stream's constraints are never admitted.
    /// Requests are first shed as the data plane sheds them (lowest priority first). Hot path.
    pub fn route(
        &mut self,
        now: Nanos,
        topology: &Topology,
        load: &Load,
        arrival: Arrival,
        rng: &mut Pcg64Mcg,
    ) -> Decision {
        let Arrival { stream, key_hash, data_plane } = arrival;
        let c = topology.stream_cluster[stream];
        let Some(installed) = &self.installed[c] else { return Decision::NoEngine };
        let Some(model) = installed.table.model(&topology.stream_model[stream]) else {
            return Decision::NoEngine;
        };
        let Some(class) = installed.stream_class[stream].map(|i| &model.classes[i]) else {
            return Decision::NoEngine;
        };
        let shed_fraction = class.shed_fraction;
        if self.shed(now, topology, stream, shed_fraction, rng) {
            return Decision::Shed;
        }
        let Some(installed) = &self.installed[c] else { return Decision::NoEngine };
        let Some(model) = installed.table.model(&topology.stream_model[stream]) else {
            return Decision::NoEngine;
        };
        let Some(class) = installed.stream_class[stream].map(|i| &model.classes[i]) else {
            return Decision::NoEngine;
        };
        let n = topology.n_engines;
        let mask = &topology.allowed_mask[stream];
        let own = data_plane * topology.stream_cluster.len() + stream;
        let peers = self.replicas.peer_in_flight(c, data_plane);
        let peer = |j: usize| peers.map_or(0, |p| p[j]);
        // As the data plane's `pick::choose`: the class's peer figure sums its candidates'.
        let peer_class = peers.map_or(0, |_| {
            let engines = class.candidates.iter().map(|cand| peer(installed.engine_map[cand.engine_idx]));
            engines.fold(0u32, u32::saturating_add)
        });
        let class_load = f64::from(load.data_plane_stream_in_flight[own].saturating_add(peer_class));
        let usable = |candidate: usize| {
            let j = installed.engine_map[class.candidates[candidate].engine_idx];
            load.up[j] && mask[j]
        };
        // As the data plane's `pick::choose`: the stream's (class's) requests on the candidate.
        let in_flight = |candidate: usize| {
            let j = installed.engine_map[class.candidates[candidate].engine_idx];
            f64::from(load.data_plane_stream_engine_in_flight[own * n + j].saturating_add(peer(j)))
        };
        let bounded = |candidate: usize| {
            ilb_core::table::within_load_bound(
                in_flight(candidate),
                class.candidates[candidate].load_share,
                class_load,
            ) && usable(candidate)
        };
        let affinity = self.replicas.affinity(c, data_plane);
        let now_s = (now / 1_000_000_000) as u32;
        let new_by_load: Option<&dyn Fn(usize) -> f64> =
            topology.place_new_keys_by_load.then_some(&in_flight);
        match class.select(key_hash, affinity, now_s, bounded, usable, new_by_load) {
            Some(candidate) => {
                class.remember(affinity, key_hash, candidate, now_s);
                Decision::Engine(installed.engine_map[class.candidates[candidate].engine_idx])
            }
            None => Decision::NoEngine,
        }
    }

    /// Data plane `data_plane` of every cluster (`None`: all of them) shares what it decided.
    pub fn share(&mut self, now: Nanos, topology: &Topology, load: &Load, data_plane: Option<usize>) {
        self.replicas.share(now, topology, load, data_plane);
    }

    /// Installed weights, stream-major.
    pub fn weights(&self, topology: &Topology, out: &mut [f64]) {
        let n = topology.n_engines;
        for (stream, row) in out.chunks_mut(n).enumerate() {
            row.iter_mut().for_each(|w| *w = 0.0);
            let Some(installed) = &self.installed[topology.stream_cluster[stream]] else { continue };
            let Some(model) = installed.table.model(&topology.stream_model[stream]) else { continue };
            let Some(class) = installed.stream_class[stream].map(|i| &model.classes[i]) else { continue };
            for cand in &class.candidates {
                row[installed.engine_map[cand.engine_idx]] += cand.weight;
            }
        }
    }
}

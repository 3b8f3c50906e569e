//! The classic feedback baseline: a proportional controller on one performance score per
//! engine. Every `period_s` it reads each engine's smoothed TTFT (the control plane's own
//! signal path and EWMA), compares it with the mean over the model's healthy engines and nudges
//! the engine's weight: `w ← w · (1 + gain · (1 − score / mean))`, kept within
//! [`min_weight`, `max_weight`] × the engine's initial (capacity-proportional) weight. Weights
//! are global (the same for every cluster, network-blind), engines without a fresh scrape get
//! weight zero, and the data planes route on them by the same weighted consistent hashing with
//! bounded load as `ilb`. Signals lag (scrape window, EWMA, one pull), so the controller
//! overshoots: moving traffic off an engine makes it look fast, and the traffic comes back.

use super::dataplane::DataPlanes;
use super::{Arrival, Decision, Load, Policy, Topology};
use crate::scenario::FeedbackSpec;
use ilb_core::snapshot::{ClassRoutes, EngineWeight, ModelRoutes, Snapshot, FORMAT};
use ilb_core::{ClassId, ClusterId, ModelName, SnapshotVersion};
use ilb_engine_sim::Nanos;
use ilb_planning::config::FleetConfig;
use ilb_planning::fleet::Fleet;
use ilb_planning::signals::EngineSample;
use rand_pcg::Pcg64Mcg;
use std::collections::BTreeMap;
use std::time::Duration;

pub struct Feedback {
    fleet: Fleet,
    spec: FeedbackSpec,
    initial: Vec<f64>,
    weight: Vec<f64>,
    /// Engine model per engine (name).
    engine_model: Vec<String>,
    data_planes: DataPlanes,
    version: u64,
    delay: Nanos,
    /// Engines given weight zero (no fresh scrape) in the latest snapshot.
    excluded: Vec<bool>,
}

impl Feedback {
    pub fn new(config: FleetConfig, topology: &Topology, spec: FeedbackSpec, delay: Nanos) -> Feedback {
        let engine_model = config.engines.iter().map(|e| e.model.clone()).collect();
        let initial = topology.capacity_rps.clone();
        let mut feedback = Feedback {
            fleet: Fleet::new(config),
            spec,
            weight: initial.clone(),
            initial,
            engine_model,
            data_planes: DataPlanes::new(topology),
            version: 0,
            delay,
            excluded: vec![false; topology.n_engines],
        };
        let snapshots = feedback.snapshots(0, topology);
        feedback.data_planes.install(&snapshots, topology);
        feedback
    }

    fn snapshots(&mut self, now: Nanos, topology: &Topology) -> BTreeMap<String, Snapshot> {
        self.version += 1;
        let at = Duration::from_nanos(now);
        let healthy: Vec<bool> = (0..self.weight.len()).map(|j| self.fleet.health(j, at) > 0.0).collect();
        self.excluded = healthy.iter().map(|h| !h).collect();
        let mut out = BTreeMap::new();
        for (c, cluster) in topology.cluster_ids.iter().enumerate() {
            let mut models: BTreeMap<&str, Vec<ClassRoutes>> = BTreeMap::new();
            for s in (0..topology.stream_cluster.len()).filter(|&s| topology.stream_cluster[s] == c) {
                let mut weights: Vec<EngineWeight> = topology.allowed[s]
                    .iter()
                    .map(|&j| EngineWeight {
                        engine: topology.engine_entries[j].id.clone(),
                        weight: if healthy[j] { self.weight[j] } else { 0.0 },
                        expected_latency_ms: None,
                        network_ms: None,
                        in_flight_ms: None,
                    })
                    .collect();
                if weights.iter().all(|w| w.weight <= 0.0) {
                    weights.iter_mut().for_each(|w| w.weight = 1.0);
                }
                if weights.is_empty() {
                    continue;
                }
                models.entry(&topology.stream_model[s]).or_default().push(ClassRoutes {
                    id: ClassId::new(&topology.stream_class[s]),
                    require: topology.stream_require[s].clone(),
                    residency: topology.stream_residency[s].clone(),
                    weights,
                    shed_fraction: 0.0,
                });
            }
            let snapshot = Snapshot {
                format: FORMAT,
                version: SnapshotVersion(self.version),
                created_unix_ms: 0,
                cluster: ClusterId::new(cluster),
                utilisation: 0.0,
                engines: topology.engine_entries.clone(),
                models: models
                    .into_iter()
                    .map(|(model, classes)| ModelRoutes { model: ModelName::new(model), classes })
                    .collect(),
            };
            out.insert(cluster.clone(), snapshot);
        }
        out
    }

    /// One step of the proportional controller.
    fn nudge(&mut self, now: Nanos) {
        let at = Duration::from_nanos(now);
        let mut by_model: BTreeMap<&str, Vec<(usize, f64)>> = BTreeMap::new();
        for j in 0..self.weight.len() {
            if self.fleet.health(j, at) <= 0.0 {
                continue;
            }
            if let Some(score) = self.fleet.engines[j].ttft_ms.value() {
                by_model.entry(&self.engine_model[j]).or_default().push((j, score));
            }
        }
        for scores in by_model.values() {
            let mean = scores.iter().map(|(_, s)| s).sum::<f64>() / scores.len() as f64;
            if !(mean.is_finite() && mean > 0.0) {
                continue;
            }
            for &(j, score) in scores {
                let nudged = self.weight[j] * (1.0 + self.spec.gain * (1.0 - score / mean));
                let (lo, hi) =
                    (self.spec.min_weight * self.initial[j], self.spec.max_weight * self.initial[j]);
                self.weight[j] = nudged.clamp(lo, hi);
            }
        }
    }
}

impl Policy for Feedback {
    fn route(
        &mut self,
        now: Nanos,
        topology: &Topology,
        load: &Load,
        arrival: Arrival,
        rng: &mut Pcg64Mcg,
    ) -> Decision {
        self.data_planes.route(now, topology, load, arrival, rng)
    }

    fn has_data_planes(&self) -> bool {
        true
    }

    fn on_share(&mut self, now: Nanos, topology: &Topology, load: &Load, data_plane: Option<usize>) {
        self.data_planes.share(now, topology, load, data_plane);
    }

    fn period_s(&self) -> Option<f64> {
        Some(self.spec.period_s)
    }

    fn on_tick(&mut self, now: Nanos, topology: &Topology) -> Option<Nanos> {
        self.nudge(now);
        let snapshots = self.snapshots(now, topology);
        self.data_planes.publish(now + self.delay, snapshots);
        Some(now + self.delay)
    }

    fn on_wake(&mut self, now: Nanos, topology: &Topology) {
        self.data_planes.install_due(now, topology);
    }

    fn wants_signals(&self) -> bool {
        true
    }

    fn on_scrape(
        &mut self,
        now: Nanos,
        engine: usize,
        result: Result<Vec<(ModelName, EngineSample)>, String>,
    ) {
        self.fleet.on_scrape(engine, Duration::from_nanos(now), result);
    }

    fn weights(&self, topology: &Topology, _load: &Load, out: &mut [f64]) {
        self.data_planes.weights(topology, out);
    }

    fn plan_excludes(&self, engines: &[usize]) -> Option<bool> {
        Some(engines.iter().all(|&j| self.excluded[j]))
    }
}

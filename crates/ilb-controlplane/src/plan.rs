//! From the fleet's state to optimizer problems (one per model), and from their solutions to
//! one routing snapshot per front-end cluster.
//!
//! Classes: every cluster has a `default` class per model, plus one class per configured
//! constraint rule that at least one engine of the model satisfies. A class may only use
//! engines that satisfy its rule (residency, capabilities); other pairs are forbidden.

use crate::config::ClassRule;
use crate::fleet::{ClassKey, Fleet, Now};
use crate::profile::LatencyProfile;
use ilb_core::snapshot::{ClassRoutes, EngineEntry, EngineWeight, ModelRoutes, Snapshot, FORMAT};
use ilb_core::{ClassId, ClusterId, EngineId, ModelName, SnapshotVersion};
use ilb_optimizer::{Class, Engine, Latency, NetworkMatrix, Problem, Solution, SolverOptions};
use std::collections::{BTreeMap, BTreeSet};

/// One model's problem and how its indices map back to the fleet.
#[derive(Clone, Debug)]
pub struct ModelPlan {
    pub model: String,
    /// Problem class index → the class it stands for.
    pub classes: Vec<PlanClass>,
    /// Problem engine index → fleet engine index.
    pub engines: Vec<usize>,
    /// Effective capacity of each engine as planned, req/s.
    pub capacity_rps: Vec<f64>,
    pub problem: Problem,
}

#[derive(Clone, Debug)]
pub struct PlanClass {
    pub key: ClassKey,
    pub require: Vec<String>,
    pub residency: Option<String>,
    /// Demand as measured (before the floor that keeps weights defined).
    pub measured_demand_rps: f64,
}

fn allows(rule: Option<&ClassRule>, engine: &crate::config::Engine) -> bool {
    match rule {
        None => true,
        Some(rule) => {
            rule.require.iter().all(|cap| engine.capabilities.contains(cap))
                && rule.residency.as_ref().is_none_or(|zone| engine.residency.contains(zone))
        }
    }
}

/// Builds one problem per model (sorted by model name).
pub fn build(fleet: &Fleet, now: Now) -> Vec<ModelPlan> {
    let config = &fleet.config;
    let cp = &config.control_plane;
    let mut models: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (idx, engine) in config.engines.iter().enumerate() {
        models.entry(engine.model.as_str()).or_default().push(idx);
    }
    let shed_penalty = cp.shed_penalty_ms.get("normal").copied().unwrap_or(10_000.0);
    models
        .into_iter()
        .filter_map(|(model, engine_idx)| {
            let rules: Vec<Option<&ClassRule>> = std::iter::once(None)
                .chain(
                    config
                        .classes
                        .iter()
                        .filter(|rule| engine_idx.iter().any(|&j| allows(Some(rule), &config.engines[j])))
                        .map(Some),
                )
                .collect();
            let mut classes = Vec::new();
            let mut class_rules = Vec::new();
            for cluster in &config.clusters {
                for rule in &rules {
                    let key = ClassKey {
                        cluster: cluster.id.clone(),
                        model: model.to_owned(),
                        class: rule.map_or("default".to_owned(), |r| r.id.clone()),
                    };
                    let measured = fleet.demand_rps(&key);
                    classes.push(PlanClass {
                        key,
                        require: rule.map(|r| r.require.clone()).unwrap_or_default(),
                        residency: rule.and_then(|r| r.residency.clone()),
                        measured_demand_rps: measured,
                    });
                    class_rules.push(*rule);
                }
            }
            let capacity_rps: Vec<f64> =
                engine_idx.iter().map(|&j| fleet.effective_capacity(j, now)).collect();
            let profiles = fleet.latency_profiles(&engine_idx);
            let problem = Problem {
                rho: cp.rho,
                classes: classes
                    .iter()
                    .map(|c| Class {
                        id: format!("{}/{}", c.key.cluster, c.key.class),
                        demand_rps: c.measured_demand_rps.max(cp.demand_floor_rps),
                        shed_penalty_ms: shed_penalty,
                    })
                    .collect(),
                engines: engine_idx
                    .iter()
                    .zip(&capacity_rps)
                    .zip(profiles)
                    .map(|((&j, &capacity), profile)| Engine {
                        id: config.engines[j].id.clone(),
                        capacity_rps: capacity,
                        latency: to_optimizer(profile),
                    })
                    .collect(),
                network_ms: NetworkMatrix::from_fn(classes.len(), engine_idx.len(), |k, j| {
                    let engine = &config.engines[engine_idx[j]];
                    // Measured and configured latencies are finite and non-negative; clamp anyway
                    // so a bad measurement cannot make the problem invalid.
                    let ms = fleet.network_ms(&classes[k].key.cluster, engine_idx[j]);
                    let ms = if ms.is_finite() { ms.max(0.0) } else { 1e6 };
                    allows(class_rules[k], engine).then_some(ms)
                })
                .ok()?,
            };
            Some(ModelPlan { model: model.to_owned(), classes, engines: engine_idx, capacity_rps, problem })
        })
        .collect()
}

fn to_optimizer(profile: LatencyProfile) -> Latency {
    match profile {
        LatencyProfile::Queueing { t0_ms, b_ms } => Latency::Queueing { t0_ms, b_ms },
        LatencyProfile::Piecewise(knots) => {
            Latency::Piecewise(knots.into_iter().map(|(y, l)| [y, l]).collect())
        }
    }
}

/// One snapshot per cluster from the solved plans. `solutions[i]` solves `plans[i]`, or is
/// `None` when that model could not be solved: its classes then route in proportion to
/// effective capacity, so data planes never lose a model because of one failed solve.
/// The optimizer's options from the control plane's settings (one solver per model uses them).
pub fn solver_options(config: &crate::config::FleetConfig) -> SolverOptions {
    SolverOptions { stability_ms: config.control_plane.stability_ms, ..SolverOptions::default() }
}

pub fn snapshots(
    fleet: &Fleet,
    plans: &[ModelPlan],
    solutions: &[Option<Solution>],
    version: u64,
    created_unix_ms: u64,
) -> BTreeMap<String, Snapshot> {
    let config = &fleet.config;
    let (mut planned_load, mut capacity) = (0.0, 0.0);
    for (plan, solution) in plans.iter().zip(solutions) {
        if let Some(s) = solution {
            planned_load += s.engines.iter().map(|e| e.load_rps).sum::<f64>();
            capacity += plan.capacity_rps.iter().sum::<f64>();
        }
    }
    let utilisation = if capacity > 0.0 { (planned_load / capacity).clamp(0.0, 1.0) } else { 1.0 };
    let mut out = BTreeMap::new();
    for cluster in &config.clusters {
        let mut engines_used: BTreeSet<usize> = BTreeSet::new();
        let mut models = Vec::new();
        for (plan, solution) in plans.iter().zip(solutions) {
            let mut classes = Vec::new();
            for (k, class) in plan.classes.iter().enumerate().filter(|(_, c)| c.key.cluster == cluster.id) {
                let routes = solution.as_ref().map_or(&[][..], |s| s.class_routes(k));
                let mut weights: Vec<EngineWeight> = Vec::new();
                for (j, &fleet_idx) in plan.engines.iter().enumerate() {
                    let Some(network) = plan.problem.network_ms.get(k, j) else { continue };
                    let weight = match solution {
                        Some(_) => routes.iter().find(|r| r.engine == j).map_or(0.0, |r| r.weight),
                        None => plan.capacity_rps[j],
                    };
                    engines_used.insert(fleet_idx);
                    weights.push(EngineWeight {
                        engine: EngineId::new(&config.engines[fleet_idx].id),
                        weight,
                        expected_latency_ms: solution.as_ref().map(|s| s.engines[j].expected_latency_ms),
                        network_ms: Some(network),
                    });
                }
                if weights.iter().all(|w| w.weight <= 0.0) {
                    // Everything shed (or nothing allowed): keep the class routable at equal
                    // weights so admitted requests still find an engine.
                    weights.iter_mut().for_each(|w| w.weight = 1.0);
                }
                if weights.is_empty() {
                    continue;
                }
                let demand = plan.problem.classes[k].demand_rps;
                let shed = solution.as_ref().and_then(|s| s.shed_rps.get(k).copied()).unwrap_or(0.0);
                classes.push(ClassRoutes {
                    id: ClassId::new(&class.key.class),
                    require: class.require.clone(),
                    residency: class.residency.clone(),
                    weights,
                    shed_fraction: if demand > 0.0 { (shed / demand).clamp(0.0, 1.0) } else { 0.0 },
                });
            }
            if !classes.is_empty() {
                models.push(ModelRoutes { model: ModelName::new(&plan.model), classes });
            }
        }
        let engines = engines_used
            .iter()
            .map(|&j| {
                let e = &config.engines[j];
                EngineEntry {
                    id: EngineId::new(&e.id),
                    url: e.url.clone(),
                    region: e.region.clone(),
                    capabilities: e.capabilities.clone(),
                    residency: e.residency.clone(),
                    max_in_flight: e.max_in_flight.unwrap_or(0),
                }
            })
            .collect();
        out.insert(
            cluster.id.clone(),
            Snapshot {
                format: FORMAT,
                version: SnapshotVersion(version),
                created_unix_ms,
                cluster: ClusterId::new(&cluster.id),
                utilisation,
                engines,
                models,
            },
        );
    }
    out
}

//! From the fleet's state to optimizer problems (one per model), and from their solutions to
//! one routing snapshot per front-end cluster.
//!
//! Classes: every cluster has a `default` class per model, plus one class per configured
//! constraint rule that at least one engine of the model satisfies. A class may only use
//! engines that satisfy its rule (residency, capabilities); other pairs are forbidden.
//!
//! Priorities: a class whose demand comes in several priorities (`x-ilb-priority`) is one
//! problem class per priority, each shed at its priority's price
//! (`control_plane.shed_penalty_ms`). The parts share the class's network row, so the
//! optimizer routes them alike and sheds the cheapest first, which is what the data plane
//! does with the class's `shed_fraction` (lowest priority first). A class's prices are scaled
//! up together until its `normal` price is `control_plane.shed_price_floor` times the slowest
//! unloaded end-to-end latency it could be served at (`scale_shed_prices`): a fixed 10 s
//! would be below the service time of a long decode on slow hardware, and the plan would shed
//! with engines idle. With the objective's tail term, prices are then raised by the most the
//! term multiplies a request's cost by at ρ × capacity, where plans shed, so that the term
//! moves traffic without deciding admission.

use crate::config::{ClassRule, ControlPlaneSettings, FleetConfig};
use crate::fleet::{ClassKey, PlanningInputs};
use crate::profile::LatencyProfile;
use ilb_core::constraint::satisfies;
use ilb_core::priority::Priority;
use ilb_core::snapshot::{ClassRoutes, EngineEntry, EngineWeight, ModelRoutes, Snapshot, FORMAT};
use ilb_core::{ClassId, ClusterId, EngineId, ModelName, SnapshotVersion};
use ilb_optimizer::{Class, Curve, Engine, Latency, NetworkMatrix, Problem, Solution, SolverOptions};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A priority with less than this share of its class's demand is planned with the class's
/// largest priority instead of as a part of its own: a trickle of one priority should not
/// add a problem class that comes and goes with the noise.
const MIN_PART_SHARE: f64 = 0.01;

/// One model's problem and how its indices map back to the fleet.
#[derive(Clone, Debug)]
pub struct ModelPlan {
    pub model: String,
    /// The classes planned: one per cluster and constraint rule.
    pub classes: Vec<PlanClass>,
    /// Problem class index → (index into `classes`, the priority it stands for). Parts of one
    /// class are adjacent.
    pub parts: Vec<(usize, Priority)>,
    /// Problem engine index → fleet engine index.
    pub engines: Vec<usize>,
    /// Effective capacity of each engine as planned, req/s.
    pub capacity_rps: Vec<f64>,
    /// Per engine: the expected latency the objective counts, without its tail term, as a
    /// function of its load, ms (network excluded; [`EngineCurves::mean`](crate::fleet::EngineCurves::mean)).
    pub mean: Vec<LatencyProfile>,
    /// Per engine: how long a request stays on it as a function of its load, ms (network
    /// excluded; [`EngineCurves::in_flight`](crate::fleet::EngineCurves::in_flight)).
    pub in_flight: Vec<LatencyProfile>,
    /// Each class's `headroom_rps` is how much of its demand is headroom above the demand
    /// expected (the planner plans each class at the top of its noise band, as far as the
    /// model's usable capacity has room for it); [`ModelPlan::outcome`] takes it off the
    /// class's demand. Zero as built.
    pub problem: Problem,
}

#[derive(Clone, Debug)]
pub struct PlanClass {
    pub key: ClassKey,
    pub require: Vec<String>,
    pub residency: Option<String>,
    /// Demand as measured (before the floor that keeps weights defined).
    pub measured_demand_rps: f64,
    /// Measured demand per priority, lowest first.
    pub measured_by_priority: [f64; 4],
}

/// A model that could not be planned, and why (shown in `/v1/state`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unplanned {
    pub model: String,
    pub reason: String,
}

/// What a solution does with one class: all its priority parts together.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassOutcome {
    /// Per problem engine index: planned req/s and the share of the class's admitted traffic.
    pub routes: Vec<(usize, f64, f64)>,
    /// The demand the plan expects (its demand band's centre), without the headroom.
    pub planned_demand_rps: f64,
    /// Planned on top of `planned_demand_rps` for bursts within the demand's noise band.
    pub headroom_rps: f64,
    pub shed_rps: f64,
    /// Per part, in `parts` order: (priority, planned demand, shed price, shed req/s).
    pub by_priority: Vec<(Priority, f64, f64, f64)>,
}

impl ModelPlan {
    /// The problem classes that stand for class `k`.
    pub fn parts_of(&self, k: usize) -> impl Iterator<Item = usize> + '_ {
        self.parts.iter().enumerate().filter(move |(_, (c, _))| *c == k).map(|(i, _)| i)
    }

    /// Network latency from class `k`'s cluster to problem engine `j`; `None` where the class
    /// may not use the engine.
    pub fn network_ms(&self, k: usize, j: usize) -> Option<f64> {
        self.parts_of(k).next().and_then(|i| self.problem.network_ms.get(i, j))
    }

    /// Scales every class's headroom by `factor` (in [0, 1]).
    pub fn scale_headroom(&mut self, factor: f64) {
        for class in &mut self.problem.classes {
            class.demand_rps -= class.headroom_rps * (1.0 - factor);
            class.headroom_rps *= factor;
        }
    }

    /// Sets class `k`'s demand, measured and planned, split over its parts as they are split
    /// now.
    pub fn set_demand(&mut self, k: usize, rps: f64) {
        self.classes[k].measured_demand_rps = rps;
        let parts: Vec<usize> = self.parts_of(k).collect();
        let total: f64 = parts.iter().map(|&i| self.problem.classes[i].demand_rps).sum();
        for i in parts {
            let share = if total > 0.0 { self.problem.classes[i].demand_rps / total } else { 1.0 };
            self.problem.classes[i].demand_rps = rps * share;
        }
    }

    /// Class `k` in `solution` (which solves this plan's problem); without one, its demand,
    /// prices and nothing shed or routed. Demand is without the headroom, which is not expected
    /// to arrive.
    /// Engine `j`'s mean latency curve ([`ModelPlan::mean`]) as the solver evaluates curves.
    pub fn mean_curve(&self, j: usize) -> Curve {
        let engine = &self.problem.engines[j];
        Curve::new(&to_optimizer(self.mean[j].clone()), engine.capacity_rps, self.problem.rho)
    }

    /// Restates `solution`'s latencies on the mean curves: the solver's are on the objective's,
    /// whose tail term is a price, not a latency anyone sees. Each engine's expected latency
    /// becomes its mean curve at its planned load, and the mean latency loses the tail's share.
    pub fn restate_latencies(&self, solution: &mut Solution) {
        let demand: f64 = self.problem.classes.iter().map(|c| c.demand_rps).sum();
        let mut tail_cost = 0.0;
        for (j, engine) in solution.engines.iter_mut().enumerate() {
            let mean = self.mean_curve(j).latency(engine.load_rps);
            tail_cost += engine.load_rps * (engine.expected_latency_ms - mean);
            engine.expected_latency_ms = mean;
        }
        if demand > 0.0 {
            solution.mean_latency_ms -= tail_cost / demand;
        }
    }

    pub fn outcome(&self, k: usize, solution: Option<&Solution>) -> ClassOutcome {
        let mut out = ClassOutcome::default();
        let (mut rps, mut share) = (vec![0.0; self.engines.len()], vec![0.0; self.engines.len()]);
        for i in self.parts_of(k) {
            let class = &self.problem.classes[i];
            let shed = solution.and_then(|s| s.shed_rps.get(i).copied()).unwrap_or(0.0);
            let demand = class.demand_rps - class.headroom_rps;
            out.planned_demand_rps += demand;
            out.headroom_rps += class.headroom_rps;
            out.shed_rps += shed;
            out.by_priority.push((self.parts[i].1, demand, class.shed_penalty_ms, shed));
            let routes = solution.map_or(&[][..], |s| s.class_routes(i));
            let admitted: f64 = routes.iter().map(|r| r.rps).sum();
            for r in routes {
                rps[r.engine] += r.rps;
                // The published weight: the share of the admitted traffic, except for a class
                // holding its weights, whose headroom may be planned elsewhere.
                share[r.engine] += r.weight * admitted;
            }
        }
        let admitted: f64 = share.iter().sum();
        out.routes = rps
            .into_iter()
            .zip(share)
            .enumerate()
            .filter(|&(_, (x, w))| x > 0.0 || w > 0.0)
            .map(|(j, (x, w))| (j, x, if admitted > 0.0 { w / admitted } else { 0.0 }))
            .collect();
        out
    }
}

fn allows(rule: Option<&ClassRule>, engine: &crate::config::Engine) -> bool {
    rule.is_none_or(|rule| {
        satisfies(&rule.require, rule.residency.as_deref(), &engine.capabilities, &engine.residency)
    })
}

/// The priority parts of a class with `measured` demand per priority and at least `floor`
/// in total: (priority, planned demand). Priorities below [`MIN_PART_SHARE`] of the demand
/// are planned with the largest one; without measured demand the class is one `normal` part.
fn priority_parts(measured: [f64; 4], floor: f64) -> Vec<(Priority, f64)> {
    let total: f64 = measured.iter().sum();
    let planned = total.max(floor);
    if total <= 0.0 {
        return vec![(Priority::Normal, planned)];
    }
    let largest = (0..4).max_by(|&a, &b| measured[a].total_cmp(&measured[b])).unwrap_or(1);
    let mut shares = [0.0; 4];
    for (p, &rps) in measured.iter().enumerate() {
        let share = rps / total;
        let into = if share >= MIN_PART_SHARE { p } else { largest };
        shares[into] += share;
    }
    Priority::ALL
        .into_iter()
        .filter(|p| shares[p.index()] > 0.0)
        .map(|p| (p, planned * shares[p.index()]))
        .collect()
}

/// The problem's id for a part of class `key`: `cluster/class`, with `@priority` for parts
/// other than `normal` (so a class with one priority keeps the id it always had).
fn part_id(key: &ClassKey, priority: Priority) -> String {
    match priority {
        Priority::Normal => format!("{}/{}", key.cluster, key.class),
        p => format!("{}/{}@{}", key.cluster, key.class, p.as_str()),
    }
}

/// Builds one problem per model (sorted by model name) from the fleet's inputs
/// ([`Fleet::planning_inputs`](crate::fleet::Fleet::planning_inputs)), and says which models
/// could not be planned and why.
pub fn build(inputs: &PlanningInputs<'_>) -> (Vec<ModelPlan>, Vec<Unplanned>) {
    let config = inputs.config;
    let mut models: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (idx, engine) in config.engines.iter().enumerate() {
        models.entry(engine.model.as_str()).or_default().push(idx);
    }
    let (mut plans, mut unplanned) = (Vec::new(), Vec::new());
    for (model, engine_idx) in models {
        match plan_model(inputs, model, engine_idx) {
            Ok(plan) => plans.push(plan),
            Err(why) => unplanned.push(why),
        }
    }
    (plans, unplanned)
}

/// The shed price of a priority (`control_plane.shed_penalty_ms`).
fn shed_price(cp: &ControlPlaneSettings, p: Priority) -> f64 {
    cp.shed_penalty_ms.get(p.as_str()).copied().unwrap_or(10_000.0)
}

/// One model's problem over its engines `engine_idx`, or why it cannot be planned.
fn plan_model(
    inputs: &PlanningInputs<'_>,
    model: &str,
    engine_idx: Vec<usize>,
) -> Result<ModelPlan, Unplanned> {
    let config = inputs.config;
    let cp = &config.control_plane;
    let ModelClasses { classes, class_rules, parts, mut problem_classes } =
        model_classes(inputs, model, &engine_idx);
    let capacity_rps: Vec<f64> = engine_idx.iter().map(|&j| inputs.capacity_rps[j]).collect();
    let curves = engine_idx.iter().map(|&j| &inputs.curves[j]);
    let profiles: Vec<LatencyProfile> = curves.clone().map(|c| c.objective.clone()).collect();
    let mean: Vec<LatencyProfile> = curves.clone().map(|c| c.mean.clone()).collect();
    let in_flight: Vec<LatencyProfile> = curves.map(|c| c.in_flight.clone()).collect();
    let network = NetworkMatrix::from_fn(parts.len(), engine_idx.len(), |i, j| {
        let k = parts[i].0;
        let engine = &config.engines[engine_idx[j]];
        // Measured and configured latencies are finite and non-negative; clamp anyway
        // so a bad measurement cannot make the problem invalid.
        let ms = inputs.network_ms(&classes[k].key.cluster, engine_idx[j]);
        let ms = if ms.is_finite() { ms.max(0.0) } else { 1e6 };
        allows(class_rules[k], engine).then_some(ms)
    });
    let network_ms = match network {
        Ok(network) => network,
        Err(e) => {
            tracing::error!(model, error = %e, "model not planned: its network matrix is invalid");
            return Err(Unplanned { model: model.to_owned(), reason: format!("network matrix: {e}") });
        }
    };
    // Engines without capacity (down, asleep) serve nobody: they do not set the scale.
    let unloaded: Vec<f64> = profiles
        .iter()
        .zip(&capacity_rps)
        .map(|(p, &c)| if c > 0.0 { p.latency_ms(0.0, c) } else { f64::NAN })
        .collect();
    scale_shed_prices(
        &mut problem_classes,
        &network_ms,
        &unloaded,
        cp.shed_price_floor,
        shed_price(cp, Priority::Normal),
    );
    // The tail term weighs where traffic goes, not whether it is admitted. A plan sheds where
    // engines are full, and there the objective prices a request up to `full` times its mean
    // latency: prices raised alike leave that decision as the mean alone would make it.
    let full = mean
        .iter()
        .zip(&profiles)
        .zip(&capacity_rps)
        .filter(|(_, &c)| c > 0.0)
        .map(|((mean, objective), &c)| objective.latency_ms(cp.rho * c, c) / mean.latency_ms(cp.rho * c, c))
        .filter(|r| r.is_finite())
        .fold(1.0, f64::max);
    for class in &mut problem_classes {
        class.shed_penalty_ms *= full;
    }
    let problem = Problem {
        rho: cp.rho,
        classes: problem_classes,
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
        network_ms,
    };
    Ok(ModelPlan {
        model: model.to_owned(),
        classes,
        parts,
        engines: engine_idx,
        capacity_rps,
        mean,
        in_flight,
        problem,
    })
}

/// A model's classes (one per front-end cluster and class rule that applies to its engines),
/// each class's rule, and the problem's classes: one part per priority with demand.
struct ModelClasses<'c> {
    classes: Vec<PlanClass>,
    class_rules: Vec<Option<&'c ClassRule>>,
    parts: Vec<(usize, Priority)>,
    problem_classes: Vec<Class>,
}

fn model_classes<'c>(inputs: &PlanningInputs<'c>, model: &str, engine_idx: &[usize]) -> ModelClasses<'c> {
    let config = inputs.config;
    let cp = &config.control_plane;
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
    let mut parts = Vec::new();
    let mut problem_classes = Vec::new();
    for cluster in &config.clusters {
        for rule in &rules {
            let key = ClassKey {
                cluster: cluster.id.clone(),
                model: model.to_owned(),
                class: rule.map_or("default".to_owned(), |r| r.id.clone()),
            };
            let by_priority = inputs.demand_by_priority(&key);
            for (priority, demand_rps) in priority_parts(by_priority, cp.demand_floor_rps) {
                parts.push((classes.len(), priority));
                problem_classes.push(Class {
                    id: part_id(&key, priority),
                    demand_rps,
                    shed_penalty_ms: shed_price(cp, priority),
                    headroom_rps: 0.0,
                });
            }
            classes.push(PlanClass {
                key,
                require: rule.map(|r| r.require.clone()).unwrap_or_default(),
                residency: rule.and_then(|r| r.residency.clone()),
                measured_demand_rps: by_priority.iter().sum(),
                measured_by_priority: by_priority,
            });
            class_rules.push(*rule);
        }
    }
    ModelClasses { classes, class_rules, parts, problem_classes }
}

/// Scales each problem class's shed price by max(1, `floor` × its slowest unloaded latency /
/// `normal`): the slowest, over the engines it may use, of network + the engine's latency at
/// zero load (engines whose latency is not finite, such as those without capacity, are left
/// out). All parts of a class share their network row, so they scale alike and keep their
/// priorities' order. A `floor` of 0 changes nothing.
fn scale_shed_prices(
    classes: &mut [Class],
    network: &NetworkMatrix,
    unloaded: &[f64],
    floor: f64,
    normal: f64,
) {
    if floor <= 0.0 || normal <= 0.0 {
        return;
    }
    for (i, class) in classes.iter_mut().enumerate() {
        let slowest = (0..unloaded.len())
            .filter_map(|j| network.get(i, j).map(|n| n + unloaded[j]))
            .filter(|ms| ms.is_finite())
            .fold(0.0, f64::max);
        class.shed_penalty_ms *= (floor * slowest / normal).max(1.0);
    }
}

fn to_optimizer(profile: LatencyProfile) -> Latency {
    match profile {
        LatencyProfile::Queueing { t0_ms, b_ms } => Latency::Queueing { t0_ms, b_ms },
        LatencyProfile::Piecewise(knots) => {
            Latency::Piecewise(knots.into_iter().map(|(y, l)| [y, l]).collect())
        }
    }
}

/// The optimizer's options from the control plane's settings (one solver per model uses them).
pub(crate) fn solver_options(config: &FleetConfig) -> SolverOptions {
    let cp = &config.control_plane;
    SolverOptions {
        stability_ms: cp.stability_ms,
        stability_tolerance: cp.stability_tolerance,
        ..SolverOptions::default()
    }
}

/// One snapshot per cluster from the solved plans. `solutions[i]` solves `plans[i]`, or is
/// `None` when that model could not be solved: its classes then route in proportion to
/// effective capacity, so data planes never lose a model because of one failed solve.
pub fn snapshots(
    config: &FleetConfig,
    plans: &[ModelPlan],
    solutions: &[Option<&Solution>],
    version: u64,
    created_unix_ms: u64,
) -> BTreeMap<String, Snapshot> {
    let (mut planned_load, mut capacity) = (0.0, 0.0);
    for (plan, solution) in plans.iter().zip(solutions) {
        if let Some(s) = solution {
            planned_load += s.engines.iter().map(|e| e.load_rps).sum::<f64>();
            capacity += plan.capacity_rps.iter().sum::<f64>();
        }
    }
    let utilisation = if capacity > 0.0 { (planned_load / capacity).clamp(0.0, 1.0) } else { 1.0 };
    // Per plan and engine: how long a request stays on it at its planned load (the same for
    // every class; each adds its round trip).
    let stays: Vec<Vec<f64>> = plans
        .iter()
        .zip(solutions)
        .map(|(plan, solution)| match solution {
            Some(s) => (0..plan.engines.len())
                .map(|j| plan.in_flight[j].latency_ms(s.engines[j].load_rps, plan.capacity_rps[j]))
                .collect(),
            None => Vec::new(),
        })
        .collect();
    let mut out = BTreeMap::new();
    for cluster in &config.clusters {
        let mut engines_used: BTreeSet<usize> = BTreeSet::new();
        let mut models = Vec::new();
        for ((plan, solution), stays) in plans.iter().zip(solutions).zip(&stays) {
            let mut classes = Vec::new();
            for (k, class) in plan.classes.iter().enumerate().filter(|(_, c)| c.key.cluster == cluster.id) {
                classes.extend(class_routes(config, plan, k, class, *solution, stays, &mut engines_used));
            }
            if !classes.is_empty() {
                models.push(ModelRoutes { model: ModelName::new(&plan.model), classes });
            }
        }
        let engines = engine_entries(config, &engines_used);
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

/// Class `k`'s routes in the snapshot (`stays`: how long a request stays on each engine at the
/// plan's load), noting the engines its weights name in `engines_used`; None when it may use
/// no engine.
fn class_routes(
    config: &FleetConfig,
    plan: &ModelPlan,
    k: usize,
    class: &PlanClass,
    solution: Option<&Solution>,
    stays: &[f64],
    engines_used: &mut BTreeSet<usize>,
) -> Option<ClassRoutes> {
    let outcome = solution.map(|s| plan.outcome(k, Some(s)));
    let mut weights: Vec<EngineWeight> = Vec::new();
    // The plan's index of each engine in `weights`.
    let mut candidates: Vec<usize> = Vec::new();
    for (j, &fleet_idx) in plan.engines.iter().enumerate() {
        let Some(network) = plan.network_ms(k, j) else { continue };
        candidates.push(j);
        let weight = match &outcome {
            Some(o) => o.routes.iter().find(|r| r.0 == j).map_or(0.0, |r| r.2),
            None => plan.capacity_rps[j],
        };
        engines_used.insert(fleet_idx);
        weights.push(EngineWeight {
            engine: EngineId::new(&config.engines[fleet_idx].id),
            weight,
            expected_latency_ms: solution.map(|s| s.engines[j].expected_latency_ms),
            network_ms: Some(network),
            // A request is in flight for its round trip and its stay on the engine.
            in_flight_ms: stays.get(j).map(|stay| network + stay).filter(|ms| ms.is_finite() && *ms > 0.0),
        });
    }
    if weights.iter().all(|w| w.weight <= 0.0) {
        // Everything shed (or nothing allowed): keep the class routable so the
        // requests admitted anyway find an engine.
        fallback_weights(plan, &candidates, &mut weights);
    }
    if weights.is_empty() {
        return None;
    }
    let (demand, shed) = outcome.map_or((0.0, 0.0), |o| (o.planned_demand_rps, o.shed_rps));
    Some(ClassRoutes {
        id: ClassId::new(&class.key.class),
        require: class.require.clone(),
        residency: class.residency.clone(),
        weights,
        shed_fraction: if demand > 0.0 { (shed / demand).clamp(0.0, 1.0) } else { 0.0 },
    })
}

/// The snapshot's entries of the fleet's engines `engines_used`.
fn engine_entries(config: &FleetConfig, engines_used: &BTreeSet<usize>) -> Vec<EngineEntry> {
    engines_used
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
        .collect()
}

/// Weights for a class when the plan routes none of its traffic (all of it shed, or no
/// solution): the nearest engines that have capacity, equally. A class shed everywhere finds
/// every engine it may use full, or dearer than its shed price, so the requests admitted anyway
/// (critical parts, the rounding of the shed fraction) are best served with the least network;
/// and the choice follows the network alone, not the prices, which move with every round's
/// noise (routing by marginal cost swung a shed class between two regions each round on the
/// fleet simulator's `overload`). Equal weights where no engine has capacity. `candidates[i]`
/// is the plan's index of the engine of `weights[i]`.
fn fallback_weights(plan: &ModelPlan, candidates: &[usize], weights: &mut [EngineWeight]) {
    let usable = |w: &EngineWeight, j: usize| w.network_ms.filter(|_| plan.capacity_rps[j] > 0.0);
    let nearest =
        weights.iter().zip(candidates).filter_map(|(w, &j)| usable(w, j)).fold(f64::INFINITY, f64::min);
    for (w, &j) in weights.iter_mut().zip(candidates) {
        w.weight = if nearest.is_finite() { f64::from(usable(w, j) == Some(nearest)) } else { 1.0 };
    }
}

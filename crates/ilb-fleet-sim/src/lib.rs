//! `ilb-fleet-sim`: a deterministic discrete-event simulator of a whole ilb fleet in virtual
//! time. It runs the real engine model (`ilb-engine-sim`), the real selection code
//! (`ilb-core`: snapshot → routing table → weighted consistent hashing), the control plane's
//! real planning path (`ilb-planning`: fleet state, signal windows, profile fits, problems,
//! snapshots) and the real optimizer (`ilb-optimizer`), and compares routing policies side by
//! side on one scenario.
//!
//! - [`scenario`]: the TOML scenario format and its validation.
//! - [`simulate`]: calibrate, then run every policy; [`Comparison`] holds the results.
//! - [`report`]: the summary table and the JSON; [`plot`]: SVG plots (as strings).
//!
//! **Invariant:** no IO and no wall clock (except [`clock`], for the benchmark); the same seed
//! gives the same results, byte for byte.

// No product function over `too-many-lines-threshold` (clippy.toml) lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unsafe code (the workspace's one `unsafe` is the optimizer's cache prefetch hint).
#![forbid(unsafe_code)]

pub mod calibrate;
pub mod clock;
mod engines;
pub mod fleet_config;
pub mod metrics;
pub mod plot;
pub mod policy;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod workload;

pub use calibrate::Calibration;
pub use metrics::{LatencySummary, PolicyResult};
pub use scenario::{Scenario, ScenarioError};

use ilb_core::snapshot::EngineEntry;
use ilb_core::EngineId;
use policy::{Baseline, Feedback, Ilb, Policy, Topology};
use scenario::validate_allows;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("scenario: {0}")]
    Scenario(#[from] ScenarioError),
    #[error("engine profile: {0}")]
    Engine(String),
    #[error("control plane config: {0}")]
    Config(String),
    #[error("plot: {0}")]
    Plot(String),
}

/// Overrides of the scenario's own settings.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Simulated seconds; the warm-up shrinks in proportion.
    pub duration_s: Option<f64>,
    pub seed: Option<u64>,
    pub policies: Option<Vec<String>>,
    /// Seconds per calibration run.
    pub calibration_s: Option<f64>,
    /// Data planes per cluster and how they share (`[control] data_planes`,
    /// `data_plane_sharing`).
    pub data_planes: Option<u32>,
    pub sharing: Option<scenario::Sharing>,
}

/// The results of every policy on one scenario.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub scenario: String,
    pub seed: u64,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub calibration: Vec<Calibration>,
    pub policies: BTreeMap<String, PolicyResult>,
    /// Policy names in the order they ran.
    #[serde(skip)]
    pub order: Vec<String>,
}

/// What never changes during a run, from the scenario and the engines' capacities.
pub fn topology(scenario: &Scenario, capacity_rps: &[f64]) -> Topology {
    let streams = &scenario.streams;
    let allowed: Vec<Vec<usize>> = streams
        .iter()
        .map(|s| {
            (0..scenario.engines.len())
                .filter(|&j| {
                    let e = &scenario.engines[j];
                    e.model == s.model
                        && s.class_rule.is_none_or(|r| validate_allows(&scenario.file.classes[r], e))
                })
                .collect()
        })
        .collect();
    let n = scenario.engines.len();
    Topology {
        n_engines: n,
        n_clusters: scenario.clusters.len(),
        allowed_mask: allowed
            .iter()
            .map(|a| {
                let mut mask = vec![false; n];
                a.iter().for_each(|&j| mask[j] = true);
                mask
            })
            .collect(),
        local: streams
            .iter()
            .zip(&allowed)
            .map(|(s, a)| {
                let region = scenario.clusters[s.cluster].1;
                a.iter().copied().filter(|&j| scenario.engines[j].region == region).collect()
            })
            .collect(),
        allowed,
        stream_cluster: streams.iter().map(|s| s.cluster).collect(),
        capacity_rps: capacity_rps.to_vec(),
        stream_model: streams.iter().map(|s| scenario.models[s.model].clone()).collect(),
        stream_class: streams.iter().map(|s| s.class_id.clone()).collect(),
        stream_require: streams
            .iter()
            .map(|s| {
                let mut r =
                    s.class_rule.map(|r| scenario.file.classes[r].require.clone()).unwrap_or_default();
                r.sort();
                r.dedup();
                r
            })
            .collect(),
        stream_residency: streams
            .iter()
            .map(|s| s.class_rule.and_then(|r| scenario.file.classes[r].residency.clone()))
            .collect(),
        stream_priority: streams
            .iter()
            .map(|s| ilb_core::priority::Priority::parse(&s.priority).unwrap_or_default())
            .collect(),
        cluster_ids: scenario.clusters.iter().map(|(id, _)| id.clone()).collect(),
        engine_model: scenario.engines.iter().map(|e| scenario.models[e.model].clone()).collect(),
        engine_entries: scenario
            .engines
            .iter()
            .map(|e| EngineEntry {
                id: EngineId::new(&e.id),
                url: format!("http://{}.sim:8000", e.id),
                region: scenario.regions[e.region].clone(),
                capabilities: e.capabilities.clone(),
                residency: e.residency.clone(),
                max_in_flight: 0,
            })
            .collect(),
        place_new_keys_by_load: scenario.file.control.place_new_keys_by_load,
        data_planes: scenario.file.control.data_planes as usize,
        sharing: scenario.file.control.data_plane_sharing,
    }
}

/// Applies `options` to a scenario.
pub fn with_options(scenario: &Scenario, options: &Options) -> Result<Scenario, SimError> {
    let mut file = scenario.file.clone();
    if let Some(d) = options.duration_s {
        file.warmup_s *= d / file.duration_s;
        file.duration_s = d;
        for e in &mut file.events {
            e.at_s = e.at_s.min(d);
        }
    }
    if let Some(seed) = options.seed {
        file.seed = seed;
    }
    if let Some(p) = &options.policies {
        file.policies = p.clone();
    }
    if let Some(c) = options.calibration_s {
        file.control.calibration_s = c;
    }
    if let Some(n) = options.data_planes {
        file.control.data_planes = n;
    }
    if let Some(sharing) = options.sharing {
        file.control.data_plane_sharing = sharing;
    }
    Ok(Scenario::new(file)?)
}

/// Calibrates the control plane's profiles, then runs every policy of the scenario.
pub fn simulate(scenario: &Scenario, options: &Options) -> Result<Comparison, SimError> {
    let scenario = with_options(scenario, options)?;
    let calibration = calibrate::calibrate_all(&scenario)?;
    let capacities = calibrate::capacities(&scenario, &calibration);
    let topology = topology(&scenario, &capacities);
    let file = &scenario.file;
    let spec = sim::RunSpec {
        duration_s: file.duration_s,
        warmup_s: file.warmup_s,
        seed: file.seed,
        sample_period_s: file.control.sample_period_s.unwrap_or(file.control.solve_period_s),
    };
    let mut policies = BTreeMap::new();
    for name in &file.policies {
        let mut policy = make_policy(&scenario, &topology, &calibration, name)?;
        let result = sim::run(&scenario, &topology, policy.as_mut(), spec)?;
        policies.insert(name.clone(), result);
    }
    Ok(Comparison {
        scenario: file.name.clone(),
        seed: file.seed,
        duration_s: file.duration_s,
        warmup_s: file.warmup_s,
        calibration,
        policies,
        order: file.policies.clone(),
    })
}

fn make_policy(
    scenario: &Scenario,
    topology: &Topology,
    calibration: &[Calibration],
    name: &str,
) -> Result<Box<dyn Policy>, SimError> {
    let control = &scenario.file.control;
    let delay = sim::nanos(control.snapshot_delay_s);
    if let Some(b) = Baseline::new(name, scenario.streams.len()) {
        return Ok(Box::new(b));
    }
    let config = fleet_config::build(scenario, calibration)?;
    match name {
        "feedback" => Ok(Box::new(Feedback::new(config, topology, scenario.file.feedback.clone(), delay))),
        "ilb" => Ok(Box::new(Ilb::new(config, topology, control.solve_period_s, delay))),
        other => Err(SimError::Config(format!("unknown policy '{other}'"))),
    }
}

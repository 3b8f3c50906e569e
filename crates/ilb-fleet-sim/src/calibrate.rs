//! Calibration of the control plane's configured latency profiles against the engine model.
//!
//! The control plane plans with `L(y) = t0 + b·y/(c − y)` per engine (TTFT, and TBOT for the
//! decode objective) and a per-replica capacity `c`. For its predictions to mean anything those
//! must describe the engine model under the scenario's workload, so before the comparison the
//! simulator measures them, the way one would profile a GPU offline:
//!
//! 1. a pilot run of one engine at a light load measures the workload's mean prompt and output
//!    lengths and the prefix-cache hit rate `h` (sessions stay on the one engine);
//! 2. capacity is the engine model's own closed-form estimate,
//!    `HardwareProfile::capacity_rps(P·(1 − h), O)` per replica (computed prompt tokens);
//! 3. eight runs at 30 % … 95 % of that capacity measure mean TTFT and mean time between tokens;
//! 4. the measured points themselves become the profile's measured curves (per replica), which
//!    the control plane plans with: the engine model's TBOT in particular is not
//!    queueing-shaped, and one queueing curve misses it by several per cent at 85–90 % load;
//! 5. `t0` and `b` are still fitted to them by the control plane's own least-squares fit
//!    (`fit_queueing`, without a prior), weighted by the 8th power of the load fraction: the
//!    queueing profile is the offline reference for outlier detection.
//!
//! Every run is this simulator with the `round-robin` policy over a one-engine fleet.

use crate::policy::Baseline;
use crate::scenario::{
    ClusterSpec, CurveKind, DemandSpec, EngineGroupSpec, RegionSpec, Scenario, ScenarioFile,
};
use crate::sim::{self, RunSpec};
use crate::SimError;
use ilb_engine_sim::HardwareProfile;
use ilb_planning::config::MeasuredCurves;
use ilb_planning::profile::{fit_queueing, LatencyProfile, Observation, QueueingPrior};
use serde::Serialize;

/// Fractions of capacity measured.
/// Denser near the top, where a planned fleet runs (the optimizer loads engines to 85–95 %).
const LOADS: [f64; 8] = [0.3, 0.5, 0.65, 0.75, 0.82, 0.88, 0.92, 0.95];

/// A calibrated control-plane profile for one hardware type (and replica count).
#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    /// Profile name in the control plane's config, e.g. `h100x2`.
    pub key: String,
    pub capacity_rps_per_replica: f64,
    pub replicas: u32,
    pub ttft_t0_ms: f64,
    pub ttft_b_ms: f64,
    pub tbot_t0_ms: f64,
    pub tbot_b_ms: f64,
    pub cache_hit_rate: f64,
    pub mean_prompt_tokens: f64,
    pub mean_output_tokens: f64,
    /// Measured (load rps, mean TTFT ms, mean TBOT ms).
    pub points: Vec<(f64, f64, f64)>,
}

impl Calibration {
    /// The measured (load rps per replica, mean TTFT ms) and (…, mean TBOT ms) curves, for the
    /// control plane's `measured_curves`; a curve is `None` unless it has two points.
    pub fn curves(&self) -> MeasuredCurves {
        let replicas = f64::from(self.replicas.max(1));
        let curve = |latency: fn(&(f64, f64, f64)) -> f64| {
            let mut points: Vec<[f64; 2]> = Vec::with_capacity(self.points.len());
            for p in &self.points {
                let point = [p.0 / replicas, latency(p)];
                // Completed-request rates of neighbouring runs can cross; keep loads increasing.
                if point.iter().all(|v| v.is_finite() && *v >= 0.0)
                    && points.last().is_none_or(|last| point[0] > last[0])
                {
                    points.push(point);
                }
            }
            (points.len() >= 2).then_some(points)
        };
        MeasuredCurves { ttft_curve: curve(|p| p.1), tbot_curve: curve(|p| p.2) }
    }
}

pub fn key(hardware: &str, profile: &HardwareProfile) -> String {
    format!("{hardware}x{}", profile.replicas)
}

fn one_engine(
    scenario: &Scenario,
    profile: &HardwareProfile,
    rps: f64,
    seconds: f64,
) -> Result<crate::PolicyResult, SimError> {
    let file = ScenarioFile {
        name: "calibration".into(),
        description: String::new(),
        duration_s: seconds,
        warmup_s: seconds * 0.25,
        seed: scenario.file.seed,
        policies: vec!["round-robin".into()],
        slo_ttft_ms: scenario.file.slo_ttft_ms,
        day_length_s: 86_400.0,
        start_utc_hour: 0.0,
        regions: vec![RegionSpec { id: "r".into(), lat: 0.0, lon: 0.0, utc_offset_h: Some(0.0) }],
        network: Default::default(),
        clusters: vec![ClusterSpec {
            id: "c".into(),
            region: "r".into(),
            demand: vec![DemandSpec {
                model: "m".into(),
                class: "default".into(),
                priority: "normal".into(),
                rps,
                curve: CurveKind::Constant,
                amplitude: 0.0,
                peak_local_hour: 0.0,
                steps: Vec::new(),
            }],
        }],
        classes: Vec::new(),
        hardware: [("hw".to_owned(), profile.clone())].into_iter().collect(),
        engines: vec![EngineGroupSpec {
            group: "e".into(),
            region: "r".into(),
            count: 1,
            hardware: "hw".into(),
            replicas: None,
            model: "m".into(),
            capabilities: Vec::new(),
            residency: Vec::new(),
        }],
        workload: scenario.file.workload.clone(),
        control: scenario.file.control.clone(),
        feedback: scenario.file.feedback.clone(),
        events: Vec::new(),
    };
    let calibration = Scenario::new(file).map_err(SimError::Scenario)?;
    let topology = crate::topology(&calibration, &[1.0]);
    let mut policy =
        Baseline::new("round-robin", 1).ok_or_else(|| SimError::Config("no round-robin".into()))?;
    let spec = RunSpec {
        duration_s: seconds,
        warmup_s: seconds * 0.25,
        seed: scenario.file.seed,
        sample_period_s: seconds,
    };
    sim::run(&calibration, &topology, &mut policy, spec)
}

/// Calibrates one hardware profile under `scenario`'s workload.
pub fn calibrate(
    scenario: &Scenario,
    hardware: &str,
    profile: &HardwareProfile,
) -> Result<Calibration, SimError> {
    let seconds = scenario.file.control.calibration_s;
    let w = &scenario.file.workload;
    let guess_prompt = f64::from(w.system_prompt_tokens) + w.first_prompt_tokens.mean;
    let guess = profile.engine_capacity_rps(guess_prompt, w.output_tokens.mean);
    let pilot = one_engine(scenario, profile, 0.3 * guess, seconds)?;
    let computed_prompt = pilot.mean_prompt_tokens * (1.0 - pilot.cache_hit_rate);
    let output = pilot.mean_output_tokens.max(1.0);
    let capacity = profile.engine_capacity_rps(computed_prompt, output);
    let mut points = Vec::new();
    let (mut ttft_obs, mut tbot_obs) = (Vec::new(), Vec::new());
    for f in LOADS {
        let r = one_engine(scenario, profile, f * capacity, seconds)?;
        let load = r.completed as f64 / (seconds * 0.75);
        points.push((load, r.engine_ttft_ms, r.engine_tbot_ms));
        // Weighted by load to the 8th power: the fit has to be right where the fleet will run.
        let weight = f.powi(8);
        ttft_obs.push(Observation { load_rps: load, latency_ms: r.engine_ttft_ms, weight });
        tbot_obs.push(Observation { load_rps: load, latency_ms: r.engine_tbot_ms, weight });
    }
    let fit = |obs: &[Observation]| {
        let first = obs.first().map_or(1.0, |o| o.latency_ms);
        match fit_queueing(QueueingPrior { t0_ms: first, b_ms: 1.0, weight: 0.0 }, capacity, obs) {
            LatencyProfile::Queueing { t0_ms, b_ms } => (t0_ms, b_ms),
            LatencyProfile::Piecewise(_) => (first, 1.0),
        }
    };
    let (ttft_t0_ms, ttft_b_ms) = fit(&ttft_obs);
    let (tbot_t0_ms, tbot_b_ms) = fit(&tbot_obs);
    Ok(Calibration {
        key: key(hardware, profile),
        capacity_rps_per_replica: capacity / f64::from(profile.replicas),
        replicas: profile.replicas,
        ttft_t0_ms,
        ttft_b_ms,
        tbot_t0_ms,
        tbot_b_ms,
        cache_hit_rate: pilot.cache_hit_rate,
        mean_prompt_tokens: pilot.mean_prompt_tokens,
        mean_output_tokens: output,
        points,
    })
}

/// Calibrates every distinct (hardware, replicas) of the scenario, in a stable order.
pub fn calibrate_all(scenario: &Scenario) -> Result<Vec<Calibration>, SimError> {
    let mut out: Vec<Calibration> = Vec::new();
    for e in &scenario.engines {
        let k = key(&e.hardware, &e.profile);
        if out.iter().all(|c| c.key != k) {
            out.push(calibrate(scenario, &e.hardware, &e.profile)?);
        }
    }
    Ok(out)
}

/// Nominal capacity of every engine of the scenario, requests/s.
pub fn capacities(scenario: &Scenario, calibrations: &[Calibration]) -> Vec<f64> {
    scenario
        .engines
        .iter()
        .map(|e| {
            let k = key(&e.hardware, &e.profile);
            calibrations
                .iter()
                .find(|c| c.key == k)
                .map_or(1.0, |c| c.capacity_rps_per_replica * f64::from(c.replicas))
        })
        .collect()
}

//! Calibration of the control plane's configured latency profiles against the engine model.
//!
//! The control plane plans with a latency curve per engine (TTFT, and TBOT for the decode
//! objective) and a per-replica capacity, learned online from what it sees and starting from
//! the fleet's configured profiles. Before the comparison the simulator writes those profiles
//! the way an operator would, with `ilb profile`'s search ([`search`]) against the engine model
//! under the scenario's workload:
//!
//! 1. an idle run of one engine, at a tenth of the closed-form capacity for the workload's
//!    nominal lengths, measures the idle TTFT and the workload's actual mean prompt and output
//!    lengths and prefix-cache hit rate (sessions stay on the one engine);
//! 2. the search starts at half the engine model's closed-form capacity for those lengths
//!    (`HardwareProfile::engine_capacity_rps`), doubles to the knee, brackets it within 10 %
//!    and fills in the loads below it; a step is past the knee on the same tests `ilb profile`
//!    applies (completions, TTFT against idle, latency growing through the step);
//! 3. the capacity, the queueing fits and the measured curves are [`search::fit`]'s, as
//!    `ilb profile` prints them. The measured curves are handed to the planner only with
//!    `measured_curves = true`.
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
use ilb_planning::profile::search::{self, Measured, Step};
use ilb_planning::profile::Observation;
use serde::Serialize;

/// The idle measurement's rate, as a share of the closed-form capacity for the workload's
/// nominal lengths: light enough that requests barely queue, busy enough to measure the
/// workload's lengths and prefix-cache hit rate.
const IDLE_SHARE: f64 = 0.1;

/// The share of each run not measured: the engine starts empty.
const WARM_UP_SHARE: f64 = 0.25;

/// Load steps of the search at most (it takes 8–10 on the built-in hardware).
const MAX_STEPS: usize = 14;

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
    /// The steps below the knee as (load rps, mean latency ms) curves per replica, for the
    /// control plane's `measured_curves`.
    pub curves: MeasuredCurves,
    /// Every step of the search, in order.
    pub steps: Vec<Step>,
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
        warmup_s: seconds * WARM_UP_SHARE,
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
        warmup_s: seconds * WARM_UP_SHARE,
        seed: scenario.file.seed,
        // Quarters: the warm-up, then three to see a queue grow.
        sample_period_s: seconds / 4.0 * (1.0 - 1e-9),
    };
    sim::run(&calibration, &topology, &mut policy, spec)
}

/// Requests counted per run at least: past the knee's tests are on means and shares, which a
/// handful of requests leaves to chance.
const MIN_REQUESTS: f64 = 200.0;

/// How long a run at `rate` lasts: the scenario's `calibration_s`, or long enough that its
/// measured part counts [`MIN_REQUESTS`] arrivals, or (past the idle run) long enough that its
/// warm-up quarter spans one and a half conversations (turns of thinking and answering at
/// idle), so that follow-up turns arrive at their steady rate before it is measured.
fn run_seconds(scenario: &Scenario, rate: f64, idle: Option<&crate::PolicyResult>) -> f64 {
    let w = &scenario.file.workload;
    let counted = MIN_REQUESTS / ((1.0 - WARM_UP_SHARE) * rate.max(1e-3));
    let conversations =
        idle.map_or(0.0, |idle| 1.5 * w.turns_mean * (w.think_s + idle.e2e_ms.mean / 1000.0) / WARM_UP_SHARE);
    scenario.file.control.calibration_s.max(counted).max(conversations)
}

/// One load step of the search at `rate` (requests/s offered to the workload), judged against
/// the `idle` run as `ilb profile` judges a step.
fn step(
    scenario: &Scenario,
    profile: &HardwareProfile,
    rate: f64,
    idle: &crate::PolicyResult,
) -> Result<Step, SimError> {
    let seconds = run_seconds(scenario, rate, Some(idle));
    let run = one_engine(scenario, profile, rate, seconds)?;
    // Samples every quarter of the run: the first is the warm-up's, the last the end's.
    let e2e = &run.series.e2e_ms;
    let queue_grew = e2e.len() >= 4 && search::grew(e2e[1], e2e[3], idle.e2e_ms.mean);
    let measured = Measured {
        sent: run.arrivals,
        completed: run.completed,
        ttft_ms: run.engine_ttft_ms,
        idle_ttft_ms: idle.engine_ttft_ms,
        queue_grew,
    };
    Ok(Step {
        offered_rps: rate,
        // Sessions end early at the context limit, so fewer requests arrive than offered.
        load_rps: run.arrivals as f64 / (seconds * (1.0 - WARM_UP_SHARE)),
        ttft_ms: run.engine_ttft_ms,
        tbot_ms: run.engine_tbot_ms,
        overloaded: measured.past_knee(),
    })
}

/// The idle run: one engine at [`IDLE_SHARE`] of the closed-form capacity for the workload's
/// nominal lengths.
fn idle(scenario: &Scenario, profile: &HardwareProfile) -> Result<crate::PolicyResult, SimError> {
    let w = &scenario.file.workload;
    let nominal_prompt = f64::from(w.system_prompt_tokens) + w.first_prompt_tokens.mean;
    let rate = IDLE_SHARE * profile.engine_capacity_rps(nominal_prompt, w.output_tokens.mean);
    one_engine(scenario, profile, rate, run_seconds(scenario, rate, None))
}

/// Calibrates one hardware profile under `scenario`'s workload.
pub fn calibrate(
    scenario: &Scenario,
    hardware: &str,
    profile: &HardwareProfile,
) -> Result<Calibration, SimError> {
    let idle = idle(scenario, profile)?;
    let computed_prompt = idle.mean_prompt_tokens * (1.0 - idle.cache_hit_rate);
    let output = idle.mean_output_tokens.max(1.0);
    let estimate = profile.engine_capacity_rps(computed_prompt, output);
    let mut steps: Vec<Step> = Vec::new();
    let mut rate = Some(0.5 * estimate);
    while let Some(r) = rate.filter(|_| steps.len() < MAX_STEPS) {
        steps.push(step(scenario, profile, r, &idle)?);
        rate = search::next_rate(&steps);
    }
    let fitted = search::fit(&steps, profile.replicas)
        .map_err(|e| SimError::Config(format!("calibrating {hardware} under {}: {e}", scenario.file.name)))?;
    let curve = |points: &[Observation]| -> Option<Vec<[f64; 2]>> {
        (points.len() >= 2).then(|| points.iter().map(|o| [o.load_rps, o.latency_ms]).collect())
    };
    Ok(Calibration {
        key: key(hardware, profile),
        capacity_rps_per_replica: fitted.capacity_rps,
        replicas: profile.replicas,
        ttft_t0_ms: fitted.ttft_t0_ms,
        ttft_b_ms: fitted.ttft_b_ms,
        tbot_t0_ms: fitted.tbot_t0_ms,
        tbot_b_ms: fitted.tbot_b_ms,
        cache_hit_rate: idle.cache_hit_rate,
        mean_prompt_tokens: idle.mean_prompt_tokens,
        mean_output_tokens: output,
        curves: MeasuredCurves {
            ttft_curve: curve(&fitted.ttft_curve),
            tbot_curve: curve(&fitted.tbot_curve),
        },
        steps,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The calibrated capacity is where the engine model saturates under the scenario's
    /// workload: at 80 % of it an engine keeps up, at 125 % it does not. On this fleet's L4 the
    /// closed-form estimate the search starts from is far above that.
    #[test]
    fn the_calibrated_capacity_is_where_the_engine_saturates() {
        let scenario = Scenario::new(crate::scenario::random_fleet(1, 68)).expect("a valid fleet");
        let engine = scenario.engines.iter().find(|e| e.hardware == "l4").expect("an l4 group");
        let (hardware, profile) = (engine.hardware.clone(), engine.profile.clone());
        let calibration = calibrate(&scenario, &hardware, &profile).expect("calibrated");
        let capacity = calibration.capacity_rps_per_replica * f64::from(calibration.replicas);
        let idle = idle(&scenario, &profile).expect("idle run");
        // Offered rates give fewer arrivals (sessions end at the context limit): the ratio
        // from a step well below the knee.
        let probe = step(&scenario, &profile, 0.5 * capacity, &idle).expect("a step");
        let arrivals_per_offered = probe.load_rps / probe.offered_rps;
        let at = |share: f64| {
            step(&scenario, &profile, share * capacity / arrivals_per_offered, &idle).expect("a step")
        };
        let estimate = profile.engine_capacity_rps(
            idle.mean_prompt_tokens * (1.0 - idle.cache_hit_rate),
            idle.mean_output_tokens,
        );
        assert!(estimate > 1.3 * capacity, "closed form {estimate} against calibrated {capacity}");
        let (under, over) = (at(0.8), at(1.25));
        assert!(!under.overloaded, "{under:?} against {calibration:?}");
        assert!(over.overloaded, "{over:?} against {calibration:?}");
    }
}

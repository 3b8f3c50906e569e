//! The scenario TOML as written: plain serde structs, `deny_unknown_fields` everywhere, defaults
//! documented on each field. Units are in the field names (`_s`, `_ms`, `_rps`).

use ilb_engine_sim::HardwareProfile;
use ilb_planning::config::{ClassRule, NetworkSettings};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A whole scenario file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// Short name, used in reports. Example: `"three-regions"`.
    pub name: String,
    /// What the scenario shows, free text.
    #[serde(default)]
    pub description: String,
    /// Simulated time, seconds. Example: 600.
    pub duration_s: f64,
    /// Requests finishing before this many seconds are not counted in the statistics. Default 0.
    #[serde(default)]
    pub warmup_s: f64,
    /// Seed of every random choice (arrivals, lengths, random policies). Default 1.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Policies to compare, from `round-robin`, `random`, `nearest`, `least-loaded`, `feedback`,
    /// `ilb`. Default: all six.
    #[serde(default = "default_policies")]
    pub policies: Vec<String>,
    /// A request is good (counts in goodput) if its TTFT, network included, is at most this, ms.
    /// Default 2000.
    #[serde(default = "default_slo")]
    pub slo_ttft_ms: f64,
    /// Length of a simulated day for diurnal curves, seconds: 86400 is real time, 1200 compresses
    /// a day into 20 simulated minutes. Default 86400.
    #[serde(default = "default_day")]
    pub day_length_s: f64,
    /// UTC hour at simulated time 0. Default 0.
    #[serde(default)]
    pub start_utc_hour: f64,
    /// Regions with coordinates.
    pub regions: Vec<RegionSpec>,
    /// Network latency between regions: `base_ms + ms_per_1000_km × great-circle distance`, or
    /// an explicit `latency` list (the control plane's `[network]` table, reused as is;
    /// `use_measured` is ignored: the simulator has no measured round trips).
    #[serde(default)]
    pub network: NetworkSettings,
    /// Front-end clusters and their demand.
    pub clusters: Vec<ClusterSpec>,
    /// Constrained traffic classes (the control plane's `[[classes]]`): `id`, `require`, `residency`.
    #[serde(default)]
    pub classes: Vec<ClassRule>,
    /// Custom hardware profiles by name (the engine model's parameters; unset fields are the
    /// `a100` profile's). Built-in names: `l4`, `a100`, `h100`.
    #[serde(default)]
    pub hardware: BTreeMap<String, HardwareProfile>,
    /// Engine groups.
    pub engines: Vec<EngineGroupSpec>,
    #[serde(default)]
    pub workload: WorkloadSpec,
    #[serde(default)]
    pub control: ControlSpec,
    #[serde(default)]
    pub feedback: FeedbackSpec,
    /// Timed events (failures, recoveries, outages, slowdowns, surges).
    #[serde(default)]
    pub events: Vec<EventSpec>,
}

fn default_seed() -> u64 {
    1
}
fn default_policies() -> Vec<String> {
    super::POLICIES.iter().map(|p| (*p).to_owned()).collect()
}
fn default_day() -> f64 {
    86_400.0
}
fn default_slo() -> f64 {
    2000.0
}

/// `[[regions]]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegionSpec {
    pub id: String,
    /// Latitude, degrees.
    pub lat: f64,
    /// Longitude, degrees.
    pub lon: f64,
    /// Local time offset from UTC, hours, for diurnal demand. Default: `round(lon / 15)`.
    #[serde(default)]
    pub utc_offset_h: Option<f64>,
}

/// `[[clusters]]`: a front-end cluster in a region.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub id: String,
    pub region: String,
    /// One entry per (model, class) this cluster sends.
    pub demand: Vec<DemandSpec>,
}

/// `[[clusters.demand]]`: requests/s of one model and class over time.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DemandSpec {
    /// Model name. Default `"m"`.
    #[serde(default = "default_model")]
    pub model: String,
    /// Traffic class: `"default"` or the id of a `[[classes]]` rule. Default `"default"`.
    #[serde(default = "default_class")]
    pub class: String,
    /// `low`, `normal`, `high` or `critical`: what shedding costs (`control.shed_penalty_ms`).
    /// Default `"normal"`.
    #[serde(default = "default_priority")]
    pub priority: String,
    /// Mean request rate, requests/s (all turns of all sessions). Example: 90.
    pub rps: f64,
    /// `constant` or `diurnal`. Default `constant`.
    #[serde(default)]
    pub curve: CurveKind,
    /// Diurnal only: relative swing, rate = rps × (1 + amplitude × cos(2π (local hour − peak) / 24)).
    /// In [0, 1]. Default 0.5.
    #[serde(default = "default_amplitude")]
    pub amplitude: f64,
    /// Diurnal only: local hour of the peak. Default 14.
    #[serde(default = "default_peak")]
    pub peak_local_hour: f64,
    /// Step changes: from `at_s` on, the rate is multiplied by `factor` (the last step wins).
    #[serde(default)]
    pub steps: Vec<StepSpec>,
}

fn default_model() -> String {
    "m".into()
}
fn default_class() -> String {
    "default".into()
}
fn default_priority() -> String {
    "normal".into()
}
fn default_amplitude() -> f64 {
    0.5
}
fn default_peak() -> f64 {
    14.0
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CurveKind {
    #[default]
    Constant,
    Diurnal,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    pub at_s: f64,
    pub factor: f64,
}

/// `[[engines]]`: `count` identical engines `{group}-0`, `{group}-1`, … in one region.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EngineGroupSpec {
    /// Group name, also the engine id prefix. Example: `"eu-h100"`.
    pub group: String,
    pub region: String,
    /// Engines in the group. Default 1. Example: 40.
    #[serde(default = "one")]
    pub count: u32,
    /// `l4`, `a100`, `h100` or a `[hardware.NAME]` table.
    pub hardware: String,
    /// Replicas per engine; default: the hardware profile's.
    #[serde(default)]
    pub replicas: Option<u32>,
    /// Model served. Default `"m"`.
    #[serde(default = "default_model")]
    pub model: String,
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Residency zones the engines satisfy. Example: `["eu"]`.
    #[serde(default)]
    pub residency: Vec<String>,
}

fn one() -> u32 {
    1
}

/// A length distribution, tokens: `{ mean = 300, min = 16, max = 2000, dist = "exponential" }`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LengthSpec {
    pub mean: f64,
    #[serde(default = "one")]
    pub min: u32,
    #[serde(default = "default_max_len")]
    pub max: u32,
    /// `exponential` (mean before clamping to [min, max]), `uniform` (on [min, max]) or `fixed`
    /// (always `mean`). Default `exponential`.
    #[serde(default)]
    pub dist: LengthDist,
}

fn default_max_len() -> u32 {
    4096
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LengthDist {
    #[default]
    Exponential,
    Uniform,
    Fixed,
}

/// `[workload]`: conversations. A session has a geometric number of turns; each turn's prompt is
/// the previous prompt + its output + new user tokens, so turns share a growing prefix.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadSpec {
    /// Mean turns per session (geometric, ≥ 1). Default 4.
    pub turns_mean: f64,
    /// Mean think time between a reply and the next turn, seconds (exponential). Default 5.
    pub think_s: f64,
    /// System prompt shared by every session of a model, tokens. Default 128.
    pub system_prompt_tokens: u32,
    /// User tokens of the first turn.
    pub first_prompt_tokens: LengthSpec,
    /// User tokens added by each later turn.
    pub followup_tokens: LengthSpec,
    /// Output tokens of each turn.
    pub output_tokens: LengthSpec,
    /// A session ends once its next prompt would exceed this many tokens. Default 8000.
    pub max_context_tokens: u32,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            turns_mean: 4.0,
            think_s: 5.0,
            system_prompt_tokens: 128,
            first_prompt_tokens: LengthSpec {
                mean: 300.0,
                min: 16,
                max: 2000,
                dist: LengthDist::Exponential,
            },
            followup_tokens: LengthSpec { mean: 60.0, min: 4, max: 500, dist: LengthDist::Exponential },
            output_tokens: LengthSpec { mean: 100.0, min: 4, max: 1000, dist: LengthDist::Exponential },
            max_context_tokens: 8000,
        }
    }
}

/// `[control]`: the control plane as the simulator runs it, and the data planes' reporting.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlSpec {
    /// Optimizer period (solve and publish), seconds. Default 2.
    pub solve_period_s: f64,
    /// Engine metrics scrape period, seconds. Default 1.
    pub scrape_period_s: f64,
    /// Data-plane report period, seconds. Default 1.
    pub report_period_s: f64,
    /// Delay from a solve to data planes installing its snapshot (one pull), seconds. Default 1.
    pub snapshot_delay_s: f64,
    /// EWMA time constant of demand and signals, seconds. Default 5.
    pub smoothing_s: f64,
    /// Usable fraction ρ of capacity. Default 0.95.
    pub rho: f64,
    /// Stability strength, ms of latency a new plan must save per moved request (the control
    /// plane's `stability_ms`). Default: the control plane's.
    pub stability_ms: f64,
    /// Relative stability tolerance (the control plane's `stability_tolerance`). Default: the
    /// control plane's.
    pub stability_tolerance: f64,
    /// The control plane's `demand_band_sigmas`. Default: the control plane's.
    pub demand_band_sigmas: f64,
    /// The control plane's `tail_weight`. Default: the control plane's.
    pub tail_weight: f64,
    /// `ttft` or `ttft_plus_decode` (the optimizer then predicts mean end-to-end latency). Default
    /// `ttft_plus_decode`.
    pub objective: String,
    /// Shed cost per priority, ms (`low`, `normal`, `high`, `critical`); defaults as the control plane's.
    pub shed_penalty_ms: BTreeMap<String, f64>,
    /// The control plane's `shed_price_floor`. Default: the control plane's.
    pub shed_price_floor: f64,
    /// Simulated seconds per load step, at least, when calibrating the control plane's profiles
    /// against the engine model (longer where 200 requests or the conversations' warm-up need
    /// it). Default 60.
    pub calibration_s: f64,
    /// Seconds between time-series samples (plots, weight churn, oscillation). Default: the
    /// solve period.
    pub sample_period_s: Option<f64>,
    /// Hand the control plane the calibration's measured curves
    /// (`control_plane.measured_curves`, the second block `ilb profile` prints) besides its
    /// queueing profile, as an operator who profiled the hardware would. Default true; false
    /// plans from the queueing fit alone.
    pub measured_curves: bool,
    /// The data planes place new conversations by load (`data_plane.place_new_keys_by_load`,
    /// `ilb_core::table::ClassTable::select`). Default true, as in the data plane; false hashes
    /// new conversations blindly.
    pub place_new_keys_by_load: bool,
    /// Data planes per front-end cluster (replicas behind one Service), from 1 to
    /// [`MAX_DATA_PLANES`]. Each request reaches one of them uniformly at random, and each has
    /// its own affinity table and in-flight counts (`feedback` and `ilb`; the baselines route
    /// as one). Default 1. Example: 4.
    pub data_planes: u32,
    /// How a cluster's data planes share what they decide (new and moved conversations, their
    /// requests in flight) when there are several: `none`, `peers` or `control-plane`. Default
    /// `control-plane`, as the data plane does without `--peer`.
    pub data_plane_sharing: Sharing,
}

/// Most data planes per cluster: each holds a 2 MiB affinity table.
pub const MAX_DATA_PLANES: u32 = 32;

/// `[control] data_plane_sharing`: how the data planes of one cluster learn each other's
/// decisions (`ilb_core::deltas::Deltas`).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// Each data plane decides alone, from the requests it saw.
    None,
    /// Directly (`--peer`): every data plane's changes reach the others within the data
    /// plane's shortest gap between two messages (5 ms).
    Peers,
    /// Through the control plane: each data plane's changes ride on its next report, and the
    /// others learn them from the answers to their own next reports (every `report_period_s`).
    #[default]
    ControlPlane,
}

impl Sharing {
    /// The name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Sharing::None => "none",
            Sharing::Peers => "peers",
            Sharing::ControlPlane => "control-plane",
        }
    }
}

impl std::str::FromStr for Sharing {
    type Err = String;

    fn from_str(name: &str) -> Result<Sharing, String> {
        [Sharing::None, Sharing::Peers, Sharing::ControlPlane]
            .into_iter()
            .find(|sharing| sharing.name() == name)
            .ok_or_else(|| format!("unknown sharing '{name}' (none, peers, control-plane)"))
    }
}

impl Default for ControlSpec {
    fn default() -> Self {
        ControlSpec {
            solve_period_s: 2.0,
            scrape_period_s: 1.0,
            report_period_s: 1.0,
            snapshot_delay_s: 1.0,
            smoothing_s: 5.0,
            rho: 0.95,
            stability_ms: ilb_planning::config::ControlPlaneSettings::default().stability_ms,
            stability_tolerance: ilb_planning::config::ControlPlaneSettings::default().stability_tolerance,
            demand_band_sigmas: ilb_planning::config::ControlPlaneSettings::default().demand_band_sigmas,
            tail_weight: ilb_planning::config::ControlPlaneSettings::default().tail_weight,
            objective: "ttft_plus_decode".into(),
            shed_penalty_ms: ilb_planning::config::ControlPlaneSettings::default().shed_penalty_ms,
            shed_price_floor: ilb_planning::config::ControlPlaneSettings::default().shed_price_floor,
            calibration_s: 60.0,
            sample_period_s: None,
            measured_curves: true,
            place_new_keys_by_load: true,
            data_planes: 1,
            data_plane_sharing: Sharing::default(),
        }
    }
}

/// `[feedback]`: the classic proportional controller baseline.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FeedbackSpec {
    /// Control period, seconds. Default 2.
    pub period_s: f64,
    /// Proportional gain: weight × (1 + gain × (1 − score / fleet mean score)) each period. Default 0.5.
    pub gain: f64,
    /// Weights stay within [min_weight, max_weight] × the engine's initial weight. Default 0.05 / 5.
    pub min_weight: f64,
    pub max_weight: f64,
}

impl Default for FeedbackSpec {
    fn default() -> Self {
        FeedbackSpec { period_s: 2.0, gain: 0.5, min_weight: 0.05, max_weight: 5.0 }
    }
}

/// `[[events]]`: something that happens at `at_s`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    pub at_s: f64,
    /// `engine_failure`, `engine_recovery`, `region_outage`, `region_recovery`, `slowdown`, `surge`.
    pub kind: EventKind,
    /// Engines of this group (failure, recovery, slowdown).
    #[serde(default)]
    pub group: Option<String>,
    /// Only the first `count` engines of the group. Default: all.
    #[serde(default)]
    pub count: Option<u32>,
    /// Region (outage, recovery; or engines of a region for failure/slowdown).
    #[serde(default)]
    pub region: Option<String>,
    /// Cluster (surge; default every cluster).
    #[serde(default)]
    pub cluster: Option<String>,
    /// Slowdown: iteration cost multiplier (1 = healthy). Surge: demand multiplier.
    #[serde(default)]
    pub factor: Option<f64>,
    /// Surge only: how long it lasts, seconds. Default: to the end.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Requests arriving this many seconds after the event are its transient in the report
    /// (latency during it). Default: a surge's `duration_s`, else 60; never past the next
    /// event or the end of the run.
    #[serde(default)]
    pub window_s: Option<f64>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    EngineFailure,
    EngineRecovery,
    RegionOutage,
    RegionRecovery,
    Slowdown,
    Surge,
}

impl EventKind {
    /// The name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::EngineFailure => "engine_failure",
            EventKind::EngineRecovery => "engine_recovery",
            EventKind::RegionOutage => "region_outage",
            EventKind::RegionRecovery => "region_recovery",
            EventKind::Slowdown => "slowdown",
            EventKind::Surge => "surge",
        }
    }
}

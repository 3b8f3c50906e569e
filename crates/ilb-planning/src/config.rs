//! The control plane's configuration: the fleet (regions, front-end clusters, engines, hardware
//! profiles), traffic-class rules, network latency, optimizer settings and periods.
//!
//! These types are what the `[control_plane]` and fleet tables of the TOML file deserialize into
//! (unknown fields are errors); [`FleetConfig::validate`] then checks every cross-reference and
//! range and names the offending field. The binary reads the file; this crate never does.

use crate::profile::Objective;
use ilb_core::bounds;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

/// Everything the control plane needs to know about the fleet and how to plan it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    #[serde(default)]
    pub control_plane: ControlPlaneSettings,
    /// Regions with coordinates; network latency between regions is derived from distance
    /// unless `network` gives it explicitly.
    #[serde(default)]
    pub regions: Vec<Region>,
    #[serde(default)]
    pub network: NetworkSettings,
    pub clusters: Vec<Cluster>,
    /// Traffic classes with constraints, in addition to every model's `default` class.
    #[serde(default)]
    pub classes: Vec<ClassRule>,
    /// Hardware profiles by name.
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
    /// Engines known from the file. May be empty: engines can also register
    /// (`POST /v1/engines`) or be discovered (`[[engine_groups]]`).
    #[serde(default)]
    pub engines: Vec<Engine>,
    /// Engines found by DNS: each address a group's name resolves to becomes an engine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_groups: Vec<EngineGroup>,
}

/// `[control_plane]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlPlaneSettings {
    /// Address of the control plane's HTTP API and dashboard, e.g. `"0.0.0.0:7000"`.
    pub listen: String,
    /// How often each engine's `/metrics` is scraped, ms. Default 1000.
    pub scrape_interval_ms: u64,
    /// How often the optimizer runs and snapshots are published, ms. Default 2000.
    pub solve_interval_ms: u64,
    /// An engine without a successful scrape for this long counts as unhealthy, ms. Default 5000.
    pub signal_stale_ms: u64,
    /// A data plane that has not reported for this long no longer counts, ms. Default 10000.
    pub report_timeout_ms: u64,
    /// Time constant of the EWMA smoothing of demand and signals, ms. Default 5000.
    pub smoothing_ms: u64,
    /// Usable fraction ρ of each engine's capacity, in (0, 1]. Default 0.95.
    pub rho: f64,
    /// Stability strength: how many ms of latency a new plan must save per request it moves to
    /// another engine before a class's published weights change (a moved conversation loses
    /// its prefix cache). A model whose demand really changed (some class's measurement jumped
    /// by more than twice its demand band) is planned without it until the measurement has
    /// settled. 0 = always publish the optimum. Default 100: a conversation that moves pays
    /// the prefill of its cached prefix again, on the order of 100 ms for a few thousand tokens
    /// on current GPUs (figures in docs/results.md; docs/config.md, "The stability knobs", puts
    /// the four stability rules side by side).
    pub stability_ms: f64,
    /// Stability tolerance: classes also keep their published weights while the plan's expected
    /// latency on the new problem stays within this fraction of the new optimum's, so that
    /// demand noise and differences as small as the solve's own certified gap move no traffic;
    /// when some classes must move, the others keep theirs as far as the tolerance allows.
    /// 0 = off. Default 0.001 (the 0.1 % gap every solve is certified to).
    pub stability_tolerance: f64,
    /// Demand band: the half-width, in standard deviations of the measurement's noise
    /// (√(rate / 2·smoothing) for Poisson arrivals), of the band each class's demand is planned
    /// from. The band moves only when the measured rate leaves it: upwards only as far as it
    /// takes to hold the rate on its top edge, downwards (or after a jump of more than twice
    /// its width) re-centred on it, so that noise moves no traffic; each class is planned at
    /// the band's top, as far as three quarters of the slack the centres leave under the
    /// model's usable capacity has room for that headroom. A class whose weights the
    /// stability rule holds need only fit its engines without half the headroom: what of that
    /// half no longer fits a full engine is planned on engines with room, and its weights stay.
    /// 0 = plan with every measurement as it is. Default 3.
    pub demand_band_sigmas: f64,
    /// Which latency the optimizer minimises.
    pub objective: ObjectiveSetting,
    /// Output tokens per request to expect before the engines have reported any: the
    /// starting point of the output length the control plane learns per model from the
    /// engines' generated-token and finished-request counters (it counts as 20 requests'
    /// worth, with an exponential spread). The decode term of `objective = "ttft_plus_decode"` and, under either
    /// objective, how long the plan expects a request to stay on each engine (the snapshots'
    /// `in_flight_ms`) use the learned length. Default 128.
    pub expected_output_tokens: f64,
    /// How much the objective weighs the tail (decode objective only): each millisecond by
    /// which a request is expected to run past its model's p99 latency counts this many times
    /// on top of the mean. The spread of output lengths is learned per model from the engines'
    /// histograms of generated tokens per request (vLLM, SGLang, TGI), and for engines without
    /// one (llama.cpp) from the same histogram the data planes count of their answers; until
    /// either has answers, it is exponential around the learned mean (the widest spread a mean
    /// alone allows). At w, the objective is the mean + w/100 × the p99's conditional value at
    /// risk, so the plan keeps long answers off engines that decode slowly at their load even
    /// where the mean alone would accept them. Shed prices are raised
    /// by 1 + w alike, so the term moves traffic but sheds nothing the mean alone would not.
    /// 0 = the mean alone. Default 2.
    pub tail_weight: f64,
    /// Cost of shedding one request, ms, per priority (`low`, `normal`, `high`, `critical`).
    /// A class's demand is planned per priority (data planes report the split), each part
    /// shed at its price, so the optimizer sheds the lowest priority first, as data planes do.
    pub shed_penalty_ms: BTreeMap<String, f64>,
    /// Shed prices follow the objective's scale: a class's prices are raised (all in the
    /// same proportion, so priorities keep their order) until its `normal` price is at least
    /// this many times the slowest unloaded end-to-end latency among the engines it may use
    /// (network included). Serving a request then costs less than shedding it wherever an
    /// engine has room, also when decoding makes every request take seconds; the configured
    /// prices still decide how full an overloaded fleet runs when they are the larger.
    /// 0 = the configured prices alone. Default 2.
    pub shed_price_floor: f64,
    /// Demand (req/s) assumed for a class before any data plane reports it, so weights exist
    /// from the start. Default 0.1.
    pub demand_floor_rps: f64,
    /// Bearer token required by mutating endpoints (`POST /v1/reports`, `POST /v1/engines`,
    /// `DELETE /v1/engines/{id}`). Empty: reports need none and registration is off.
    pub token: String,
    /// `[control_plane.outliers]`: detection of outlier engines and their penalties.
    pub outliers: OutlierSettings,
    /// Measured latency curves by profile name: `[control_plane.measured_curves.NAME]` with
    /// `ttft_curve` and/or `tbot_curve`, each `[[load_rps_per_replica, latency_ms], …]` (at
    /// least 2 points, loads strictly increasing, TBOT in ms per token). A given curve replaces
    /// the profile's queueing curve of that signal when planning, because a real engine's curve
    /// (TBOT especially) is often not queueing-shaped: the planner joins its points by a smooth
    /// convex curve and refits it from what it observes. The queueing curve still serves as the
    /// offline reference for outlier detection. Default: none.
    pub measured_curves: BTreeMap<String, MeasuredCurves>,
}

/// Measured latency curves of one hardware profile, points `[load_rps_per_replica, latency_ms]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MeasuredCurves {
    /// Mean time to first token, ms, by per-replica load, req/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_curve: Option<Vec<[f64; 2]>>,
    /// Mean time between output tokens, ms, by per-replica load, req/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tbot_curve: Option<Vec<[f64; 2]>>,
}

impl MeasuredCurves {
    /// Finite non-negative points, at least two, loads strictly increasing; `field` prefixes errors.
    fn validate(&self, field: &str) -> Result<(), ConfigError> {
        for (name, curve) in [("ttft_curve", &self.ttft_curve), ("tbot_curve", &self.tbot_curve)] {
            let Some(points) = curve else { continue };
            if points.len() < 2 {
                return err(format!("{field}.{name}: needs at least 2 points"));
            }
            for (i, &[load, ms]) in points.iter().enumerate() {
                bounds::RATE_RPS.check(&format!("{field}.{name}[{i}] load"), load)?;
                bounds::LATENCY_MS.check(&format!("{field}.{name}[{i}] latency"), ms)?;
                if i > 0 && load <= points[i - 1][0] {
                    return err(format!("{field}.{name}[{i}]: loads must be strictly increasing"));
                }
            }
        }
        Ok(())
    }
}

impl Default for ControlPlaneSettings {
    fn default() -> Self {
        ControlPlaneSettings {
            listen: "127.0.0.1:7000".into(),
            scrape_interval_ms: 1000,
            solve_interval_ms: 2000,
            signal_stale_ms: 5000,
            report_timeout_ms: 10_000,
            smoothing_ms: 5000,
            rho: 0.95,
            stability_ms: 100.0,
            stability_tolerance: 0.001,
            demand_band_sigmas: 3.0,
            objective: ObjectiveSetting::TtftPlusDecode,
            expected_output_tokens: 128.0,
            tail_weight: 2.0,
            shed_penalty_ms: [
                ("low", 2_000.0),
                ("normal", 10_000.0),
                ("high", 30_000.0),
                ("critical", 100_000.0),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
            shed_price_floor: 2.0,
            demand_floor_rps: 0.1,
            token: String::new(),
            outliers: OutlierSettings::default(),
            measured_curves: BTreeMap::new(),
        }
    }
}

/// `[control_plane.outliers]`: which engines count as outliers and how hard they are penalised.
///
/// Every `interval_ms`, each engine with enough requests in its window is judged: an **error
/// outlier** has a success rate below its model's mean − `success_rate_stdev_factor`·σ (as
/// Envoy's success-rate outlier detection), from its own failure counters or the data planes'
/// observed errors, whichever is worse; a **latency outlier** has a mean TTFT at least
/// `latency_ratio` times what its offline profile predicts at its observed load (times the
/// fleet's median ratio) and what its fitted curve predicts, and decodes `latency_ratio` times
/// slower than its fitted TBOT curve where it reports TBOT: it became slow, and its workload
/// does not explain it. Unpenalised engines are also judged between intervals, to be convicted
/// early, on their window once it spans half an interval and on their latest half interval. A
/// window in which the engine was unreachable is not judged, nor, for three `smoothing_ms` after an
/// engine of the model went down or came back, the windows of engines not yet penalised (the
/// traffic that moved queues and lost its cached prefixes). A penalty withholds a share of the
/// engine's capacity from the optimizer: at first at least half, more for a worse outlier, and
/// enough that the engine keeps at most three quarters of the load it was convicted at; it grows
/// while the engine stays an outlier; every healthy interval halves it, but at most doubles the
/// capacity the engine keeps (a deep penalty is lifted in steps, each judged on the traffic it
/// brings back).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierSettings {
    /// Detect outliers and penalise them. Default true.
    pub enabled: bool,
    /// Length of one evaluation interval, ms. Default 10000 (Envoy's default interval).
    pub interval_ms: u64,
    /// Requests an engine needs in its window before it is judged, e.g. 20. Default 20.
    pub min_requests: u64,
    /// Requests a penalised engine (whose traffic the penalty throttles) needs to be judged
    /// again. Default 5.
    pub probe_requests: u64,
    /// A window without enough requests is given up after this many intervals; a penalised
    /// engine then recovers one step on the benefit of the doubt. Default 6.
    pub max_window_intervals: u32,
    /// k in the success-rate threshold mean − k·σ. Default 1.9.
    pub success_rate_stdev_factor: f64,
    /// A success rate must also be this far below the mean (a fraction, 0.05 = 5 points)
    /// to count, so that a fleet at 100 % with σ ≈ 0 does not flag an engine at 99.9 %.
    /// Default 0.05.
    pub success_rate_min_gap: f64,
    /// Engines of a model with enough requests needed to compute success-rate statistics.
    /// Default 3.
    pub success_rate_min_engines: usize,
    /// Observed / predicted TTFT (offline profile and fitted curve; TBOT too, see above) at
    /// which an engine is a latency outlier, > 1. Default 2.
    pub latency_ratio: f64,
    /// Largest share of a model's nominal capacity whose engines may be penalised at once,
    /// in [0, 1]. Default 0.15.
    pub max_penalised_share: f64,
    /// While none of a model's engines is penalised, one may be even if its capacity alone is
    /// over `max_penalised_share` (as Envoy's `always_eject_one_host`; gRPC always allows one);
    /// so may one that outweighs all the penalised engines together while they hold less than
    /// the cap (small engines penalised do not shelter a large grey one).
    /// Without it a model of fewer than seven equal engines could never penalise a grey one
    /// at the default share. In models of fewer than `success_rate_min_engines` engines, too
    /// few for a median to tell a fleet-wide slowdown, only an engine slow alone may: its peers
    /// run within 1.5× their profiles, and it runs below 90 % of its capacity. Default true.
    pub always_penalise_one: bool,
    /// Largest penalty, in (0, 1): the share of an engine's capacity that may be withheld.
    /// Default 0.98: an engine that ran at a fifth of its capacity or more then keeps at most
    /// a tenth of its traffic, yet still gets a trickle that shows when it has recovered.
    pub max_penalty: f64,
    /// A recovering penalty below this is removed, in (0, 1). Default 0.05.
    pub min_penalty: f64,
}

impl Default for OutlierSettings {
    fn default() -> Self {
        OutlierSettings {
            enabled: true,
            interval_ms: 10_000,
            min_requests: 20,
            probe_requests: 5,
            max_window_intervals: 6,
            success_rate_stdev_factor: 1.9,
            success_rate_min_gap: 0.05,
            success_rate_min_engines: 3,
            latency_ratio: 2.0,
            max_penalised_share: 0.15,
            always_penalise_one: true,
            max_penalty: 0.98,
            min_penalty: 0.05,
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ObjectiveSetting {
    /// Time to first token only.
    Ttft,
    /// TTFT plus expected output tokens × time between tokens.
    TtftPlusDecode,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    pub id: String,
    /// Latitude and longitude in degrees.
    pub lat: f64,
    pub lon: f64,
}

/// `[network]`: how network latency between a cluster's region and an engine's region is known.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkSettings {
    /// Added to every distance-derived latency, ms (switching, the last mile). Default 2.
    pub base_ms: f64,
    /// Round-trip ms per 1,000 km of great-circle distance. Default 10 (light in fibre, both ways).
    pub ms_per_1000_km: f64,
    /// Latency within one region, ms. Default 1.
    pub same_region_ms: f64,
    /// Explicit region-to-region latencies that override the distance model.
    pub latency: Vec<LinkLatency>,
    /// Prefer latencies measured by data planes over configured ones once reported. Default true.
    pub use_measured: bool,
}

impl Default for NetworkSettings {
    fn default() -> Self {
        NetworkSettings {
            base_ms: 2.0,
            ms_per_1000_km: 10.0,
            same_region_ms: 1.0,
            latency: Vec::new(),
            use_measured: true,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LinkLatency {
    pub from: String,
    pub to: String,
    pub ms: f64,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    pub id: String,
    pub region: String,
}

/// A constrained traffic class: requests asking for these capabilities / this residency zone
/// may only go to engines offering them.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClassRule {
    pub id: String,
    #[serde(default)]
    pub require: Vec<String>,
    #[serde(default)]
    pub residency: Option<String>,
}

/// A hardware profile: per-replica capacity and the offline latency curve
/// L(y) = t0 + b·y/(c − y) of TTFT (and TBOT for the decode objective). `ilb profile
/// --engine URL` measures one against a live engine (docs/engines.md); the control plane
/// refines the curves online and lowers an engine's capacity while its queue keeps growing.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Sustainable requests/s of one replica.
    pub capacity_rps: f64,
    /// TTFT at zero load, ms.
    pub ttft_t0_ms: f64,
    /// TTFT queueing coefficient b, ms.
    pub ttft_b_ms: f64,
    /// Time between output tokens at zero load, ms. Default 15.
    #[serde(default = "default_tbot_t0")]
    pub tbot_t0_ms: f64,
    /// TBOT queueing coefficient, ms. Default 2.
    #[serde(default = "default_tbot_b")]
    pub tbot_b_ms: f64,
}

fn default_tbot_t0() -> f64 {
    15.0
}
fn default_tbot_b() -> f64 {
    2.0
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Engine {
    pub id: String,
    /// Base URL, `http://host:port` or `https://host:port` (scraped with the trust settings of
    /// `[control_plane.engine_tls]`).
    pub url: String,
    pub model: String,
    pub region: String,
    /// Name of a `[profiles.NAME]` table.
    pub profile: String,
    /// Replicas behind the URL. Default 1.
    #[serde(default = "one")]
    pub replicas: u32,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub residency: Vec<String>,
    /// Overrides the profile's per-replica capacity, req/s.
    #[serde(default)]
    pub capacity_rps: Option<f64>,
    /// Most requests one data plane may have in flight to this engine (local overload
    /// protection; beyond it requests wait briefly, then are shed). Default: no limit.
    #[serde(default)]
    pub max_in_flight: Option<u32>,
}

fn one() -> u32 {
    1
}

/// `[[engine_groups]]`: a group of engines declared by a DNS name (a Kubernetes headless
/// Service, a Consul service, any DNS name with one record per engine). The name is resolved
/// every `resolve_interval_ms`; every address becomes an engine with id `GROUP-ADDRESS-PORT`
/// (`:` and `.` as `-`) and the fields below. An address that appears is added to the next
/// plan; one missing from two resolutions in a row is removed.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EngineGroup {
    /// Names the group; engine ids start with it.
    pub id: String,
    /// The name to resolve, e.g. `"vllm.inference.svc.cluster.local"` (A and AAAA records), or
    /// with `srv = true` an SRV name such as `"_http._tcp.vllm.inference.svc.cluster.local"`.
    pub dns: String,
    /// Port of every address found by A/AAAA records. Required unless `srv = true`.
    #[serde(default)]
    pub port: Option<u16>,
    /// Resolve `dns` as SRV records: each target's A/AAAA addresses with the record's port.
    #[serde(default)]
    pub srv: bool,
    /// How often the name is resolved, ms. Default 5000.
    #[serde(default = "default_resolve_interval_ms")]
    pub resolve_interval_ms: u64,
    /// DNS servers to ask (UDP and TCP), `"ip:port"`. Default: the system's (`/etc/resolv.conf`).
    #[serde(default)]
    pub nameservers: Vec<String>,
    /// The fields every engine of the group shares, as in `[[engines]]`.
    pub model: String,
    pub region: String,
    pub profile: String,
    #[serde(default = "one")]
    pub replicas: u32,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub residency: Vec<String>,
    #[serde(default)]
    pub capacity_rps: Option<f64>,
    #[serde(default)]
    pub max_in_flight: Option<u32>,
}

fn default_resolve_interval_ms() -> u64 {
    5000
}

impl EngineGroup {
    /// The engine at one resolved address.
    pub fn engine(&self, addr: std::net::SocketAddr) -> Engine {
        let host = addr.ip().to_string().replace([':', '.'], "-");
        Engine {
            id: format!("{}-{host}-{}", self.id, addr.port()),
            url: format!("http://{addr}"),
            model: self.model.clone(),
            region: self.region.clone(),
            profile: self.profile.clone(),
            replicas: self.replicas,
            capabilities: self.capabilities.clone(),
            residency: self.residency.clone(),
            capacity_rps: self.capacity_rps,
            max_in_flight: self.max_in_flight,
        }
    }
}

/// A config that failed validation; the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl From<bounds::OutOfBounds> for ConfigError {
    fn from(e: bounds::OutOfBounds) -> ConfigError {
        ConfigError(e.to_string())
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

impl OutlierSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        let field = "control_plane.outliers";
        for (name, v) in [
            ("interval_ms", self.interval_ms),
            ("min_requests", self.min_requests),
            ("probe_requests", self.probe_requests),
            ("max_window_intervals", u64::from(self.max_window_intervals)),
            ("success_rate_min_engines", self.success_rate_min_engines as u64),
        ] {
            bounds::check_count(&format!("{field}.{name}"), v, &(1..=u64::from(u32::MAX)))?;
        }
        if !(self.success_rate_stdev_factor.is_finite() && self.success_rate_stdev_factor >= 0.0) {
            return err(format!("{field}.success_rate_stdev_factor: must be a non-negative number"));
        }
        if !(0.0..=1.0).contains(&self.success_rate_min_gap) {
            return err(format!(
                "{field}.success_rate_min_gap: {} is not in [0, 1]",
                self.success_rate_min_gap
            ));
        }
        if !(self.latency_ratio.is_finite() && self.latency_ratio > 1.0) {
            return err(format!("{field}.latency_ratio: {} must be a number > 1", self.latency_ratio));
        }
        if !(0.0..=1.0).contains(&self.max_penalised_share) {
            return err(format!(
                "{field}.max_penalised_share: {} is not in [0, 1]",
                self.max_penalised_share
            ));
        }
        if !(self.max_penalty > 0.0 && self.max_penalty < 1.0) {
            return err(format!("{field}.max_penalty: {} is not in (0, 1)", self.max_penalty));
        }
        if !(self.min_penalty > 0.0 && self.min_penalty < self.max_penalty) {
            return err(format!("{field}.min_penalty: {} is not in (0, max_penalty)", self.min_penalty));
        }
        Ok(())
    }
}

impl ControlPlaneSettings {
    /// Checks the `[control_plane]` table's ranges.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return err(format!("control_plane.listen: '{}' is not host:port", self.listen));
        }
        for (name, v) in [
            ("scrape_interval_ms", self.scrape_interval_ms),
            ("solve_interval_ms", self.solve_interval_ms),
            ("signal_stale_ms", self.signal_stale_ms),
            ("report_timeout_ms", self.report_timeout_ms),
            ("smoothing_ms", self.smoothing_ms),
        ] {
            bounds::check_count(&format!("control_plane.{name}"), v, &bounds::PERIOD_MS)?;
        }
        if !(self.rho > 0.0 && self.rho <= 1.0) {
            return err(format!("control_plane.rho: {} is not in (0, 1]", self.rho));
        }
        bounds::LATENCY_MS.check("control_plane.stability_ms", self.stability_ms)?;
        if !(0.0..=0.1).contains(&self.stability_tolerance) {
            return err("control_plane.stability_tolerance: must be in [0, 0.1]");
        }
        if !(0.0..=10.0).contains(&self.demand_band_sigmas) {
            return err("control_plane.demand_band_sigmas: must be in [0, 10]");
        }
        bounds::TOKENS.check("control_plane.expected_output_tokens", self.expected_output_tokens)?;
        if !(0.0..=100.0).contains(&self.tail_weight) {
            return err("control_plane.tail_weight: must be in [0, 100]");
        }
        bounds::Bound { min_exclusive: true, ..bounds::RATE_RPS }
            .check("control_plane.demand_floor_rps", self.demand_floor_rps)?;
        if !(self.shed_price_floor.is_finite() && (0.0..=1000.0).contains(&self.shed_price_floor)) {
            return err("control_plane.shed_price_floor: must be in [0, 1000]");
        }
        for priority in ["low", "normal", "high", "critical"] {
            match self.shed_penalty_ms.get(priority) {
                Some(p) if bounds::POSITIVE_LATENCY_MS.contains(*p) => {}
                _ => {
                    return err(format!(
                        "control_plane.shed_penalty_ms.{priority}: must be a positive number"
                    ))
                }
            }
        }
        if let Some(extra) =
            self.shed_penalty_ms.keys().find(|k| !["low", "normal", "high", "critical"].contains(&k.as_str()))
        {
            return err(format!(
                "control_plane.shed_penalty_ms.{extra}: unknown priority (low, normal, high, critical)"
            ));
        }
        self.outliers.validate()?;
        Ok(())
    }
}

impl FleetConfig {
    /// Checks ranges and cross-references.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.control_plane.validate()?;
        let regions = self.validate_network()?;
        self.validate_clusters_and_classes(&regions)?;
        self.validate_profiles()?;
        self.validate_engines()
    }

    /// Regions and network latencies; returns the region ids.
    fn validate_network(&self) -> Result<HashSet<&str>, ConfigError> {
        let mut regions = HashSet::new();
        for r in &self.regions {
            if !regions.insert(r.id.as_str()) {
                return err(format!("regions: duplicate id '{}'", r.id));
            }
            if !(-90.0..=90.0).contains(&r.lat) || !(-180.0..=180.0).contains(&r.lon) {
                return err(format!("regions.{}: lat/lon out of range", r.id));
            }
        }
        let n = &self.network;
        for (name, v) in [
            ("base_ms", n.base_ms),
            ("ms_per_1000_km", n.ms_per_1000_km),
            ("same_region_ms", n.same_region_ms),
        ] {
            bounds::LATENCY_MS.check(&format!("network.{name}"), v)?;
        }
        let known_region = |id: &str| regions.is_empty() || regions.contains(id);
        for link in &n.latency {
            bounds::LATENCY_MS.check(&format!("network.latency {}→{}: ms", link.from, link.to), link.ms)?;
            for r in [&link.from, &link.to] {
                if !known_region(r) {
                    return err(format!("network.latency: unknown region '{r}'"));
                }
            }
        }
        Ok(regions)
    }

    /// Front-end clusters (in known regions) and class rules.
    fn validate_clusters_and_classes(&self, regions: &HashSet<&str>) -> Result<(), ConfigError> {
        let known_region = |id: &str| regions.is_empty() || regions.contains(id);
        if self.clusters.is_empty() {
            return err("clusters: at least one front-end cluster is needed");
        }
        let mut clusters = HashSet::new();
        for c in &self.clusters {
            ilb_core::snapshot::check_name("clusters.id", &c.id).map_err(|e| ConfigError(e.to_string()))?;
            if !clusters.insert(c.id.as_str()) {
                return err(format!("clusters: duplicate id '{}'", c.id));
            }
            if !known_region(&c.region) {
                return err(format!("clusters.{}.region: unknown region '{}'", c.id, c.region));
            }
        }
        let mut classes = HashSet::from(["default"]);
        for rule in &self.classes {
            if !classes.insert(rule.id.as_str()) {
                return err(format!("classes: duplicate or reserved id '{}'", rule.id));
            }
            if rule.require.is_empty() && rule.residency.is_none() {
                return err(format!("classes.{}: needs `require` or `residency`", rule.id));
            }
        }
        Ok(())
    }

    /// Engine profiles, and the measured curves of known ones.
    fn validate_profiles(&self) -> Result<(), ConfigError> {
        for (name, p) in &self.profiles {
            bounds::CAPACITY_RPS.check(&format!("profiles.{name}.capacity_rps"), p.capacity_rps)?;
            for (field, v) in [
                ("ttft_t0_ms", p.ttft_t0_ms),
                ("ttft_b_ms", p.ttft_b_ms),
                ("tbot_t0_ms", p.tbot_t0_ms),
                ("tbot_b_ms", p.tbot_b_ms),
            ] {
                bounds::LATENCY_MS.check(&format!("profiles.{name}.{field}"), v)?;
            }
        }
        for (name, curves) in &self.control_plane.measured_curves {
            let field = format!("control_plane.measured_curves.{name}");
            if !self.profiles.contains_key(name) {
                return err(format!("{field}: unknown profile '{name}'"));
            }
            curves.validate(&field)?;
        }
        Ok(())
    }

    /// Engines and engine groups (each group's engines as a sample of them).
    fn validate_engines(&self) -> Result<(), ConfigError> {
        let mut engines = HashSet::new();
        for e in &self.engines {
            if !engines.insert(e.id.as_str()) {
                return err(format!("engines: duplicate id '{}'", e.id));
            }
            self.validate_engine(e, &format!("engines.{}", e.id))?;
        }
        let mut groups = HashSet::new();
        for g in &self.engine_groups {
            let field = format!("engine_groups.{}", g.id);
            if !groups.insert(g.id.as_str()) {
                return err(format!("engine_groups: duplicate id '{}'", g.id));
            }
            if g.dns.is_empty() || g.dns.len() > 253 || !g.dns.bytes().all(|b| b.is_ascii_graphic()) {
                return err(format!("{field}.dns: '{}' is not a DNS name", g.dns));
            }
            if !g.srv && g.port.is_none() {
                return err(format!("{field}.port: needed unless srv = true"));
            }
            bounds::check_count(
                &format!("{field}.resolve_interval_ms"),
                g.resolve_interval_ms,
                &bounds::PERIOD_MS,
            )?;
            for ns in &g.nameservers {
                if ns.parse::<std::net::SocketAddr>().is_err() {
                    return err(format!("{field}.nameservers: '{ns}' is not ip:port"));
                }
            }
            let sample = g.engine(std::net::SocketAddr::from(([127, 0, 0, 1], g.port.unwrap_or(80))));
            self.validate_engine(&sample, &field)?;
        }
        Ok(())
    }

    /// Checks one engine against this fleet (its URL, and that its region and profile exist);
    /// `field` names it in errors (`engines.ID`, `registration`).
    pub fn validate_engine(&self, e: &Engine, field: &str) -> Result<(), ConfigError> {
        ilb_core::snapshot::check_name(&format!("{field}.id"), &e.id)
            .map_err(|x| ConfigError(x.to_string()))?;
        if let Err(why) = ilb_core::snapshot::check_engine_url(&e.url) {
            return err(format!("{field}.url: '{}' {why}", ilb_core::redact::url(&e.url)));
        }
        if !self.regions.is_empty() && !self.regions.iter().any(|r| r.id == e.region) {
            return err(format!("{field}.region: unknown region '{}'", e.region));
        }
        if !self.profiles.contains_key(&e.profile) {
            return err(format!("{field}.profile: unknown profile '{}'", e.profile));
        }
        if e.model.is_empty() {
            return err(format!("{field}.model: must not be empty"));
        }
        // Zero replicas is allowed in the file: the engine is held (scaled to zero).
        bounds::check_count(
            &format!("{field}.replicas"),
            u64::from(e.replicas),
            &(0..=*bounds::REPLICAS.end()),
        )?;
        bounds::CAPACITY_RPS.check_opt(&format!("{field}.capacity_rps"), e.capacity_rps)?;
        if let Some(n) = e.max_in_flight {
            bounds::check_count(&format!("{field}.max_in_flight"), u64::from(n), &bounds::MAX_IN_FLIGHT)?;
        }
        Ok(())
    }

    pub fn objective(&self) -> Objective {
        match self.control_plane.objective {
            ObjectiveSetting::Ttft => Objective::Ttft,
            ObjectiveSetting::TtftPlusDecode => Objective::TtftPlusDecode {
                expected_output_tokens: self.control_plane.expected_output_tokens,
            },
        }
    }

    /// Configured network latency between two regions, ms.
    pub fn region_latency_ms(&self, from: &str, to: &str) -> f64 {
        let n = &self.network;
        if let Some(link) =
            n.latency.iter().find(|l| (l.from == from && l.to == to) || (l.from == to && l.to == from))
        {
            return link.ms;
        }
        if from == to {
            return n.same_region_ms;
        }
        let coords = |id: &str| self.regions.iter().find(|r| r.id == id).map(|r| (r.lat, r.lon));
        match (coords(from), coords(to)) {
            (Some(a), Some(b)) => n.base_ms + great_circle_km(a, b) / 1000.0 * n.ms_per_1000_km,
            // Without coordinates, regions are only "same" or "elsewhere".
            _ => n.base_ms + 50.0,
        }
    }
}

/// Great-circle distance in km between two (lat, lon) points in degrees (haversine).
pub fn great_circle_km(a: (f64, f64), b: (f64, f64)) -> f64 {
    let (lat1, lon1, lat2, lon2) = (a.0.to_radians(), a.1.to_radians(), b.0.to_radians(), b.1.to_radians());
    let h =
        ((lat2 - lat1) / 2.0).sin().powi(2) + lat1.cos() * lat2.cos() * ((lon2 - lon1) / 2.0).sin().powi(2);
    2.0 * 6371.0 * h.sqrt().asin()
}

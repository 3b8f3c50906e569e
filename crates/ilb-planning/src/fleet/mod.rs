//! The control plane's picture of the fleet: per-engine signals (scraped), per-cluster demand
//! and network round trips (reported by data planes), and what follows from them — health,
//! effective capacity and the latency curve of each engine, network latency of each
//! (cluster, engine) pair, and demand of each traffic class.
//!
//! Pure state: every update takes `now` (time since the control plane started), so the fleet
//! simulator can drive it in virtual time. Only the control loop owns a `Fleet`.
//!
//! `outliers` judges engines against their model's fleet and their offline profiles and sets
//! their penalties ([`Fleet::update_penalties`]).

mod changes;
mod history;
pub mod members;
mod outliers;
mod output;
mod saturation;

pub use changes::FleetDiff;
pub use outliers::{OutlierWindow, RecentWindows};

use crate::config::FleetConfig;
use crate::profile::{
    combine, combine_with_tail, fit_level, fit_queueing, fit_shape, mixture_quantile, DecodeLengths,
    LatencyProfile, Objective, Observation, QueueingPrior, Tail,
};
use crate::signals::{window, EngineFlavor, EngineSample, WindowStats};
use crate::smoothing::Ewma;
use history::LoadHistory;
use ilb_core::holds::HoldReason;
use ilb_core::priority::Priority;
use ilb_core::report::Report;
use ilb_core::ModelName;
use output::OutputLengths;
use saturation::Saturation;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Time since the control plane started (the caller's epoch: the shell's start, a
/// simulator's time zero).
pub type Now = Duration;

/// How the text of a scrape error begins when the connect failed (refused, unreachable, or
/// the TLS handshake failed): [`Fleet::on_scrape`] holds such an engine after one failure
/// instead of two. The shell's scraper writes its connect errors with this prefix.
pub const CONNECT_FAILED: &str = "connect failed";

/// How much the offline profile counts against observations (in requests).
const PRIOR_WEIGHT: f64 = 200.0;

/// How much the twins' common curve counts against one engine's own observations (in
/// requests): more than the ten minutes of history hold of even a large engine's traffic, so
/// an engine's own level counts for at most about a third.
const TWIN_PRIOR_WEIGHT: f64 = 20_000.0;

/// A latency signal with its own offline profile.
#[derive(Clone, Copy)]
enum Signal {
    Ttft,
    Tbot,
}

/// Identifies a traffic class: front-end cluster × model × constraint class.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClassKey {
    pub cluster: String,
    pub model: String,
    pub class: String,
}

/// What the control plane knows about one engine.
#[derive(Debug)]
pub struct EngineRuntime {
    pub last_scrape_ok: Option<Now>,
    pub last_scrape_error: Option<String>,
    pub consecutive_scrape_failures: u32,
    previous: Option<(Now, EngineSample)>,
    pub last_window: Option<WindowStats>,
    pub running: f64,
    pub waiting: f64,
    pub kv_usage: f64,
    pub ttft_ms: Ewma<Now>,
    pub tbot_ms: Ewma<Now>,
    pub request_rate: Ewma<Now>,
    pub cache_hit_rate: Ewma<Now>,
    pub error_rate: Ewma<Now>,
    /// Which engine software the last successful scrape came from; `None`: never scraped, or
    /// no metric ilb knows.
    pub kind: Option<EngineFlavor>,
    /// The engine said it is asleep (vLLM `engine_sleep_state`): it gets no traffic.
    pub asleep: bool,
    /// Replicas taking requests over replicas behind the endpoint, when the engine says.
    pub ready_fraction: Option<f64>,
    /// Whether the last scrape carried the engine's own TTFT / TBOT histograms. Without them
    /// (llama.cpp, TGI's TTFT), `ttft_ms` / `tbot_ms`, the fits and the request rate follow
    /// the data planes' reports instead.
    pub ttft_from_engine: bool,
    pub tbot_from_engine: bool,
    /// Whether the engine counts finished requests; if not, `request_rate` is the data
    /// planes' reported rate.
    pub requests_from_engine: bool,
    /// Time queued before scheduling (vLLM, SGLang, TGI), ms.
    pub queue_ms: Ewma<Now>,
    /// Preemptions (vLLM) or retractions (SGLang) per second: the engine runs past its knee.
    pub preemption_rate: Ewma<Now>,
    /// llama.cpp's own decode time per token, ms.
    pub decode_ms_per_token: Ewma<Now>,
    /// Its answers' lengths, for the objective's decode and tail terms ([`Fleet::output_tokens`],
    /// [`Fleet::decode_lengths`]).
    output: OutputLengths,
    /// Capacity learned from the windows in which the engine's queue grew ([`Saturation`]).
    saturation: Saturation,
    /// Whether the last scrape failure was a refused or failed connect.
    pub last_failure_connect: bool,
    /// Operating points for the latency-profile fits. Nothing is added while the engine is
    /// penalised (see [`outliers`] for why).
    observations: LoadHistory,
    /// Share of capacity withheld because the engine behaves as an outlier, in [0, 1).
    pub penalty: f64,
    /// Why the engine is penalised, for people: "ttft 3.1× its profile at 42 req/s".
    pub penalty_reason: Option<String>,
    /// The engine qualified as an outlier in the last evaluation but the share of its
    /// model's capacity that may be penalised at once was used up; why it qualified.
    pub outlier_waiting: Option<String>,
    /// What the engine did since it was last judged.
    pub outlier_window: OutlierWindow,
    /// Its latest half interval, also judged between intervals.
    pub recent: RecentWindows,
    /// When the engine joined a running fleet (None: it was there from the start); until its
    /// first scrape it counts as up for the staleness bound from then.
    pub added: Option<Now>,
}

impl EngineRuntime {
    fn new(tau: Duration) -> EngineRuntime {
        EngineRuntime {
            last_scrape_ok: None,
            last_scrape_error: None,
            consecutive_scrape_failures: 0,
            previous: None,
            last_window: None,
            running: 0.0,
            waiting: 0.0,
            kv_usage: 0.0,
            ttft_ms: Ewma::new(tau),
            tbot_ms: Ewma::new(tau),
            request_rate: Ewma::new(tau),
            cache_hit_rate: Ewma::new(tau),
            error_rate: Ewma::new(tau),
            kind: None,
            asleep: false,
            ready_fraction: None,
            ttft_from_engine: false,
            tbot_from_engine: false,
            requests_from_engine: false,
            queue_ms: Ewma::new(tau),
            preemption_rate: Ewma::new(tau),
            decode_ms_per_token: Ewma::new(tau),
            output: OutputLengths::new(),
            saturation: Saturation::default(),
            last_failure_connect: false,
            observations: LoadHistory::default(),
            penalty: 0.0,
            penalty_reason: None,
            outlier_waiting: None,
            outlier_window: OutlierWindow::default(),
            recent: RecentWindows::default(),
            added: None,
        }
    }
}

/// Adds one reported class demand to `out` (per priority, req/s): a rate that is not finite
/// and positive counts as zero, an instance that does not split its rate by priority counts as
/// `normal`, and a split that does not add up to the rate is scaled to it.
fn add_demand(out: &mut [f64; 4], d: &ilb_core::report::ClassDemand) {
    let valid = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
    let mut normal = [0.0; 4];
    normal[Priority::Normal.index()] = 1.0;
    let rps = valid(d.rps);
    let split = d.by_priority.map_or(normal, |p| p.to_array().map(valid));
    let total: f64 = split.iter().sum();
    let (split, total) = if total > 0.0 { (split, total) } else { (normal, 1.0) };
    for (o, s) in out.iter_mut().zip(split) {
        *o += rps * s / total;
    }
}

/// One engine's latency curves as functions of its load, ms (network excluded).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineCurves {
    /// What the optimizer minimises: [`EngineCurves::mean`] plus the tail term, if any.
    pub objective: LatencyProfile,
    /// The expected latency the objective counts: TTFT, or TTFT plus decode.
    pub mean: LatencyProfile,
    /// How long a request stays on the engine: TTFT plus (output tokens − 1) × TBOT, whatever
    /// the objective.
    pub in_flight: LatencyProfile,
}

/// Everything [`plan::build`](crate::plan::build) needs from the fleet, taken at one instant
/// ([`Fleet::planning_inputs`]): the configuration, and what the signals say of every engine,
/// (cluster, engine) pair and traffic class. Fleet engines are indexed as in
/// `config.engines`.
#[derive(Clone, Debug)]
pub struct PlanningInputs<'a> {
    pub config: &'a FleetConfig,
    /// Per engine: its effective capacity, req/s ([`Fleet::effective_capacity`]).
    pub capacity_rps: Vec<f64>,
    /// Per engine: its curves as functions of its load ([`Fleet::engine_curves`]).
    pub curves: Vec<EngineCurves>,
    /// Per cluster id: the network latency to each engine, ms, measured if reported (and
    /// allowed by the config), else configured ([`Fleet::network_ms`]).
    pub network_ms: BTreeMap<String, Vec<f64>>,
    /// Demand per priority (low, normal, high, critical), req/s, of every class the live
    /// data-plane instances report ([`Fleet::demand_by_priority`]).
    pub demand: BTreeMap<ClassKey, [f64; 4]>,
}

impl PlanningInputs<'_> {
    /// Class `key`'s demand per priority, req/s; zero for a class nobody reports.
    pub fn demand_by_priority(&self, key: &ClassKey) -> [f64; 4] {
        self.demand.get(key).copied().unwrap_or_default()
    }

    /// Network latency from `cluster` to engine `idx`, ms; infinite for a cluster or engine
    /// the fleet does not have.
    pub fn network_ms(&self, cluster: &str, idx: usize) -> f64 {
        self.network_ms.get(cluster).and_then(|row| row.get(idx)).copied().unwrap_or(f64::INFINITY)
    }
}

/// The latest report of one data-plane instance.
#[derive(Debug)]
struct InstanceState {
    received: Now,
    report: Report,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("report from unknown cluster '{0}'")]
    UnknownCluster(String),
    #[error("report sequence {got} is not newer than {have} for instance '{instance}'")]
    OutOfOrder { instance: String, got: u64, have: u64 },
}

pub struct Fleet {
    pub config: FleetConfig,
    pub engines: Vec<EngineRuntime>,
    instances: BTreeMap<(String, String), InstanceState>,
    /// Smoothed measured round trip per (cluster, engine id), ms.
    rtt: BTreeMap<(String, String), Ewma<Now>>,
    /// Engine id → index into `engines`.
    engine_index: HashMap<String, usize>,
    /// When outliers were last evaluated.
    last_outlier_evaluation: Option<Now>,
    /// Per model: the ids of its engines that were up at the last outlier evaluation, and when
    /// that set last changed (None: not since it was first seen).
    engines_up: HashMap<String, (Vec<String>, Option<Now>)>,
}

impl Fleet {
    /// `config` must have passed [`FleetConfig::validate`].
    pub fn new(config: FleetConfig) -> Fleet {
        let tau = Duration::from_millis(config.control_plane.smoothing_ms);
        let engines = config.engines.iter().map(|_| EngineRuntime::new(tau)).collect();
        let engine_index = config.engines.iter().enumerate().map(|(idx, e)| (e.id.clone(), idx)).collect();
        Fleet {
            config,
            engines,
            instances: BTreeMap::new(),
            rtt: BTreeMap::new(),
            engine_index,
            last_outlier_evaluation: None,
            engines_up: HashMap::new(),
        }
    }

    fn tau(&self) -> Duration {
        Duration::from_millis(self.config.control_plane.smoothing_ms)
    }

    /// A scrape of engine `idx` finished: its samples for the engine's model, or why it failed.
    pub fn on_scrape(
        &mut self,
        idx: usize,
        now: Now,
        result: Result<Vec<(ModelName, EngineSample)>, String>,
    ) {
        let model = self.config.engines[idx].model.clone();
        let nominal_rps = self.nominal_capacity(idx);
        let early_span_s =
            outliers::EARLY_WINDOW_SHARE * self.config.control_plane.outliers.interval_ms as f64 / 1000.0;
        let e = &mut self.engines[idx];
        let samples = match result {
            Ok(samples) => samples,
            Err(error) => {
                e.consecutive_scrape_failures += 1;
                e.last_failure_connect = error.starts_with(CONNECT_FAILED);
                e.last_scrape_error = Some(error);
                return;
            }
        };
        e.last_scrape_ok = Some(now);
        // The first scrape after failed ones spans the outage: what waited through it is in
        // its window, so that outlier window is not judged (see `fleet::outliers`).
        let resumed = e.consecutive_scrape_failures > 0;
        e.consecutive_scrape_failures = 0;
        e.last_scrape_error = None;
        e.last_failure_connect = false;
        // An engine exposing several models is scraped once; take the configured one, else the first.
        let Some((_, sample)) =
            samples.iter().find(|(m, _)| m.as_str() == model).or(samples.first()).cloned()
        else {
            e.kind = None;
            return;
        };
        e.kind = Some(sample.flavor);
        e.asleep = sample.asleep == Some(true);
        e.ready_fraction = match (sample.ready_replicas, sample.replicas) {
            (Some(ready), Some(all)) if all > 0.0 => Some((ready / all).clamp(0.0, 1.0)),
            (Some(ready), _) => Some(if ready > 0.0 { 1.0 } else { 0.0 }),
            _ => None,
        };
        e.ttft_from_engine = sample.ttft.is_some();
        e.tbot_from_engine = sample.tbot.is_some();
        e.requests_from_engine = sample.requests_finished.is_some() || sample.e2e.is_some();
        e.running = sample.running.unwrap_or(0.0);
        e.waiting = sample.waiting.unwrap_or(0.0);
        e.kv_usage = sample.kv_usage.unwrap_or(0.0);
        if let Some((then, previous)) = e.previous.take() {
            if let Some(w) = window(&previous, &sample, now.saturating_sub(then)) {
                if w.counter_reset {
                    // A new process: what was learned of the old one (a capacity cut while its
                    // queue ran away, its latencies) does not describe it. It starts from its
                    // nominal capacity and its twins' curves, and learns afresh.
                    tracing::info!(engine = %self.config.engines[idx].id, "engine restarted (its counters went down): its learned capacity and latencies start afresh");
                    e.saturation = Saturation::default();
                    e.observations = LoadHistory::default();
                }
                e.outlier_window.add_scrape(&w);
                e.outlier_window.disturbed |= resumed;
                e.recent.add_scrape(&w, resumed, early_span_s);
                let waiting = (previous.waiting.unwrap_or(0.0), sample.waiting.unwrap_or(0.0));
                e.saturation.on_window(now, waiting, w.request_rate, nominal_rps);
                if let Some(rate) = w.request_rate {
                    e.request_rate.update(now, rate);
                }
                if let Some(ttft) = w.ttft {
                    e.ttft_ms.update(now, ttft.mean_ms);
                }
                if let Some(tbot) = w.tbot {
                    e.tbot_ms.update(now, tbot.mean_ms);
                }
                // The load is the smoothed rate, not the window's own count: one window's count is
                // a noisy reading of the load the engine's queue responds to, and pairing it with
                // the latency biases the fit wherever the curve is steep (errors in variables).
                let rate = e.request_rate.value().filter(|_| w.request_rate.is_some());
                let population = |s: &EngineSample| s.running.unwrap_or(0.0) + s.waiting.unwrap_or(0.0);
                let population = (population(&previous), population(&sample));
                if let (Some(rate), Some(ttft), true) = (rate, w.ttft, e.penalty == 0.0) {
                    // Both latencies count per request (TBOT's own count is in tokens).
                    let at =
                        |mean_ms| Observation { load_rps: rate, latency_ms: mean_ms, weight: ttft.count };
                    e.observations.record(now, at(ttft.mean_ms), w.tbot.map(|t| at(t.mean_ms)), population);
                }
                if let Some(hit) = w.prefix_cache_hit_rate {
                    e.cache_hit_rate.update(now, hit);
                }
                if let Some(err) = w.error_rate {
                    e.error_rate.update(now, err);
                }
                if let Some(queue) = w.queue {
                    e.queue_ms.update(now, queue.mean_ms);
                }
                if let Some(rate) = w.preemption_rate {
                    e.preemption_rate.update(now, rate);
                }
                if let Some(ms) = w.decode_ms_per_token {
                    e.decode_ms_per_token.update(now, ms);
                }
                // Engines that count no requests (llama.cpp) finish them at the reported rate.
                e.output.add(now, &w, w.request_rate.or(e.request_rate.value()));
                e.last_window = Some(w);
            }
        }
        e.previous = Some((now, sample));
    }

    /// A data plane's report arrived.
    pub fn on_report(&mut self, now: Now, report: Report) -> Result<(), ReportError> {
        if !self.config.clusters.iter().any(|c| c.id == report.cluster.as_str()) {
            return Err(ReportError::UnknownCluster(report.cluster.to_string()));
        }
        let key = (report.cluster.to_string(), report.instance.clone());
        if let Some(existing) = self.instances.get(&key) {
            if report.sequence <= existing.report.sequence && report.sequence != 0 {
                return Err(ReportError::OutOfOrder {
                    instance: report.instance.clone(),
                    got: report.sequence,
                    have: existing.report.sequence,
                });
            }
        }
        let tau = self.tau();
        let period_s = report.period_ms as f64 / 1000.0;
        let engines: Vec<_> = report
            .engines
            .iter()
            .filter_map(|obs| self.engine_index.get(obs.engine.as_str()).map(|&idx| (idx, obs.clone())))
            .collect();
        for obs in &report.engines {
            if let Some(&idx) = self.engine_index.get(obs.engine.as_str()) {
                self.engines[idx].outlier_window.add_report(obs.requests, obs.errors);
                self.engines[idx].recent.add_report(obs.requests, obs.errors);
            }
            if let Some(rtt) = obs.rtt_ms.filter(|r| r.is_finite() && *r >= 0.0) {
                self.rtt
                    .entry((report.cluster.to_string(), obs.engine.to_string()))
                    .or_insert_with(|| Ewma::new(tau))
                    .update(now, rtt);
            }
        }
        self.instances.insert(key, InstanceState { received: now, report });
        for (idx, obs) in engines {
            self.on_reported_latency(idx, now, period_s, &obs);
        }
        Ok(())
    }

    /// What a data plane measured of engine `idx` stands in for what the engine does not
    /// expose: its request rate (llama.cpp counts no requests), its TTFT (llama.cpp, TGI) and
    /// its time between tokens (llama.cpp), and then feeds the latency fits.
    fn on_reported_latency(
        &mut self,
        idx: usize,
        now: Now,
        period_s: f64,
        obs: &ilb_core::report::EngineObservation,
    ) {
        if period_s <= 0.0 {
            return;
        }
        let id = self.config.engines[idx].id.clone();
        let reported_rps: f64 = self
            .instances
            .values()
            .filter(|i| {
                now.saturating_sub(i.received)
                    <= Duration::from_millis(self.config.control_plane.report_timeout_ms)
            })
            .filter(|i| i.report.period_ms > 0)
            .flat_map(|i| {
                let secs = i.report.period_ms as f64 / 1000.0;
                i.report
                    .engines
                    .iter()
                    .filter(|o| o.engine.as_str() == id)
                    .map(move |o| o.requests as f64 / secs)
            })
            .sum();
        let e = &mut self.engines[idx];
        if !e.requests_from_engine {
            e.request_rate.update(now, reported_rps);
        }
        let valid = |ms: Option<f64>| ms.filter(|v| v.is_finite() && *v >= 0.0);
        let ttft = valid(obs.first_chunk_ms).filter(|_| obs.streams > 0 && !e.ttft_from_engine);
        let tbot = valid(obs.chunk_gap_ms).filter(|_| obs.chunk_gaps > 0 && !e.tbot_from_engine);
        if let Some(ms) = ttft {
            e.ttft_ms.update(now, ms);
        }
        if let Some(ms) = tbot {
            e.tbot_ms.update(now, ms);
        }
        if let Some(counts) = &obs.output_tokens {
            e.output.add_reported(now, counts);
        }
        // Fits pair the smoothed load with the measured latency, as for scraped engines.
        if let (Some(rate), Some(ms), true) = (e.request_rate.value(), ttft, e.penalty == 0.0) {
            let weight = obs.streams as f64;
            let at = |latency_ms| Observation { load_rps: rate, latency_ms, weight };
            // The population as last scraped: a bucket over which it ran away is left out.
            let population = e.running + e.waiting;
            e.observations.record(now, at(ms), tbot.map(at), (population, population));
        }
    }

    /// Engines the data planes must not send new requests to now, and why: asleep, no ready
    /// replica, or unreachable (the last scrape's connect failed, or two scrapes in a row
    /// failed). Served beside the snapshots as the data planes' fast guard, so they stop
    /// within about a scrape period instead of waiting for the next plan. Unreachable engines
    /// are held only while at most half of the fleet is: more at once looks like the control
    /// plane's own network, not the engines.
    pub fn holds(&self) -> Vec<(String, HoldReason)> {
        let down = (0..self.engines.len())
            .filter(|&idx| self.hold_reason(idx) == Some(HoldReason::Unreachable))
            .count();
        let hold_unreachable = down * 2 <= self.engines.len();
        (0..self.engines.len())
            .filter_map(|idx| {
                let reason = self.hold_reason(idx)?;
                (reason != HoldReason::Unreachable || hold_unreachable)
                    .then(|| (self.config.engines[idx].id.clone(), reason))
            })
            .collect()
    }

    /// Why engine `idx` alone should be held, before the fleet-wide cap on unreachable ones
    /// ([`Fleet::holds`]). Cheap: the control loop compares it around each scrape and
    /// recomputes the holds only when it changed.
    pub fn hold_reason(&self, idx: usize) -> Option<HoldReason> {
        let (e, cfg) = (&self.engines[idx], &self.config.engines[idx]);
        if e.asleep {
            Some(HoldReason::Asleep)
        } else if cfg.replicas == 0 || e.ready_fraction == Some(0.0) {
            Some(HoldReason::NoReadyReplicas)
        } else if e.consecutive_scrape_failures >= 2
            || (e.consecutive_scrape_failures >= 1 && e.last_failure_connect)
        {
            Some(HoldReason::Unreachable)
        } else {
            None
        }
    }

    /// Forgets data-plane instances that stopped reporting.
    pub fn expire(&mut self, now: Now) {
        let timeout = Duration::from_millis(self.config.control_plane.report_timeout_ms);
        self.instances.retain(|_, i| now.saturating_sub(i.received) <= timeout);
    }

    /// Live data-plane instances: (cluster, instance, age).
    pub fn instances(&self, now: Now) -> Vec<(String, String, Duration)> {
        self.instances
            .iter()
            .map(|((c, i), s)| (c.clone(), i.clone(), now.saturating_sub(s.received)))
            .collect()
    }

    /// Demand of a class: the sum over live instances of their smoothed rates, req/s.
    pub fn demand_rps(&self, key: &ClassKey) -> f64 {
        self.demand_by_priority(key).iter().sum()
    }

    /// Demand of a class per priority (low, normal, high, critical), req/s: the sum over live
    /// instances. An instance that does not split its rate by priority counts as `normal`; a
    /// split that does not add up to the class's rate is scaled to it.
    pub fn demand_by_priority(&self, key: &ClassKey) -> [f64; 4] {
        let mut out = [0.0; 4];
        let reports = self
            .instances
            .iter()
            .filter(|((cluster, _), _)| *cluster == key.cluster)
            .flat_map(|(_, i)| &i.report.demand)
            .filter(|d| d.model.as_str() == key.model && d.class.as_str() == key.class);
        for d in reports {
            add_demand(&mut out, d);
        }
        out
    }

    /// [`Fleet::demand_by_priority`] of every class some instance reports, in one pass over the
    /// reports (the same sums, added in the same order).
    fn demand_of_every_class(&self) -> BTreeMap<ClassKey, [f64; 4]> {
        let mut out: BTreeMap<ClassKey, [f64; 4]> = BTreeMap::new();
        for ((cluster, _), instance) in &self.instances {
            for d in &instance.report.demand {
                let key = ClassKey {
                    cluster: cluster.clone(),
                    model: d.model.as_str().to_owned(),
                    class: d.class.as_str().to_owned(),
                };
                add_demand(out.entry(key).or_default(), d);
            }
        }
        out
    }

    /// Everything planning reads from the fleet at `now`, in one value (see
    /// [`PlanningInputs`]): [`plan::build`](crate::plan::build) takes it and asks the fleet
    /// nothing else.
    pub fn planning_inputs(&self, now: Now) -> PlanningInputs<'_> {
        let all: Vec<usize> = (0..self.engines.len()).collect();
        PlanningInputs {
            config: &self.config,
            capacity_rps: all.iter().map(|&idx| self.effective_capacity(idx, now)).collect(),
            curves: self.engine_curves(&all, now),
            network_ms: self
                .config
                .clusters
                .iter()
                .map(|c| (c.id.clone(), all.iter().map(|&idx| self.network_ms(&c.id, idx)).collect()))
                .collect(),
            demand: self.demand_of_every_class(),
        }
    }

    /// Whether engine `idx` counts as up (1) or not (0): its last scrape succeeded, or failed
    /// only once (a blip), and the last success is fresh; an engine that is asleep counts as
    /// down, and one with only some replicas ready as that fraction up. Engines never scraped
    /// yet get the benefit of the doubt until the staleness bound has passed since start (or
    /// since they joined), so a new engine is in the next plan without waiting for its first
    /// scrape.
    pub fn health(&self, idx: usize, now: Now) -> f64 {
        let stale = Duration::from_millis(self.config.control_plane.signal_stale_ms);
        let e = &self.engines[idx];
        let fresh = match e.last_scrape_ok {
            Some(t) => now.saturating_sub(t) <= stale,
            None => now.saturating_sub(e.added.unwrap_or_default()) <= stale,
        };
        // Two failed scrapes in a row (connection refused, 5xx, timeout) take the engine out of
        // the next plan without waiting for the staleness bound.
        if fresh && e.consecutive_scrape_failures < 2 && !e.asleep {
            // Replicas that are not ready carry no load.
            e.ready_fraction.unwrap_or(1.0)
        } else {
            0.0
        }
    }

    /// Replicas × per-replica capacity, req/s.
    pub fn nominal_capacity(&self, idx: usize) -> f64 {
        let e = &self.config.engines[idx];
        let per_replica = e.capacity_rps.unwrap_or_else(|| self.config.profiles[&e.profile].capacity_rps);
        e.replicas as f64 * per_replica
    }

    /// Nominal capacity × the share its growing-queue windows left (`saturation.rs`), req/s:
    /// the pole of the engine's queueing curves.
    pub fn learned_capacity(&self, idx: usize) -> f64 {
        self.nominal_capacity(idx) * self.engines[idx].saturation.share()
    }

    /// Learned capacity × health × (1 − penalty), req/s.
    pub fn effective_capacity(&self, idx: usize, now: Now) -> f64 {
        self.learned_capacity(idx) * self.health(idx, now) * (1.0 - self.engines[idx].penalty)
    }

    /// The mean latency curve of engine `idx` (see [`Fleet::engine_curves`]).
    pub fn latency_profile(&self, idx: usize) -> LatencyProfile {
        self.latency_profiles(&[idx]).pop().unwrap_or(LatencyProfile::Queueing { t0_ms: 0.0, b_ms: 0.0 })
    }

    /// The mean latency curves of `engines` ([`EngineCurves::mean`]).
    pub fn latency_profiles(&self, engines: &[usize]) -> Vec<LatencyProfile> {
        self.curves(engines, None).into_iter().map(|curves| curves.mean).collect()
    }

    /// The curves planning uses for `engines`: the offline TTFT and TBOT profiles refined by
    /// observed (load, latency) pairs, combined per the objective. A measured curve
    /// (`control_plane.measured_curves`), its points joined smoothly
    /// ([`LatencyProfile::through_measured`]), replaces the queueing profile of its signal. Either
    /// curve is then reshaped to the observations where they are dense ([`fit_shape`]): a
    /// queueing curve whose pole is the configured capacity cannot follow an engine whose
    /// latency is queueing-shaped with another pole, and a curve profiled on one engine alone
    /// is steeper at the top than the fleet's engines are (figures from the fleet simulator's
    /// `global-day` in docs/results.md).
    ///
    /// Twins (engines of one model, profile, replica count and capacity) are fitted together
    /// first, and each engine's own observations then only scale the twins' curve, against a
    /// prior worth `TWIN_PRIOR_WEIGHT` requests. Fitted one by one, an engine the plan gives
    /// little traffic has few observations, and its curve stays at the offline profile however
    /// wrong that is for the workload; pooled, the twins' data corrects it for all of them (on
    /// the fleet simulator's `global-day`, pooling cut the lightly used L4s' share of requests
    /// from 2.6 to 1.9 % and ilb's p99 latency by 1 %). Noise in one
    /// engine's fit can no longer make it look faster than its identical twins either. A truly
    /// different engine still shows: it is the outlier detector's to penalise (and its slow
    /// spell never enters its history).
    ///
    /// Under the decode objective the optimizer's curve adds the tail term
    /// (`control_plane.tail_weight` × how far past the model's p99 a request runs, on average;
    /// see `profile/tail.rs`), with the p99 taken from the engines as they run now
    /// (`Fleet::tail_threshold_ms`). That curve is tabulated up to the engine's effective
    /// capacity at `now`, the pole the optimizer gives the queueing shapes of the others.
    pub fn engine_curves(&self, engines: &[usize], now: Now) -> Vec<EngineCurves> {
        self.curves(engines, Some(now))
    }

    /// [`Fleet::engine_curves`]; without `now`, without the tail term.
    fn curves(&self, engines: &[usize], now: Option<Now>) -> Vec<EngineCurves> {
        let counts_decode = matches!(self.config.objective(), Objective::TtftPlusDecode { .. });
        let weight = self.config.control_plane.tail_weight;
        // Per model: its decode tokens per request (e2e = TTFT + (output tokens − 1) × time
        // between tokens), their law and the tail threshold.
        let mut models: HashMap<&str, (f64, DecodeLengths, Option<f64>)> = HashMap::new();
        for &idx in engines {
            let model = self.config.engines[idx].model.as_str();
            models.entry(model).or_insert_with(|| {
                let decode_tokens = (self.output_tokens(model) - 1.0).max(0.0);
                let lengths = self.decode_lengths(model);
                let threshold = if counts_decode && weight > 0.0 && now.is_some() {
                    self.tail_threshold_ms(model, &lengths)
                } else {
                    None
                };
                (decode_tokens, lengths, threshold)
            });
        }
        engines
            .iter()
            .zip(self.fitted_signals(engines))
            .map(|(&idx, (ttft, tbot))| {
                let capacity = self.learned_capacity(idx);
                let (decode_tokens, lengths, threshold) = &models[self.config.engines[idx].model.as_str()];
                let stay = Objective::TtftPlusDecode { expected_output_tokens: *decode_tokens };
                let in_flight = combine(&ttft, &tbot, stay, capacity);
                if !counts_decode {
                    return EngineCurves { objective: ttft.clone(), mean: ttft, in_flight };
                }
                // An engine with no capacity gets no load: it needs no tail.
                let effective = now.map(|now| self.effective_capacity(idx, now)).filter(|c| *c > 0.0);
                let tail = effective
                    .zip(*threshold)
                    .map(|(effective, threshold_ms)| (Tail { threshold_ms, weight, lengths }, effective));
                let objective = match tail {
                    Some((tail, effective)) => combine_with_tail(&ttft, &tbot, stay, Some(tail), effective),
                    None => in_flight.clone(),
                };
                EngineCurves { objective, mean: in_flight.clone(), in_flight }
            })
            .collect()
    }

    /// The p99 of `model`'s latency on its engines as they run now (their measured TTFT, time
    /// between tokens and request rates; each request's decode tokens of law `lengths`), network
    /// excluded, ms: the tail term's threshold. `None` before any engine of the model has
    /// served.
    fn tail_threshold_ms(&self, model: &str, lengths: &DecodeLengths) -> Option<f64> {
        let engines: Vec<(f64, f64, f64)> = self
            .config
            .engines
            .iter()
            .zip(&self.engines)
            .filter(|(config, _)| config.model == model)
            .filter_map(|(_, e)| Some((e.request_rate.value()?, e.ttft_ms.value()?, e.tbot_ms.value()?)))
            .collect();
        mixture_quantile(&engines, lengths, 0.99)
    }

    /// Mean output tokens per request of `model`: what its engines generated per finished
    /// request over the last few minutes, against the configured `expected_output_tokens` as a
    /// prior (see `fleet/output.rs`).
    pub fn output_tokens(&self, model: &str) -> f64 {
        output::mean_output_tokens(self.config.control_plane.expected_output_tokens, self.outputs(model))
    }

    /// The law of `model`'s decode tokens per request (output tokens less the first), with mean
    /// [`Fleet::output_tokens`] − 1: shaped by its engines' histograms of generated tokens where
    /// they expose one, exponential otherwise (see `fleet/output.rs`).
    pub fn decode_lengths(&self, model: &str) -> DecodeLengths {
        let decode_tokens = (self.output_tokens(model) - 1.0).max(0.0);
        let prior = (self.config.control_plane.expected_output_tokens - 1.0).max(0.0);
        output::decode_lengths(prior, decode_tokens, self.outputs(model))
    }

    /// Answers (decayed) in the histograms that shape `model`'s law of answer lengths: counted
    /// by its engines, and by the data planes for engines that count none.
    pub fn answers_counted(&self, model: &str) -> (f64, f64) {
        let (mut by_engines, mut by_data_planes) = (0.0, 0.0);
        for (answers, by_data_plane) in self.outputs(model).map(OutputLengths::counted) {
            *if by_data_plane { &mut by_data_planes } else { &mut by_engines } += answers;
        }
        (by_engines, by_data_planes)
    }

    fn outputs<'a>(&'a self, model: &'a str) -> impl Iterator<Item = &'a OutputLengths> + 'a {
        self.config
            .engines
            .iter()
            .zip(&self.engines)
            .filter(move |(c, _)| c.model == model)
            .map(|(_, e)| &e.output)
    }

    /// The fitted TTFT and TBOT curves of `engines` (see [`Fleet::latency_profiles`]).
    pub(crate) fn fitted_signals(&self, engines: &[usize]) -> Vec<(LatencyProfile, LatencyProfile)> {
        type TwinKey<'a> = (&'a str, &'a str, u32, Option<u64>);
        let twin_key = |idx: usize| -> TwinKey<'_> {
            let e = &self.config.engines[idx];
            (e.model.as_str(), e.profile.as_str(), e.replicas, e.capacity_rps.map(f64::to_bits))
        };
        let mut pooled: HashMap<TwinKey<'_>, (LatencyProfile, LatencyProfile)> = HashMap::new();
        engines
            .iter()
            .map(|&idx| {
                let key = twin_key(idx);
                let capacity = self.nominal_capacity(idx);
                let (ttft, tbot) = pooled
                    .entry(key)
                    .or_insert_with(|| {
                        let twins: Vec<usize> =
                            (0..self.engines.len()).filter(|&j| twin_key(j) == key).collect();
                        let gather = |signal: fn(&LoadHistory) -> Vec<Observation>| -> Vec<Observation> {
                            twins.iter().flat_map(|&j| signal(&self.engines[j].observations)).collect()
                        };
                        (
                            self.offline_fit(idx, Signal::Ttft, &gather(LoadHistory::ttft)),
                            self.offline_fit(idx, Signal::Tbot, &gather(LoadHistory::tbot)),
                        )
                    })
                    .clone();
                let history = &self.engines[idx].observations;
                let ttft = fit_level(&ttft, TWIN_PRIOR_WEIGHT, capacity, &history.ttft());
                let tbot = fit_level(&tbot, TWIN_PRIOR_WEIGHT, capacity, &history.tbot());
                (ttft, tbot)
            })
            .collect()
    }

    /// Engine `idx`'s offline profile of one signal refined by `observations`.
    fn offline_fit(&self, idx: usize, signal: Signal, observations: &[Observation]) -> LatencyProfile {
        let e = &self.config.engines[idx];
        let p = &self.config.profiles[&e.profile];
        let capacity = self.nominal_capacity(idx);
        let curves = self.config.control_plane.measured_curves.get(&e.profile);
        let (measured, t0_ms, b_ms) = match signal {
            Signal::Ttft => (curves.and_then(|c| c.ttft_curve.as_ref()), p.ttft_t0_ms, p.ttft_b_ms),
            Signal::Tbot => (curves.and_then(|c| c.tbot_curve.as_ref()), p.tbot_t0_ms, p.tbot_b_ms),
        };
        match measured {
            Some(points) => {
                // Curves are per replica; the engine's replicas share its load evenly.
                let replicas = f64::from(e.replicas.max(1));
                let points: Vec<_> = points.iter().map(|&[load, ms]| (load * replicas, ms)).collect();
                fit_shape(&LatencyProfile::through_measured(&points), PRIOR_WEIGHT, capacity, observations)
            }
            None => {
                let queueing =
                    fit_queueing(QueueingPrior { t0_ms, b_ms, weight: PRIOR_WEIGHT }, capacity, observations);
                fit_shape(&queueing, PRIOR_WEIGHT, capacity, observations)
            }
        }
    }

    /// Network latency from `cluster`'s region to engine `idx`, ms: measured if reported (and
    /// allowed by config), else configured.
    pub fn network_ms(&self, cluster: &str, idx: usize) -> f64 {
        let engine = &self.config.engines[idx];
        if self.config.network.use_measured {
            if let Some(rtt) = self.rtt.get(&(cluster.to_owned(), engine.id.clone())).and_then(|e| e.value())
            {
                return rtt;
            }
        }
        let region =
            self.config.clusters.iter().find(|c| c.id == cluster).map(|c| c.region.as_str()).unwrap_or("");
        self.config.region_latency_ms(region, &engine.region)
    }

    /// What the data planes saw of engine `engine_id` in its current outlier window (since it
    /// was last judged), summed over every report received: (requests, errors). Each report
    /// counts one period, so the sum covers the window once whatever the reporting period.
    pub fn proxy_errors(&self, engine_id: &str) -> (u64, u64) {
        self.engine_index.get(engine_id).map_or((0, 0), |&idx| {
            let w = &self.engines[idx].outlier_window;
            (w.proxy_requests, w.proxy_errors)
        })
    }
}

//! Outlier engines and their penalties: the "protect" step of the control plane.
//!
//! Each engine accumulates an [`OutlierWindow`] from its scrapes (finished and failed
//! requests, TTFT and TBOT histograms) and from the data planes' reports (attempts and errors
//! seen through the proxy, one period per report). Every `interval_ms`
//! ([`Fleet::update_penalties`]) each engine with enough requests in its window is judged
//! against its model's fleet and its own profiles:
//!
//! - **error outlier**: its success rate (the worse of the engine's own counters and the
//!   proxies' view) is below the model's mean − k·σ over engines with at least `min_requests`
//!   (Envoy's success-rate outlier detection), and at least `success_rate_min_gap` below it;
//! - **latency outlier**: its mean TTFT over the window, at its observed load, is at least
//!   `latency_ratio` times its *offline* profile (times the fleet's median ratio, so a
//!   fleet-wide slowdown is nobody's fault and a pessimistic profile hides no one) *and*
//!   `latency_ratio` times its *fitted* curve, and, where the engine reports time between
//!   tokens, its TBOT is at least `latency_ratio` times its fitted TBOT curve (TBOT is judged
//!   on its own too when the objective counts decode time). The offline profile alone would convict an engine whose workload differs
//!   from its peers' (longer prompts, traffic that lost its cached prefixes after moving to
//!   it): against its fitted curve such an engine is normal. The fitted curve alone would
//!   learn a grey engine's slowness as its normal; with both, a latency outlier is an engine
//!   that became slow, and the penalty keeps its slow spell out of its fit (below). A slow
//!   first token alone may be the workload; an engine that is slow is slow between tokens too.
//!
//! Between intervals (every call) engines that are not penalised are judged early, only to be
//! convicted: a grey engine is penalised as soon as its open window shows it, not at the end
//! of an interval that may have begun before it turned slow. So is one whose recent window (its
//! latest scrapes covering half an interval, judged against its peers' over the same span)
//! shows it: healthy seconds at the start of the open window dilute its mean, and a slowdown
//! that began mid-interval would otherwise wait for the next window to fill. An early verdict
//! needs a window at least half an interval long (`EARLY_WINDOW_SHARE`), however many
//! requests it holds:
//! latency is correlated in time (one queue build-up or a few long prompts last seconds), so
//! the first seconds of a window are one sample of it, and judging the open window on every
//! call tests it again and again: without the rule, healthy engines were penalised on short
//! windows (`docs/results.md`).
//!
//! A window in which the engine was down is not judged: requests that waited through the
//! outage finish after it with latencies that say nothing about the engine's speed. Nor, for
//! three smoothing time constants after an engine of the model went down or came back, are the
//! windows of its engines not yet penalised: the traffic that moved queues on its new engines
//! and has lost its cached prefixes, so they look slow for a while. Judged, such windows
//! penalise a healthy engine that took a failed engine's traffic or came back from an outage,
//! and the plan sheds for the capacity withheld.
//!
//! A penalty withholds a share of the engine's capacity from the optimizer, so its traffic
//! moves in a planned way. A new outlier starts at max(0.5, severity) — severity 1 − 1/ratio for
//! latency (a 3× slower engine has about a third of its capacity), 1 − rate/mean for errors —
//! or more, so that the usable capacity it keeps is at most three quarters of the load it was
//! convicted at (`LOAD_KEPT`): withheld from an engine running at a third of its capacity, half
//! of it moves nothing, and its traffic would wait an interval for the escalation. While it
//! stays an outlier the capacity it keeps is quartered every interval, up to
//! `max_penalty`. Every healthy interval halves the penalty, but at most doubles the
//! capacity the engine keeps; under `min_penalty` it is removed. Quick to punish, quick to
//! forgive a light penalty, and a deep one in doubling steps: a deeply penalised engine's
//! healthy verdict rests on a trickle of requests, so each step is judged on the traffic the
//! last one brought.
//! A penalised engine gets little traffic by design, so it is judged again after only
//! `probe_requests`; a window that gathers too few requests for `max_window_intervals` is given
//! up, and a penalised engine then recovers one step on the benefit of the doubt, so a penalty
//! can never starve an engine of the evidence it needs to recover.
//!
//! At most `max_penalised_share` of a model's nominal capacity may belong to penalised engines
//! at once. When more engines qualify, the most severe are penalised first and the rest wait
//! (`outlier_waiting`), so a fleet-wide problem never ejects everything; already penalised
//! engines are not displaced, which would move traffic back and forth. While none is
//! penalised, the most severe may be even when it alone is over the cap
//! (`always_penalise_one`, as Envoy's `always_eject_one_host`): LLM fleets have few engines per
//! model, and at 15 % a model of six equal engines could otherwise never penalise one. So may
//! an outlier that outweighs all the penalised engines together while they hold less than the
//! cap: two small engines penalised must not shelter a large one that turned grey. Either way
//! the cap is exceeded by one engine at most. When too few engines have a latency ratio for a
//! median (fewer than `success_rate_min_engines`), each is judged against the slowest of its
//! peers instead; and a model that small may penalise one over the cap only when it is slow
//! alone: its peers run within
//! [`PEERS_CALM`] of their profiles, none is penalised or down, and it runs below
//! [`NEAR_CAPACITY`] of its learned capacity (an overloaded engine is slow because of its load).
//! Otherwise a grey engine of a two-engine model kept its traffic until its fitted curve had
//! learned its slowness (26.5 s against feedback's 7.5 in the fleet simulator).
//!
//! The fit: while an engine is penalised its observations are kept out of its latency profile,
//! and the observations of the window that got it penalised are dropped. Otherwise the grey
//! period would become its curve; the optimizer would then avoid it twice (through the
//! penalty and through the curve), and after recovery the pessimistic curve would linger for
//! the length of the observation history, longest exactly when the engine gets little traffic
//! to replace it. An engine that only waits behind the cap is planned as normal, so its
//! observations do refine its curve: the optimizer should see how slow it really is.

use super::{Fleet, Now};
use crate::config::OutlierSettings;
use crate::profile::{LatencyProfile, Objective};
use crate::signals::WindowStats;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Windows with load above this share of nominal capacity are not judged on latency.
const NEAR_CAPACITY: f64 = 0.9;

/// With too few engines for a median, peers whose latency is within this multiple of their
/// profiles run normally, halfway to the outlier threshold's default: one engine slow beside
/// them is slow alone. Peers slower than that share the slowdown (an overload, a long-prompt
/// spell), and moving traffic onto them would not help.
const PEERS_CALM: f64 = 1.5;

/// The share of `interval_ms` an engine's window must span before an early verdict (between
/// intervals) may convict it, and the span of the recent window it is also judged on (see the
/// module's documentation).
pub(super) const EARLY_WINDOW_SHARE: f64 = 0.5;

/// A new outlier's usable capacity is at most this share of the load it was convicted at, so
/// its penalty moves at least a quarter of its traffic at once (see the module's documentation).
const LOAD_KEPT: f64 = 0.75;
/// The smallest penalty a newly detected outlier gets.
const INITIAL_PENALTY: f64 = 0.5;
/// Each interval an engine stays an outlier multiplies the capacity it keeps by this: it had
/// an interval to get better, and it is hurting the traffic it still gets.
const ESCALATION_FACTOR: f64 = 0.25;
/// Each healthy interval multiplies the penalty by this.
const RECOVERY_FACTOR: f64 = 0.5;
/// A healthy interval at most multiplies the capacity a penalised engine keeps by this.
const RECOVERY_GROWTH: f64 = 2.0;
/// Prefix of the reason of a penalty that is decaying.
const RECOVERING: &str = "recovering after ";

/// What one engine did since it was last judged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutlierWindow {
    /// When the window opened (the last verdict); `None`: at start.
    pub started: Option<Now>,
    /// Evaluations this window has lasted without enough requests for a verdict.
    pub intervals: u32,
    /// Time covered by the scrape windows added, seconds.
    pub elapsed_s: f64,
    /// Requests the engine finished (its own counters), and how many of them failed.
    pub finished: f64,
    pub failed: f64,
    /// Attempts and errors the data planes saw through their proxies.
    pub proxy_requests: u64,
    pub proxy_errors: u64,
    /// TTFT observations and their sum, ms.
    pub ttft_count: f64,
    pub ttft_sum_ms: f64,
    /// TBOT observations (tokens) and their sum, ms.
    pub tbot_count: f64,
    pub tbot_sum_ms: f64,
    /// The engine was down during this window, or the model's engines that are up changed
    /// recently (see the module's documentation). Such a window says nothing about the
    /// engine's speed, so it is given up at the next interval instead of judged.
    pub disturbed: bool,
}

impl OutlierWindow {
    /// Folds in one scrape window of the engine.
    pub fn add_scrape(&mut self, w: &WindowStats) {
        let finished = w.request_rate.map_or(0.0, |rate| rate * w.elapsed_s);
        if !(finished.is_finite() && w.elapsed_s.is_finite()) {
            return;
        }
        self.elapsed_s += w.elapsed_s;
        self.finished += finished;
        self.failed += w.error_rate.map_or(0.0, |e| e * finished);
        if let Some(t) = w.ttft.filter(|t| t.count > 0.0 && t.mean_ms.is_finite()) {
            self.ttft_count += t.count;
            self.ttft_sum_ms += t.count * t.mean_ms;
        }
        if let Some(t) = w.tbot.filter(|t| t.count > 0.0 && t.mean_ms.is_finite()) {
            self.tbot_count += t.count;
            self.tbot_sum_ms += t.count * t.mean_ms;
        }
    }

    /// Folds in one data-plane report's counts for the engine (one reporting period).
    pub fn add_report(&mut self, requests: u64, errors: u64) {
        self.proxy_requests = self.proxy_requests.saturating_add(requests);
        self.proxy_errors = self.proxy_errors.saturating_add(errors.min(requests));
    }

    /// Counts an interval without enough evidence; whether the window stays open (it is given
    /// up once it has lasted `max_intervals`).
    fn keeps_waiting(&mut self, max_intervals: u32) -> bool {
        self.intervals += 1;
        self.intervals < max_intervals
    }

    fn reset(&mut self, now: Now) {
        *self = OutlierWindow { started: Some(now), ..OutlierWindow::default() };
    }

    /// Requests seen in the window by whichever source saw more.
    fn volume(&self) -> f64 {
        self.finished.max(self.proxy_requests as f64)
    }

    /// Adds what `other` saw (a later or earlier stretch of the same engine's time).
    fn absorb(&mut self, other: &OutlierWindow) {
        self.elapsed_s += other.elapsed_s;
        self.finished += other.finished;
        self.failed += other.failed;
        self.proxy_requests = self.proxy_requests.saturating_add(other.proxy_requests);
        self.proxy_errors = self.proxy_errors.saturating_add(other.proxy_errors);
        self.ttft_count += other.ttft_count;
        self.ttft_sum_ms += other.ttft_sum_ms;
        self.tbot_count += other.tbot_count;
        self.tbot_sum_ms += other.tbot_sum_ms;
        self.disturbed |= other.disturbed;
    }
}

/// An engine's latest scrape windows, as few as cover the early span (half an interval): the
/// recent window an unpenalised engine is also judged on between intervals. The open window
/// may have begun seconds before the engine turned slow, and those healthy seconds dilute its
/// mean; the recent one holds only the last span, so a grey engine is convicted once its slow
/// spell fills it, wherever the interval boundary fell.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecentWindows {
    scrapes: VecDeque<OutlierWindow>,
}

impl RecentWindows {
    /// Adds one scrape window (`disturbed`: the engine was down during it) and drops the oldest
    /// while the rest still cover `span_s`.
    pub fn add_scrape(&mut self, w: &WindowStats, disturbed: bool, span_s: f64) {
        let mut scrape = OutlierWindow { disturbed, ..OutlierWindow::default() };
        scrape.add_scrape(w);
        self.scrapes.push_back(scrape);
        let mut covered: f64 = self.scrapes.iter().map(|s| s.elapsed_s).sum();
        while self.scrapes.len() > 1 && covered - self.scrapes[0].elapsed_s >= span_s {
            covered -= self.scrapes[0].elapsed_s;
            self.scrapes.pop_front();
        }
    }

    /// Folds a data-plane report into the latest scrape window.
    pub fn add_report(&mut self, requests: u64, errors: u64) {
        if let Some(last) = self.scrapes.back_mut() {
            last.add_report(requests, errors);
        }
    }

    /// The windows held, merged, once they cover `span_s`.
    fn window(&self, span_s: f64) -> Option<OutlierWindow> {
        let mut merged = OutlierWindow::default();
        for scrape in &self.scrapes {
            merged.absorb(scrape);
        }
        (merged.elapsed_s >= span_s * (1.0 - 1e-9)).then_some(merged)
    }
}

/// What an engine's window says.
#[derive(Debug)]
enum Verdict {
    /// Not judged now (between intervals): the window stays open and nothing is counted.
    Pending,
    /// Not enough requests this interval: keep accumulating, for up to `max_window_intervals`.
    Insufficient,
    /// The engine is down, or was during the window: give the window up.
    Expired,
    Healthy,
    Outlier {
        severity: f64,
        /// Requests per second the engine served over the window that convicts it.
        load_rps: f64,
        /// Its peers, too few for a median, all ran near their profiles (`Peers::calm`).
        alone: bool,
        reason: String,
    },
}

/// One signal's latency over an engine's outlier window, as a multiple of what its offline
/// profile and its fitted curve predict at the window's load.
struct LatencyRatio {
    signal: &'static str,
    offline: f64,
    fitted: f64,
    load: f64,
}

/// The worse success rate of an engine's window and where it comes from.
fn success_rate(w: &OutlierWindow, required: f64) -> Option<(f64, &'static str)> {
    let engine = (w.finished >= required && w.finished > 0.0)
        .then(|| (1.0 - (w.failed / w.finished).clamp(0.0, 1.0), "engine"));
    let proxy = (w.proxy_requests as f64 >= required && w.proxy_requests > 0)
        .then(|| (1.0 - w.proxy_errors as f64 / w.proxy_requests as f64, "proxy"));
    match (engine, proxy) {
        (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// Mean and population standard deviation.
fn mean_and_sigma(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, variance.max(0.0).sqrt())
}

/// What one engine of a model is judged against: its peers' success rate (mean, σ) when enough
/// of them have the volume, their median TTFT over its profile (with too few for a median, the
/// slowest peer's worst counted signal over its profile, at least 1), and whether the objective
/// counts TBOT.
struct Peers {
    rate: Option<(f64, f64)>,
    median_ratio: f64,
    uses_tbot: bool,
    /// Too few engines for a median, and every other one runs within [`PEERS_CALM`] of its
    /// profile: an outlier here is slow alone (see [`Fleet::slow_alone`]).
    calm: bool,
}

impl Fleet {
    /// Judges every engine whose window has enough requests, once per
    /// `control_plane.outliers.interval_ms`, and updates penalties and their reasons. Calls in
    /// between judge early, but only engines that are not penalised and only to penalise
    /// them: a grey engine is penalised as soon as its open window convicts it, instead of at
    /// the end of an interval that may have begun before it turned slow; healthy verdicts,
    /// recovery and escalation keep the interval's pace. Call it before planning, e.g. on every
    /// solve tick.
    pub fn update_penalties(&mut self, now: Now) {
        let settings = self.config.control_plane.outliers.clone();
        if !settings.enabled {
            for e in &mut self.engines {
                e.penalty = 0.0;
                e.penalty_reason = None;
                e.outlier_waiting = None;
            }
            return;
        }
        let last = self.last_outlier_evaluation.unwrap_or(Duration::ZERO);
        let early = now.saturating_sub(last) < Duration::from_millis(settings.interval_ms);
        if !early {
            self.last_outlier_evaluation = Some(now);
        }
        let mut models: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (idx, engine) in self.config.engines.iter().enumerate() {
            models.entry(engine.model.clone()).or_default().push(idx);
        }
        let settle = crate::smoothing::SETTLING_TAUS * self.tau();
        for (model, engine_idx) in &models {
            let down: Vec<bool> = engine_idx.iter().map(|&j| self.health(j, now) <= 0.0).collect();
            let up: Vec<String> = engine_idx
                .iter()
                .zip(&down)
                .filter(|(_, &down)| !down)
                .map(|(&j, _)| self.config.engines[j].id.clone())
                .collect();
            let (before, changed) =
                self.engines_up.entry(model.clone()).or_insert_with(|| (up.clone(), None));
            if *before != up {
                *before = up;
                *changed = Some(now);
            }
            let settling = changed.is_some_and(|at| now < at + settle);
            for (&j, down) in engine_idx.iter().zip(down) {
                // Down engines' windows, and for a while after an engine of the model went down
                // or came back the windows of engines not yet penalised: their traffic moved
                // between engines and queued, which says nothing about any one engine's speed.
                if down || settling && self.engines[j].penalty == 0.0 {
                    self.engines[j].outlier_window.disturbed = true;
                }
            }
            let open: Vec<&OutlierWindow> =
                engine_idx.iter().map(|&j| &self.engines[j].outlier_window).collect();
            let mut verdicts = self.judge_model(engine_idx, &open, now, &settings);
            if early {
                // Between intervals only the conviction of an engine not yet penalised counts,
                // on its open window once that spans more than one moment, or on its recent
                // window (the last half interval, judged against its peers' over the same span).
                let least_s = EARLY_WINDOW_SHARE * settings.interval_ms as f64 / 1000.0;
                let recent: Vec<OutlierWindow> = engine_idx
                    .iter()
                    .map(|&j| {
                        let engine = &self.engines[j];
                        let mut w = engine.recent.window(least_s).unwrap_or_default();
                        w.disturbed |= engine.outlier_window.disturbed;
                        w
                    })
                    .collect();
                let recent_verdicts =
                    self.judge_model(engine_idx, &recent.iter().collect::<Vec<_>>(), now, &settings);
                for ((verdict, recent_verdict), (&j, recent)) in
                    verdicts.iter_mut().zip(recent_verdicts).zip(engine_idx.iter().zip(&recent))
                {
                    let engine = &mut self.engines[j];
                    let open_convicts = matches!(verdict, Verdict::Outlier { .. })
                        && engine.outlier_window.elapsed_s >= least_s;
                    if engine.penalty > 0.0 {
                        *verdict = Verdict::Pending;
                    } else if matches!(recent_verdict, Verdict::Outlier { .. }) && !open_convicts {
                        // Its slow spell may have begun before the open window: keep it out
                        // of the fit from where the recent window starts.
                        let recent_start = now.saturating_sub(Duration::from_secs_f64(recent.elapsed_s));
                        let window = &mut engine.outlier_window;
                        window.started = Some(window.started.map_or(recent_start, |s| s.min(recent_start)));
                        *verdict = recent_verdict;
                    } else if !open_convicts {
                        *verdict = Verdict::Pending;
                    }
                }
            }
            self.apply(engine_idx, verdicts, now, &settings);
        }
    }

    /// One verdict per engine of one model (same order as `engine_idx`), each judged on its
    /// window in `windows` (same order).
    fn judge_model(
        &self,
        engine_idx: &[usize],
        windows: &[&OutlierWindow],
        now: Now,
        s: &OutlierSettings,
    ) -> Vec<Verdict> {
        let uses_tbot = matches!(self.config.objective(), Objective::TtftPlusDecode { .. });
        let min_requests = s.min_requests as f64;
        // The fleet's success-rate statistics, over engines with the full volume.
        let rates: Vec<f64> = engine_idx
            .iter()
            .zip(windows)
            .filter(|(&j, _)| self.health(j, now) > 0.0)
            .filter_map(|(_, w)| success_rate(w, min_requests))
            .map(|(rate, _)| rate)
            .collect();
        let fleet_rate = (rates.len() >= s.success_rate_min_engines).then(|| mean_and_sigma(&rates));
        // A latency outlier is slow against its profile *and* against its peers: the threshold
        // follows the fleet's median ratio. When the whole model runs slower than its profiles
        // (a miscalibrated profile, a daily peak), the fleet is not penalised for it; when it
        // runs faster (a pessimistic profile), a grey engine still within its profile is found.
        let fitted = self.fitted_signals(engine_idx);
        // Per engine that is up, its TTFT over its profile, and the worst of the signals that
        // count (TBOT too when the objective counts it).
        let ratios: Vec<(Option<f64>, f64)> = engine_idx
            .iter()
            .zip(windows)
            .zip(&fitted)
            .map(|((&j, w), fitted)| {
                let up = self.health(j, now) > 0.0;
                let ratios = if up { self.latency_ratios(j, w, min_requests, fitted) } else { Vec::new() };
                let ttft = ratios.iter().find(|r| r.signal == "ttft").map(|r| r.offline);
                let counted = ratios.iter().filter(|r| uses_tbot || r.signal == "ttft");
                (ttft, counted.map(|r| r.offline).fold(1.0, f64::max))
            })
            .collect();
        let mut fleet_ratios: Vec<f64> = ratios.iter().filter_map(|r| r.0).collect();
        fleet_ratios.sort_by(f64::total_cmp);
        // Too few for a median: each engine is judged against the slowest of its peers on any
        // signal that counts (if that one ran slower than its profile), so two engines that are
        // both slow (a shared overload) convict neither.
        let median =
            (fleet_ratios.len() >= s.success_rate_min_engines).then(|| fleet_ratios[fleet_ratios.len() / 2]);
        engine_idx
            .iter()
            .enumerate()
            .zip(windows)
            .zip(&fitted)
            .map(|(((i, &j), w), fitted)| {
                let slowest_peer = ratios.iter().enumerate().filter(|&(k, _)| k != i).map(|(_, r)| r.1);
                let slowest_peer = slowest_peer.fold(1.0, f64::max);
                let median_ratio = median.unwrap_or(slowest_peer);
                let calm = median.is_none() && slowest_peer < PEERS_CALM;
                let peers = Peers { rate: fleet_rate, median_ratio, uses_tbot, calm };
                self.judge_engine(j, w, fitted, s, &peers)
            })
            .collect()
    }

    /// Engine `j`'s verdict on window `w` against its peers (`fitted`: its fitted TTFT and
    /// TBOT curves).
    fn judge_engine(
        &self,
        j: usize,
        w: &OutlierWindow,
        fitted: &(LatencyProfile, LatencyProfile),
        s: &OutlierSettings,
        peers: &Peers,
    ) -> Verdict {
        let median_ratio = peers.median_ratio;
        // Down engines (marked disturbed by the caller) get no capacity through health; a
        // penalty would only take budget from engines that are up.
        if w.disturbed {
            return Verdict::Expired;
        }
        let penalised = self.engines[j].penalty > 0.0;
        let required = if penalised { s.probe_requests.min(s.min_requests) } else { s.min_requests };
        let required = required as f64;
        if w.volume() < required {
            return Verdict::Insufficient;
        }
        let mut severity: f64 = 0.0;
        let mut reasons = Vec::new();
        if let (Some((rate, source)), Some((mean, sigma))) = (success_rate(w, required), peers.rate) {
            let threshold = mean - (s.success_rate_stdev_factor * sigma).max(s.success_rate_min_gap);
            if rate < threshold {
                severity = severity.max(if mean > 0.0 { (1.0 - rate / mean).clamp(0.0, 1.0) } else { 0.0 });
                reasons.push(format!(
                    "success rate {:.0} % vs fleet {:.0} % ± {:.0} % ({source})",
                    rate * 100.0,
                    mean * 100.0,
                    sigma * 100.0
                ));
            }
        }
        let ratios = self.latency_ratios(j, w, required, fitted);
        // Whether `r` is at least `ratio` times its offline profile (times the fleet's median
        // ratio) and its fitted curve. A slow first token alone may be the workload (prompts
        // that lost their cached prefix after traffic moved); a slow engine is slow between
        // tokens too. TBOT counts on its own only when the objective counts it: otherwise its
        // offline profile is not something the operator had to get right (its defaults are
        // placeholders).
        let slow = |r: &LatencyRatio, ratio: f64| {
            let decode_agrees = ratios.iter().find(|t| t.signal == "tbot").is_none_or(|t| t.fitted >= ratio);
            (peers.uses_tbot || r.signal == "ttft")
                && r.offline >= ratio * median_ratio
                && r.fitted >= ratio
                && (r.signal != "ttft" || decode_agrees)
        };
        for r in ratios.iter().filter(|r| slow(r, s.latency_ratio)) {
            severity = severity.max((1.0 - median_ratio / r.offline).min(1.0 - 1.0 / r.fitted));
            let peers = if median_ratio != 1.0 {
                format!(" (fleet median {median_ratio:.1}×)")
            } else {
                String::new()
            };
            reasons.push(format!(
                "{} {:.1}× its profile at {:.0} req/s{peers}, {:.1}× its fitted curve",
                r.signal, r.offline, r.load, r.fitted
            ));
        }
        // Attempts seen by the proxies are not evidence of speed: a slow engine has many
        // requests in flight and few first tokens. Only an engine that finishes
        // requests without exposing TTFT at all is judged on errors alone.
        let latency_evidence = w.ttft_count >= required || (w.ttft_count == 0.0 && w.finished >= required);
        if reasons.is_empty() && !latency_evidence {
            Verdict::Insufficient
        } else if reasons.is_empty() {
            Verdict::Healthy
        } else {
            let load_rps = if w.elapsed_s > 0.0 { w.volume() / w.elapsed_s } else { 0.0 };
            Verdict::Outlier { severity, load_rps, alone: peers.calm, reason: reasons.join("; ") }
        }
    }

    /// Observed TTFT and TBOT of engine `j` over window `w` against its offline profiles and
    /// its fitted curves `fitted` (TTFT, TBOT), at the window's load.
    fn latency_ratios(
        &self,
        j: usize,
        w: &OutlierWindow,
        required: f64,
        fitted: &(LatencyProfile, LatencyProfile),
    ) -> Vec<LatencyRatio> {
        let profile = &self.config.profiles[&self.config.engines[j].profile];
        let capacity = self.nominal_capacity(j);
        if w.elapsed_s <= 0.0 {
            return Vec::new();
        }
        let finished = if w.finished > 0.0 { w.finished } else { w.ttft_count };
        let load = finished / w.elapsed_s;
        let mut out = Vec::new();
        let mut check = |signal, count: f64, sum_ms: f64, t0_ms, b_ms, fitted: &LatencyProfile| {
            let offline = LatencyProfile::Queueing { t0_ms, b_ms }.latency_ms(load, capacity);
            let fitted = fitted.latency_ms(load, capacity);
            // Near and beyond capacity the offline curve is too steep (or infinite) to judge
            // by: an overloaded engine is the optimizer's business, not an outlier.
            let usable = |ms: f64| ms.is_finite() && ms > 0.0;
            if count >= required && load < NEAR_CAPACITY * capacity && usable(offline) && usable(fitted) {
                let observed = sum_ms / count;
                out.push(LatencyRatio {
                    signal,
                    offline: observed / offline,
                    fitted: observed / fitted,
                    load,
                });
            }
        };
        check("ttft", w.ttft_count, w.ttft_sum_ms, profile.ttft_t0_ms, profile.ttft_b_ms, &fitted.0);
        check("tbot", w.tbot_count, w.tbot_sum_ms, profile.tbot_t0_ms, profile.tbot_b_ms, &fitted.1);
        out
    }

    /// Turns verdicts into penalties, within the model's cap.
    fn apply(&mut self, engine_idx: &[usize], verdicts: Vec<Verdict>, now: Now, s: &OutlierSettings) {
        let mut candidates = Vec::new();
        for (&j, verdict) in engine_idx.iter().zip(verdicts) {
            let e = &mut self.engines[j];
            if matches!(verdict, Verdict::Insufficient)
                && e.outlier_window.keeps_waiting(s.max_window_intervals)
            {
                continue;
            }
            match verdict {
                Verdict::Pending => continue,
                // An insufficient window here has waited too long: given up, like an expired one.
                Verdict::Insufficient | Verdict::Expired | Verdict::Healthy => {
                    if e.penalty > 0.0 {
                        e.penalty = recovered(e.penalty);
                        if e.penalty < s.min_penalty {
                            tracing::info!(engine = %self.config.engines[j].id, "penalty removed");
                            e.penalty = 0.0;
                            e.penalty_reason = None;
                        } else if let Some(reason) = &mut e.penalty_reason {
                            if !reason.starts_with(RECOVERING) {
                                *reason = format!("{RECOVERING}{reason}");
                            }
                        }
                    }
                    e.outlier_waiting = None;
                }
                Verdict::Outlier { severity, load_rps, alone, reason } => {
                    if e.penalty > 0.0 {
                        let escalated = 1.0 - (1.0 - e.penalty) * ESCALATION_FACTOR;
                        e.penalty = severity.max(escalated).min(s.max_penalty);
                        e.penalty_reason = Some(reason);
                    } else {
                        let started = e.outlier_window.started.unwrap_or(Duration::ZERO);
                        candidates.push(Candidate { severity, load_rps, alone, engine: j, reason, started });
                    }
                }
            }
            self.engines[j].outlier_window.reset(now);
        }
        if candidates.is_empty() {
            return;
        }
        // Most severe first; ties by engine order so that equal inputs give equal penalties.
        candidates.sort_by(|a, b| b.severity.total_cmp(&a.severity).then(a.engine.cmp(&b.engine)));
        let total: f64 = engine_idx.iter().map(|&j| self.nominal_capacity(j)).sum();
        let allowed = s.max_penalised_share * total;
        let mut used: f64 = engine_idx
            .iter()
            .filter(|&&j| self.engines[j].penalty > 0.0)
            .map(|&j| self.nominal_capacity(j))
            .sum();
        // With too few engines for a peer comparison, one that turned slow alone may be
        // (`slow_alone`).
        let one_allowed = s.always_penalise_one
            && (engine_idx.len() >= s.success_rate_min_engines
                || candidates.len() == 1 && self.slow_alone(engine_idx, &candidates[0], now));
        for Candidate { severity, load_rps, engine: j, reason, started, .. } in candidates {
            let nominal = self.nominal_capacity(j);
            // The penalty that leaves it `LOAD_KEPT` of its load to plan with.
            let usable = self.config.control_plane.rho * self.learned_capacity(j) * self.health(j, now);
            let binding = if usable > 0.0 { 1.0 - LOAD_KEPT * load_rps / usable } else { 0.0 };
            let id = self.config.engines[j].id.clone();
            let e = &mut self.engines[j];
            // Over the cap, one outlier still may be while the penalised hold less than the cap,
            // if it alone outweighs them all (none penalised is the Envoy case).
            let outweighs = used == 0.0 || (used < allowed && nominal > used);
            if used + nominal <= allowed * (1.0 + 1e-12) || (one_allowed && outweighs) {
                used += nominal;
                e.penalty = severity.max(INITIAL_PENALTY).max(binding).clamp(s.min_penalty, s.max_penalty);
                tracing::info!(engine = %id, penalty = e.penalty, %reason, "engine penalised");
                e.penalty_reason = Some(reason);
                e.outlier_waiting = None;
                // The window that got it penalised is not its normal behaviour.
                e.observations.forget_since(started);
            } else {
                tracing::debug!(engine = %id, %reason, "outlier waits: penalised share at its cap");
                e.outlier_waiting = Some(reason);
            }
        }
    }

    /// Whether `candidate` is the one engine of its model that turned slow while its peers are
    /// fine, and not because it is overloaded: they ran near their profiles (`alone`), every
    /// other engine is up and unpenalised (it is the only candidate), and it ran below
    /// [`NEAR_CAPACITY`] of its learned capacity. An overloaded engine is slow because of its
    /// load: its queue grows, and its learned capacity comes down to what it completes
    /// (`saturation.rs`).
    fn slow_alone(&self, engine_idx: &[usize], candidate: &Candidate, now: Now) -> bool {
        let j = candidate.engine;
        if !candidate.alone {
            return false;
        }
        let peers_fine = engine_idx
            .iter()
            .filter(|&&k| k != j)
            .all(|&k| self.health(k, now) > 0.0 && self.engines[k].penalty == 0.0);
        peers_fine && candidate.load_rps < NEAR_CAPACITY * self.learned_capacity(j)
    }
}

/// An engine convicted this interval that was not penalised yet: whether it is depends on the
/// cap on the penalised share, most severe first.
struct Candidate {
    severity: f64,
    /// The load it was convicted at, requests/s.
    load_rps: f64,
    /// Convicted beside calm peers, too few for a median (`Peers::calm`).
    alone: bool,
    engine: usize,
    reason: String,
    /// Where the convicting window began: its observations are forgotten from there.
    started: Duration,
}

/// The penalty after a healthy interval: halved ([`RECOVERY_FACTOR`]), but the capacity the
/// engine keeps at most doubled ([`RECOVERY_GROWTH`]). A lightly penalised engine is forgiven
/// quickly; a deeply penalised one carried a trickle of traffic, so its healthy verdict rests on
/// a few requests (or on none, given up on the benefit of the doubt), and it earns its capacity
/// back in doubling steps, each judged on the traffic it brings. Halving a 98 % penalty would
/// hand a still-slow engine half its capacity on that thin evidence, convict it again an
/// interval later, and swing that traffic back and forth every few intervals (the fleet
/// simulator's `grey-engine` moved 13–16 % of all traffic each way, every 30 s).
fn recovered(penalty: f64) -> f64 {
    let kept = (1.0 - penalty).max(0.0);
    (penalty * RECOVERY_FACTOR).max(1.0 - RECOVERY_GROWTH * kept).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_rate_takes_the_worse_source_with_enough_volume() {
        let w = OutlierWindow {
            finished: 100.0,
            failed: 10.0,
            proxy_requests: 50,
            proxy_errors: 25,
            ..Default::default()
        };
        assert_eq!(success_rate(&w, 20.0), Some((0.5, "proxy")));
        // The proxies saw too little to count.
        assert_eq!(success_rate(&w, 60.0), Some((0.9, "engine")));
        assert_eq!(success_rate(&w, 200.0), None);
    }

    #[test]
    fn report_errors_never_exceed_requests() {
        let mut w = OutlierWindow::default();
        w.add_report(3, 9);
        assert_eq!((w.proxy_requests, w.proxy_errors), (3, 3));
    }

    #[test]
    fn recovery_halves_a_light_penalty_and_doubles_what_a_deep_one_keeps() {
        assert!((recovered(0.5) - 0.25).abs() < 1e-12);
        assert!((recovered(0.2) - 0.1).abs() < 1e-12);
        // 98 % withheld: 2 % kept becomes 4 %, not 51 %.
        assert!((recovered(0.98) - 0.96).abs() < 1e-12);
        // The two rules meet at two thirds.
        assert!((recovered(2.0 / 3.0) - 1.0 / 3.0).abs() < 1e-12);
        let mut p = 0.98;
        let mut steps = 0;
        while p >= 0.05 {
            p = recovered(p);
            steps += 1;
        }
        assert_eq!(steps, 8, "intervals from the deepest penalty to none");
    }

    #[test]
    fn population_sigma() {
        let (mean, sigma) = mean_and_sigma(&[0.9, 1.0, 1.0, 0.9]);
        assert!((mean - 0.95).abs() < 1e-12 && (sigma - 0.05).abs() < 1e-12);
    }
}

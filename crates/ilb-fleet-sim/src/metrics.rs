//! What a run measures: latency distributions (TTFT and end-to-end, network included),
//! prefix-cache hit rate, goodput, shed and failed requests, engine utilisation, and from
//! periodic samples of each policy's intended weights, weight churn (traffic moved per period)
//! and oscillation (reversals of each engine's traffic share per hour).

use serde::Serialize;
use std::collections::BTreeMap;

/// Reversals smaller than this fraction of an engine's mean traffic share are noise, not
/// oscillation (zig-zag threshold).
pub const OSCILLATION_THRESHOLD: f64 = 0.1;

/// Seconds after a scenario event whose arrivals count as its transient, unless the event sets
/// `window_s`, is a surge with a duration, or the next event or the end of the run comes first.
pub const TRANSIENT_WINDOW_S: f64 = 60.0;

/// A plan reflects a surge once it has moved this share of the surged clusters' traffic
/// (weighted by their demand just before the surge) away from the plan in force at the surge.
pub const REFLECT_MOVE: f64 = 0.10;

/// A plan reflects a slowdown once the slowed engines' share of traffic (weighted by the demand
/// before the event) has fallen by this fraction of their share at the event.
pub const REFLECT_SHARE_DROP: f64 = 0.25;

/// Traffic has settled at the first plan (at or after the re-plan) followed by
/// [`SETTLE_PLANS`] plans that each move less than this share of traffic from the one before.
pub const SETTLE_MOVE: f64 = 0.01;

/// See [`SETTLE_MOVE`].
pub const SETTLE_PLANS: usize = 5;

#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

impl LatencySummary {
    fn of(values: &mut [f32]) -> LatencySummary {
        if values.is_empty() {
            return LatencySummary::default();
        }
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64;
        values.sort_unstable_by(f32::total_cmp);
        let at = |q: f64| f64::from(values[((values.len() - 1) as f64 * q).round() as usize]);
        LatencySummary { mean, p50: at(0.5), p99: at(0.99) }
    }
}

/// Per-priority counts (the overload scenario checks that low priority is shed first).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PriorityStats {
    pub arrivals: u64,
    pub shed: u64,
    pub shed_rate: f64,
    pub completed: u64,
    pub e2e_p99_ms: f64,
}

/// Completed requests served by one hardware class (a capacity planner's view: which GPUs
/// carried the traffic, and how fast they decoded at the load they were given).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct HardwareStats {
    pub engines: usize,
    pub completed: u64,
    /// Share of all completed requests.
    pub share: f64,
    /// Mean end-to-end latency (network included), engine TTFT and time between tokens, ms.
    pub e2e_mean_ms: f64,
    pub e2e_p99_ms: f64,
    pub engine_ttft_ms: f64,
    pub engine_tbot_ms: f64,
    /// Mean busy fraction of the class's engines.
    pub utilisation_mean: f64,
}

/// Per hardware class: completions, their e2e latencies, sums of engine TTFT (ms), decode ns
/// and tokens.
#[derive(Clone, Debug, Default)]
struct HardwareSums {
    completed: u64,
    e2e: Vec<f32>,
    engine_ttft_ms: f64,
    decode_ns: f64,
    decode_tokens: f64,
}

/// One policy's results. The first fields are the documented JSON contract.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PolicyResult {
    pub e2e_ms: LatencySummary,
    pub ttft_ms: LatencySummary,
    /// Prompt tokens served from the prefix cache / prompt tokens, completed requests.
    pub cache_hit_rate: f64,
    /// Completed requests with TTFT (network included) within the SLO, per measured second.
    pub goodput_rps: f64,
    /// Shed requests / arrivals.
    pub shed_rate: f64,
    /// Requests lost: in flight on an engine that failed, no allowed engine up, or refused.
    pub failed: u64,
    /// Mean share of traffic whose intended engine changed from one sample period to the next.
    pub weight_churn: f64,
    /// Reversals of an engine's traffic-share trend per hour, mean over engines.
    pub oscillation: f64,
    /// `weight_churn` over the sample periods at steady demand only (see
    /// [`crate::workload::steady`]); `None` when the run has none after the warm-up.
    pub steady_churn: Option<f64>,
    /// `oscillation` over the stretches of steady demand only (each stretch's reversals, per
    /// hour of steady demand); `None` as for `steady_churn`.
    pub steady_oscillation: Option<f64>,
    /// The largest share of one stream's traffic (one demand entry of a cluster) whose intended
    /// engine changed from one sample period to the next at steady demand; `None` as for
    /// `steady_churn`. The mean over the fleet (`steady_churn`) can hide a rare large move of
    /// one cluster: an operator watching that cluster sees this one.
    pub steady_largest_move: Option<f64>,
    /// Seconds of steady demand after the warm-up.
    pub steady_s: f64,
    pub arrivals: u64,
    pub completed: u64,
    pub shed: u64,
    pub failed_in_flight: u64,
    pub failed_no_engine: u64,
    pub failed_refused: u64,
    /// Share of follow-up turns served by a different engine than the conversation's previous
    /// turn: each such move pays the whole prefix's prefill again.
    pub session_moves: f64,
    /// Requests of residency-bound classes served by an engine outside their zone.
    pub residency_violations: u64,
    /// Mean busy fraction of engines and its standard deviation across engines.
    pub utilisation_mean: f64,
    pub utilisation_spread: f64,
    /// ilb: the optimizer's predicted mean latency of admitted traffic, mean over the plans
    /// made after the warm-up (each for the demand measured then), each weighted by the
    /// requests completed while it was the latest, as the delivered mean is, ms.
    pub predicted_e2e_ms: Option<f64>,
    /// ilb: the optimizer's prediction at the simulated steady state (the final fleet state
    /// with each class's mean measured demand), ms. Compare with `e2e_ms.mean`.
    pub steady_state_e2e_ms: Option<f64>,
    /// Policies with a control loop: longest time from an engine failure to the first plan
    /// that gives the failed engines no traffic, seconds.
    pub replan_s: Option<f64>,
    /// Engine-side means (no network): TTFT and time between tokens, ms.
    pub engine_ttft_ms: f64,
    pub engine_tbot_ms: f64,
    /// Mean prompt and output tokens of completed requests.
    pub mean_prompt_tokens: f64,
    pub mean_output_tokens: f64,
    pub by_priority: BTreeMap<String, PriorityStats>,
    /// Where the traffic went and how it fared, per hardware class of engine.
    pub by_hardware: BTreeMap<String, HardwareStats>,
    /// One entry per scenario event: how fast the plan followed it and what latency the
    /// requests arriving during it saw.
    pub transients: Vec<TransientStats>,
    /// Whether the policy has a control loop that publishes plans (`feedback`, `ilb`); the
    /// baselines route on the fleet's state directly and have no `replan_s`.
    pub plans: bool,
    #[serde(skip)]
    pub series: Series,
}

/// What one scenario event did to one policy.
///
/// `replan_s` is the time from the event to the first plan installed in the data planes that
/// reflects it: for a failure or an outage, a plan giving the failed engines no traffic; for a
/// recovery, one giving the recovered engines traffic again; for a slowdown, one in which the
/// slowed engines' traffic share fell by [`REFLECT_SHARE_DROP`] of itself (rose, for a
/// speed-up); for a surge, one that moved [`REFLECT_MOVE`] of the surged clusters' traffic.
/// `settle_s` is the time from the event to the plan at which traffic settled (see
/// [`SETTLE_MOVE`]), looked for until the next event or the end of the run. Both are `None`
/// for policies without a control loop and when it never happened.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct TransientStats {
    /// Index into the scenario's `[[events]]`.
    pub event: usize,
    /// The event's kind, as in the scenario (`region_outage`, `slowdown`, `surge`, …).
    pub kind: String,
    pub at_s: f64,
    /// Arrivals in `[at_s, at_s + window_s)` are the transient's.
    pub window_s: f64,
    pub replan_s: Option<f64>,
    pub settle_s: Option<f64>,
    /// Latency of the requests that arrived in the window, ms (network included).
    pub e2e_ms: LatencySummary,
    pub ttft_ms: LatencySummary,
    /// Latency of the requests that arrived in the `window_s` before the event (after the
    /// warm-up), for comparison.
    pub before_e2e_ms: LatencySummary,
    /// Requests that arrived in the window, and those of them shed or lost (lost: no engine,
    /// refused; plus the requests in flight on engines failed by this event).
    pub arrivals: u64,
    pub shed: u64,
    pub failed: u64,
}

/// Accumulates one transient.
#[derive(Clone, Debug, Default)]
struct TransientSums {
    stats: TransientStats,
    e2e: Vec<f32>,
    ttft: Vec<f32>,
    before: Vec<f32>,
}

impl TransientSums {
    fn during(&self, t_s: f64) -> bool {
        t_s >= self.stats.at_s && t_s < self.stats.at_s + self.stats.window_s
    }
    fn just_before(&self, t_s: f64, warmup_s: f64) -> bool {
        t_s >= warmup_s && t_s < self.stats.at_s && t_s >= self.stats.at_s - self.stats.window_s
    }
}

/// Time series for plots.
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub t_s: Vec<f64>,
    /// Mean end-to-end latency of requests finished in each sample period, ms (NaN if none).
    pub e2e_ms: Vec<f64>,
    /// `[sample][engine]` requests in flight.
    pub in_flight: Vec<Vec<f32>>,
    /// `[sample][engine]` intended share of all traffic.
    pub share: Vec<Vec<f32>>,
    /// Per sample: whether demand was steady through the period it ends.
    pub steady: Vec<bool>,
    /// The last sampled weight matrix, `[stream * n_engines + engine]`.
    pub final_weights: Vec<f64>,
}

/// Collects one run's measurements.
#[derive(Debug)]
pub struct Recorder {
    warmup_s: f64,
    slo_ms: f64,
    priorities: Vec<String>,
    stream_priority: Vec<usize>,
    ttft: Vec<f32>,
    e2e: Vec<f32>,
    e2e_by_priority: Vec<Vec<f32>>,
    arrivals_by_priority: Vec<u64>,
    shed_by_priority: Vec<u64>,
    prompt_tokens: u64,
    cached_tokens: u64,
    output_tokens: u64,
    good: u64,
    engine_ttft_sum: f64,
    decode_ns: f64,
    decode_tokens: f64,
    pub result: PolicyResult,
    bin: (f64, u64),
    previous_weights: Option<Vec<f64>>,
    churn: (f64, u64),
    steady_churn: (f64, u64),
    util_sum: Vec<f64>,
    util_samples: u64,
    predicted: (f64, u64),
    hardware_names: Vec<String>,
    /// Per engine: index into `hardware_names`.
    engine_hardware: Vec<usize>,
    hardware: Vec<HardwareSums>,
    /// Follow-up turns routed, and those routed to another engine than the turn before.
    follow_ups: (u64, u64),
    transients: Vec<TransientSums>,
}

/// One finished request.
pub struct Completion {
    pub stream: usize,
    /// When the request was routed (reached the engine), seconds.
    pub arrived_s: f64,
    pub engine: usize,
    pub finished_s: f64,
    pub ttft_ms: f64,
    pub e2e_ms: f64,
    pub engine_ttft_ms: f64,
    pub decode_ns: f64,
    pub output_tokens: u32,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
}

impl Recorder {
    /// `engine_hardware` names each engine's hardware class.
    pub fn new(
        warmup_s: f64,
        slo_ms: f64,
        stream_priority_names: &[String],
        engine_hardware: &[&str],
    ) -> Recorder {
        let n_engines = engine_hardware.len();
        let mut hardware_names: Vec<String> = engine_hardware.iter().map(|h| h.to_string()).collect();
        hardware_names.sort();
        hardware_names.dedup();
        let engine_hardware: Vec<usize> =
            engine_hardware.iter().map(|h| hardware_names.iter().position(|n| n == h).unwrap_or(0)).collect();
        let mut priorities: Vec<String> = stream_priority_names.to_vec();
        priorities.sort();
        priorities.dedup();
        let stream_priority = stream_priority_names
            .iter()
            .map(|p| priorities.iter().position(|q| q == p).unwrap_or(0))
            .collect();
        let n = priorities.len();
        Recorder {
            warmup_s,
            slo_ms,
            priorities,
            stream_priority,
            ttft: Vec::new(),
            e2e: Vec::new(),
            e2e_by_priority: vec![Vec::new(); n],
            arrivals_by_priority: vec![0; n],
            shed_by_priority: vec![0; n],
            prompt_tokens: 0,
            cached_tokens: 0,
            output_tokens: 0,
            good: 0,
            engine_ttft_sum: 0.0,
            decode_ns: 0.0,
            decode_tokens: 0.0,
            result: PolicyResult::default(),
            bin: (0.0, 0),
            previous_weights: None,
            churn: (0.0, 0),
            steady_churn: (0.0, 0),
            util_sum: vec![0.0; n_engines],
            util_samples: 0,
            predicted: (0.0, 0),
            hardware: vec![HardwareSums::default(); hardware_names.len()],
            follow_ups: (0, 0),
            transients: Vec::new(),
            hardware_names,
            engine_hardware,
        }
    }

    fn measured(&self, t_s: f64) -> bool {
        t_s >= self.warmup_s
    }

    /// Declares the transient of scenario event `event` (in the order of the events).
    pub fn add_transient(&mut self, event: usize, kind: &str, at_s: f64, window_s: f64) {
        self.transients.push(TransientSums {
            stats: TransientStats {
                event,
                kind: kind.to_owned(),
                at_s,
                window_s,
                ..TransientStats::default()
            },
            ..TransientSums::default()
        });
    }

    /// The plan timing of transient `i` (index in the order declared).
    pub fn transient_plan(&mut self, i: usize, replan_s: Option<f64>, settle_s: Option<f64>) {
        if let Some(t) = self.transients.get_mut(i) {
            t.stats.replan_s = replan_s;
            t.stats.settle_s = settle_s;
        }
    }

    /// `n` requests in flight were lost to scenario event `event`.
    pub fn transient_lost(&mut self, event: usize, n: u64) {
        for t in self.transients.iter_mut().filter(|t| t.stats.event == event) {
            t.stats.failed += n;
        }
    }

    fn transient_count(&mut self, t_s: f64, arrival: bool, shed: bool, failed: bool) {
        for t in self.transients.iter_mut().filter(|t| t.during(t_s)) {
            t.stats.arrivals += u64::from(arrival);
            t.stats.shed += u64::from(shed);
            t.stats.failed += u64::from(failed);
        }
    }

    pub fn arrival(&mut self, stream: usize, t_s: f64) {
        self.transient_count(t_s, true, false, false);
        if self.measured(t_s) {
            self.result.arrivals += 1;
            self.arrivals_by_priority[self.stream_priority[stream]] += 1;
        }
    }

    pub fn shed(&mut self, stream: usize, t_s: f64) {
        self.transient_count(t_s, false, true, false);
        if self.measured(t_s) {
            self.result.shed += 1;
            self.shed_by_priority[self.stream_priority[stream]] += 1;
        }
    }

    pub fn no_engine(&mut self, t_s: f64) {
        self.transient_count(t_s, false, false, true);
        if self.measured(t_s) {
            self.result.failed_no_engine += 1;
        }
    }

    pub fn refused(&mut self, t_s: f64) {
        self.transient_count(t_s, false, false, true);
        if self.measured(t_s) {
            self.result.failed_refused += 1;
        }
    }

    /// Requests lost when their engine failed are counted whenever it happens.
    pub fn failed_in_flight(&mut self, n: u64) {
        self.result.failed_in_flight += n;
    }

    /// A follow-up turn was routed; `moved` if to another engine than the previous turn.
    pub fn follow_up(&mut self, t_s: f64, moved: bool) {
        if self.measured(t_s) {
            self.follow_ups.0 += 1;
            self.follow_ups.1 += u64::from(moved);
        }
    }

    pub fn residency_violation(&mut self) {
        self.result.residency_violations += 1;
    }

    pub fn complete(&mut self, c: &Completion) {
        self.bin.0 += c.e2e_ms;
        self.bin.1 += 1;
        let warmup_s = self.warmup_s;
        for t in &mut self.transients {
            if t.during(c.arrived_s) {
                t.e2e.push(c.e2e_ms as f32);
                t.ttft.push(c.ttft_ms as f32);
            } else if t.just_before(c.arrived_s, warmup_s) {
                t.before.push(c.e2e_ms as f32);
            }
        }
        if !self.measured(c.finished_s) {
            return;
        }
        self.result.completed += 1;
        self.ttft.push(c.ttft_ms as f32);
        self.e2e.push(c.e2e_ms as f32);
        self.e2e_by_priority[self.stream_priority[c.stream]].push(c.e2e_ms as f32);
        self.prompt_tokens += u64::from(c.prompt_tokens);
        self.cached_tokens += u64::from(c.cached_tokens);
        self.output_tokens += u64::from(c.output_tokens);
        self.good += u64::from(c.ttft_ms <= self.slo_ms);
        self.engine_ttft_sum += c.engine_ttft_ms;
        let hw = &mut self.hardware[self.engine_hardware[c.engine]];
        hw.completed += 1;
        hw.e2e.push(c.e2e_ms as f32);
        hw.engine_ttft_ms += c.engine_ttft_ms;
        if c.output_tokens > 1 {
            self.decode_ns += c.decode_ns;
            self.decode_tokens += f64::from(c.output_tokens - 1);
            hw.decode_ns += c.decode_ns;
            hw.decode_tokens += f64::from(c.output_tokens - 1);
        }
    }

    /// A periodic sample: `weights` stream-major, `demand` per stream (the scenario's curve),
    /// `utilisation` per engine over the period, `steady` whether the scenario's demand and
    /// fleet were steady through the period.
    #[allow(clippy::too_many_arguments)]
    pub fn sample(
        &mut self,
        t_s: f64,
        in_flight: &[u32],
        weights: Vec<f64>,
        demand: &[f64],
        utilisation: &[f64],
        predicted_ms: Option<f64>,
        steady: bool,
    ) {
        let n = in_flight.len();
        let series = &mut self.result.series;
        series.t_s.push(t_s);
        series.e2e_ms.push(if self.bin.1 > 0 { self.bin.0 / self.bin.1 as f64 } else { f64::NAN });
        let completed = std::mem::take(&mut self.bin).1;
        series.in_flight.push(in_flight.iter().map(|&x| x as f32).collect());
        let total: f64 = demand.iter().sum();
        let mut share = vec![0f32; n];
        if total > 0.0 {
            for (row, d) in weights.chunks(n).zip(demand) {
                for (s, w) in share.iter_mut().zip(row) {
                    *s += (w * d / total) as f32;
                }
            }
        }
        series.share.push(share);
        let measured = t_s >= self.warmup_s;
        series.steady.push(measured && steady);
        if let (true, Some(previous)) = (measured, &self.previous_weights) {
            if total > 0.0 {
                let (mut moved, mut largest) = (0.0, 0.0f64);
                for ((now, before), &d) in weights.chunks(n).zip(previous.chunks(n)).zip(demand) {
                    let share = 0.5 * now.iter().zip(before).map(|(a, b)| (a - b).abs()).sum::<f64>();
                    moved += d * share;
                    if d > 0.0 {
                        largest = largest.max(share);
                    }
                }
                self.churn.0 += moved / total;
                self.churn.1 += 1;
                if steady {
                    self.steady_churn.0 += moved / total;
                    self.steady_churn.1 += 1;
                    let r = &mut self.result;
                    r.steady_largest_move = Some(r.steady_largest_move.unwrap_or(0.0).max(largest));
                }
            }
        }
        if measured {
            for (sum, u) in self.util_sum.iter_mut().zip(utilisation) {
                *sum += u;
            }
            self.util_samples += 1;
            // Weighted by the requests completed in the period, as the delivered mean is.
            if let Some(p) = predicted_ms {
                self.predicted.0 += p * completed as f64;
                self.predicted.1 += completed;
            }
        }
        self.previous_weights = Some(weights);
    }

    pub fn finish(mut self, duration_s: f64, replan_s: Option<f64>) -> PolicyResult {
        let window = (duration_s - self.warmup_s).max(1e-9);
        let r = &mut self.result;
        r.ttft_ms = LatencySummary::of(&mut self.ttft);
        r.e2e_ms = LatencySummary::of(&mut self.e2e);
        r.cache_hit_rate =
            if self.prompt_tokens > 0 { self.cached_tokens as f64 / self.prompt_tokens as f64 } else { 0.0 };
        r.goodput_rps = self.good as f64 / window;
        r.shed_rate = if r.arrivals > 0 { r.shed as f64 / r.arrivals as f64 } else { 0.0 };
        r.failed = r.failed_in_flight + r.failed_no_engine + r.failed_refused;
        r.session_moves =
            if self.follow_ups.0 > 0 { self.follow_ups.1 as f64 / self.follow_ups.0 as f64 } else { 0.0 };
        r.weight_churn = if self.churn.1 > 0 { self.churn.0 / self.churn.1 as f64 } else { 0.0 };
        r.replan_s = replan_s;
        r.predicted_e2e_ms = (self.predicted.1 > 0).then(|| self.predicted.0 / self.predicted.1 as f64);
        if r.completed > 0 {
            r.engine_ttft_ms = self.engine_ttft_sum / r.completed as f64;
            r.mean_prompt_tokens = self.prompt_tokens as f64 / r.completed as f64;
            r.mean_output_tokens = self.output_tokens as f64 / r.completed as f64;
        }
        r.engine_tbot_ms =
            if self.decode_tokens > 0.0 { self.decode_ns / self.decode_tokens / 1e6 } else { 0.0 };
        let utils: Vec<f64> = self.util_sum.iter().map(|s| s / self.util_samples.max(1) as f64).collect();
        if self.util_samples > 0 {
            let mean = utils.iter().sum::<f64>() / utils.len().max(1) as f64;
            let var = utils.iter().map(|u| (u - mean).powi(2)).sum::<f64>() / utils.len().max(1) as f64;
            r.utilisation_mean = mean;
            r.utilisation_spread = var.sqrt();
        }
        for (h, (name, sums)) in self.hardware_names.iter().zip(&mut self.hardware).enumerate() {
            let members: Vec<f64> = (self.engine_hardware.iter().zip(&utils))
                .filter(|(&eh, _)| eh == h)
                .map(|(_, &u)| u)
                .collect();
            let per = |sum: f64, n: f64| if n > 0.0 { sum / n } else { 0.0 };
            let n = sums.completed as f64;
            let e2e = LatencySummary::of(&mut sums.e2e);
            r.by_hardware.insert(
                name.clone(),
                HardwareStats {
                    engines: members.len(),
                    completed: sums.completed,
                    share: per(n, r.completed as f64),
                    e2e_mean_ms: e2e.mean,
                    e2e_p99_ms: e2e.p99,
                    engine_ttft_ms: per(sums.engine_ttft_ms, n),
                    engine_tbot_ms: per(sums.decode_ns / 1e6, sums.decode_tokens),
                    utilisation_mean: per(members.iter().sum(), members.len() as f64),
                },
            );
        }
        for (p, name) in self.priorities.iter().enumerate() {
            let mut e2e = std::mem::take(&mut self.e2e_by_priority[p]);
            let (arrivals, shed) = (self.arrivals_by_priority[p], self.shed_by_priority[p]);
            r.by_priority.insert(
                name.clone(),
                PriorityStats {
                    arrivals,
                    shed,
                    shed_rate: if arrivals > 0 { shed as f64 / arrivals as f64 } else { 0.0 },
                    completed: e2e.len() as u64,
                    e2e_p99_ms: LatencySummary::of(&mut e2e).p99,
                },
            );
        }
        r.transients = self
            .transients
            .iter_mut()
            .map(|t| {
                let mut stats = t.stats.clone();
                stats.e2e_ms = LatencySummary::of(&mut t.e2e);
                stats.ttft_ms = LatencySummary::of(&mut t.ttft);
                stats.before_e2e_ms = LatencySummary::of(&mut t.before);
                stats
            })
            .collect();
        let first_measured = r.series.t_s.iter().position(|&t| t >= self.warmup_s).unwrap_or(0);
        let shares = &r.series.share[first_measured..];
        r.oscillation = oscillation(shares, std::slice::from_ref(&(0..shares.len())), window / 3600.0);
        // Stretches of steady samples; a stretch's first sample ends a period that was steady,
        // but the share it starts from is that of the sample before, so each stretch begins
        // one sample earlier.
        let steady = &r.series.steady[first_measured..];
        let t = &r.series.t_s[first_measured..];
        let (mut stretches, mut steady_s, mut at) = (Vec::new(), 0.0, 0);
        for run in steady.chunk_by(|a, b| a == b) {
            let end = at + run.len();
            if run[0] {
                let from = at.saturating_sub(1);
                steady_s += t[end - 1] - t[from];
                stretches.push(from..end);
            }
            at = end;
        }
        r.steady_s = steady_s;
        r.steady_churn = (self.steady_churn.1 > 0).then(|| self.steady_churn.0 / self.steady_churn.1 as f64);
        r.steady_oscillation = (steady_s > 0.0).then(|| oscillation(shares, &stretches, steady_s / 3600.0));
        r.series.final_weights = self.previous_weights.take().unwrap_or_default();
        self.result
    }
}

/// Mean over engines of the reversals per hour of each engine's share series within
/// `stretches` (ranges of `share`, each counted on its own; `hours` is their total length),
/// counting a reversal only once the share moved back by more than [`OSCILLATION_THRESHOLD`] ×
/// its mean share over all of `share` (a zig-zag filter, so sampling noise is not oscillation).
pub fn oscillation(share: &[Vec<f32>], stretches: &[std::ops::Range<usize>], hours: f64) -> f64 {
    let Some(first) = share.first() else { return 0.0 };
    let n = first.len();
    let mut total = 0.0;
    let mut engines = 0usize;
    for j in 0..n {
        let series: Vec<f64> = share.iter().map(|row| f64::from(row[j])).collect();
        let mean = series.iter().sum::<f64>() / series.len() as f64;
        if mean <= 1e-9 {
            continue;
        }
        engines += 1;
        total += stretches
            .iter()
            .map(|r| reversals(&series[r.clone()], OSCILLATION_THRESHOLD * mean) as f64)
            .sum::<f64>();
    }
    if engines == 0 || hours <= 0.0 {
        0.0
    } else {
        total / engines as f64 / hours
    }
}

/// Zig-zag reversals of `series` with threshold `h`.
pub fn reversals(series: &[f64], h: f64) -> u32 {
    let Some(&start) = series.first() else { return 0 };
    let (mut extreme, mut direction, mut count) = (start, 0i8, 0u32);
    for &x in &series[1..] {
        match direction {
            0 => {
                if x >= extreme + h {
                    direction = 1;
                    extreme = x;
                } else if x <= extreme - h {
                    direction = -1;
                    extreme = x;
                }
            }
            1 => {
                if x > extreme {
                    extreme = x;
                } else if extreme - x >= h {
                    count += 1;
                    direction = -1;
                    extreme = x;
                }
            }
            _ => {
                if x < extreme {
                    extreme = x;
                } else if x - extreme >= h {
                    count += 1;
                    direction = 1;
                    extreme = x;
                }
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_ignores_noise_and_counts_swings() {
        let noisy: Vec<f64> = (0..100).map(|i| 1.0 + if i % 2 == 0 { 0.01 } else { -0.01 }).collect();
        assert_eq!(reversals(&noisy, 0.1), 0);
        let swinging: Vec<f64> = (0..100).map(|i| if (i / 5) % 2 == 0 { 1.0 } else { 1.5 }).collect();
        assert_eq!(reversals(&swinging, 0.1), 18);
    }

    /// Two engines, one stream of 10 req/s, a sample every 2 s from a 10-s warm-up: the weights
    /// swing between the engines until t = 30 s, demand is steady from the period after, and the
    /// weights move by 1 % once at steady demand. Only that move counts at steady demand, and
    /// the swings do not.
    #[test]
    fn steady_figures_count_only_the_steady_periods() {
        let mut r = Recorder::new(10.0, 1000.0, &["normal".to_owned()], &["h", "h"]);
        for i in 0..=30 {
            let t = f64::from(i) * 2.0;
            let w = match t {
                t if t < 30.0 => [f64::from(i % 2), f64::from(1 - i % 2)],
                t if t < 44.0 => [0.5, 0.5],
                _ => [0.51, 0.49],
            };
            r.sample(t, &[0, 0], w.to_vec(), &[10.0], &[0.5, 0.5], None, t >= 32.0);
        }
        let result = r.finish(60.0, None);
        // 15 periods from t = 30 to 60 at steady demand, one of them moving 1 %.
        assert!((result.steady_churn.unwrap() - 0.01 / 15.0).abs() < 1e-12);
        assert_eq!(result.steady_s, 30.0);
        assert_eq!(result.steady_oscillation, Some(0.0));
        assert!(result.weight_churn > 0.3 && result.oscillation > 100.0);
        assert!((result.steady_largest_move.unwrap() - 0.01).abs() < 1e-12);
    }

    /// A small stream that moves a fifth of its traffic once at steady demand shows in the
    /// largest move, while the fleet-wide churn (weighted by demand) stays small; moves before
    /// demand is steady do not count.
    #[test]
    fn the_largest_move_is_per_stream() {
        let mut r = Recorder::new(0.0, 1000.0, &["normal".to_owned()], &["h", "h"]);
        for i in 0..=10 {
            let t = f64::from(i) * 2.0;
            let big = if i < 3 { [f64::from(i % 2), f64::from(1 - i % 2)] } else { [0.5, 0.5] };
            let small = if i < 8 { [1.0, 0.0] } else { [0.8, 0.2] };
            let weights = [big, small].concat();
            r.sample(t, &[0, 0], weights, &[90.0, 10.0], &[0.5, 0.5], None, i >= 4);
        }
        let result = r.finish(20.0, None);
        assert!((result.steady_largest_move.unwrap() - 0.2).abs() < 1e-12);
        // One move of 0.2 × 10 of 100 req/s over the 7 steady periods.
        assert!((result.steady_churn.unwrap() - 0.02 / 7.0).abs() < 1e-12);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<f32> = (1..=100).map(|x| x as f32).collect();
        let s = LatencySummary::of(&mut v);
        assert_eq!(s.mean, 50.5);
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.p50, 51.0);
    }
}

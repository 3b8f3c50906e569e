//! The workload: demand over time per stream (constant or diurnal curves shifted by the
//! cluster's time zone, step changes, surges) and conversations whose turns share a growing
//! prefix. Each session draws from its own small generator seeded by the scenario seed and the
//! session id, so every policy sees the same sessions with the same token ids and lengths.

use crate::scenario::{CurveKind, EventKind, LengthDist, LengthSpec, Scenario, WorkloadSpec};
use std::sync::Arc;

/// Request rate of `stream` at `t_s` seconds, requests/s (turns of all sessions).
pub fn demand_rps(scenario: &Scenario, stream: usize, t_s: f64) -> f64 {
    let s = &scenario.streams[stream];
    let d = &s.demand;
    let shape = match d.curve {
        CurveKind::Constant => 1.0,
        CurveKind::Diurnal => {
            let file = &scenario.file;
            let hour = file.start_utc_hour + t_s / file.day_length_s * 24.0 + s.utc_offset_h;
            let phase = (hour - d.peak_local_hour) / 24.0 * std::f64::consts::TAU;
            1.0 + d.amplitude * phase.cos()
        }
    };
    let step = d.steps.iter().rfind(|step| step.at_s <= t_s).map_or(1.0, |step| step.factor);
    let cluster = &scenario.clusters[s.cluster].0;
    let surge: f64 = scenario
        .file
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Surge && e.at_s <= t_s)
        .filter(|e| e.duration_s.is_none_or(|d| t_s < e.at_s + d))
        .filter(|e| e.cluster.as_ref().is_none_or(|c| c == cluster))
        .map(|e| e.factor.unwrap_or(1.0))
        .product();
    (d.rps * shape * step * surge).max(0.0)
}

/// How long after a change of the scenario (an event, a surge's end, a demand step) its demand
/// is not yet steady: the planner's demand estimate needs about three smoothing time constants
/// (15 s at the default 5 s) to take a step, and a plan one solve and one pull more.
pub const STEADY_AFTER_S: f64 = 30.0;

/// A stream's demand is steady while it moved by at most this share over the last
/// [`STEADY_AFTER_S`] (a diurnal curve: near its peak and trough).
pub const STEADY_DEMAND_CHANGE: f64 = 0.05;

/// Whether the scenario's demand and fleet were steady through the [`STEADY_AFTER_S`] before
/// `t_s`: no event, surge end or demand step in that time, and every stream's demand within
/// [`STEADY_DEMAND_CHANGE`] of what it was at its start. Weight churn and oscillation at steady
/// demand are the planner's reaction to measurement noise alone.
pub fn steady(scenario: &Scenario, t_s: f64) -> bool {
    let since = t_s - STEADY_AFTER_S;
    if since < 0.0 {
        return false;
    }
    let file = &scenario.file;
    let events = file.events.iter().flat_map(|e| {
        let end = (e.kind == EventKind::Surge).then(|| e.duration_s.map(|d| e.at_s + d)).flatten();
        std::iter::once(e.at_s).chain(end)
    });
    let steps = scenario.streams.iter().flat_map(|s| s.demand.steps.iter().map(|step| step.at_s));
    if events.chain(steps).any(|at| at > since && at <= t_s) {
        return false;
    }
    (0..scenario.streams.len()).all(|s| {
        let (before, now) = (demand_rps(scenario, s, since), demand_rps(scenario, s, t_s));
        (now - before).abs() <= STEADY_DEMAND_CHANGE * now.max(before)
    })
}

/// SplitMix64: a tiny, fast, seedable generator for per-session draws.
#[derive(Clone, Copy, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }

    pub fn length(&mut self, spec: &LengthSpec) -> u32 {
        let raw = match spec.dist {
            LengthDist::Fixed => spec.mean,
            LengthDist::Uniform => spec.min as f64 + self.next_f64() * (spec.max - spec.min + 1) as f64,
            LengthDist::Exponential => self.exp(spec.mean),
        };
        (raw.floor() as u32).clamp(spec.min, spec.max)
    }
}

/// One conversation, carried from turn to turn.
#[derive(Clone, Debug)]
pub struct Session {
    pub id: u64,
    pub stream: usize,
    /// `ilb_core::stable_hash` of the session id: the affinity key.
    pub key_hash: u64,
    /// This turn's prompt (system prompt + every earlier turn + this turn's user tokens).
    pub prompt: Arc<[u32]>,
    /// This turn's output length.
    pub output_tokens: u32,
    /// 0 for the first turn.
    pub turn: u32,
    /// The simulator engine that served the previous turn.
    pub last_engine: Option<usize>,
    rng: SplitMix,
}

/// The token ids of a model's shared system prompt.
fn system_token(model: usize, i: u32) -> u32 {
    let mut g = SplitMix(((model as u64) << 32) | u64::from(i));
    g.next_u64() as u32
}

impl Session {
    /// The first turn of session `id` of `stream`.
    pub fn start(seed: u64, id: u64, stream: usize, model: usize, w: &WorkloadSpec) -> Session {
        let mut rng = SplitMix(seed ^ id.wrapping_mul(0xd134_2543_de82_ef95));
        let user = rng.length(&w.first_prompt_tokens);
        let mut prompt = Vec::with_capacity((w.system_prompt_tokens + user) as usize);
        prompt.extend((0..w.system_prompt_tokens).map(|i| system_token(model, i)));
        prompt.extend((0..user).map(|_| rng.next_u64() as u32));
        let output_tokens = rng.length(&w.output_tokens);
        Session {
            id,
            stream,
            key_hash: ilb_core::stable_hash(&id.to_le_bytes()),
            prompt: prompt.into(),
            output_tokens,
            turn: 0,
            last_engine: None,
            rng,
        }
    }

    /// After this turn finished: the next turn (prompt + output + new user tokens) and the think
    /// time before it, seconds; `None` when the conversation ends.
    pub fn next_turn(mut self: Box<Self>, w: &WorkloadSpec) -> Option<(Box<Session>, f64)> {
        let continue_probability = 1.0 - 1.0 / w.turns_mean;
        if self.rng.next_f64() >= continue_probability {
            return None;
        }
        let user = self.rng.length(&w.followup_tokens);
        let output_tokens = self.rng.length(&w.output_tokens);
        let len = self.prompt.len() + self.output_tokens as usize + user as usize;
        if len + output_tokens as usize > w.max_context_tokens as usize {
            return None;
        }
        let mut prompt = Vec::with_capacity(len);
        prompt.extend_from_slice(&self.prompt);
        prompt.extend((0..self.output_tokens + user).map(|_| self.rng.next_u64() as u32));
        let think = self.rng.exp(w.think_s);
        self.prompt = prompt.into();
        self.output_tokens = output_tokens;
        self.turn += 1;
        Some((self, think))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Demand is steady from 30 s after the start and after every change: the surge's start
    /// (t = 100) and end (150), a demand step (300).
    #[test]
    fn steady_demand_excludes_the_changes_and_what_follows_them() {
        let scenario = Scenario::from_toml(
            r#"
name = "t"
duration_s = 400
warmup_s = 10
[[regions]]
id = "r"
lat = 0.0
lon = 0.0
[[clusters]]
id = "a"
region = "r"
demand = [{ rps = 10.0, steps = [{ at_s = 300.0, factor = 2.0 }] }]
[[engines]]
group = "g"
region = "r"
count = 1
hardware = "h100"
[[events]]
at_s = 100.0
kind = "surge"
cluster = "a"
factor = 2.0
duration_s = 50.0
"#,
        )
        .unwrap();
        let steady: Vec<u32> =
            (0..=40).map(|i| i * 10).filter(|&t| steady(&scenario, f64::from(t))).collect();
        let expected: Vec<u32> = [(30, 90), (130, 140), (180, 290), (330, 400)]
            .iter()
            .flat_map(|&(from, to)| (from..=to).step_by(10))
            .collect();
        assert_eq!(steady, expected);
    }
}

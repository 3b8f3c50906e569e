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

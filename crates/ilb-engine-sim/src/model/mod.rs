//! The engine model: a deterministic continuous-batching state machine with a prefix KV cache.
//!
//! No clock, no IO, no randomness: time comes in as nanoseconds ([`Nanos`]) on every call, so
//! the same code runs in real time (the HTTP simulator's driver task) and in virtual time (a
//! fleet simulator's event loop). See the crate README for the model as math.
//!
//! Two drivers:
//! - **real time**: [`EngineModel::submit`], then [`EngineModel::step_until`] with the current
//!   time, which completes finished iterations and reports every produced token
//!   ([`TokenEvent`]); sleep until [`EngineModel::next_event_time`] and repeat.
//! - **virtual time**: [`EngineModel::advance_until`], which jumps over runs of identical decode
//!   iterations in O(batch) per run and reports one [`Outcome`] per finished request.

mod kv;
mod replica;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

pub use kv::{block_hashes, blocks_for, BLOCK_TOKENS};
pub use replica::Counters;

use crate::profile::{HardwareProfile, ProfileError};
use replica::{Replica, Seq};

/// Time in nanoseconds since an arbitrary epoch chosen by the driver.
pub type Nanos = u64;

/// A request as the model sees it.
#[derive(Clone, Debug)]
pub struct Request {
    /// Caller-chosen id, unique among the requests live in this model.
    pub id: u64,
    /// Prompt token ids (after the chat template).
    pub prompt: Arc<[u32]>,
    /// Tokens to generate; the request finishes after exactly this many (>= 1).
    pub max_output_tokens: u32,
}

/// One token produced by a completed iteration (real-time driver only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenEvent {
    pub id: u64,
    /// End of the iteration that produced the token.
    pub at: Nanos,
    /// 1-based index of the token in the output: 1 is the first token.
    pub index: u32,
    /// This was the last token of the request.
    pub finished: bool,
}

/// What happened to one finished request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub id: u64,
    /// Replica that served it.
    pub replica: u32,
    pub arrival: Nanos,
    pub first_token_at: Nanos,
    pub finished_at: Nanos,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u32,
    /// Times the request was preempted (and recomputed).
    pub preemptions: u32,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("request needs {needed} KV tokens but a replica holds {capacity}")]
    TooLong { needed: u64, capacity: u64 },
    #[error("request has an empty prompt")]
    EmptyPrompt,
    #[error("request id {0} is already live")]
    DuplicateId(u64),
}

/// Snapshot of the model's state and cumulative counters, summed over replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ModelStats {
    pub running: usize,
    pub waiting: usize,
    /// Blocks referenced by sequences / all blocks, 0..=1.
    pub kv_usage: f64,
    pub replicas: usize,
    pub ready_replicas: usize,
    pub counters: Counters,
}

/// Iteration cost in integer nanoseconds, so that a run of `k` identical iterations lasts
/// exactly `k` times one of them (what makes jumping exact).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Costs {
    base_ns: u64,
    prefill_token_ns: u64,
    decode_seq_ns: u64,
    slowdown: f64,
}

impl Costs {
    fn from_profile(profile: &HardwareProfile) -> Self {
        Self {
            base_ns: (profile.iteration_base_ms * 1e6).round() as u64,
            prefill_token_ns: (profile.prefill_token_us * 1e3).round() as u64,
            decode_seq_ns: (profile.decode_seq_us * 1e3).round() as u64,
            slowdown: 1.0,
        }
    }

    /// `base + prefill_token·prefill_tokens + decode_seq·decoding`, times the slowdown.
    pub fn iteration(&self, prefill_tokens: u32, decoding: u32) -> Nanos {
        let raw = self.base_ns
            + self.prefill_token_ns * u64::from(prefill_tokens)
            + self.decode_seq_ns * u64::from(decoding);
        let scaled = if self.slowdown == 1.0 { raw } else { (raw as f64 * self.slowdown).round() as u64 };
        scaled.max(1)
    }
}

/// An engine: `profile.replicas` independent replicas behind one endpoint.
#[derive(Debug)]
pub struct EngineModel {
    replicas: Vec<Replica>,
    ready_replicas: usize,
    costs: Costs,
    /// Replica of each live request, for abort.
    location: HashMap<u64, u32>,
    kv_tokens_per_replica: u64,
}

impl EngineModel {
    pub fn new(profile: &HardwareProfile) -> Result<Self, ProfileError> {
        profile.validate()?;
        let replicas = (0..profile.replicas)
            .map(|_| Replica::new(profile.kv_blocks, profile.max_num_seqs, profile.max_num_batched_tokens))
            .collect::<Vec<_>>();
        Ok(Self {
            ready_replicas: replicas.len(),
            replicas,
            costs: Costs::from_profile(profile),
            location: HashMap::new(),
            kv_tokens_per_replica: u64::from(profile.kv_blocks) * u64::from(BLOCK_TOKENS),
        })
    }

    /// Multiplies every iteration planned from now on by `factor` (> 0; others are ignored).
    pub fn set_slowdown(&mut self, factor: f64) {
        if factor.is_finite() && factor > 0.0 {
            self.costs.slowdown = factor;
        }
    }

    /// New requests go only to the first `ready` replicas (clamped to the replica count);
    /// requests already on other replicas finish there.
    pub fn set_ready_replicas(&mut self, ready: usize) {
        self.ready_replicas = ready.min(self.replicas.len());
    }

    pub fn ready_replicas(&self) -> usize {
        self.ready_replicas
    }

    /// Queues a request arriving at `now`. Among the ready replicas at most a quarter (plus two
    /// requests) busier than the least loaded, it goes to the one holding the longest cached
    /// prefix of its prompt, then the least loaded, then the lowest index. With zero
    /// ready replicas it is refused by the caller (the model still queues it on replica 0).
    pub fn submit(&mut self, now: Nanos, request: Request) -> Result<(), SubmitError> {
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        let max_output = request.max_output_tokens.max(1);
        let needed = request.prompt.len() as u64 + u64::from(max_output);
        if needed > self.kv_tokens_per_replica {
            return Err(SubmitError::TooLong { needed, capacity: self.kv_tokens_per_replica });
        }
        if self.location.contains_key(&request.id) {
            return Err(SubmitError::DuplicateId(request.id));
        }
        let hashes: Arc<[u64]> = block_hashes(&request.prompt).into();
        let candidates = self.ready_replicas.max(1);
        // Cache-aware with a balance guard (as SGLang's router does): the longest cached prefix
        // wins among replicas not much busier than the least loaded one, so a shared system
        // prompt cannot pin all traffic to the replica that cached it first.
        let load_of = |r: &Replica| r.running.len() + r.waiting.len();
        let min_load = self.replicas.iter().take(candidates).map(load_of).min().unwrap_or(0);
        let max_allowed = min_load + min_load / 4 + 2;
        let mut best = 0usize;
        let mut best_key: Option<(u32, usize)> = None;
        for (index, replica) in self.replicas.iter().take(candidates).enumerate() {
            let load = load_of(replica);
            if load > max_allowed {
                continue;
            }
            let hit = replica.kv.match_prefix(&hashes).blocks;
            let better = match best_key {
                None => true,
                Some((best_hit, best_load)) => hit > best_hit || (hit == best_hit && load < best_load),
            };
            if better {
                best = index;
                best_key = Some((hit, load));
            }
        }
        let seq = Seq {
            id: request.id,
            arrival: now,
            prompt_len: request.prompt.len() as u32,
            max_output,
            hashes,
            generated: 0,
            kv_len: 0,
            held: Vec::new(),
            private_blocks: 0,
            cached_tokens: 0,
            admitted_once: false,
            first_token_at: None,
            planned_prefill: 0,
            planned_decode: false,
            preemptions: 0,
        };
        self.replicas[best].enqueue(now, seq);
        self.location.insert(request.id, best as u32);
        Ok(())
    }

    /// Drops a live request (client went away). Returns whether it was live.
    pub fn abort(&mut self, id: u64) -> bool {
        match self.location.remove(&id) {
            Some(replica) => self.replicas[replica as usize].abort(id),
            None => false,
        }
    }

    /// Virtual-time driver: completes every iteration ending at or before `t`, plans every
    /// iteration starting at or before `t`, jumping over runs of identical decode iterations.
    /// Appends one [`Outcome`] per request finished.
    pub fn advance_until(&mut self, t: Nanos, out: &mut Vec<Outcome>) {
        self.run_until(t, true, None, out);
    }

    /// Real-time driver: like [`Self::advance_until`] but one iteration at a time, appending
    /// every produced token to `tokens`.
    pub fn step_until(&mut self, t: Nanos, tokens: &mut Vec<TokenEvent>, out: &mut Vec<Outcome>) {
        self.run_until(t, false, Some(tokens), out);
    }

    fn run_until(
        &mut self,
        t: Nanos,
        jumps: bool,
        mut tokens: Option<&mut Vec<TokenEvent>>,
        out: &mut Vec<Outcome>,
    ) {
        let first_new = out.len();
        for (index, replica) in self.replicas.iter_mut().enumerate() {
            replica.run_until(t, jumps, &self.costs, tokens.as_deref_mut(), out, index as u32);
        }
        for outcome in &out[first_new..] {
            self.location.remove(&outcome.id);
        }
    }

    /// Virtual time: a time no request finishes before (so `advance_until` of it is the next
    /// useful step of an event loop), or `None` when idle. During a run of identical decode
    /// iterations it is the end of the run, not the next iteration's.
    pub fn next_event_time(&self) -> Option<Nanos> {
        self.replicas.iter().filter_map(|replica| replica.next_event_time(&self.costs)).min()
    }

    /// Real time: the next iteration boundary (an end, or a start), or `None` when idle. A
    /// driver calls `step_until` then, to stream each token when its iteration ends.
    pub fn next_iteration_time(&self) -> Option<Nanos> {
        self.replicas.iter().filter_map(Replica::next_iteration_time).min()
    }

    /// Requests in running batches.
    pub fn running(&self) -> usize {
        self.replicas.iter().map(|replica| replica.running.len()).sum()
    }

    /// Requests waiting for admission.
    pub fn waiting(&self) -> usize {
        self.replicas.iter().map(|replica| replica.waiting.len()).sum()
    }

    /// Live requests (running or waiting).
    pub fn live(&self) -> usize {
        self.location.len()
    }

    pub fn stats(&self) -> ModelStats {
        let mut counters = Counters::default();
        let (mut used, mut total) = (0u64, 0u64);
        for replica in &self.replicas {
            let c = &replica.counters;
            counters.prefix_queries_tokens += c.prefix_queries_tokens;
            counters.prefix_hits_tokens += c.prefix_hits_tokens;
            counters.prompt_tokens += c.prompt_tokens;
            counters.generation_tokens += c.generation_tokens;
            counters.finished += c.finished;
            counters.aborted += c.aborted;
            counters.preemptions += c.preemptions;
            counters.iterations += c.iterations;
            counters.busy_ns += c.busy_ns;
            used += u64::from(replica.kv.used());
            total += u64::from(replica.kv.total());
        }
        ModelStats {
            running: self.running(),
            waiting: self.waiting(),
            kv_usage: if total == 0 { 0.0 } else { used as f64 / total as f64 },
            replicas: self.replicas.len(),
            ready_replicas: self.ready_replicas,
            counters,
        }
    }

    /// Cached prompt blocks (referenced or not) summed over replicas.
    pub fn cached_blocks(&self) -> usize {
        self.replicas.iter().map(|replica| replica.kv.cached_blocks()).sum()
    }
}

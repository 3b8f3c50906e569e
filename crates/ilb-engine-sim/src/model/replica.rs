//! One replica: a continuous-batching scheduler over a waiting queue, a running batch and a
//! KV cache, advanced one iteration (or one run of identical iterations) at a time.
//!
//! An iteration is *planned* at its start (preemption, prefill chunks, admission, decode block
//! allocation, cost) and *completed* at its end (tokens produced, sequences finished). The
//! planned iteration is "in flight" in between, so a driver never sees a token before the
//! iteration that produced it has ended.

use std::collections::VecDeque;
use std::sync::Arc;

use super::kv::{blocks_for, KvCache, BLOCK_TOKENS};
use super::{Costs, Nanos, Outcome, TokenEvent};

/// A request inside the replica.
#[derive(Debug)]
pub(crate) struct Seq {
    pub id: u64,
    pub arrival: Nanos,
    pub prompt_len: u32,
    pub max_output: u32,
    pub hashes: Arc<[u64]>,
    pub generated: u32,
    /// Tokens whose KV is computed.
    pub kv_len: u32,
    /// Cached blocks this sequence references.
    pub held: Vec<u64>,
    pub private_blocks: u32,
    /// Prefix-cache hit of the first admission, in tokens.
    pub cached_tokens: u32,
    pub admitted_once: bool,
    pub first_token_at: Option<Nanos>,
    pub planned_prefill: u32,
    pub planned_decode: bool,
    pub preemptions: u32,
}

impl Seq {
    /// KV length at which prefill is over: the prompt plus every generated token but the last
    /// (after a preemption the generated tokens are recomputed too).
    fn prefill_target(&self) -> u32 {
        self.prompt_len + self.generated.saturating_sub(1)
    }
    fn in_prefill(&self) -> bool {
        self.kv_len < self.prefill_target()
    }
    /// Whether this sequence's next decode step needs a new block.
    fn decode_needs_block(&self) -> bool {
        !self.in_prefill() && self.kv_len.is_multiple_of(BLOCK_TOKENS)
    }
    /// Blocks the prefix cache may serve: full prompt blocks, never the whole prompt (the last
    /// prompt token is always computed, to produce logits).
    fn max_hit_blocks(&self) -> usize {
        (self.hashes.len()).min((self.prompt_len.saturating_sub(1) / BLOCK_TOKENS) as usize)
    }
}

/// Cumulative counters of one replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Prompt tokens looked up in the prefix cache (each admission counts its prompt).
    pub prefix_queries_tokens: u64,
    /// Prompt tokens served by the prefix cache.
    pub prefix_hits_tokens: u64,
    /// Prompt tokens of requests whose prefill finished (counted once per request).
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Requests finished.
    pub finished: u64,
    /// Requests aborted.
    pub aborted: u64,
    /// Sequences preempted (their KV dropped, recomputed later).
    pub preemptions: u64,
    /// Iterations run.
    pub iterations: u64,
    /// Nanoseconds spent in iterations.
    pub busy_ns: u64,
}

#[derive(Debug)]
pub(crate) struct Replica {
    pub kv: KvCache,
    pub waiting: VecDeque<Seq>,
    pub running: Vec<Seq>,
    /// End of the planned, not yet completed iteration.
    pub in_flight_end: Option<Nanos>,
    /// The in-flight iteration is decode-only: no prefill, no admission, no preemption.
    in_flight_steady: bool,
    /// When the next iteration may start: end of the last one, or the latest arrival if idle.
    pub free_at: Nanos,
    pub counters: Counters,
    max_seqs: usize,
    max_batched: u32,
}

impl Replica {
    pub fn new(kv_blocks: u32, max_seqs: u32, max_batched: u32) -> Self {
        Self {
            kv: KvCache::new(kv_blocks),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight_end: None,
            in_flight_steady: false,
            free_at: 0,
            counters: Counters::default(),
            max_seqs: max_seqs as usize,
            max_batched,
        }
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    pub fn enqueue(&mut self, now: Nanos, seq: Seq) {
        if !self.has_work() && self.in_flight_end.is_none() {
            self.free_at = self.free_at.max(now);
        }
        // A new queue head may be admitted at the next plan: the run predicted from the
        // in-flight iteration no longer holds.
        self.in_flight_steady = false;
        self.waiting.push_back(seq);
    }

    /// Next iteration boundary: the in-flight iteration's end, or the next start.
    pub fn next_iteration_time(&self) -> Option<Nanos> {
        match self.in_flight_end {
            Some(end) => Some(end),
            None if self.has_work() => Some(self.free_at),
            None => None,
        }
    }

    /// A time no request finishes before. After a steady (decode-only) in-flight iteration
    /// every following iteration stays identical until the first sequence finishes (see
    /// `jump`), so this is the end of that run, or of its longest prefix whose decode blocks
    /// fit in the pool (a preemption is not an outcome but ends the run).
    pub fn next_event_time(&self, costs: &Costs) -> Option<Nanos> {
        let end = self.next_iteration_time()?;
        if self.in_flight_end.is_none() || !self.in_flight_steady || self.running.is_empty() {
            return Some(end);
        }
        let after = self.running.iter().map(|seq| seq.max_output - seq.generated - 1).min().unwrap_or(0);
        let pool = self.kv.pool();
        // Allocations of iterations 1..=n after the in-flight one, whose KV is kv_len + 1.
        let blocks = |n: u32| -> u64 {
            self.running
                .iter()
                .map(|seq| u64::from(blocks_for(seq.kv_len + 1 + n) - blocks_for(seq.kv_len + 1)))
                .sum()
        };
        let run = largest_fitting(after, pool, blocks);
        Some(end + u64::from(run) * costs.iteration(0, self.running.len() as u32))
    }

    /// Removes a sequence, returning its blocks. Returns whether it was here.
    pub fn abort(&mut self, id: u64) -> bool {
        let seq = if let Some(index) = self.running.iter().position(|seq| seq.id == id) {
            self.running.remove(index)
        } else if let Some(index) = self.waiting.iter().position(|seq| seq.id == id) {
            match self.waiting.remove(index) {
                Some(seq) => seq,
                None => return false,
            }
        } else {
            return false;
        };
        self.kv.release(&seq.held, seq.private_blocks);
        self.counters.aborted += 1;
        // Freed blocks may let the queue head in: no steady run can be predicted.
        self.in_flight_steady = false;
        true
    }

    /// Completes every iteration ending at or before `t` and plans every iteration starting at
    /// or before `t`. With `jumps`, runs of identical decode iterations are applied in one
    /// step (no per-token events then, so real-time drivers pass `jumps = false`).
    pub fn run_until(
        &mut self,
        t: Nanos,
        jumps: bool,
        costs: &Costs,
        mut tokens: Option<&mut Vec<TokenEvent>>,
        out: &mut Vec<Outcome>,
        replica_index: u32,
    ) {
        loop {
            if let Some(end) = self.in_flight_end {
                if end > t {
                    return;
                }
                self.complete(end, tokens.as_deref_mut(), out, replica_index);
                continue;
            }
            if !self.has_work() || self.free_at > t {
                return;
            }
            if jumps {
                self.jump(t, costs);
            }
            self.plan(costs);
        }
    }

    fn plan(&mut self, costs: &Costs) {
        let start = self.free_at;
        let mut steady = !self.running.is_empty();
        // 1. Make room for this iteration's decode blocks, preempting the newest sequences.
        let mut decode_blocks = self.running.iter().filter(|seq| seq.decode_needs_block()).count() as u32;
        while decode_blocks > self.kv.pool() {
            let Some(mut victim) = self.running.pop() else { break };
            decode_blocks -= u32::from(victim.decode_needs_block());
            self.kv.release(&victim.held, victim.private_blocks);
            victim.held.clear();
            victim.private_blocks = 0;
            victim.kv_len = 0;
            victim.preemptions += 1;
            self.counters.preemptions += 1;
            self.waiting.push_front(victim);
            steady = false;
        }
        // 2. Continue chunked prefills within the token budget left after decode tokens.
        let decoding = self.running.iter().filter(|seq| !seq.in_prefill()).count() as u32;
        let mut budget = self.max_batched.saturating_sub(decoding);
        let mut prefill_tokens = 0u32;
        for seq in self.running.iter_mut().filter(|seq| seq.in_prefill()) {
            let chunk = (seq.prefill_target() - seq.kv_len).min(budget);
            seq.planned_prefill = chunk;
            budget -= chunk;
            prefill_tokens += chunk;
        }
        // 3. Admit from the head of the queue (FCFS, no skipping) while the batch, the token
        //    budget and the KV pool (less the decode blocks reserved above) allow.
        while budget > 0 && self.running.len() < self.max_seqs {
            let Some(head) = self.waiting.front() else { break };
            let hit = self.kv.match_prefix(&head.hashes[..head.max_hit_blocks()]);
            let need = blocks_for(head.prefill_target()) - hit.blocks;
            if need + decode_blocks > self.kv.pool() - hit.in_lru {
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else { break };
            self.kv.acquire_prefix(&seq.hashes, hit.blocks, &mut seq.held);
            let allocated = self.kv.alloc(need);
            debug_assert!(allocated, "admission checked the pool");
            seq.private_blocks = need;
            seq.kv_len = hit.blocks * BLOCK_TOKENS;
            let hit_tokens = hit.blocks * BLOCK_TOKENS;
            if !seq.admitted_once {
                seq.admitted_once = true;
                seq.cached_tokens = hit_tokens;
            }
            self.counters.prefix_queries_tokens += u64::from(seq.prompt_len);
            self.counters.prefix_hits_tokens += u64::from(hit_tokens);
            let chunk = (seq.prefill_target() - seq.kv_len).min(budget);
            seq.planned_prefill = chunk;
            budget -= chunk;
            prefill_tokens += chunk;
            self.running.push(seq);
            steady = false;
        }
        // 4. Allocate decode blocks (reserved in step 3, so this cannot fail).
        let allocated = self.kv.alloc(decode_blocks);
        debug_assert!(allocated, "decode blocks were made to fit in step 1");
        for seq in self.running.iter_mut().filter(|seq| !seq.in_prefill()) {
            seq.private_blocks += u32::from(seq.decode_needs_block());
            seq.planned_decode = true;
        }
        let cost = costs.iteration(prefill_tokens, decoding);
        self.in_flight_end = Some(start + cost);
        self.in_flight_steady = steady && prefill_tokens == 0;
        self.free_at = start + cost;
        self.counters.iterations += 1;
        self.counters.busy_ns += cost;
    }

    fn complete(
        &mut self,
        end: Nanos,
        mut tokens: Option<&mut Vec<TokenEvent>>,
        out: &mut Vec<Outcome>,
        replica_index: u32,
    ) {
        self.in_flight_end = None;
        let mut any_finished = false;
        for seq in &mut self.running {
            let produced = if seq.planned_prefill > 0 {
                seq.kv_len += std::mem::take(&mut seq.planned_prefill);
                let done = seq.kv_len == seq.prefill_target();
                if done {
                    for hash in &seq.hashes[seq.held.len().min(seq.hashes.len())..] {
                        if seq.private_blocks > 0 && self.kv.register(*hash) {
                            seq.private_blocks -= 1;
                            seq.held.push(*hash);
                        }
                    }
                    if seq.first_token_at.is_none() {
                        self.counters.prompt_tokens += u64::from(seq.prompt_len);
                    }
                }
                done
            } else if std::mem::take(&mut seq.planned_decode) {
                seq.kv_len += 1;
                true
            } else {
                false
            };
            if !produced {
                continue;
            }
            seq.generated += 1;
            self.counters.generation_tokens += 1;
            if seq.first_token_at.is_none() {
                seq.first_token_at = Some(end);
            }
            let finished = seq.generated >= seq.max_output;
            any_finished |= finished;
            if let Some(tokens) = tokens.as_deref_mut() {
                tokens.push(TokenEvent { id: seq.id, at: end, index: seq.generated, finished });
            }
        }
        if any_finished {
            let kv = &mut self.kv;
            let counters = &mut self.counters;
            self.running.retain(|seq| {
                if seq.generated < seq.max_output {
                    return true;
                }
                kv.release(&seq.held, seq.private_blocks);
                counters.finished += 1;
                out.push(Outcome {
                    id: seq.id,
                    replica: replica_index,
                    arrival: seq.arrival,
                    first_token_at: seq.first_token_at.unwrap_or(end),
                    finished_at: end,
                    prompt_tokens: seq.prompt_len,
                    output_tokens: seq.generated,
                    cached_tokens: seq.cached_tokens,
                    preemptions: seq.preemptions,
                });
                false
            });
        }
    }

    /// Applies, in O(batch · log) time, the longest run of identical decode-only iterations
    /// that starts at `free_at`, ends at or before `t`, finishes no sequence, admits nothing
    /// and preempts nothing. The iteration that ends the run is left to `plan`.
    ///
    /// Why checking admission once suffices: every block allocation lowers (pool − need of the
    /// queue head) by at least one (an eviction inside the head's cached prefix raises its need
    /// by at least as much as it frees), so a head that does not fit now never fits later in
    /// the run, and batch size and token budget are constant in it.
    fn jump(&mut self, t: Nanos, costs: &Costs) {
        let start = self.free_at;
        if self.running.is_empty() || self.running.iter().any(Seq::in_prefill) {
            return;
        }
        let decoding = self.running.len() as u32;
        let decode_blocks = self.running.iter().filter(|seq| seq.decode_needs_block()).count() as u32;
        if decode_blocks > self.kv.pool() {
            return;
        }
        let budget = self.max_batched.saturating_sub(decoding);
        if let Some(head) = self.waiting.front() {
            if budget > 0 && self.running.len() < self.max_seqs {
                let hit = self.kv.match_prefix(&head.hashes[..head.max_hit_blocks()]);
                let need = blocks_for(head.prefill_target()) - hit.blocks;
                if need + decode_blocks <= self.kv.pool() - hit.in_lru {
                    return;
                }
            }
        }
        let cost = costs.iteration(0, decoding);
        let remaining = self.running.iter().map(|seq| seq.max_output - seq.generated).min().unwrap_or(1);
        let by_time = (t.saturating_sub(start) / cost).min(u64::from(u32::MAX)) as u32;
        let mut iterations = (remaining - 1).min(by_time);
        let blocks_after = |n: u32| -> u64 {
            self.running
                .iter()
                .map(|seq| u64::from(blocks_for(seq.kv_len + n) - blocks_for(seq.kv_len)))
                .sum()
        };
        iterations = largest_fitting(iterations, self.kv.pool(), blocks_after);
        if iterations == 0 {
            return;
        }
        let total_blocks = blocks_after(iterations) as u32;
        let allocated = self.kv.alloc(total_blocks);
        debug_assert!(allocated, "run length was bounded by the pool");
        for seq in &mut self.running {
            seq.private_blocks += blocks_for(seq.kv_len + iterations) - blocks_for(seq.kv_len);
            seq.kv_len += iterations;
            seq.generated += iterations;
        }
        let n = u64::from(iterations);
        self.counters.generation_tokens += n * u64::from(decoding);
        self.counters.iterations += n;
        self.counters.busy_ns += n * cost;
        self.free_at = start + n * cost;
    }
}

/// Largest `n <= limit` with `blocks(n) <= pool`, for `blocks` non-decreasing in `n`.
fn largest_fitting(limit: u32, pool: u32, blocks: impl Fn(u32) -> u64) -> u32 {
    if blocks(limit) <= u64::from(pool) {
        return limit;
    }
    let (mut low, mut high) = (0u32, limit);
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if blocks(mid) <= u64::from(pool) {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    low
}

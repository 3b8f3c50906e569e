//! Model tests: latency responds to queueing, batch size and cache hits; LRU eviction; abort;
//! preemption; determinism; and the property that jumping equals stepping.

use super::*;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

const MS: Nanos = 1_000_000;

fn prompt(seed: u32, len: u32) -> Arc<[u32]> {
    (0..len).map(|i| seed.wrapping_mul(1_000_003).wrapping_add(i)).collect()
}

fn request(id: u64, prompt: Arc<[u32]>, max_output_tokens: u32) -> Request {
    Request { id, prompt, max_output_tokens }
}

fn one_replica(profile: HardwareProfile) -> EngineModel {
    EngineModel::new(&HardwareProfile { replicas: 1, ..profile }).expect("valid profile")
}

/// Runs to idle and returns outcomes sorted by id.
fn finish(model: &mut EngineModel) -> Vec<Outcome> {
    let mut out = Vec::new();
    model.advance_until(Nanos::MAX, &mut out);
    assert_eq!(model.next_event_time(), None);
    out.sort_by_key(|outcome| outcome.id);
    out
}

fn ttft(outcome: &Outcome) -> Nanos {
    outcome.first_token_at - outcome.arrival
}

fn tbot(outcome: &Outcome) -> f64 {
    (outcome.finished_at - outcome.first_token_at) as f64 / f64::from(outcome.output_tokens - 1)
}

#[test]
fn idle_ttft_and_tbot_follow_the_profile() {
    let profile = HardwareProfile::a100();
    let mut model = one_replica(profile.clone());
    model.submit(0, request(1, prompt(1, 1000), 11)).expect("submit");
    let out = finish(&mut model);
    // One iteration of 1000 prefill tokens, then 10 decode iterations of one sequence.
    assert_eq!(ttft(&out[0]), 10 * MS + 1000 * 100_000);
    assert_eq!(tbot(&out[0]), (10 * MS + 80_000) as f64);
    assert_eq!(out[0].output_tokens, 11);
}

#[test]
fn ttft_rises_with_queue_length() {
    let mean_ttft = |concurrent: u64| {
        let mut model = one_replica(HardwareProfile::l4());
        for id in 0..concurrent {
            model.submit(0, request(id, prompt(id as u32, 1000), 32)).expect("submit");
        }
        let out = finish(&mut model);
        out.iter().map(ttft).sum::<Nanos>() / concurrent
    };
    let (alone, eight, thirty_two) = (mean_ttft(1), mean_ttft(8), mean_ttft(32));
    assert!(alone < eight && eight < thirty_two, "{alone} {eight} {thirty_two}");
    assert!(thirty_two > 4 * alone, "queueing must dominate: {alone} vs {thirty_two}");
}

#[test]
fn tbot_rises_with_batch_size() {
    let mean_tbot = |concurrent: u64| {
        let mut model = one_replica(HardwareProfile::a100());
        for id in 0..concurrent {
            model.submit(0, request(id, prompt(id as u32, 64), 200)).expect("submit");
        }
        let out = finish(&mut model);
        out.iter().map(tbot).sum::<f64>() / concurrent as f64
    };
    let (alone, batch_64, batch_200) = (mean_tbot(1), mean_tbot(64), mean_tbot(200));
    assert!(alone < batch_64 && batch_64 < batch_200, "{alone} {batch_64} {batch_200}");
    assert!((9e6..12e6).contains(&alone), "alone {alone}");
    assert!(batch_200 > 2.0 * alone, "batch 200 {batch_200}");
}

#[test]
fn follow_up_turn_hits_the_prefix_cache_and_has_lower_ttft() {
    let turn_one = prompt(7, 2000);
    let turn_two: Arc<[u32]> = turn_one.iter().copied().chain(prompt(8, 100).iter().copied()).collect();

    let mut warm = one_replica(HardwareProfile::a100());
    warm.submit(0, request(1, turn_one, 50)).expect("submit");
    let first = finish(&mut warm);
    let later = first[0].finished_at + 1000 * MS;
    warm.submit(later, request(2, turn_two.clone(), 50)).expect("submit");
    let warm_out = finish(&mut warm);

    let mut cold = one_replica(HardwareProfile::a100());
    cold.submit(0, request(2, turn_two, 50)).expect("submit");
    let cold_out = finish(&mut cold);

    assert_eq!(warm_out[0].cached_tokens, 2000, "all 125 full blocks of turn one hit");
    assert_eq!(cold_out[0].cached_tokens, 0);
    assert!(ttft(&warm_out[0]) * 5 < ttft(&cold_out[0]), "{:?} vs {:?}", warm_out[0], cold_out[0]);
    let stats = warm.stats();
    assert_eq!(stats.counters.prefix_hits_tokens, 2000);
    assert_eq!(stats.counters.prefix_queries_tokens, 2000 + 2100);
}

/// Regression (found by the fleet simulator): requests sharing a system prompt all went to the
/// replica that cached it first, leaving the others idle.
#[test]
fn a_shared_prefix_does_not_pin_every_request_to_one_replica() {
    let mut model = EngineModel::new(&HardwareProfile { replicas: 4, ..HardwareProfile::a100() }).unwrap();
    let shared: Vec<u32> = (0..512).collect();
    let with_suffix = |id: u64| -> Arc<[u32]> {
        let mut tokens = shared.clone();
        tokens.extend((0..32).map(|t| 10_000 + id as u32 * 100 + t));
        tokens.into()
    };
    // One request first, so that one replica holds the shared prefix.
    model.submit(0, request(1_000, with_suffix(1_000), 16)).unwrap();
    let warm = finish(&mut model);
    let now = warm[0].finished_at;
    for id in 0..64u64 {
        model.submit(now, request(id, with_suffix(id), 16)).unwrap();
    }
    let outcomes = finish(&mut model);
    let mut per_replica = [0usize; 4];
    for o in &outcomes {
        per_replica[o.replica as usize] += 1;
    }
    assert!(per_replica.iter().all(|&n| n >= 8), "requests per replica: {per_replica:?}");
}

#[test]
fn lru_evicts_unreferenced_blocks_under_capacity() {
    // 200 blocks; each prompt of 960 tokens caches 60 blocks.
    let profile = HardwareProfile { kv_blocks: 200, ..HardwareProfile::a100() };
    let run = |others: u32| {
        let mut model = one_replica(profile.clone());
        let mut now = 0;
        for (id, seed) in std::iter::once(0).chain(1..=others).enumerate() {
            model.submit(now, request(id as u64, prompt(seed, 960), 4)).expect("submit");
            now = finish(&mut model)[0].finished_at;
            assert!(model.cached_blocks() <= 200);
            assert_eq!(model.stats().kv_usage, 0.0, "idle engine references no block");
        }
        model.submit(now, request(99, prompt(0, 960), 4)).expect("submit");
        finish(&mut model)[0].cached_tokens
    };
    assert_eq!(run(2), 944, "three prompts fit: the first is still cached");
    assert_eq!(run(4), 0, "five prompts do not: the oldest was evicted");
}

#[test]
fn abort_releases_everything() {
    let mut model = one_replica(HardwareProfile::a100());
    model.submit(0, request(1, prompt(1, 500), 1000)).expect("submit");
    model.submit(0, request(2, prompt(2, 500), 1000)).expect("submit");
    let mut out = Vec::new();
    model.advance_until(200 * MS, &mut out);
    assert_eq!(model.running(), 2);
    assert!(model.stats().kv_usage > 0.0);
    assert!(model.abort(1));
    assert!(!model.abort(1), "second abort is a no-op");
    assert_eq!(finish(&mut model).len(), 1);
    assert_eq!(model.stats().counters.aborted, 1);
    assert_eq!(model.stats().kv_usage, 0.0);
}

#[test]
fn preemption_under_kv_pressure_still_finishes_every_request() {
    let profile = HardwareProfile { kv_blocks: 64, max_num_seqs: 8, ..HardwareProfile::a100() };
    let mut model = one_replica(profile);
    for id in 0..8 {
        model.submit(0, request(id, prompt(id as u32, 100), 300)).expect("submit");
    }
    let out = finish(&mut model);
    assert_eq!(out.len(), 8);
    assert!(out.iter().all(|outcome| outcome.output_tokens == 300));
    assert!(model.stats().counters.preemptions > 0, "8 × 400 tokens exceed 64 blocks");
}

#[test]
fn refuses_what_cannot_fit() {
    let mut model = one_replica(HardwareProfile { kv_blocks: 10, ..HardwareProfile::a100() });
    assert!(matches!(model.submit(0, request(1, prompt(1, 150), 20)), Err(SubmitError::TooLong { .. })));
    assert_eq!(model.submit(0, request(1, Arc::from(Vec::new()), 20)), Err(SubmitError::EmptyPrompt));
    model.submit(0, request(1, prompt(1, 100), 20)).expect("fits");
    assert_eq!(model.submit(0, request(1, prompt(1, 100), 20)), Err(SubmitError::DuplicateId(1)));
}

#[test]
fn step_until_reports_every_token_in_order() {
    let mut model = one_replica(HardwareProfile::a100());
    model.submit(0, request(5, prompt(1, 40), 4)).expect("submit");
    let (mut tokens, mut out) = (Vec::new(), Vec::new());
    while let Some(next) = model.next_event_time() {
        model.step_until(next, &mut tokens, &mut out);
    }
    let indices: Vec<u32> = tokens.iter().map(|token| token.index).collect();
    assert_eq!(indices, vec![1, 2, 3, 4]);
    assert!(tokens.windows(2).all(|pair| pair[0].at < pair[1].at));
    assert_eq!(tokens.iter().filter(|token| token.finished).count(), 1);
    assert_eq!(out[0].finished_at, tokens[3].at);
}

#[derive(Clone, Debug)]
struct Arrival {
    gap: Nanos,
    group: u32,
    prefix: u32,
    suffix: u32,
    max_output: u32,
}

fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec(
        (0..60 * MS, 0..4u32, 0..200u32, 1..100u32, 1..150u32).prop_map(
            |(gap, group, prefix, suffix, max_output)| Arrival { gap, group, prefix, suffix, max_output },
        ),
        1..40,
    )
}

fn small_profile() -> impl Strategy<Value = HardwareProfile> {
    (1..12u32, 0..200u32, 24..300u32, 1..3u32).prop_map(|(seqs, extra_tokens, kv_blocks, replicas)| {
        HardwareProfile {
            max_num_seqs: seqs,
            max_num_batched_tokens: seqs + extra_tokens,
            kv_blocks,
            replicas,
            ..HardwareProfile::a100()
        }
    })
}

fn arrival_prompt(index: usize, arrival: &Arrival) -> Arc<[u32]> {
    let shared = prompt(arrival.group, arrival.prefix);
    let unique = prompt(10_000 + index as u32, arrival.suffix);
    shared.iter().chain(unique.iter()).copied().collect()
}

/// Drives `arrivals` through a model either with `advance_until` (jumps) or by stepping one
/// event at a time without jumps; returns outcomes and final stats.
fn drive(profile: &HardwareProfile, arrivals: &[Arrival], jumps: bool) -> (Vec<Outcome>, ModelStats) {
    let mut model = EngineModel::new(profile).expect("valid");
    let (mut out, mut tokens) = (Vec::new(), Vec::new());
    let mut now = 0;
    for (index, arrival) in arrivals.iter().enumerate() {
        now += arrival.gap;
        if jumps {
            model.advance_until(now - arrival.gap / 2, &mut out);
            model.advance_until(now, &mut out);
        } else {
            while let Some(next) = model.next_iteration_time().filter(|next| *next <= now) {
                model.step_until(next, &mut tokens, &mut out);
            }
        }
        let request = request(index as u64, arrival_prompt(index, arrival), arrival.max_output);
        // Requests that cannot fit are refused identically in both modes.
        let _ = model.submit(now, request);
    }
    if jumps {
        model.advance_until(Nanos::MAX, &mut out);
    } else {
        while let Some(next) = model.next_iteration_time() {
            model.step_until(next, &mut tokens, &mut out);
        }
    }
    out.sort_by_key(|outcome| outcome.id);
    (out, model.stats())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, rng_seed: RngSeed::Fixed(1), ..ProptestConfig::default() })]

    #[test]
    fn jumping_equals_stepping(profile in small_profile(), arrivals in arrivals()) {
        let (jumped, jumped_stats) = drive(&profile, &arrivals, true);
        let (stepped, stepped_stats) = drive(&profile, &arrivals, false);
        prop_assert_eq!(&jumped, &stepped);
        prop_assert_eq!(jumped_stats, stepped_stats);
    }

    #[test]
    fn event_loop_never_overshoots_an_outcome(profile in small_profile(), arrivals in arrivals()) {
        let (expected, expected_stats) = drive(&profile, &arrivals, false);
        let mut model = EngineModel::new(&profile).expect("valid");
        let mut out = Vec::new();
        let mut now = 0;
        let advance_to = |model: &mut EngineModel, until: Nanos, out: &mut Vec<Outcome>| {
            while let Some(next) = model.next_event_time().filter(|next| *next <= until) {
                let before = out.len();
                model.advance_until(next, out);
                for outcome in &out[before..] {
                    assert_eq!(outcome.finished_at, next, "next_event_time skipped past an outcome");
                }
            }
            model.advance_until(until, out);
        };
        for (index, arrival) in arrivals.iter().enumerate() {
            now += arrival.gap;
            advance_to(&mut model, now, &mut out);
            let _ = model.submit(now, request(index as u64, arrival_prompt(index, arrival), arrival.max_output));
        }
        advance_to(&mut model, Nanos::MAX - 1, &mut out);
        out.sort_by_key(|outcome| outcome.id);
        prop_assert_eq!(out, expected);
        prop_assert_eq!(model.stats(), expected_stats);
    }

    #[test]
    fn same_inputs_same_outputs(profile in small_profile(), arrivals in arrivals()) {
        prop_assert_eq!(drive(&profile, &arrivals, true), drive(&profile, &arrivals, true));
    }
}

#[test]
fn jumping_skips_most_iterations_work() {
    // A long decode-only run: the jump must cover it, so the driver loop runs few times.
    let mut model = one_replica(HardwareProfile::a100());
    for id in 0..100 {
        model.submit(0, request(id, prompt(id as u32, 100), 3000)).expect("submit");
    }
    let mut out = Vec::new();
    let mut calls = 0;
    while let Some(next) = model.next_event_time() {
        model.advance_until(next, &mut out);
        calls += 1;
    }
    assert_eq!(out.len(), 100);
    assert!(model.stats().counters.iterations >= 3000);
    assert!(calls < 20, "{calls} driver calls for 3000 iterations");
}

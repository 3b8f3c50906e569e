//! Virtual-time throughput check of the engine model: N requests (default 1,000,000) over E
//! engines (default 1,000), Poisson arrivals at 70% of the fleet's estimated capacity, random
//! routing, conversations sharing a system prompt. Prints wall time and latency means.
//!
//! `cargo run --release -p ilb-engine-sim --example virtual_fleet -- [requests] [engines]`
#![allow(clippy::disallowed_methods)] // an example program: reads its argv and times itself

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use ilb_engine_sim::{EngineModel, HardwareProfile, Nanos, Outcome, Request};
use rand::{Rng, SeedableRng};

/// Wall-clock reading for the benchmark report only (the model itself never reads a clock).
#[allow(clippy::disallowed_methods)]
fn wall_now() -> std::time::Instant {
    std::time::Instant::now()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let requests: u64 = args.next().and_then(|arg| arg.parse().ok()).unwrap_or(1_000_000);
    let n_engines: usize = args.next().and_then(|arg| arg.parse().ok()).unwrap_or(1_000);
    let profile = HardwareProfile { replicas: 1, ..HardwareProfile::a100() };
    let (mean_prompt, mean_output) = (500.0, 100.0);
    let fleet_capacity = profile.engine_capacity_rps(mean_prompt, mean_output) * n_engines as f64;
    let rate = 0.7 * fleet_capacity;
    println!("{n_engines} engines, capacity ~{fleet_capacity:.0} req/s, offered {rate:.0} req/s, {requests} requests");

    let mut engines: Vec<EngineModel> =
        (0..n_engines).map(|_| EngineModel::new(&profile).expect("valid profile")).collect();
    let mut rng = rand_pcg::Pcg64::seed_from_u64(1);
    let system: Vec<u32> = (0..256).collect();
    let mut heap: BinaryHeap<Reverse<(Nanos, usize)>> = BinaryHeap::new();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let (mut ttft_sum, mut tbot_sum, mut finished, mut cached) = (0u128, 0f64, 0u64, 0u64);
    let mut drain = |outcomes: &mut Vec<Outcome>| {
        for outcome in outcomes.drain(..) {
            ttft_sum += u128::from(outcome.first_token_at - outcome.arrival);
            if outcome.output_tokens > 1 {
                tbot_sum += (outcome.finished_at - outcome.first_token_at) as f64
                    / f64::from(outcome.output_tokens - 1);
            }
            cached += u64::from(outcome.cached_tokens);
            finished += 1;
        }
    };

    let started = wall_now();
    let mut now: Nanos = 0;
    let mut submitted = 0u64;
    let mut next_arrival = Some(0);
    loop {
        let next_engine_event = heap.peek().map(|Reverse((at, _))| *at);
        match (next_arrival, next_engine_event) {
            (Some(arrival), event) if event.is_none_or(|event| arrival <= event) => {
                now = arrival;
                let engine = rng.gen_range(0..n_engines);
                let unique = rng.gen_range(100..400u32);
                let prompt: Arc<[u32]> = system
                    .iter()
                    .copied()
                    .chain((0..unique).map(|i| (submitted as u32) ^ (i << 20)))
                    .collect();
                let output = rng.gen_range(50..150u32);
                engines[engine].advance_until(now, &mut outcomes);
                engines[engine]
                    .submit(now, Request { id: submitted, prompt, max_output_tokens: output })
                    .expect("fits");
                if let Some(at) = engines[engine].next_event_time() {
                    heap.push(Reverse((at, engine)));
                }
                submitted += 1;
                let gap = -rng.gen::<f64>().max(f64::MIN_POSITIVE).ln() / rate;
                next_arrival = (submitted < requests).then(|| now + (gap * 1e9) as Nanos);
            }
            (_, Some(_)) => {
                let Some(Reverse((at, engine))) = heap.pop() else { break };
                // Entries go stale when an arrival moved the engine; skip those.
                if engines[engine].next_event_time() != Some(at) {
                    continue;
                }
                engines[engine].advance_until(at, &mut outcomes);
                if let Some(next) = engines[engine].next_event_time() {
                    heap.push(Reverse((next, engine)));
                }
            }
            _ => break,
        }
        drain(&mut outcomes);
    }
    let wall = started.elapsed();
    let iterations: u64 = engines.iter().map(|engine| engine.stats().counters.iterations).sum();
    println!(
        "finished {finished} requests in {wall:.2?} wall ({:.0} req/s simulated per wall second), {:.1} s virtual",
        finished as f64 / wall.as_secs_f64(),
        now as f64 / 1e9
    );
    println!(
        "mean TTFT {:.1} ms, mean TBOT {:.1} ms, cached prompt tokens {:.1}%, {iterations} iterations",
        ttft_sum as f64 / finished.max(1) as f64 / 1e6,
        tbot_sum / finished.max(1) as f64 / 1e6,
        100.0 * cached as f64 / (finished.max(1) as f64 * (256.0 + 250.0)),
    );
}

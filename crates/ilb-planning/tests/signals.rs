//! Engine signals from the vLLM (current and V0) and SGLang fixtures, and windowed figures
//! between two vLLM scrapes taken 10 s apart (the fixtures are built with known deltas:
//! 100 requests of which 2 aborted, 50k prompt and 20k generated tokens, half the prefix
//! lookups hit, TTFT deltas 50 in (60,80] ms, 40 in (80,100], 10 in (100,250]).
#![allow(clippy::disallowed_methods)] // tests read their fixtures from files

use ilb_core::ModelName;
use ilb_planning::profile::DecodeLengths;
use ilb_planning::prom::{parse, Limits};
use ilb_planning::signals::{extract, window, EngineFlavor, EngineSample, Histogram};
use std::time::Duration;

fn samples(file: &str) -> Vec<(ModelName, EngineSample)> {
    let text =
        std::fs::read_to_string(format!("{}/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let exposition = parse(&text, &Limits::default()).unwrap();
    extract(&exposition)
}

fn model<'a>(samples: &'a [(ModelName, EngineSample)], name: &str) -> &'a EngineSample {
    &samples.iter().find(|(model, _)| model.as_str() == name).unwrap().1
}

fn close(actual: Option<f64>, expected: f64) {
    let actual = actual.expect("value present");
    assert!((actual - expected).abs() <= 1e-9 * expected.abs().max(1.0), "{actual} != {expected}");
}

const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";
const QWEN: &str = "Qwen/Qwen2.5-7B-Instruct";

#[test]
fn vllm_groups_per_model_and_sums_data_parallel_engines() {
    let samples = samples("vllm.txt");
    let names: Vec<&str> = samples.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(names, [QWEN, LLAMA], "sorted by model name");
    let llama = model(&samples, LLAMA);
    assert_eq!(llama.flavor, EngineFlavor::Vllm);
    close(llama.running, 22.0);
    close(llama.waiting, 4.0);
    close(llama.kv_usage, 0.39);
    close(llama.prompt_tokens, 1_523_000.0 + 1_498_500.0);
    close(llama.generation_tokens, 812_340.0 + 790_100.0);
    // The deprecated gpu_prefix_cache_* aliases carry the same counts and are not added again.
    close(llama.prefix_cache_queries, 1_523_000.0 + 1_498_500.0);
    close(llama.prefix_cache_hits, 1_200_000.0);
    close(llama.requests_finished, 3000.0 + 400.0 + 12.0 + 2950.0 + 380.0 + 8.0);
    close(llama.requests_failed, 20.0);
    let ttft = llama.ttft.as_ref().unwrap();
    close(Some(ttft.count), 2.0 * 3392.0);
    // inter_token_latency is preferred over the deprecated time_per_output_token (not summed).
    let tbot = llama.tbot.as_ref().unwrap();
    close(Some(tbot.count), 2.0 * 793_400.0);
    assert!(llama.e2e.is_some());
    assert_eq!(llama.gen_throughput, None);
}

#[test]
fn vllm_window_over_ten_seconds() {
    let before = samples("vllm.txt");
    let after = samples("vllm_later.txt");
    let stats = window(model(&before, LLAMA), model(&after, LLAMA), Duration::from_secs(10)).unwrap();
    assert!(!stats.counter_reset);
    close(Some(stats.elapsed_s), 10.0);
    close(stats.request_rate, 10.0);
    close(stats.error_rate, 0.02);
    close(stats.prompt_token_rate, 5000.0);
    close(stats.generation_token_rate, 2000.0);
    close(stats.prefix_cache_hit_rate, 0.5);
    let ttft = stats.ttft.unwrap();
    close(Some(ttft.count), 100.0);
    close(Some(ttft.mean_ms), 85.0);
    close(Some(ttft.p50_ms), 80.0);
    close(Some(ttft.p90_ms), 100.0);
    let tbot = stats.tbot.unwrap();
    close(Some(tbot.mean_ms), 20.0);
    close(Some(tbot.p50_ms), 20.0);
    close(Some(tbot.p90_ms), 40.0);
    let e2e = stats.e2e.unwrap();
    close(Some(e2e.mean_ms), 2200.0);
}

#[test]
fn vllm_window_detects_engine_restart() {
    let before = samples("vllm.txt");
    let after = samples("vllm_later.txt");
    let stats = window(model(&before, QWEN), model(&after, QWEN), Duration::from_secs(10)).unwrap();
    assert!(stats.counter_reset);
    // After a restart the new totals are the increase: 10 requests, 5200 prompt tokens.
    close(stats.request_rate, 1.0);
    close(stats.prompt_token_rate, 520.0);
    close(stats.error_rate, 0.0);
    let ttft = stats.ttft.unwrap();
    close(Some(ttft.count), 10.0);
    close(Some(ttft.mean_ms), 70.0);
}

#[test]
fn empty_window_is_none() {
    let before = samples("vllm.txt");
    assert!(window(&before[0].1, &before[0].1, Duration::ZERO).is_none());
    // Identical samples: zero rates, no latency figures (nothing observed).
    let stats = window(&before[0].1, &before[0].1, Duration::from_secs(5)).unwrap();
    close(stats.request_rate, 0.0);
    assert_eq!(stats.error_rate, None);
    assert_eq!(stats.ttft, None);
}

#[test]
fn vllm_v0_names() {
    let samples = samples("vllm_v0.txt");
    assert_eq!(samples.len(), 1);
    let (model_name, sample) = &samples[0];
    assert_eq!(model_name.as_str(), "mistralai/Mistral-7B-Instruct-v0.3");
    close(sample.running, 7.0);
    close(sample.waiting, 2.0);
    close(sample.kv_usage, 0.2875);
    close(sample.prefix_cache_hit_rate, 0.3125);
    assert_eq!(sample.prefix_cache_queries, None);
    close(sample.requests_finished, 1790.0);
    close(sample.requests_failed, 0.0);
    close(sample.tbot.as_ref().map(|h| h.count), 453_000.0);
    close(sample.ttft.as_ref().and_then(Histogram::mean), 105.0 / 1790.0);
}

#[test]
fn sglang_names() {
    let samples = samples("sglang.txt");
    assert_eq!(samples.len(), 2);
    let llama = model(&samples, LLAMA);
    assert_eq!(llama.flavor, EngineFlavor::Sglang);
    close(llama.running, 23.0);
    close(llama.waiting, 4.0);
    close(llama.kv_usage, 0.28);
    close(llama.prefix_cache_hit_rate, 0.4375);
    close(llama.gen_throughput, 1843.7);
    close(llama.prompt_tokens, 8_128_902.0);
    // SGLang: prompt tokens are the prefix lookups, cached tokens the hits.
    close(llama.prefix_cache_queries, 8_128_902.0);
    close(llama.prefix_cache_hits, 3_500_000.0);
    close(llama.requests_finished, 21_050.0);
    close(llama.requests_failed, 21.0);
    let ttft = llama.ttft.as_ref().unwrap();
    close(Some(ttft.count), 21_050.0);
    assert!(ttft.quantile(0.5).unwrap() <= 0.2);
    assert!(llama.tbot.is_some() && llama.e2e.is_some());
    let qwen = model(&samples, "Qwen/Qwen2.5-32B-Instruct");
    close(qwen.requests_failed, 0.0);
}

#[test]
fn sglang_window_falls_back_to_hit_rate_gauge_without_cached_tokens() {
    let previous =
        EngineSample { flavor: EngineFlavor::Sglang, prefix_cache_hit_rate: Some(0.2), ..Default::default() };
    let current = EngineSample { prefix_cache_hit_rate: Some(0.3), ..previous.clone() };
    let stats = window(&previous, &current, Duration::from_secs(1)).unwrap();
    close(stats.prefix_cache_hit_rate, 0.3);
    assert_eq!(stats.request_rate, None);
}

#[test]
fn unrelated_metrics_produce_no_models() {
    let exposition = parse("process_cpu_seconds_total 12\nup 1\n", &Limits::default()).unwrap();
    assert!(extract(&exposition).is_empty());
}

fn fixture(file: &str) -> String {
    std::fs::read_to_string(format!("{}/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn only(samples: &[(ModelName, EngineSample)]) -> &EngineSample {
    assert_eq!(samples.len(), 1, "one model");
    &samples[0].1
}

#[test]
fn llamacpp_live_capture() {
    let idle = samples("llamacpp_idle.txt");
    let busy = samples("llamacpp_busy.txt");
    // No model label: the sample groups under the empty name, the engine's configured model applies.
    assert_eq!(busy[0].0.as_str(), "");
    let sample = only(&busy);
    assert_eq!(sample.flavor, EngineFlavor::Llamacpp);
    close(sample.running, 4.0);
    close(sample.waiting, 2.0);
    close(sample.prompt_tokens, 93.0);
    close(sample.prefix_cache_hits, 51.0);
    close(sample.prefix_cache_queries, 93.0 + 51.0);
    close(sample.generation_tokens, 60.0);
    close(sample.decode_seconds, 2.87841);
    close(sample.prompt_seconds, 1.34674);
    close(sample.busy_slots_per_decode, 1.02941);
    // No request counter and no latency histograms: the data planes' reports stand in.
    assert_eq!(sample.requests_finished, None);
    assert!(sample.ttft.is_none() && sample.tbot.is_none() && sample.e2e.is_none());
    assert_eq!(sample.asleep, None);
    let stats = window(only(&idle), sample, Duration::from_secs(6)).unwrap();
    assert!(!stats.counter_reset);
    assert_eq!(stats.request_rate, None);
    close(stats.generation_token_rate, 10.0);
    close(stats.decode_ms_per_token, 2.87841 / 60.0 * 1000.0);
    close(stats.prefix_cache_hit_rate, 51.0 / 144.0);
    assert_eq!(stats.ttft, None);
}

const TINY: &str = "tiny-llama";

#[test]
fn vllm_0_32_live_capture() {
    let busy = samples("vllm_0.32_busy.txt");
    let sample = model(&busy, TINY);
    assert_eq!(busy.len(), 1);
    assert_eq!(sample.flavor, EngineFlavor::Vllm);
    close(sample.running, 2.0);
    close(sample.waiting, 0.0);
    close(sample.kv_usage, 0.0006104260774020265);
    assert_eq!(sample.asleep, Some(false));
    close(sample.preemptions, 0.0);
    close(sample.requests_finished, 27.0);
    close(sample.requests_failed, 0.0);
    close(sample.prompt_tokens, 1948.0);
    close(sample.prefix_cache_queries, 1948.0);
    close(sample.prefix_cache_hits, 1280.0);
    close(sample.generation_tokens, 2539.0);
    close(sample.ttft.as_ref().map(|h| h.count), 29.0);
    close(sample.tbot.as_ref().map(|h| h.count), 2510.0);
    close(sample.queue.as_ref().map(|h| h.count), 27.0);
    close(sample.e2e.as_ref().map(|h| h.count), 27.0);
    // Generated tokens per request: 12 answers of at most 10 tokens, 5 more up to 20, 6 up to 50,
    // 4 between 200 and 500; the law of their decode tokens has that survival at the bounds.
    let generated = sample.output_tokens.as_ref().expect("vllm:request_generation_tokens");
    close(Some(generated.count), 27.0);
    close(Some(generated.sum), 2080.0);
    let law = DecodeLengths::from_output_histogram(generated).unwrap();
    for (decode, survival) in [(9.0, 15.0 / 27.0), (19.0, 10.0 / 27.0), (49.0, 4.0 / 27.0), (499.0, 0.0)] {
        close(Some(law.survival(decode)), survival);
    }
    // 0.12 dropped the gpu_* aliases and time_per_output_token.
    let text = fixture("vllm_0.32_busy.txt");
    assert!(!text.contains("vllm:gpu_") && !text.contains("vllm:time_per_output_token_seconds"));
    let idle = samples("vllm_0.32_idle.txt");
    let after = samples("vllm_0.32_after.txt");
    let stats = window(model(&idle, TINY), model(&after, TINY), Duration::from_secs(2)).unwrap();
    assert!(!stats.counter_reset);
    close(stats.request_rate, (29.0 - 15.0) / 2.0);
    close(stats.error_rate, 0.0);
    close(stats.preemption_rate, 0.0);
    assert!(stats.ttft.is_some() && stats.tbot.is_some() && stats.queue.is_some());
    let generated = stats.output_tokens.expect("generated tokens of the window's requests");
    close(Some(generated.count), 14.0);
    close(Some(generated.sum), 2960.0 - 240.0);
}

#[test]
fn vllm_sleep_state_and_summed_engine_cores() {
    let text = fixture("vllm_0.32_busy.txt");
    let asleep = text.replace(
        "vllm:engine_sleep_state{engine=\"0\",model_name=\"tiny-llama\",sleep_state=\"awake\"} 1.0",
        "vllm:engine_sleep_state{engine=\"0\",model_name=\"tiny-llama\",sleep_state=\"awake\"} 0.0",
    );
    assert_ne!(asleep, text);
    let parsed = extract(&parse(&asleep, &Limits::default()).unwrap());
    assert_eq!(only(&parsed).asleep, Some(true));
    // A second engine core (engine="1") with the same series: counts and gauges add up, and the
    // server is awake while any core is.
    let second: String = text
        .lines()
        .filter(|l| l.starts_with("vllm:") && l.contains("engine=\"0\""))
        .map(|l| l.replace("engine=\"0\"", "engine=\"1\""))
        .map(|l| {
            if l.starts_with("vllm:engine_sleep_state") && l.contains("\"awake\"") {
                l.replace("} 1.0", "} 0.0")
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let both = format!("{text}\n{second}\n");
    let parsed = extract(&parse(&both, &Limits::default()).unwrap());
    let sample = only(&parsed);
    close(sample.running, 4.0);
    close(sample.requests_finished, 54.0);
    close(sample.ttft.as_ref().map(|h| h.count), 58.0);
    assert_eq!(sample.asleep, Some(false), "one core awake");
}

#[test]
fn sglang_counts_each_dp_group_once_and_absent_counters_are_zero() {
    let parsed = samples("sglang_0.5_dp2_tp2.txt");
    let sample = only(&parsed);
    assert_eq!(sample.flavor, EngineFlavor::Sglang);
    // Two DP groups of two TP ranks each: the TP copies count once, the groups add up.
    close(sample.running, 8.0);
    close(sample.waiting, 2.0);
    close(sample.kv_usage, 0.2);
    close(sample.gen_throughput, 700.5);
    close(sample.preemptions, 4.0);
    close(sample.queue.as_ref().map(|h| h.count), 40.0);
    // Tokenizer metrics carry only the model label.
    close(sample.requests_finished, 40.0);
    close(sample.prompt_tokens, 12_000.0);
    close(sample.ttft.as_ref().map(|h| h.count), 40.0);
    // Registered at their first event, absent here: zero, not unknown.
    close(sample.prefix_cache_hits, 0.0);
    close(sample.prefix_cache_queries, 12_000.0);
    close(sample.requests_failed, 0.0);
}

#[test]
fn sglang_before_its_first_request_reads_zero_and_the_first_window_counts() {
    // A fresh server: scheduler gauges only; no tokenizer counter or histogram exists yet.
    let text = fixture("sglang_0.5_dp2_tp2.txt");
    let fresh: String = text
        .lines()
        .filter(|l| l.starts_with('#') || l.contains("tp_rank"))
        .filter(|l| !l.contains("queue_time") && !l.contains("retracted_requests_total"))
        .collect::<Vec<_>>()
        .join("\n");
    let before = extract(&parse(&fresh, &Limits::default()).unwrap());
    let before = only(&before);
    close(before.requests_finished, 0.0);
    close(before.prompt_tokens, 0.0);
    close(before.preemptions, 0.0);
    assert!(before.ttft.is_none());
    let after = samples("sglang_0.5_dp2_tp2.txt");
    let stats = window(before, only(&after), Duration::from_secs(10)).unwrap();
    assert!(!stats.counter_reset);
    close(stats.request_rate, 4.0);
    close(stats.preemption_rate, 0.4);
    let ttft = stats.ttft.expect("absent before means empty, so the first window counts");
    close(Some(ttft.count), 40.0);
    close(stats.queue.map(|q| q.count), 40.0);
}

#[test]
fn tgi_names_from_source() {
    let parsed = samples("tgi_3.3.txt");
    let sample = only(&parsed);
    assert_eq!(sample.flavor, EngineFlavor::Tgi);
    close(sample.running, 8.0);
    close(sample.waiting, 3.0);
    // Validation failures are the client's: 40 successes + 1 generation failure.
    close(sample.requests_finished, 41.0);
    close(sample.requests_failed, 1.0);
    close(sample.prompt_tokens, 12_000.0);
    close(sample.generation_tokens, 3400.0);
    close(sample.output_tokens.as_ref().map(|h| h.count), 40.0);
    assert!(sample.ttft.is_none(), "TGI has no time-to-first-token histogram");
    close(sample.tbot.as_ref().and_then(Histogram::mean), 0.02);
    close(sample.e2e.as_ref().map(|h| h.count), 40.0);
    close(sample.queue.as_ref().and_then(Histogram::mean), 0.05);
    assert_eq!(sample.prefix_cache_queries, None);
}

#[test]
fn engine_simulator_is_told_apart_by_its_replica_gauges() {
    let text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3.0\n\
                # TYPE ilb_engine_replicas gauge\nilb_engine_replicas{model_name=\"m\"} 2.0\n\
                # TYPE ilb_engine_ready_replicas gauge\nilb_engine_ready_replicas{model_name=\"m\"} 0.0\n";
    let parsed = extract(&parse(text, &Limits::default()).unwrap());
    let sample = only(&parsed);
    assert_eq!(sample.flavor, EngineFlavor::IlbSim);
    close(sample.running, 3.0);
    close(sample.replicas, 2.0);
    close(sample.ready_replicas, 0.0);
}

#[test]
fn legacy_fixtures_are_labelled() {
    for file in ["vllm.txt", "vllm_later.txt", "vllm_v0.txt", "sglang.txt"] {
        assert!(fixture(file).starts_with("# Hand-written, not captured: "), "{file}");
        assert!(fixture(file).lines().take(3).any(|l| l.contains("LEGACY")), "{file}");
    }
    for file in ["sglang_0.5_dp2_tp2.txt", "tgi_3.3.txt"] {
        assert!(fixture(file).starts_with("# Built by hand from the metric definitions"), "{file}");
    }
    for file in ["llamacpp_idle.txt", "llamacpp_busy.txt", "llamacpp_after.txt", "vllm_0.32_busy.txt"] {
        assert!(fixture(file).starts_with("# Live capture"), "{file}");
    }
}

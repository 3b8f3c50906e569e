//! Engine signals from the vLLM (current and V0) and SGLang fixtures, and windowed figures
//! between two vLLM scrapes taken 10 s apart (the fixtures are built with known deltas:
//! 100 requests of which 2 aborted, 50k prompt and 20k generated tokens, half the prefix
//! lookups hit, TTFT deltas 50 in (60,80] ms, 40 in (80,100], 10 in (100,250]).

use ilb_controlplane::prom::{parse, Limits};
use ilb_controlplane::signals::{extract, window, EngineFlavor, EngineSample, Histogram};
use ilb_core::ModelName;
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

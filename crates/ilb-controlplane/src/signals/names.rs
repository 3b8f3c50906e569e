//! The engine metric names ilb reads, in one place. Where an engine renamed a metric, the
//! list is in order of preference: newer engines often expose the old name too (deprecated
//! but still emitted), and taking both would count the same events twice.
//!
//! Checked against vLLM `vllm/v1/metrics/loggers.py` and SGLang
//! `python/sglang/srt/metrics/collector.py`.

/// Labels that carry the served model name, in order of preference (SGLang before 0.4 used
/// `name`).
pub const MODEL_LABELS: [&str; 2] = ["model_name", "name"];

/// Gauge: requests in the running batch.
pub const RUNNING: [&str; 2] = ["vllm:num_requests_running", "sglang:num_running_reqs"];
/// Gauge: requests waiting in the queue.
pub const WAITING: [&str; 2] = ["vllm:num_requests_waiting", "sglang:num_queue_reqs"];
/// Gauge: KV-cache usage fraction (0..1). vLLM V1 renamed `gpu_cache_usage_perc`.
pub const KV_USAGE: [&str; 3] =
    ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"];
/// Counter: prompt tokens processed.
pub const PROMPT_TOKENS: [&str; 2] = ["vllm:prompt_tokens_total", "sglang:prompt_tokens_total"];
/// Counter: generated tokens.
pub const GENERATION_TOKENS: [&str; 2] = ["vllm:generation_tokens_total", "sglang:generation_tokens_total"];
/// Counter: prefix-cache queries, in tokens (vLLM V1; the `gpu_` names are deprecated
/// aliases). SGLang has no such counter: its prompt tokens play that role.
pub const PREFIX_QUERIES: [&str; 2] =
    ["vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"];
/// Counter: prefix-cache hits, in tokens. SGLang: cached prompt tokens.
pub const PREFIX_HITS: [&str; 3] =
    ["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total", "sglang:cached_tokens_total"];
/// Gauge: prefix-cache hit rate as the engine computes it (SGLang, vLLM V0).
pub const PREFIX_HIT_RATE_GAUGE: [&str; 2] = ["sglang:cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate"];
/// Counter: finished requests. vLLM labels it with `finished_reason`.
pub const VLLM_REQUEST_FINISHED: &str = "vllm:request_success_total";
/// `finished_reason` values of [`VLLM_REQUEST_FINISHED`] that count as failures.
pub const VLLM_FAILED_REASONS: [&str; 2] = ["abort", "error"];
/// Counter: finished requests (SGLang).
pub const SGLANG_REQUESTS: &str = "sglang:num_requests_total";
/// Counter: aborted requests (SGLang).
pub const SGLANG_ABORTED: &str = "sglang:num_aborted_requests_total";
/// Gauge: generation throughput, tokens/s (SGLang).
pub const GEN_THROUGHPUT: [&str; 1] = ["sglang:gen_throughput"];

/// Histogram families, seconds.
pub const TTFT: [&str; 2] = ["vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"];
/// Inter-token latency (TBOT). Older engines call it time per output token.
pub const TBOT: [&str; 4] = [
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:time_per_output_token_seconds",
];
/// End-to-end request latency.
pub const E2E: [&str; 2] = ["vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"];

/// Every scalar (non-histogram) sample name read, so the extractor can skip the rest cheaply.
pub fn is_scalar(name: &str) -> bool {
    [&RUNNING[..], &WAITING, &KV_USAGE, &PROMPT_TOKENS, &GENERATION_TOKENS, &PREFIX_QUERIES]
        .iter()
        .chain([&PREFIX_HITS[..], &PREFIX_HIT_RATE_GAUGE, &GEN_THROUGHPUT].iter())
        .any(|names| names.contains(&name))
        || name == SGLANG_REQUESTS
        || name == SGLANG_ABORTED
}

/// Whether `family` is a histogram family that is read.
pub fn is_histogram(family: &str) -> bool {
    TTFT.contains(&family) || TBOT.contains(&family) || E2E.contains(&family)
}

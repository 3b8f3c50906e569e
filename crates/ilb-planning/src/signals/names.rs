//! The engine metric names ilb reads, in one place. Where an engine renamed a metric, the
//! list is in order of preference: newer engines often expose the old name too (deprecated
//! but still emitted), and taking both would count the same events twice.
//!
//! Read from the engines' own source (docs/engines.md has the table and where each name is
//! defined): vLLM `vllm/v1/metrics/loggers.py` (0.12), SGLang
//! `python/sglang/srt/metrics/collector.py`, llama.cpp `tools/server/server-task.cpp`
//! (`server_task_result_metrics::to_metrics`), TGI `router/src/server.rs`,
//! `backends/v3/src/{queue,backend}.rs` (3.3), and checked against live scrapes of vLLM and
//! llama.cpp (`tests/fixtures/`).

/// Labels that carry the served model name, in order of preference (SGLang before 0.4 used
/// `name`). llama.cpp and TGI label nothing with the model: their samples group under the
/// empty model name, and the control plane takes the engine's configured model.
pub const MODEL_LABELS: [&str; 2] = ["model_name", "name"];

/// SGLang labels that name the rank of the scheduler process that emitted a series. Every
/// rank of one data-parallel group reports the same scheduler state, so one series per
/// group is read (the lowest rank's); `dp_rank` groups are summed.
pub const SGLANG_RANK_LABELS: [&str; 3] = ["tp_rank", "pp_rank", "moe_ep_rank"];

/// Gauge: requests in the running batch. llama.cpp: busy slots. TGI: current batch size.
pub const RUNNING: [&str; 4] = [
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "llamacpp:requests_processing",
    "tgi_batch_current_size",
];
/// Gauge: requests waiting in the queue. llama.cpp: requests deferred (no free slot).
pub const WAITING: [&str; 4] =
    ["vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred", "tgi_queue_size"];
/// Gauge: KV-cache usage fraction (0..1). vLLM V1 renamed `gpu_cache_usage_perc` (gone in 0.12).
pub const KV_USAGE: [&str; 3] =
    ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"];
/// Counter: prompt tokens processed. llama.cpp (2025-11 on) excludes cached tokens.
pub const PROMPT_TOKENS: [&str; 3] =
    ["vllm:prompt_tokens_total", "sglang:prompt_tokens_total", "llamacpp:prompt_tokens_total"];
/// Counter: generated tokens.
pub const GENERATION_TOKENS: [&str; 3] =
    ["vllm:generation_tokens_total", "sglang:generation_tokens_total", "llamacpp:tokens_predicted_total"];
/// Counter: prefix-cache queries, in tokens (vLLM V1; the `gpu_` names are deprecated
/// aliases, gone in 0.12). SGLang has no such counter: its prompt tokens play that role;
/// llama.cpp: processed plus cached prompt tokens.
pub const PREFIX_QUERIES: [&str; 2] =
    ["vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"];
/// Counter: prefix-cache hits, in tokens. SGLang: cached prompt tokens; llama.cpp: prompt
/// tokens reused from the cache.
pub const PREFIX_HITS: [&str; 4] = [
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits_total",
    "sglang:cached_tokens_total",
    "llamacpp:prompt_tokens_cached_total",
];
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
/// Counter: preemptions (vLLM) or retractions (SGLang, KV cache full): a sign the engine runs
/// past its knee.
pub const PREEMPTIONS: [&str; 2] = ["vllm:num_preemptions_total", "sglang:num_retracted_requests_total"];
/// Gauge with label `sleep_state` (`awake`, `weights_offloaded`, `discard_all`), one series
/// per engine core (vLLM 0.11+).
pub const VLLM_SLEEP_STATE: &str = "vllm:engine_sleep_state";
/// Counters, seconds: time llama.cpp's slots spent on prompts and on generating tokens.
pub const LLAMACPP_PROMPT_SECONDS: &str = "llamacpp:prompt_seconds_total";
pub const LLAMACPP_DECODE_SECONDS: &str = "llamacpp:tokens_predicted_seconds_total";
/// Gauge: mean busy slots per `llama_decode()` call since start (llama.cpp's batch width).
pub const LLAMACPP_BUSY_SLOTS: &str = "llamacpp:n_busy_slots_per_decode";
/// Counters (TGI's exporter writes them without `_total`): successful and failed requests;
/// failures carry `err`.
pub const TGI_SUCCESS: &str = "tgi_request_success";
pub const TGI_FAILURE: &str = "tgi_request_failure";
/// `err` values of [`TGI_FAILURE`] that are the client's fault, not the engine's.
pub const TGI_CLIENT_ERRORS: [&str; 2] = ["validation", "template"];
/// Gauges of ilb's engine simulator: replicas behind the endpoint and those taking requests.
pub const ILB_REPLICAS: &str = "ilb_engine_replicas";
pub const ILB_READY_REPLICAS: &str = "ilb_engine_ready_replicas";

/// Histogram families, seconds. llama.cpp and TGI have no time-to-first-token histogram: the
/// data planes' measurements stand in.
pub const TTFT: [&str; 2] = ["vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"];
/// Inter-token latency (TBOT). Older engines call it time per output token (vLLM dropped that
/// name in 0.12); TGI has only a per-request mean time per token.
pub const TBOT: [&str; 5] = [
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:time_per_output_token_seconds",
    "tgi_request_mean_time_per_token_duration",
];
/// End-to-end request latency.
pub const E2E: [&str; 3] =
    ["vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds", "tgi_request_duration"];
/// Time spent queued before scheduling.
pub const QUEUE: [&str; 3] =
    ["vllm:request_queue_time_seconds", "sglang:queue_time_seconds", "tgi_request_queue_duration"];
/// Generated tokens per finished request: the law of output lengths (SGLang's only with
/// `--enable-metrics` and its token histograms on).
pub const OUTPUT_TOKENS: [&str; 3] =
    ["vllm:request_generation_tokens", "sglang:generation_tokens_histogram", TGI_GENERATED_TOKENS];
/// TGI histograms whose sums are token counters (TGI has no token counters of its own).
pub const TGI_INPUT_LENGTH: &str = "tgi_request_input_length";
pub const TGI_GENERATED_TOKENS: &str = "tgi_request_generated_tokens";

/// Every scalar (non-histogram) sample name read, so the extractor can skip the rest cheaply.
pub fn is_scalar(name: &str) -> bool {
    [&RUNNING[..], &WAITING, &KV_USAGE, &PROMPT_TOKENS, &GENERATION_TOKENS, &PREFIX_QUERIES]
        .iter()
        .chain([&PREFIX_HITS[..], &PREFIX_HIT_RATE_GAUGE, &GEN_THROUGHPUT, &PREEMPTIONS].iter())
        .any(|names| names.contains(&name))
        || [
            SGLANG_REQUESTS,
            SGLANG_ABORTED,
            LLAMACPP_PROMPT_SECONDS,
            LLAMACPP_DECODE_SECONDS,
            LLAMACPP_BUSY_SLOTS,
            TGI_SUCCESS,
            ILB_REPLICAS,
            ILB_READY_REPLICAS,
        ]
        .contains(&name)
}

/// Whether `family` is a histogram family that is read.
pub fn is_histogram(family: &str) -> bool {
    TTFT.contains(&family)
        || TBOT.contains(&family)
        || E2E.contains(&family)
        || QUEUE.contains(&family)
        || OUTPUT_TOKENS.contains(&family)
        || family == TGI_INPUT_LENGTH
}

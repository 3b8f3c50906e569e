//! Windowed figures between two consecutive samples of one engine and model: rates from
//! counter deltas, latency means and quantiles from histogram deltas. A counter that went
//! down means the engine restarted; as PromQL's `rate` does, the current value is then taken
//! as the increase, and [`WindowStats::counter_reset`] says so.

use super::{EngineSample, Histogram};
use std::time::Duration;

/// Latency over one window, milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyStats {
    /// Observations in the window.
    pub count: f64,
    pub mean_ms: f64,
    /// Approximate median (interpolated inside the histogram bucket).
    pub p50_ms: f64,
    /// Approximate 90th percentile.
    pub p90_ms: f64,
}

/// What happened between two samples. `None` fields: not exposed, or nothing observed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowStats {
    /// Window length, seconds.
    pub elapsed_s: f64,
    /// Some counter or histogram went down: the engine restarted during the window.
    pub counter_reset: bool,
    /// Finished requests per second.
    pub request_rate: Option<f64>,
    /// Fraction of finished requests that failed (aborted or errored), 0..1.
    pub error_rate: Option<f64>,
    /// Prompt tokens per second.
    pub prompt_token_rate: Option<f64>,
    /// Generated tokens per second.
    pub generation_token_rate: Option<f64>,
    /// Prefix-cache hits / lookups over the window (tokens); falls back to the engine's own
    /// hit-rate gauge when it has no counters.
    pub prefix_cache_hit_rate: Option<f64>,
    pub ttft: Option<LatencyStats>,
    pub tbot: Option<LatencyStats>,
    pub e2e: Option<LatencyStats>,
    /// Time queued before scheduling.
    pub queue: Option<LatencyStats>,
    /// Preemptions (vLLM) or retractions (SGLang) per second.
    pub preemption_rate: Option<f64>,
    /// Decode time per generated token, ms (llama.cpp: slot generation seconds over tokens,
    /// which is the mean time between tokens of a stream).
    pub decode_ms_per_token: Option<f64>,
    /// Generated tokens of the requests finished in the window.
    pub output_tokens: Option<Histogram>,
}

/// Computes the windowed figures from `previous` to `current`, taken `elapsed` apart.
/// Returns `None` for an empty window (rates would be undefined).
pub fn window(previous: &EngineSample, current: &EngineSample, elapsed: Duration) -> Option<WindowStats> {
    let elapsed_s = elapsed.as_secs_f64();
    if elapsed_s <= 0.0 {
        return None;
    }
    let mut reset = false;
    let mut delta = |before: Option<f64>, now: Option<f64>| -> Option<f64> {
        let (before, now) = (before?, now?);
        if !before.is_finite() || !now.is_finite() {
            return None;
        }
        if now < before {
            reset = true;
            Some(now.max(0.0))
        } else {
            Some(now - before)
        }
    };
    let finished = delta(previous.requests_finished, current.requests_finished);
    let failed = delta(previous.requests_failed, current.requests_failed);
    let prompt = delta(previous.prompt_tokens, current.prompt_tokens);
    let generated = delta(previous.generation_tokens, current.generation_tokens);
    let queries = delta(previous.prefix_cache_queries, current.prefix_cache_queries);
    let hits = delta(previous.prefix_cache_hits, current.prefix_cache_hits);
    let preempted = delta(previous.preemptions, current.preemptions);
    let decode_seconds = delta(previous.decode_seconds, current.decode_seconds);

    // SGLang and TGI register a histogram at its first observation: absent before means empty.
    let absent_is_empty = previous.flavor.absent_means_zero() && previous.flavor == current.flavor;
    let mut histogram_delta = |before: &Option<Histogram>, now: &Option<Histogram>| -> Option<Histogram> {
        let now = now.as_ref()?;
        let Some(before) = before.as_ref() else {
            return absent_is_empty.then(|| now.clone());
        };
        let (window, was_reset) = now.delta_since(before)?;
        reset |= was_reset;
        Some(window)
    };
    let ttft = histogram_delta(&previous.ttft, &current.ttft);
    let tbot = histogram_delta(&previous.tbot, &current.tbot);
    let e2e = histogram_delta(&previous.e2e, &current.e2e);
    let queue = histogram_delta(&previous.queue, &current.queue);
    let output_tokens = histogram_delta(&previous.output_tokens, &current.output_tokens);

    // Without a request counter, every finished request still lands in the e2e histogram.
    let finished = finished.or(e2e.as_ref().map(|window| window.count));
    let error_rate = match (finished, failed) {
        (Some(finished), Some(failed)) if finished > 0.0 => Some((failed / finished).clamp(0.0, 1.0)),
        _ => None,
    };
    let prefix_cache_hit_rate = match (queries, hits) {
        (Some(queries), Some(hits)) if queries > 0.0 => Some((hits / queries).clamp(0.0, 1.0)),
        _ => current.prefix_cache_hit_rate,
    };
    Some(WindowStats {
        elapsed_s,
        counter_reset: reset,
        request_rate: finished.map(|n| n / elapsed_s),
        error_rate,
        prompt_token_rate: prompt.map(|n| n / elapsed_s),
        generation_token_rate: generated.map(|n| n / elapsed_s),
        prefix_cache_hit_rate,
        ttft: ttft.as_ref().and_then(latency_stats),
        tbot: tbot.as_ref().and_then(latency_stats),
        e2e: e2e.as_ref().and_then(latency_stats),
        queue: queue.as_ref().and_then(latency_stats),
        preemption_rate: preempted.map(|n| n / elapsed_s),
        decode_ms_per_token: match (decode_seconds, generated) {
            (Some(seconds), Some(tokens)) if tokens > 0.0 => Some(seconds / tokens * 1000.0),
            _ => None,
        },
        output_tokens: output_tokens.filter(|h| h.count > 0.0),
    })
}

fn latency_stats(window: &Histogram) -> Option<LatencyStats> {
    Some(LatencyStats {
        count: window.count,
        mean_ms: window.mean()? * 1000.0,
        p50_ms: window.quantile(0.5)? * 1000.0,
        p90_ms: window.quantile(0.9)? * 1000.0,
    })
}

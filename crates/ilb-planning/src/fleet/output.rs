//! What the engines' answers are like: generated tokens per finished request, learned per
//! engine from its scrapes and pooled per model, for the objective's decode term (the mean)
//! and its tail term (the law, [`DecodeLengths`]).
//!
//! The mean comes from the token and request counters every engine has; the law's shape from
//! the histograms of generated tokens per request that vLLM, SGLang and TGI expose, and for an
//! engine without one (llama.cpp) from the same histogram the data planes count of its answers
//! (their `usage`, or their streamed events) and report. Both decay over `OUTPUT_LENGTH_TAU`,
//! so that a change of workload shows within a few minutes, and both start from the configured
//! `expected_output_tokens` (exponential), a prior worth `OUTPUT_PRIOR_REQUESTS` requests.

use super::Now;
use crate::profile::DecodeLengths;
use crate::signals::{Histogram, WindowStats};
use crate::smoothing::{DecayedSums, TimePoint};
use ilb_core::metrics::OUTPUT_TOKEN_BUCKETS;
use ilb_core::report::TokenCounts;
use std::time::Duration;

/// How much the configured `expected_output_tokens` counts against what the engines report,
/// in finished requests.
const OUTPUT_PRIOR_REQUESTS: f64 = 20.0;

/// Time constant of the output-length estimate: long enough to average over many requests,
/// short enough to follow a change of workload within a few minutes.
const OUTPUT_LENGTH_TAU: Duration = Duration::from_secs(120);

/// One engine's answers.
#[derive(Clone, Debug)]
pub(super) struct OutputLengths {
    /// Generated tokens and finished requests, decayed.
    sums: DecayedSums<Now>,
    /// Its histogram of generated tokens per request, counts decayed the same way, as of when.
    histogram: Option<(Histogram, Now)>,
    /// The engine exposes that histogram itself: the data planes' count is not needed.
    counted_by_engine: bool,
}

impl OutputLengths {
    pub(super) fn new() -> OutputLengths {
        OutputLengths { sums: DecayedSums::new(OUTPUT_LENGTH_TAU), histogram: None, counted_by_engine: false }
    }

    /// Adds one scrape window; `finished` requests in it (the engine's count, or the data
    /// planes' rate for engines that count none).
    pub(super) fn add(&mut self, now: Now, window: &WindowStats, finished: Option<f64>) {
        if let (Some(tokens), Some(finished)) = (window.generation_token_rate, finished) {
            self.sums.add(now, tokens * window.elapsed_s, finished * window.elapsed_s);
        }
        if let Some(delta) = &window.output_tokens {
            self.counted_by_engine = true;
            self.add_histogram(now, delta);
        }
    }

    /// Adds the answers one data plane counted in one report period, unless the engine counts
    /// them itself (the same answers, counted twice).
    pub(super) fn add_reported(&mut self, now: Now, counts: &TokenCounts) {
        if self.counted_by_engine {
            return;
        }
        if let Some(delta) = reported_histogram(counts) {
            self.add_histogram(now, &delta);
        }
    }

    fn add_histogram(&mut self, now: Now, delta: &Histogram) {
        let Some((kept, since)) = &mut self.histogram else {
            self.histogram = Some((delta.clone(), now));
            return;
        };
        // A window older than the last is ignored, as `DecayedSums` ignores it.
        let age = now.seconds_since(*since);
        if age < 0.0 {
            return;
        }
        kept.scale((-age / OUTPUT_LENGTH_TAU.as_secs_f64()).exp());
        // New bounds (the engine restarted with another maximum length): start afresh.
        if !kept.add(delta) {
            *kept = delta.clone();
        }
        *since = now;
    }

    /// Answers in its histogram (decayed), and whether the data planes counted them.
    pub(super) fn counted(&self) -> (f64, bool) {
        let answers = self.histogram.as_ref().map_or(0.0, |(h, _)| h.count);
        (answers, answers > 0.0 && !self.counted_by_engine)
    }

    /// The engine's histogram's law and its weight (decayed requests), if it has one.
    fn law(&self) -> Option<(f64, DecodeLengths)> {
        let (histogram, _) = self.histogram.as_ref()?;
        Some((histogram.count, DecodeLengths::from_output_histogram(histogram)?))
    }
}

/// A data plane's count of answers per bucket of [`OUTPUT_TOKEN_BUCKETS`] as a histogram with
/// those bounds and +Inf (the report's validation checked their number).
fn reported_histogram(counts: &TokenCounts) -> Option<Histogram> {
    let bounds = OUTPUT_TOKEN_BUCKETS.iter().copied().chain([f64::INFINITY]);
    let mut cumulative = 0.0;
    let buckets = bounds
        .zip(&counts.buckets)
        .map(|(le, n)| {
            cumulative += *n as f64;
            (le, cumulative)
        })
        .collect();
    Histogram::from_parts(buckets, counts.sum as f64, cumulative)
}

/// Mean output tokens per request over `engines` (one model's), against `prior` as worth
/// `OUTPUT_PRIOR_REQUESTS` requests.
pub(super) fn mean_output_tokens<'a>(prior: f64, engines: impl Iterator<Item = &'a OutputLengths>) -> f64 {
    let (tokens, requests) =
        engines.map(|e| e.sums.sums()).fold((0.0, 0.0), |(t, r), (et, er)| (t + et, r + er));
    (prior * OUTPUT_PRIOR_REQUESTS + tokens) / (OUTPUT_PRIOR_REQUESTS + requests)
}

/// The law of decode tokens (output tokens less the first) over `engines`: the mixture of their
/// histograms' laws and the prior's exponential (each by its requests), stretched to mean
/// `decode_tokens`.
pub(super) fn decode_lengths<'a>(
    prior_decode_tokens: f64,
    decode_tokens: f64,
    engines: impl Iterator<Item = &'a OutputLengths>,
) -> DecodeLengths {
    let prior = DecodeLengths::exponential(prior_decode_tokens);
    let laws: Vec<(f64, DecodeLengths)> = engines.filter_map(OutputLengths::law).collect();
    if laws.is_empty() {
        return DecodeLengths::exponential(decode_tokens);
    }
    let parts: Vec<(f64, &DecodeLengths)> = std::iter::once((OUTPUT_PRIOR_REQUESTS, &prior))
        .chain(laws.iter().map(|(w, law)| (*w, law)))
        .collect();
    DecodeLengths::mixture(&parts)
        .map_or_else(|| DecodeLengths::exponential(decode_tokens), |law| law.scaled_to_mean(decode_tokens))
}

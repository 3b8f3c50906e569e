//! Engine signals: from one parsed scrape of a vLLM or SGLang server, one [`EngineSample`] per
//! served model, and ([`window`]) the windowed figures between two consecutive samples.
//!
//! A model may appear in several series (vLLM's `engine` label for data-parallel engine
//! cores, SGLang's `dp_rank`): counters, histograms, running and waiting counts are summed
//! over them, and fractions (KV usage, hit-rate gauges) are averaged. Series without a model
//! label are grouped under the empty model name.

mod histogram;
pub mod names;
mod window;

pub use histogram::Histogram;
pub use window::{window, LatencyStats, WindowStats};

use crate::prom::{Exposition, Sample};
use ilb_core::ModelName;
use std::collections::{BTreeMap, HashMap};

/// Which engine software produced a sample, from its metric prefix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineFlavor {
    #[default]
    Vllm,
    Sglang,
}

/// One model's signals from one scrape. Counters are cumulative since engine start; `None`
/// means the engine did not expose the metric.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineSample {
    pub flavor: EngineFlavor,
    /// Requests in the running batch (gauge).
    pub running: Option<f64>,
    /// Requests waiting in the queue (gauge).
    pub waiting: Option<f64>,
    /// KV-cache usage fraction, 0..1 (gauge).
    pub kv_usage: Option<f64>,
    /// Prompt tokens processed (counter).
    pub prompt_tokens: Option<f64>,
    /// Generated tokens (counter).
    pub generation_tokens: Option<f64>,
    /// Prefix-cache lookups, tokens (counter). For SGLang: prompt tokens.
    pub prefix_cache_queries: Option<f64>,
    /// Prefix-cache hits, tokens (counter). For SGLang: cached prompt tokens.
    pub prefix_cache_hits: Option<f64>,
    /// Prefix-cache hit rate as computed by the engine itself (gauge; SGLang, vLLM V0).
    pub prefix_cache_hit_rate: Option<f64>,
    /// Finished requests, whatever the outcome (counter).
    pub requests_finished: Option<f64>,
    /// Finished requests that were aborted or errored (counter).
    pub requests_failed: Option<f64>,
    /// Generation throughput reported by the engine, tokens/s (gauge; SGLang).
    pub gen_throughput: Option<f64>,
    /// Time to first token, seconds.
    pub ttft: Option<Histogram>,
    /// Time between output tokens (inter-token latency), seconds.
    pub tbot: Option<Histogram>,
    /// End-to-end request latency, seconds.
    pub e2e: Option<Histogram>,
}

/// Sum and number of series of one scalar metric.
#[derive(Clone, Copy, Default)]
struct ScalarAcc {
    sum: f64,
    series: u32,
}

impl ScalarAcc {
    fn add(&mut self, value: f64) {
        // NaN gauges (an engine that has not computed a figure yet) carry no information.
        if value.is_finite() {
            self.sum += value;
            self.series += 1;
        }
    }
}

struct HistParts {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Default for HistParts {
    /// NaN marks a missing `_sum` / `_count` line (the histogram then derives what it can).
    fn default() -> Self {
        Self { buckets: Vec::new(), sum: f64::NAN, count: f64::NAN }
    }
}

#[derive(Default)]
struct ModelAcc<'a> {
    flavor: Option<EngineFlavor>,
    scalars: HashMap<&'a str, ScalarAcc>,
    vllm_finished: ScalarAcc,
    vllm_failed: ScalarAcc,
    /// family → series key (labels other than `le`) → parts.
    histograms: HashMap<&'a str, BTreeMap<String, HistParts>>,
}

/// Extracts one [`EngineSample`] per model from a parsed exposition, sorted by model name.
/// Models are those that expose at least one recognised vLLM or SGLang metric.
pub fn extract(exposition: &Exposition<'_>) -> Vec<(ModelName, EngineSample)> {
    let mut models: BTreeMap<String, ModelAcc<'_>> = BTreeMap::new();
    for sample in &exposition.samples {
        let flavor = if sample.name.starts_with("vllm:") {
            EngineFlavor::Vllm
        } else if sample.name.starts_with("sglang:") {
            EngineFlavor::Sglang
        } else {
            continue;
        };
        accumulate(&mut models, sample, flavor);
    }
    models.into_iter().map(|(model, acc)| (ModelName::new(model), acc.finish())).collect()
}

fn model_of(sample: &Sample<'_>) -> String {
    names::MODEL_LABELS.iter().find_map(|label| sample.label(label)).unwrap_or("").to_owned()
}

fn accumulate<'a>(models: &mut BTreeMap<String, ModelAcc<'a>>, sample: &Sample<'a>, flavor: EngineFlavor) {
    let name = sample.name;
    if names::is_scalar(name) || name == names::VLLM_REQUEST_FINISHED {
        let acc = models.entry(model_of(sample)).or_default();
        acc.flavor.get_or_insert(flavor);
        if name == names::VLLM_REQUEST_FINISHED {
            acc.vllm_finished.add(sample.value);
            let reason = sample.label("finished_reason").unwrap_or("");
            if names::VLLM_FAILED_REASONS.contains(&reason) {
                acc.vllm_failed.add(sample.value);
            }
        } else {
            acc.scalars.entry(name).or_default().add(sample.value);
        }
        return;
    }
    let (family, part) = if let Some(family) = name.strip_suffix("_bucket") {
        (family, Part::Bucket)
    } else if let Some(family) = name.strip_suffix("_sum") {
        (family, Part::Sum)
    } else if let Some(family) = name.strip_suffix("_count") {
        (family, Part::Count)
    } else {
        return;
    };
    if !names::is_histogram(family) {
        return;
    }
    let le = sample.label("le").and_then(|le| le.parse::<f64>().ok());
    let series_key = sample
        .labels
        .iter()
        .filter(|label| label.name != "le")
        .map(|label| format!("{}={}\u{1f}", label.name, label.value))
        .collect::<String>();
    let acc = models.entry(model_of(sample)).or_default();
    acc.flavor.get_or_insert(flavor);
    let parts = acc.histograms.entry(family).or_default().entry(series_key).or_default();
    match part {
        Part::Bucket => {
            if let Some(le) = le {
                parts.buckets.push((le, sample.value));
            }
        }
        Part::Sum => parts.sum = sample.value,
        Part::Count => parts.count = sample.value,
    }
}

enum Part {
    Bucket,
    Sum,
    Count,
}

impl ModelAcc<'_> {
    /// Sum over series of the first name in `preference` that the engine exposed.
    fn sum(&self, preference: &[&str]) -> Option<f64> {
        preference.iter().find_map(|name| self.scalars.get(name)).filter(|a| a.series > 0).map(|a| a.sum)
    }

    /// Mean over series of the first name in `preference` that the engine exposed.
    fn mean(&self, preference: &[&str]) -> Option<f64> {
        preference
            .iter()
            .find_map(|name| self.scalars.get(name))
            .filter(|a| a.series > 0)
            .map(|a| a.sum / f64::from(a.series))
    }

    /// Sum over series of the first histogram family in `preference` that was exposed.
    /// Series whose bucket bounds differ from the first one cannot be added and are dropped.
    fn histogram(&mut self, preference: &[&str]) -> Option<Histogram> {
        let series = preference.iter().find_map(|family| self.histograms.remove(*family))?;
        let mut total: Option<Histogram> = None;
        for parts in series.into_values() {
            let Some(histogram) = Histogram::from_parts(parts.buckets, parts.sum, parts.count) else {
                continue;
            };
            match &mut total {
                None => total = Some(histogram),
                Some(total) => {
                    if !total.add(&histogram) {
                        tracing::debug!("histogram series with different bucket bounds dropped");
                    }
                }
            }
        }
        total
    }

    fn finish(mut self) -> EngineSample {
        let flavor = self.flavor.unwrap_or_default();
        let prompt_tokens = self.sum(&names::PROMPT_TOKENS);
        let prefix_cache_hits = self.sum(&names::PREFIX_HITS);
        let prefix_cache_queries = match flavor {
            EngineFlavor::Vllm => self.sum(&names::PREFIX_QUERIES),
            // SGLang counts cached prompt tokens, so prompt tokens are the lookups.
            EngineFlavor::Sglang => prefix_cache_hits.and(prompt_tokens),
        };
        let (requests_finished, requests_failed) = match flavor {
            EngineFlavor::Vllm => {
                let finished = (self.vllm_finished.series > 0).then_some(self.vllm_finished.sum);
                (finished, finished.map(|_| self.vllm_failed.sum))
            }
            EngineFlavor::Sglang => (self.sum(&[names::SGLANG_REQUESTS]), self.sum(&[names::SGLANG_ABORTED])),
        };
        EngineSample {
            flavor,
            running: self.sum(&names::RUNNING),
            waiting: self.sum(&names::WAITING),
            kv_usage: self.mean(&names::KV_USAGE),
            prompt_tokens,
            generation_tokens: self.sum(&names::GENERATION_TOKENS),
            prefix_cache_queries,
            prefix_cache_hits,
            prefix_cache_hit_rate: self.mean(&names::PREFIX_HIT_RATE_GAUGE),
            requests_finished,
            requests_failed,
            gen_throughput: self.sum(&names::GEN_THROUGHPUT),
            ttft: self.histogram(&names::TTFT),
            tbot: self.histogram(&names::TBOT),
            e2e: self.histogram(&names::E2E),
        }
    }
}

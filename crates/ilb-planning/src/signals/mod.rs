//! Engine signals: from one parsed scrape of a vLLM, SGLang, llama.cpp or TGI server (or ilb's
//! engine simulator), one [`EngineSample`] per served model, and ([`window()`]) the windowed
//! figures between two consecutive samples.
//!
//! A model may appear in several series (vLLM's `engine` label for data-parallel engine
//! cores, SGLang's `dp_rank`): counters, histograms, running and waiting counts are summed
//! over them, and fractions (KV usage, hit-rate gauges) are averaged. SGLang can emit the same
//! scheduler state once per tensor/pipeline/expert-parallel rank (`tp_rank`, `pp_rank`,
//! `moe_ep_rank`): of those copies only the lowest rank's is read, so a TP-8 server does not
//! count its running requests eight times. Series without a model label (llama.cpp, TGI) are
//! grouped under the empty model name.
//!
//! Absent and zero: SGLang and TGI register a labelled counter or histogram only at its first
//! event (`sglang:cached_tokens_total` appears with the first cache hit), so on those engines
//! an absent counter reads as zero, not unknown.

mod histogram;
pub mod names;
mod window;

pub use histogram::Histogram;
pub use window::{window, LatencyStats, WindowStats};

use crate::prom::{Exposition, Sample};
use ilb_core::ModelName;
use std::collections::{BTreeMap, HashMap};

/// Which engine software produced a sample, from its metric prefix. ilb's engine simulator
/// speaks vLLM's names and adds `ilb_engine_*` gauges, which tell it apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineFlavor {
    #[default]
    Vllm,
    Sglang,
    Llamacpp,
    Tgi,
    IlbSim,
}

impl EngineFlavor {
    /// The name shown in `/v1/state` and on the dashboard.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineFlavor::Vllm => "vllm",
            EngineFlavor::Sglang => "sglang",
            EngineFlavor::Llamacpp => "llamacpp",
            EngineFlavor::Tgi => "tgi",
            EngineFlavor::IlbSim => "ilb-sim",
        }
    }

    /// Whether the engine registers a counter or histogram only at its first event, so an
    /// absent one means zero (SGLang, TGI) rather than not exposed.
    pub fn absent_means_zero(self) -> bool {
        matches!(self, EngineFlavor::Sglang | EngineFlavor::Tgi)
    }

    fn of(name: &str) -> Option<EngineFlavor> {
        if name.starts_with("vllm:") {
            Some(EngineFlavor::Vllm)
        } else if name.starts_with("sglang:") {
            Some(EngineFlavor::Sglang)
        } else if name.starts_with("llamacpp:") {
            Some(EngineFlavor::Llamacpp)
        } else if name.starts_with("tgi_") {
            Some(EngineFlavor::Tgi)
        } else if name.starts_with("ilb_engine_") {
            Some(EngineFlavor::IlbSim)
        } else {
            None
        }
    }
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
    /// Preemptions (vLLM) or retractions (SGLang), counter.
    pub preemptions: Option<f64>,
    /// Whether the engine is asleep (vLLM `engine_sleep_state`: no engine core awake).
    pub asleep: Option<bool>,
    /// Replicas behind the endpoint and those taking requests (ilb's engine simulator).
    pub replicas: Option<f64>,
    pub ready_replicas: Option<f64>,
    /// Seconds the engine spent generating tokens, summed over its slots (llama.cpp, counter).
    pub decode_seconds: Option<f64>,
    /// Seconds spent processing prompts, summed over slots (llama.cpp, counter).
    pub prompt_seconds: Option<f64>,
    /// Mean busy slots per decode call since start (llama.cpp, gauge).
    pub busy_slots_per_decode: Option<f64>,
    /// Time to first token, seconds.
    pub ttft: Option<Histogram>,
    /// Time between output tokens (inter-token latency), seconds.
    pub tbot: Option<Histogram>,
    /// End-to-end request latency, seconds.
    pub e2e: Option<Histogram>,
    /// Time queued before scheduling, seconds.
    pub queue: Option<Histogram>,
    /// Generated tokens per finished request.
    pub output_tokens: Option<Histogram>,
}

/// One scalar metric: per series group (labels other than the model and the SGLang rank
/// labels), the value of the lowest rank seen.
#[derive(Clone, Default)]
struct ScalarAcc {
    groups: BTreeMap<String, (String, f64)>,
}

impl ScalarAcc {
    fn add(&mut self, group: String, rank: String, value: f64) {
        // NaN gauges (an engine that has not computed a figure yet) carry no information.
        if !value.is_finite() {
            return;
        }
        match self.groups.get_mut(&group) {
            Some(existing) if existing.0 <= rank => {}
            Some(existing) => *existing = (rank, value),
            None => {
                self.groups.insert(group, (rank, value));
            }
        }
    }

    fn series(&self) -> usize {
        self.groups.len()
    }

    fn sum(&self) -> f64 {
        self.groups.values().map(|(_, v)| v).sum()
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
    tgi_failed: ScalarAcc,
    /// `vllm:engine_sleep_state{sleep_state="awake"}` per engine core.
    vllm_awake: ScalarAcc,
    /// family → series key (labels other than `le` and ranks) → rank key → parts. Only the
    /// lowest rank of each series is read.
    histograms: HashMap<&'a str, BTreeMap<String, BTreeMap<String, HistParts>>>,
}

/// Extracts one [`EngineSample`] per model from a parsed exposition, sorted by model name.
/// Models are those that expose at least one recognised engine metric.
pub fn extract(exposition: &Exposition<'_>) -> Vec<(ModelName, EngineSample)> {
    let mut models: BTreeMap<String, ModelAcc<'_>> = BTreeMap::new();
    for sample in &exposition.samples {
        let Some(flavor) = EngineFlavor::of(sample.name) else { continue };
        accumulate(&mut models, sample, flavor);
    }
    models.into_iter().map(|(model, acc)| (ModelName::new(model), acc.finish())).collect()
}

fn model_of(sample: &Sample<'_>) -> String {
    names::MODEL_LABELS.iter().find_map(|label| sample.label(label)).unwrap_or("").to_owned()
}

/// (group key, rank key) of a sample: the group is every label but the model, `le`, the rank
/// labels and those in `skip`; the rank is the SGLang rank labels.
fn keys(sample: &Sample<'_>, skip: &[&str]) -> (String, String) {
    let mut group = String::new();
    let mut rank = String::new();
    for label in &sample.labels {
        let name = label.name;
        if name == "le" || names::MODEL_LABELS.contains(&name) || skip.contains(&name) {
            continue;
        }
        // Rank labels hold small integers; pad them so the string order is the numeric one.
        let target = if names::SGLANG_RANK_LABELS.contains(&name) { &mut rank } else { &mut group };
        target.push_str(name);
        target.push('=');
        if names::SGLANG_RANK_LABELS.contains(&name) {
            target.push_str(&format!("{:>8}", label.value));
        } else {
            target.push_str(&label.value);
        }
        target.push('\u{1f}');
    }
    (group, rank)
}

fn note_flavor(acc: &mut ModelAcc<'_>, flavor: EngineFlavor) {
    match acc.flavor {
        None => acc.flavor = Some(flavor),
        // The simulator's own gauges mark vLLM-named samples as the simulator's.
        Some(EngineFlavor::Vllm) if flavor == EngineFlavor::IlbSim => acc.flavor = Some(flavor),
        Some(_) => {}
    }
}

fn accumulate<'a>(models: &mut BTreeMap<String, ModelAcc<'a>>, sample: &Sample<'a>, flavor: EngineFlavor) {
    let name = sample.name;
    let special =
        name == names::VLLM_REQUEST_FINISHED || name == names::VLLM_SLEEP_STATE || name == names::TGI_FAILURE;
    if names::is_scalar(name) || special {
        let acc = models.entry(model_of(sample)).or_default();
        note_flavor(acc, flavor);
        if name == names::VLLM_REQUEST_FINISHED {
            let (group, rank) = keys(sample, &[]);
            acc.vllm_finished.add(group.clone(), rank.clone(), sample.value);
            let reason = sample.label("finished_reason").unwrap_or("");
            if names::VLLM_FAILED_REASONS.contains(&reason) {
                acc.vllm_failed.add(group, rank, sample.value);
            }
        } else if name == names::VLLM_SLEEP_STATE {
            if sample.label("sleep_state") == Some("awake") {
                let (group, rank) = keys(sample, &["sleep_state"]);
                acc.vllm_awake.add(group, rank, sample.value);
            }
        } else if name == names::TGI_FAILURE {
            let err = sample.label("err").unwrap_or("");
            if !names::TGI_CLIENT_ERRORS.contains(&err) {
                let (group, rank) = keys(sample, &[]);
                acc.tgi_failed.add(group, rank, sample.value);
            }
        } else {
            let (group, rank) = keys(sample, &[]);
            acc.scalars.entry(name).or_default().add(group, rank, sample.value);
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
    let (group, rank) = keys(sample, &[]);
    let acc = models.entry(model_of(sample)).or_default();
    note_flavor(acc, flavor);
    let parts = acc.histograms.entry(family).or_default().entry(group).or_default().entry(rank).or_default();
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
    fn acc<'s>(&'s self, preference: &[&str]) -> Option<&'s ScalarAcc> {
        preference.iter().find_map(|name| self.scalars.get(*name)).filter(|a| a.series() > 0)
    }

    /// Sum over series of the first name in `preference` that the engine exposed.
    fn sum(&self, preference: &[&str]) -> Option<f64> {
        self.acc(preference).map(ScalarAcc::sum)
    }

    /// Mean over series of the first name in `preference` that the engine exposed.
    fn mean(&self, preference: &[&str]) -> Option<f64> {
        self.acc(preference).map(|a| a.sum() / a.series() as f64)
    }

    /// Sum over series of the first histogram family in `preference` that was exposed.
    /// Series whose bucket bounds differ from the first one cannot be added and are dropped.
    fn histogram(&mut self, preference: &[&str]) -> Option<Histogram> {
        let series = preference.iter().find_map(|family| self.histograms.remove(*family))?;
        let mut total: Option<Histogram> = None;
        // Per series, the lowest rank's copy only.
        for parts in series.into_values().filter_map(|ranks| ranks.into_values().next()) {
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
        // Counters an engine registers at their first event read as zero until then.
        // (TGI's token counts come from histogram sums below; its success counter is handled there.)
        let zero = (flavor == EngineFlavor::Sglang).then_some(0.0);
        let counter = |acc: &ModelAcc<'_>, names: &[&str]| acc.sum(names).or(zero);
        let mut prompt_tokens = counter(&self, &names::PROMPT_TOKENS);
        let mut generation_tokens = counter(&self, &names::GENERATION_TOKENS);
        let prefix_cache_hits = counter(&self, &names::PREFIX_HITS);
        let prefix_cache_queries = match flavor {
            EngineFlavor::Vllm | EngineFlavor::IlbSim | EngineFlavor::Tgi => self.sum(&names::PREFIX_QUERIES),
            // SGLang counts cached prompt tokens, so prompt tokens are the lookups.
            EngineFlavor::Sglang => prefix_cache_hits.and(prompt_tokens),
            // llama.cpp's prompt tokens exclude the cached ones.
            EngineFlavor::Llamacpp => prefix_cache_hits.zip(prompt_tokens).map(|(h, p)| h + p),
        };
        let (requests_finished, requests_failed) = match flavor {
            EngineFlavor::Vllm | EngineFlavor::IlbSim => {
                let finished = (self.vllm_finished.series() > 0).then(|| self.vllm_finished.sum());
                (finished, finished.map(|_| self.vllm_failed.sum()))
            }
            EngineFlavor::Sglang => {
                (counter(&self, &[names::SGLANG_REQUESTS]), counter(&self, &[names::SGLANG_ABORTED]))
            }
            EngineFlavor::Tgi => {
                let failed = self.tgi_failed.sum();
                let success = counter(&self, &[names::TGI_SUCCESS]).unwrap_or(0.0);
                (Some(success + failed), Some(failed))
            }
            // llama.cpp counts no requests: the data planes' reports give the rate.
            EngineFlavor::Llamacpp => (None, None),
        };
        let asleep = (self.vllm_awake.series() > 0).then(|| self.vllm_awake.sum() < 0.5);
        let output_tokens = self.histogram(&names::OUTPUT_TOKENS);
        if flavor == EngineFlavor::Tgi {
            let input = self.histogram(&[names::TGI_INPUT_LENGTH]);
            prompt_tokens = input.map(|h| h.sum).or(prompt_tokens);
            generation_tokens = output_tokens.as_ref().map(|h| h.sum).or(generation_tokens);
        }
        EngineSample {
            flavor,
            running: self.sum(&names::RUNNING),
            waiting: self.sum(&names::WAITING),
            kv_usage: self.mean(&names::KV_USAGE),
            prompt_tokens,
            generation_tokens,
            prefix_cache_queries,
            prefix_cache_hits,
            prefix_cache_hit_rate: self.mean(&names::PREFIX_HIT_RATE_GAUGE),
            requests_finished,
            requests_failed,
            gen_throughput: self.sum(&names::GEN_THROUGHPUT),
            preemptions: counter(&self, &names::PREEMPTIONS),
            asleep,
            replicas: self.sum(&[names::ILB_REPLICAS]),
            ready_replicas: self.sum(&[names::ILB_READY_REPLICAS]),
            decode_seconds: self.sum(&[names::LLAMACPP_DECODE_SECONDS]),
            prompt_seconds: self.sum(&[names::LLAMACPP_PROMPT_SECONDS]),
            busy_slots_per_decode: self.sum(&[names::LLAMACPP_BUSY_SLOTS]),
            ttft: self.histogram(&names::TTFT),
            tbot: self.histogram(&names::TBOT),
            e2e: self.histogram(&names::E2E),
            queue: self.histogram(&names::QUEUE),
            output_tokens,
        }
    }
}

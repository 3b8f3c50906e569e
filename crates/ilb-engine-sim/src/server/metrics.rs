//! Every metric the HTTP simulator exposes, in one place (the table `FAMILIES`): vLLM's
//! Prometheus names (text format 0.0.4, hand-written), vLLM's histogram buckets, and the
//! atomics behind them.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::ModelStats;

/// vLLM's `time_to_first_token_seconds` buckets.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's `inter_token_latency_seconds` (formerly `time_per_output_token_seconds`) buckets.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// vLLM's `e2e_request_latency_seconds` buckets.
pub const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];

/// vLLM's `request_generation_tokens` buckets: the 1-2-5 series up to the maximum model length
/// (8,192 here), as the data planes count answers too.
pub const GENERATION_TOKEN_BUCKETS: &[f64] = &ilb_core::metrics::OUTPUT_TOKEN_BUCKETS;

/// A Prometheus histogram over fixed buckets, lock-free.
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations are counted in units of 1/`per_unit` of the bounds' unit (ns for seconds).
    per_unit: f64,
    /// Non-cumulative counts; the last slot is `+Inf`.
    counts: Vec<AtomicU64>,
    sum_raw: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// A histogram of durations, in seconds.
    pub fn new(bounds: &'static [f64]) -> Self {
        Self::with_unit(bounds, 1e9)
    }

    /// A histogram of counts (tokens).
    pub fn of_counts(bounds: &'static [f64]) -> Self {
        Self::with_unit(bounds, 1.0)
    }

    fn with_unit(bounds: &'static [f64], per_unit: f64) -> Self {
        Self {
            bounds,
            per_unit,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_raw: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe_ns(&self, ns: u64) {
        self.observe_raw(ns);
    }

    /// Observes a count (a histogram made by [`Histogram::of_counts`]).
    pub fn observe_count(&self, n: u64) {
        self.observe_raw(n);
    }

    fn observe_raw(&self, raw: u64) {
        let value = raw as f64 / self.per_unit;
        let slot = self.bounds.partition_point(|bound| *bound < value);
        self.counts[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_raw.fetch_add(raw, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn mean_seconds(&self) -> f64 {
        let count = self.count();
        if count == 0 {
            0.0
        } else {
            self.sum_raw.load(Ordering::Relaxed) as f64 / self.per_unit / count as f64
        }
    }

    /// The histogram's samples (its family's header is written by `Metrics::render`).
    fn render(&self, out: &mut String, name: &str, label: &str) {
        let mut cumulative = 0;
        for (index, bound) in self.bounds.iter().enumerate() {
            cumulative += self.counts[index].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{label},le=\"{bound:?}\"}} {cumulative}");
        }
        cumulative += self.counts[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_raw.load(Ordering::Relaxed) as f64 / self.per_unit;
        let _ = writeln!(out, "{name}_sum{{{label}}} {sum:?}");
        let _ = writeln!(out, "{name}_count{{{label}}} {cumulative}");
    }
}

/// Why a request ended, as vLLM's `finished_reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishedReason {
    Stop,
    Length,
    Abort,
}

/// Counters and histograms the HTTP layer records; gauges and token counters come from the
/// model snapshot at render time.
pub struct Metrics {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    /// Generated tokens per finished request.
    pub generated: Histogram,
    pub finished_stop: AtomicU64,
    pub finished_length: AtomicU64,
    pub finished_abort: AtomicU64,
    /// Prompt and generated tokens of requests served without the model (latency off).
    pub direct_prompt_tokens: AtomicU64,
    pub direct_generation_tokens: AtomicU64,
    pub errors_injected: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            generated: Histogram::of_counts(GENERATION_TOKEN_BUCKETS),
            finished_stop: AtomicU64::new(0),
            finished_length: AtomicU64::new(0),
            finished_abort: AtomicU64::new(0),
            direct_prompt_tokens: AtomicU64::new(0),
            direct_generation_tokens: AtomicU64::new(0),
            errors_injected: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    pub fn finished(&self, reason: FinishedReason) {
        let counter = match reason {
            FinishedReason::Stop => &self.finished_stop,
            FinishedReason::Length => &self.finished_length,
            FinishedReason::Abort => &self.finished_abort,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests finished normally (stop or length).
    pub fn served(&self) -> u64 {
        self.finished_stop.load(Ordering::Relaxed) + self.finished_length.load(Ordering::Relaxed)
    }

    /// The `/metrics` document. `stats` is the model snapshot (absent with latency off).
    pub fn render(&self, model_name: &str, stats: &ModelStats, replicas: u32, ready_replicas: u32) -> String {
        let scrape = Scrape { metrics: self, stats, replicas, ready_replicas };
        let label = format!("model_name=\"{}\"", escape_label(model_name));
        let mut out = String::with_capacity(8192);
        for family in FAMILIES {
            header(&mut out, family.name, family.help, family.samples.kind());
            family.samples.write(&scrape, &mut out, family.name, &label);
        }
        out
    }
}

/// What one scrape reads.
struct Scrape<'a> {
    metrics: &'a Metrics,
    stats: &'a ModelStats,
    replicas: u32,
    ready_replicas: u32,
}

/// One metric family: its name, help text and samples (which give its type).
struct Family {
    name: &'static str,
    help: &'static str,
    samples: Samples,
}

/// How a family's samples come from a scrape; each is labelled `model_name`.
enum Samples {
    Gauge(fn(&Scrape) -> f64),
    Counter(fn(&Scrape) -> u64),
    /// Finished requests by `finished_reason`.
    Finished,
    Histogram(fn(&Metrics) -> &Histogram),
}

impl Samples {
    fn kind(&self) -> &'static str {
        match self {
            Samples::Gauge(_) => "gauge",
            Samples::Counter(_) | Samples::Finished => "counter",
            Samples::Histogram(_) => "histogram",
        }
    }

    fn write(&self, scrape: &Scrape, out: &mut String, name: &str, label: &str) {
        match self {
            Samples::Gauge(value) => {
                let _ = writeln!(out, "{name}{{{label}}} {:?}", value(scrape));
            }
            Samples::Counter(value) => {
                let _ = writeln!(out, "{name}{{{label}}} {}.0", value(scrape));
            }
            Samples::Finished => {
                let m = scrape.metrics;
                for (reason, value) in
                    [("stop", &m.finished_stop), ("length", &m.finished_length), ("abort", &m.finished_abort)]
                {
                    let value = value.load(Ordering::Relaxed);
                    let _ = writeln!(out, "{name}{{{label},finished_reason=\"{reason}\"}} {value}.0");
                }
            }
            Samples::Histogram(histogram) => histogram(scrape.metrics).render(out, name, label),
        }
    }
}

/// Every metric of the simulator, in the order `/metrics` shows them.
static FAMILIES: &[Family] = &[
    Family {
        name: "vllm:num_requests_running",
        help: "Number of requests in model execution batches.",
        samples: Samples::Gauge(|s| s.stats.running as f64),
    },
    Family {
        name: "vllm:num_requests_waiting",
        help: "Number of requests waiting to be processed.",
        samples: Samples::Gauge(|s| s.stats.waiting as f64),
    },
    Family {
        name: "vllm:kv_cache_usage_perc",
        help: "KV-cache usage. 1 means 100 percent usage.",
        samples: Samples::Gauge(|s| s.stats.kv_usage),
    },
    Family {
        name: "vllm:gpu_cache_usage_perc",
        help: "GPU KV-cache usage (pre-v1 name). 1 means 100 percent usage.",
        samples: Samples::Gauge(|s| s.stats.kv_usage),
    },
    Family {
        name: "ilb_engine_replicas",
        help: "Replicas behind this engine endpoint.",
        samples: Samples::Gauge(|s| f64::from(s.replicas)),
    },
    Family {
        name: "ilb_engine_ready_replicas",
        help: "Replicas taking new requests.",
        samples: Samples::Gauge(|s| f64::from(s.ready_replicas)),
    },
    Family {
        name: "vllm:prefix_cache_queries_total",
        help: "Prefix cache queries, in terms of number of queried tokens.",
        samples: Samples::Counter(|s| s.stats.counters.prefix_queries_tokens),
    },
    Family {
        name: "vllm:prefix_cache_hits_total",
        help: "Prefix cache hits, in terms of number of cached tokens.",
        samples: Samples::Counter(|s| s.stats.counters.prefix_hits_tokens),
    },
    Family {
        name: "vllm:prompt_tokens_total",
        help: "Number of prefill tokens processed.",
        samples: Samples::Counter(|s| {
            s.stats.counters.prompt_tokens + s.metrics.direct_prompt_tokens.load(Ordering::Relaxed)
        }),
    },
    Family {
        name: "vllm:generation_tokens_total",
        help: "Number of generation tokens processed.",
        samples: Samples::Counter(|s| {
            s.stats.counters.generation_tokens + s.metrics.direct_generation_tokens.load(Ordering::Relaxed)
        }),
    },
    Family {
        name: "vllm:num_preemptions_total",
        help: "Cumulative number of preemptions from the engine.",
        samples: Samples::Counter(|s| s.stats.counters.preemptions),
    },
    Family {
        name: "vllm:request_success_total",
        help: "Count of successfully processed requests.",
        samples: Samples::Finished,
    },
    Family {
        name: "vllm:time_to_first_token_seconds",
        help: "Histogram of time to first token in seconds.",
        samples: Samples::Histogram(|m| &m.ttft),
    },
    Family {
        name: "vllm:inter_token_latency_seconds",
        help: "Histogram of inter-token latency in seconds.",
        samples: Samples::Histogram(|m| &m.itl),
    },
    Family {
        name: "vllm:e2e_request_latency_seconds",
        help: "Histogram of e2e request latency in seconds.",
        samples: Samples::Histogram(|m| &m.e2e),
    },
    Family {
        name: "vllm:request_generation_tokens",
        help: "Number of generation tokens processed.",
        samples: Samples::Histogram(|m| &m.generated),
    },
];

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_with_inf_and_sum() {
        let metrics = Metrics::default();
        metrics.ttft.observe_ns(3_000_000); // 0.003 s -> le 0.005
        metrics.ttft.observe_ns(5_000_000); // exactly on a bound -> le 0.005
        metrics.ttft.observe_ns(9_000_000_000_000); // 9000 s -> +Inf only
        let text = metrics.render("m", &ModelStats::default(), 1, 1);
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.001\"} 0\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.005\"} 2\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"2560.0\"} 2\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 3\n"));
        assert!(text.contains("vllm:time_to_first_token_seconds_count{model_name=\"m\"} 3\n"));
        assert!(text.contains("# TYPE vllm:kv_cache_usage_perc gauge\n"));
        // Generated tokens per request count tokens, not nanoseconds.
        metrics.generated.observe_count(12);
        metrics.generated.observe_count(20);
        metrics.generated.observe_count(6000);
        let text = metrics.render("m", &ModelStats::default(), 1, 1);
        assert!(text.contains("vllm:request_generation_tokens_bucket{model_name=\"m\",le=\"10.0\"} 0\n"));
        assert!(text.contains("vllm:request_generation_tokens_bucket{model_name=\"m\",le=\"20.0\"} 2\n"));
        assert!(text.contains("vllm:request_generation_tokens_bucket{model_name=\"m\",le=\"5000.0\"} 2\n"));
        assert!(text.contains("vllm:request_generation_tokens_bucket{model_name=\"m\",le=\"+Inf\"} 3\n"));
        assert!(text.contains("vllm:request_generation_tokens_sum{model_name=\"m\"} 6032.0\n"));
    }

    /// Pins `/metrics` byte for byte (the text was recorded from the line-by-line renderer the
    /// table replaced).
    #[test]
    fn metrics_text_is_pinned() {
        let metrics = Metrics::default();
        metrics.ttft.observe_ns(30_000_000);
        metrics.itl.observe_ns(12_000_000);
        metrics.e2e.observe_ns(2_000_000_000);
        metrics.generated.observe_count(40);
        metrics.finished(FinishedReason::Length);
        metrics.finished(FinishedReason::Abort);
        metrics.direct_prompt_tokens.fetch_add(5, Ordering::Relaxed);
        metrics.direct_generation_tokens.fetch_add(7, Ordering::Relaxed);
        let mut stats = ModelStats { running: 3, waiting: 2, kv_usage: 0.375, ..ModelStats::default() };
        stats.counters.prefix_queries_tokens = 100;
        stats.counters.prefix_hits_tokens = 40;
        stats.counters.prompt_tokens = 1000;
        stats.counters.generation_tokens = 300;
        stats.counters.preemptions = 1;
        assert_eq!(metrics.render("m\"x", &stats, 2, 1), include_str!("metrics_pinned.prom"));
    }
}

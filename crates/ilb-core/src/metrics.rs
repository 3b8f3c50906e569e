//! Lock-free metric primitives and the Prometheus text exposition writer shared by the data and
//! control planes.
//!
//! Request paths only bump atomics (no allocation, no lock, no label lookup); `/metrics`
//! renders everything at scrape time with [`TextWriter`]. This is why ilb does not put a
//! registry of labelled families on its hot path.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Latency bucket bounds in seconds, from 1 ms to 2 minutes.
pub const LATENCY_BUCKETS: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// A fixed-bucket histogram of durations, updated with relaxed atomics.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Non-cumulative counts per bucket; the last one is +Inf.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Records one observation. Hot path: one bucket search over 16 bounds and three adds.
    #[inline]
    pub fn observe_micros(&self, micros: u64) {
        let seconds = micros as f64 / 1e6;
        let idx = LATENCY_BUCKETS.iter().position(|b| seconds <= *b).unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[idx].fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(micros, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    pub fn sum_micros(&self) -> u64 {
        self.sum_micros.load(Relaxed)
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_micros.load(Relaxed) as f64 / 1e6
    }
}

/// Bounds of the histogram of generated tokens per request: vLLM's
/// `vllm:request_generation_tokens` buckets (the 1-2-5 series), so that what a data plane sees
/// and what vLLM exposes read alike.
pub const OUTPUT_TOKEN_BUCKETS: [f64; 12] =
    [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0];

/// A fixed-bucket histogram of token counts over [`OUTPUT_TOKEN_BUCKETS`], updated with relaxed
/// atomics once per request.
#[derive(Debug, Default)]
pub struct TokenHistogram {
    /// Non-cumulative counts per bucket; the last one is +Inf.
    buckets: [AtomicU64; OUTPUT_TOKEN_BUCKETS.len() + 1],
    sum: AtomicU64,
}

impl TokenHistogram {
    pub fn observe(&self, tokens: u64) {
        let idx = OUTPUT_TOKEN_BUCKETS
            .iter()
            .position(|b| tokens as f64 <= *b)
            .unwrap_or(OUTPUT_TOKEN_BUCKETS.len());
        self.buckets[idx].fetch_add(1, Relaxed);
        self.sum.fetch_add(tokens, Relaxed);
    }

    /// The counts per bucket (non-cumulative, +Inf last) and the sum of tokens.
    pub fn read(&self) -> ([u64; OUTPUT_TOKEN_BUCKETS.len() + 1], u64) {
        (std::array::from_fn(|i| self.buckets[i].load(Relaxed)), self.sum.load(Relaxed))
    }
}

/// Writes the Prometheus text format (0.0.4).
#[derive(Default)]
pub struct TextWriter {
    out: String,
}

impl TextWriter {
    pub fn new() -> TextWriter {
        TextWriter::default()
    }

    /// Starts a metric family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self
    }

    /// One sample line; label values are escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.out.push_str("\\\\"),
                        '"' => self.out.push_str("\\\""),
                        '\n' => self.out.push_str("\\n"),
                        c => self.out.push(c),
                    }
                }
                self.out.push('"');
            }
            self.out.push('}');
        }
        if value.is_nan() {
            self.out.push_str(" NaN\n");
        } else if value.is_infinite() {
            self.out.push_str(if value > 0.0 { " +Inf\n" } else { " -Inf\n" });
        } else {
            let _ = writeln!(self.out, " {value}");
        }
        self
    }

    /// All series of a latency histogram family member (`_bucket`, `_sum`, `_count`).
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) -> &mut Self {
        let counts: [u64; LATENCY_BUCKETS.len() + 1] = std::array::from_fn(|i| h.buckets[i].load(Relaxed));
        self.buckets(name, labels, &LATENCY_BUCKETS, &counts, h.sum_seconds())
    }

    /// All series of a histogram family member (`_bucket`, `_sum`, `_count`) from its counts per
    /// bucket of `bounds` (not cumulative; one more than the bounds, +Inf last) and its sum.
    pub fn buckets(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) -> &mut Self {
        let bucket_name = format!("{name}_bucket");
        let bounds = bounds.iter().map(f64::to_string).chain(["+Inf".to_owned()]);
        let mut cumulative = 0u64;
        for (bound, count) in bounds.zip(counts) {
            cumulative += count;
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", &bound));
            self.sample(&bucket_name, &with_le, cumulative as f64);
        }
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, cumulative as f64);
        self
    }

    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_escaped_labels_and_cumulative_buckets() {
        let h = Histogram::default();
        h.observe_micros(800); // ≤ 1 ms
        h.observe_micros(30_000); // ≤ 50 ms
        h.observe_micros(500_000_000); // +Inf
        let mut w = TextWriter::new();
        w.family("ilb_x_seconds", "histogram", "test").histogram("ilb_x_seconds", &[("engine", "a\"b")], &h);
        w.family("ilb_up", "gauge", "test").sample("ilb_up", &[], 1.0);
        let text = w.finish();
        assert!(text.contains("ilb_x_seconds_bucket{engine=\"a\\\"b\",le=\"0.001\"} 1\n"), "{text}");
        assert!(text.contains("ilb_x_seconds_bucket{engine=\"a\\\"b\",le=\"0.05\"} 2\n"), "{text}");
        assert!(text.contains("ilb_x_seconds_bucket{engine=\"a\\\"b\",le=\"+Inf\"} 3\n"), "{text}");
        assert!(text.contains("ilb_x_seconds_count{engine=\"a\\\"b\"} 3\n"));
        assert!(text.contains("# TYPE ilb_up gauge\nilb_up 1\n"));
    }
}

//! Fuzz target: the Prometheus text parser and the signal extraction behind every scrape, which
//! read bytes an engine (or anything at its address) sends.
//!
//! The input is one exposition, or two separated by a NUL byte (a previous and a current scrape,
//! for the windowed rates and latency quantiles). Parsed with the default limits and with tight
//! ones; checks that the limits hold, and that windowed figures keep their documented ranges.

#![no_main]

use ilb_planning::prom::{self, Limits};
use ilb_planning::signals::{self, EngineSample, Histogram};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let tight = Limits { max_bytes: 4096, max_series: 16, max_labels: 4 };
    for limits in [Limits::default(), tight] {
        let Ok(exposition) = prom::parse_bytes(data, &limits) else { continue };
        assert!(exposition.samples.len() <= limits.max_series);
        assert_eq!(exposition.first_invalid.is_some(), exposition.invalid_lines > 0);
        for sample in &exposition.samples {
            assert!(sample.labels.len() <= limits.max_labels);
            let _ = exposition.metric_type(sample.name);
        }
        for (_, sample) in signals::extract(&exposition) {
            check_sample(&sample);
        }
    }

    let Some(split) = data.iter().position(|&b| b == 0) else { return };
    let (Ok(before), Ok(after)) = (
        prom::parse_bytes(&data[..split], &Limits::default()),
        prom::parse_bytes(&data[split + 1..], &Limits::default()),
    ) else {
        return;
    };
    let (before, after) = (signals::extract(&before), signals::extract(&after));
    for (model, previous) in &before {
        let Some((_, current)) = after.iter().find(|(m, _)| m == model) else { continue };
        for elapsed in [Duration::from_millis(1), Duration::from_secs(1)] {
            let Some(w) = signals::window(previous, current, elapsed) else { continue };
            if let Some(rate) = w.error_rate {
                assert!((0.0..=1.0).contains(&rate), "error rate {rate}");
            }
            if let Some(rate) = w.request_rate {
                assert!(rate >= 0.0, "request rate {rate}");
            }
            if let Some(rate) = w.prefix_cache_hit_rate.filter(|_| current.prefix_cache_queries.is_some()) {
                assert!(!rate.is_nan(), "prefix hit rate is NaN");
            }
        }
        assert!(signals::window(previous, current, Duration::ZERO).is_none());
    }
});

fn check_sample(sample: &EngineSample) {
    for histogram in [&sample.ttft, &sample.tbot, &sample.e2e].into_iter().flatten() {
        check_histogram(histogram);
    }
}

fn check_histogram(histogram: &Histogram) {
    assert!(histogram.buckets.windows(2).all(|pair| pair[0].0 < pair[1].0), "bounds not increasing");
    for q in [0.0, 0.5, 0.9, 1.0] {
        if let Some(value) = histogram.quantile(q) {
            assert!(!value.is_nan(), "quantile {q} is NaN");
        }
    }
    assert!(histogram.quantile(1.5).is_none());
    if let Some(mean) = histogram.mean() {
        assert!(mean.is_finite());
    }
    let mut doubled = histogram.clone();
    assert!(doubled.add(histogram), "a histogram adds to itself");
    let _ = doubled.delta_since(histogram);
}

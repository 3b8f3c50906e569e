//! Prometheus text-format parser: line-level cases through one `check` helper, the engine
//! fixtures, limits, and properties (no panic on junk; render → parse round trip).
#![allow(clippy::disallowed_methods)] // tests read their fixtures from files

use ilb_planning::prom::{parse, parse_bytes, Limits, MetricType, ParseError};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

/// (name, labels, value, timestamp) of the one sample a line should parse to.
type Expected<'a> = (&'a str, &'a [(&'a str, &'a str)], f64, Option<i64>);

/// Parses one line and compares it with `expected`; `None` = the line must be rejected.
fn check(line: &str, expected: Option<Expected<'_>>) {
    let parsed = parse(line, &Limits::default()).unwrap();
    match expected {
        None => {
            assert_eq!(parsed.samples.len(), 0, "{line:?} should be rejected");
            assert_eq!(parsed.invalid_lines, 1, "{line:?}");
        }
        Some((name, labels, value, timestamp)) => {
            assert_eq!(parsed.invalid_lines, 0, "{line:?}: {:?}", parsed.first_invalid);
            let sample = &parsed.samples[0];
            assert_eq!(sample.name, name);
            let got: Vec<(&str, &str)> = sample.labels.iter().map(|l| (l.name, l.value.as_ref())).collect();
            assert_eq!(got, labels, "{line:?}");
            assert!(sample.value == value || (value.is_nan() && sample.value.is_nan()), "{line:?}");
            assert_eq!(sample.timestamp_ms, timestamp, "{line:?}");
        }
    }
}

#[test]
fn sample_lines() {
    check("up 1", Some(("up", &[], 1.0, None)));
    check(
        "vllm:num_requests_running{model_name=\"m\"} 3",
        Some(("vllm:num_requests_running", &[("model_name", "m")], 3.0, None)),
    );
    check("a{x=\"1\",y=\"2\",} 1e3", Some(("a", &[("x", "1"), ("y", "2")], 1000.0, None)));
    check("a { x = \"1\" , y=\"2\" }   -2.5", Some(("a", &[("x", "1"), ("y", "2")], -2.5, None)));
    check("a{} 1", Some(("a", &[], 1.0, None)));
    check("a 1 1700000000123", Some(("a", &[], 1.0, Some(1_700_000_000_123))));
    check("a 1 1700000000.5", Some(("a", &[], 1.0, Some(1_700_000_000_500))));
    check("a NaN", Some(("a", &[], f64::NAN, None)));
    check("a +Inf", Some(("a", &[], f64::INFINITY, None)));
    check("a -Inf", Some(("a", &[], f64::NEG_INFINITY, None)));
    check("a\t7\r", Some(("a", &[], 7.0, None)));
    check("  indented 7", Some(("indented", &[], 7.0, None)));
    // OpenMetrics exemplar after the value is ignored.
    check(
        "a_bucket{le=\"0.5\"} 3 # {trace_id=\"abc\"} 0.4 1700000000",
        Some(("a_bucket", &[("le", "0.5")], 3.0, None)),
    );
    // Escapes in label values.
    check(r#"a{v="q\"x\"\\y\nz"} 1"#, Some(("a", &[("v", "q\"x\"\\y\nz")], 1.0, None)));
    check(r#"a{v="unicode é ✓ \é"} 1"#, Some(("a", &[("v", "unicode é ✓ \\é")], 1.0, None)));
    check(r#"a{v="comma, and = inside"} 1"#, Some(("a", &[("v", "comma, and = inside")], 1.0, None)));
}

#[test]
fn malformed_lines_are_rejected() {
    check("1abc 1", None);
    check("a", None);
    check("a ", None);
    check("a{x=\"1\"", None);
    check("a{x=\"1} 1", None);
    check("a{x=1} 1", None);
    check("a{x=\"1\" y=\"2\"} 1", None);
    check("a{x=\"1\",x=\"2\"} 1", None);
    check("a{1x=\"1\"} 1", None);
    check("a one", None);
    check("a 1 notatime", None);
    check("a 1 2 3", None);
    check("a{x=\"\\", None);
    check("a-b 1", None);
}

#[test]
fn comments_types_and_eof() {
    let text =
        "# HELP a_total A counter with a \\\\ in help.\n# TYPE a_total counter\n# UNIT a_seconds seconds\n\
                # TYPE h histogram\n# just a comment\na_total 1\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n\
                # EOF\nafter_eof 1\n";
    let parsed = parse(text, &Limits::default()).unwrap();
    assert_eq!(parsed.invalid_lines, 0);
    assert_eq!(parsed.samples.len(), 3, "samples after # EOF are ignored");
    assert_eq!(parsed.metric_type("a_total"), MetricType::Counter);
    assert_eq!(parsed.metric_type("h_bucket"), MetricType::Histogram);
    assert_eq!(parsed.metric_type("h_count"), MetricType::Histogram);
    assert_eq!(parsed.metric_type("unknown"), MetricType::Untyped);
    let bad = parse("# TYPE\nx 1\n# TYPE 9bad gauge\n", &Limits::default()).unwrap();
    assert_eq!(bad.invalid_lines, 2);
    assert_eq!(bad.first_invalid.unwrap().line, 1);
    assert_eq!(bad.samples.len(), 1);
}

#[test]
fn invalid_line_is_reported_with_its_number_and_the_rest_is_kept() {
    let parsed = parse("good 1\nbad{ 2\nalso_good 3\n", &Limits::default()).unwrap();
    assert_eq!(parsed.samples.len(), 2);
    assert_eq!(parsed.invalid_lines, 1);
    assert_eq!(parsed.first_invalid.unwrap().line, 2);
}

#[test]
fn limits_are_enforced() {
    let limits = Limits { max_bytes: 10, max_series: 2, max_labels: 1 };
    assert_eq!(parse("abcdefghijk 1", &limits).unwrap_err(), ParseError::TooLarge { size: 13, limit: 10 });
    assert_eq!(
        parse_bytes(b"a 1\nb 1\nc 1", &limits).unwrap_err(),
        ParseError::TooLarge { size: 11, limit: 10 }
    );
    let limits = Limits { max_bytes: 1000, max_series: 2, max_labels: 1 };
    assert_eq!(parse("a 1\nb 1\nc 1\n", &limits).unwrap_err(), ParseError::TooManySeries { limit: 2 });
    let parsed = parse("a{x=\"1\",y=\"2\"} 1\n", &limits).unwrap();
    assert_eq!(parsed.invalid_lines, 1, "too many labels");
    assert_eq!(parse_bytes(&[0xff, 0xfe], &limits).unwrap_err(), ParseError::NotUtf8);
}

#[test]
fn fixtures_parse_cleanly() {
    for (file, min_samples) in [
        ("vllm.txt", 300),
        ("vllm_later.txt", 300),
        ("vllm_v0.txt", 60),
        ("sglang.txt", 150),
        ("sglang_0.5_dp2_tp2.txt", 200),
        ("tgi_3.3.txt", 250),
        ("llamacpp_idle.txt", 15),
        ("llamacpp_busy.txt", 15),
        ("llamacpp_after.txt", 15),
        ("vllm_0.32_idle.txt", 400),
        ("vllm_0.32_busy.txt", 400),
        ("vllm_0.32_after.txt", 400),
    ] {
        let path = format!("{}/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let parsed = parse(&text, &Limits::default()).unwrap();
        assert_eq!(parsed.invalid_lines, 0, "{file}: {:?}", parsed.first_invalid);
        assert!(parsed.samples.len() >= min_samples, "{file}: {}", parsed.samples.len());
    }
    let text =
        std::fs::read_to_string(format!("{}/tests/fixtures/vllm.txt", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let parsed = parse(&text, &Limits::default()).unwrap();
    assert_eq!(parsed.metric_type("vllm:time_to_first_token_seconds_bucket"), MetricType::Histogram);
    assert_eq!(parsed.metric_type("vllm:prompt_tokens_total"), MetricType::Counter);
    assert_eq!(parsed.metric_type("vllm:prompt_tokens_created"), MetricType::Gauge);
    let info = parsed.samples.iter().find(|s| s.name == "vllm:cache_config_info").unwrap();
    assert_eq!(info.label("notes"), Some("quoted \"value\" with \\ and \n"));
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, rng_seed: RngSeed::Fixed(1), ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let limits = Limits { max_bytes: 1024, max_series: 64, max_labels: 8 };
        let _ = parse_bytes(&bytes, &limits);
    }

    #[test]
    fn near_valid_text_never_panics(text in "[a-z_:{}=\",\\\\# \\n0-9.eE+\\-IiNnf]{0,200}") {
        let limits = Limits { max_bytes: 1024, max_series: 64, max_labels: 8 };
        if let Ok(parsed) = parse(&text, &limits) {
            prop_assert!(parsed.samples.len() <= 64);
        }
    }

    #[test]
    fn render_then_parse_round_trips(
        name in "[a-zA-Z_:][a-zA-Z0-9_:]{0,20}",
        labels in proptest::collection::btree_map("[a-zA-Z_][a-zA-Z0-9_]{0,10}", "\\PC{0,12}", 0..5),
        value in any::<f64>().prop_filter("finite", |v| v.is_finite()),
        timestamp in proptest::option::of(any::<i64>()),
    ) {
        let rendered_labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        // Without labels, render the bare form: the separator handling differs from `{}`.
        let mut line = if labels.is_empty() {
            format!("{name} {value:e}")
        } else {
            format!("{name}{{{}}} {value:e}", rendered_labels.join(","))
        };
        if let Some(ts) = timestamp {
            line.push_str(&format!(" {ts}"));
        }
        let parsed = parse(&line, &Limits::default()).unwrap();
        prop_assert_eq!(parsed.invalid_lines, 0, "{:?} {:?}", line, parsed.first_invalid);
        let sample = &parsed.samples[0];
        prop_assert_eq!(sample.name, name.as_str());
        prop_assert_eq!(sample.value, value);
        prop_assert_eq!(sample.timestamp_ms, timestamp);
        let got: Vec<(String, String)> = sample.labels.iter().map(|l| (l.name.to_owned(), l.value.to_string())).collect();
        let want: Vec<(String, String)> = labels.into_iter().collect();
        prop_assert_eq!(got, want);
    }
}

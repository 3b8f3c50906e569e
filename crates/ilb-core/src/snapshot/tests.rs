use super::*;
use proptest::prelude::*;

pub(crate) fn example_json() -> String {
    r#"{
      "format": 1, "version": 7, "created_unix_ms": 1700000000000, "cluster": "a",
      "utilisation": 0.5,
      "engines": [
        {"id": "e1", "url": "http://127.0.0.1:9000", "region": "a", "residency": ["eu"]},
        {"id": "e2", "url": "http://127.0.0.1:9001", "region": "b", "capabilities": ["long-context"]}
      ],
      "models": [{"model": "m", "classes": [
        {"id": "default", "weights": [{"engine": "e1", "weight": 3}, {"engine": "e2", "weight": 1}]},
        {"id": "eu", "residency": "eu", "weights": [{"engine": "e1", "weight": 1}]}
      ]}]
    }"#
    .to_owned()
}

fn check(mutate: impl FnOnce(&mut serde_json::Value), expected_error: &str) {
    let mut value: serde_json::Value = serde_json::from_str(&example_json()).unwrap();
    mutate(&mut value);
    let bytes = serde_json::to_vec(&value).unwrap();
    let err = Snapshot::from_json(&bytes).expect_err("snapshot should be rejected");
    assert!(err.to_string().contains(expected_error), "error {err:?} does not mention {expected_error:?}");
}

#[test]
fn example_is_valid() {
    let s = Snapshot::from_json(example_json().as_bytes()).unwrap();
    assert_eq!(s.version, SnapshotVersion(7));
    assert_eq!(s.engines.len(), 2);
}

#[test]
fn rejects_bad_snapshots_with_a_reason() {
    use serde_json::json;
    check(|v| v["format"] = json!(2), "unsupported snapshot format 2");
    check(|v| v["surprise"] = json!(1), "unknown field `surprise`");
    check(|v| v["engines"][1]["id"] = json!("e1"), "duplicate engine id 'e1'");
    check(|v| v["engines"][0]["url"] = json!("ftp://x:1"), "must start with http:// or https://");
    check(|v| v["engines"][0]["url"] = json!("https://u:p@x:1"), "credentials");
    check(|v| v["engines"][0]["url"] = json!("https://"), "no host");
    check(|v| v["engines"][0]["url"] = json!("http://u:p@x:1"), "credentials");
    check(|v| v["engines"][0]["url"] = json!("http://x:0"), "invalid port");
    check(|v| v["engines"][0]["url"] = json!("http://x:1/?q"), "query");
    check(|v| v["engines"][0]["url"] = json!("http://"), "no host");
    check(
        |v| v["models"][0]["classes"][0]["weights"][0]["weight"] = json!(-1.0),
        "not a finite non-negative",
    );
    check(
        |v| v["models"][0]["classes"][0]["weights"][0]["engine"] = json!("ghost"),
        "unknown engine 'ghost'",
    );
    check(|v| v["models"][0]["classes"][0]["weights"] = json!([]), "no candidate engines");
    check(|v| v["models"][0]["classes"][1]["id"] = json!("default"), "duplicate class id");
    check(
        |v| v["models"][0]["classes"][1]["weights"] = json!([{"engine": "e1", "weight": 0.0}]),
        "weights sum to 0",
    );
    check(|v| v["models"][0]["classes"][0]["shed_fraction"] = json!(1.5), "shed_fraction");
    check(|v| v["models"][0]["classes"] = json!([]), "has no classes");
    check(|v| v["utilisation"] = json!(7), "utilisation");
    check(|v| v["engines"][0]["id"] = json!(""), "must be 1 to");
}

#[test]
fn https_engines_are_allowed() {
    assert_eq!(check_engine_url("https://engine.example:8443/prefix"), Ok(()));
    assert_eq!(check_engine_url("https://[::1]:8443"), Ok(()));
    assert_eq!(check_engine_url("HTTPS://x:1"), Err("must start with http:// or https://"));
}

#[test]
fn in_flight_times_must_be_positive() {
    let mut s = Snapshot::from_json(example_json().as_bytes()).unwrap();
    for (ms, ok) in [(2500.0, true), (0.0, false), (-1.0, false), (f64::NAN, false), (f64::INFINITY, false)] {
        s.models[0].classes[0].weights[0].in_flight_ms = Some(ms);
        let result = s.validate();
        assert_eq!(result.is_ok(), ok, "in_flight_ms {ms}: {result:?}");
        if !ok {
            assert!(result.unwrap_err().to_string().contains("in_flight_ms"));
        }
    }
}

#[test]
fn nan_weights_are_rejected() {
    // JSON cannot spell NaN, but a snapshot built in code can carry one.
    let mut s = Snapshot::from_json(example_json().as_bytes()).unwrap();
    s.models[0].classes[0].weights[0].weight = f64::NAN;
    assert!(s.validate().unwrap_err().to_string().contains("not a finite"));
    s.models[0].classes[0].weights[0].weight = f64::INFINITY;
    assert!(s.validate().is_err());
}

#[test]
fn oversized_snapshot_is_rejected_before_parsing() {
    let big = vec![b' '; MAX_SNAPSHOT_BYTES + 1];
    assert_eq!(Snapshot::from_json(&big), Err(SnapshotError::TooLarge(MAX_SNAPSHOT_BYTES + 1)));
}

#[test]
fn engine_urls() {
    for ok in ["http://127.0.0.1:9000", "http://engine", "http://[::1]:80", "http://h:1/prefix"] {
        assert_eq!(check_engine_url(ok), Ok(()), "{ok}");
    }
    for bad in ["ftp://x", "http://[::1", "http://:80", "http://x:99999", "http://x y", "http://[::1]x"] {
        assert!(check_engine_url(bad).is_err(), "{bad}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { rng_seed: proptest::test_runner::RngSeed::Fixed(1), ..ProptestConfig::default() })]

    /// Whatever bytes arrive, parsing returns a value or an error; it never panics.
    #[test]
    fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Snapshot::from_json(&bytes);
    }

    /// Random weights: valid iff all finite, non-negative, and some positive.
    #[test]
    fn weight_validation(weights in proptest::collection::vec(prop_oneof![
        Just(f64::NAN), Just(-1.0), 0.0..10.0f64, Just(f64::INFINITY)], 1..6)) {
        let mut s = Snapshot::from_json(example_json().as_bytes()).unwrap();
        s.engines = (0..weights.len()).map(|i| EngineEntry {
            id: EngineId::new(format!("e{i}")), url: format!("http://127.0.0.1:{}", 9000 + i),
            region: String::new(), capabilities: vec![], residency: vec![], max_in_flight: 0,
        }).collect();
        s.models[0].classes.truncate(1);
        s.models[0].classes[0].weights = weights.iter().enumerate().map(|(i, &w)| EngineWeight {
            engine: EngineId::new(format!("e{i}")), weight: w, expected_latency_ms: None, network_ms: None, in_flight_ms: None,
        }).collect();
        let expect_ok = weights.iter().all(|w| w.is_finite() && *w >= 0.0) && weights.iter().sum::<f64>() > 0.0;
        prop_assert_eq!(s.validate().is_ok(), expect_ok);
    }
}

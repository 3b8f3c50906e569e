//! The fleet with real engines' metrics: a llama.cpp engine (no request counter, no latency
//! histograms) is planned on the latency the data planes measure and report; vLLM's sleep
//! state and the engine simulator's ready replicas take engines out of the plan and into the
//! fast guard's holds; an unreachable engine is held unless most of the fleet is.
#![allow(clippy::disallowed_methods)] // tests read their fixtures from files

use ilb_core::holds::HoldReason;
use ilb_core::report::{EngineObservation, Report};
use ilb_core::{ClusterId, EngineId, ModelName};
use ilb_planning::config::FleetConfig;
use ilb_planning::fleet::Fleet;
use ilb_planning::prom::{parse, Limits};
use ilb_planning::signals::{extract, EngineFlavor, EngineSample};
use std::time::Duration;

fn fleet(engines: usize) -> Fleet {
    let engines: String = (0..engines)
        .map(|i| {
            format!(
                "[[engines]]\nid = \"e{i}\"\nurl = \"http://127.0.0.1:{}\"\nmodel = \"m\"\nregion = \"r\"\nprofile = \"p\"\n",
                9000 + i
            )
        })
        .collect();
    let text = format!(
        "[control_plane]\nlisten = \"127.0.0.1:0\"\nobjective = \"ttft\"\n[[clusters]]\nid = \"a\"\nregion = \"r\"\n\
         [profiles.p]\ncapacity_rps = 10.0\nttft_t0_ms = 50.0\nttft_b_ms = 15.0\n{engines}"
    );
    let config: FleetConfig = toml::from_str(&text).unwrap();
    config.validate().unwrap();
    Fleet::new(config)
}

fn fixture(file: &str) -> Vec<(ModelName, EngineSample)> {
    let text =
        std::fs::read_to_string(format!("{}/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    extract(&parse(&text, &Limits::default()).unwrap())
}

fn observation(engine: &str, requests: u64, first_chunk_ms: f64, chunk_gap_ms: f64) -> EngineObservation {
    EngineObservation {
        engine: EngineId::new(engine),
        requests,
        errors: 0,
        ttfb_ms: Some(first_chunk_ms),
        duration_ms: None,
        first_chunk_ms: Some(first_chunk_ms),
        streams: requests,
        chunk_gap_ms: Some(chunk_gap_ms),
        chunk_gaps: requests * 20,
        rtt_ms: None,
        in_flight: 0,
        output_tokens: None,
    }
}

fn report(sequence: u64, engines: Vec<EngineObservation>) -> Report {
    Report {
        replica: None,
        cluster: ClusterId::new("a"),
        instance: "a-1".into(),
        sequence,
        period_ms: 1000,
        snapshot_version: 0,
        demand: vec![],
        engines,
    }
}

#[test]
fn llamacpp_is_planned_on_the_latency_the_data_planes_measure() {
    let mut fleet = fleet(1);
    let busy = fixture("llamacpp_busy.txt");
    let ttft_at = |fleet: &Fleet| fleet.latency_profile(0).latency_ms(8.0, 10.0);
    let before = ttft_at(&fleet);
    // Scrapes: running and waiting from the engine, nothing else to plan on.
    for s in 0..60u64 {
        let now = Duration::from_secs(s);
        fleet.on_scrape(0, now, Ok(busy.clone()));
        // 8 req/s, each stream's first chunk after 900 ms, 45 ms between chunks.
        fleet.on_report(now, report(s + 1, vec![observation("e0", 8, 900.0, 45.0)])).unwrap();
    }
    let e = &fleet.engines[0];
    assert_eq!(e.kind, Some(EngineFlavor::Llamacpp));
    assert!(!e.ttft_from_engine && !e.tbot_from_engine && !e.requests_from_engine);
    assert_eq!(e.running, 4.0);
    assert_eq!(e.waiting, 2.0);
    let close =
        |v: Option<f64>, want: f64| assert!((v.unwrap() - want).abs() < 1e-6 * want, "{v:?} != {want}");
    close(e.request_rate.value(), 8.0);
    close(e.ttft_ms.value(), 900.0);
    close(e.tbot_ms.value(), 45.0);
    let after = ttft_at(&fleet);
    assert!(after > before * 2.0, "the fit follows the reported latency: {before} ms → {after} ms");

    // A vLLM engine's own histograms win over the reports.
    let mut vllm = fleet_with_vllm();
    let e = &vllm.engines[0];
    assert!(e.ttft_from_engine && e.tbot_from_engine && e.requests_from_engine);
    let ttft = e.ttft_ms.value();
    vllm.on_report(Duration::from_secs(3), report(1, vec![observation("e0", 8, 900.0, 45.0)])).unwrap();
    assert_eq!(vllm.engines[0].ttft_ms.value(), ttft, "reports do not overwrite the engine's own TTFT");
}

fn fleet_with_vllm() -> Fleet {
    let mut fleet = fleet(1);
    fleet.on_scrape(0, Duration::from_secs(0), Ok(fixture("vllm_0.32_idle.txt")));
    fleet.on_scrape(0, Duration::from_secs(2), Ok(fixture("vllm_0.32_after.txt")));
    fleet
}

#[test]
fn asleep_and_unready_engines_are_held_and_planned_out() {
    let mut fleet = fleet(4);
    let now = Duration::from_secs(1);
    let awake = fixture("vllm_0.32_busy.txt");
    let mut asleep = awake.clone();
    asleep[0].1.asleep = Some(true);
    let unready = vec![(
        ModelName::new("m"),
        EngineSample {
            flavor: EngineFlavor::IlbSim,
            replicas: Some(2.0),
            ready_replicas: Some(0.0),
            ..EngineSample::default()
        },
    )];
    let half_ready =
        vec![(ModelName::new("m"), EngineSample { ready_replicas: Some(1.0), ..unready[0].1.clone() })];
    fleet.on_scrape(0, now, Ok(awake));
    fleet.on_scrape(1, now, Ok(asleep));
    fleet.on_scrape(2, now, Ok(unready));
    fleet.on_scrape(3, now, Ok(half_ready));
    assert_eq!(
        fleet.holds(),
        vec![("e1".to_owned(), HoldReason::Asleep), ("e2".to_owned(), HoldReason::NoReadyReplicas)]
    );
    assert_eq!(fleet.health(0, now), 1.0);
    assert_eq!(fleet.health(1, now), 0.0, "asleep: planned out");
    assert_eq!(fleet.health(2, now), 0.0, "no ready replica: planned out");
    assert_eq!(fleet.health(3, now), 0.5, "half the replicas ready: half the capacity");
    assert_eq!(fleet.engines[3].kind, Some(EngineFlavor::IlbSim));
}

#[test]
fn unreachable_engines_are_held_unless_most_of_the_fleet_is() {
    let mut fleet = fleet(4);
    let now = Duration::from_secs(1);
    let ok = fixture("vllm_0.32_busy.txt");
    for i in 0..4 {
        fleet.on_scrape(i, now, Ok(ok.clone()));
    }
    // A refused connect holds at once; another failure needs a second one in a row.
    fleet.on_scrape(0, now, Err("connect failed: connection refused".into()));
    fleet.on_scrape(1, now, Err("scrape timed out after 1s".into()));
    assert_eq!(fleet.holds(), vec![("e0".to_owned(), HoldReason::Unreachable)]);
    fleet.on_scrape(1, now, Err("scrape timed out after 1s".into()));
    assert_eq!(
        fleet.holds(),
        vec![("e0".to_owned(), HoldReason::Unreachable), ("e1".to_owned(), HoldReason::Unreachable)]
    );
    // Three of four unreachable at once looks like the control plane's network: no holds.
    fleet.on_scrape(2, now, Err("connect failed: connection refused".into()));
    assert_eq!(fleet.holds(), vec![]);
    fleet.on_scrape(2, now, Ok(ok.clone()));
    fleet.on_scrape(0, now, Ok(ok));
    assert_eq!(fleet.holds(), vec![("e1".to_owned(), HoldReason::Unreachable)]);
}

#[test]
fn a_restarted_engine_learns_its_capacity_afresh() {
    let mut fleet = fleet(1);
    // Its queue grows every second while it finishes 3 req/s of its nominal 10: the learned
    // capacity comes down.
    let sample = |finished: f64, waiting: f64| {
        let sample = EngineSample {
            flavor: EngineFlavor::Vllm,
            requests_finished: Some(finished),
            generation_tokens: Some(finished * 20.0),
            running: Some(8.0),
            waiting: Some(waiting),
            ..EngineSample::default()
        };
        vec![(ModelName::new("m"), sample)]
    };
    for s in 0..8u64 {
        fleet.on_scrape(0, Duration::from_secs(s), Ok(sample(3.0 * s as f64, 2.0 + s as f64)));
    }
    let cut = fleet.learned_capacity(0);
    assert!(cut < 6.0, "a runaway queue cuts the capacity: {cut}");
    // Killed and started again: scrapes fail, then its counters start from zero.
    fleet.on_scrape(0, Duration::from_secs(9), Err("connect failed: connection refused".into()));
    fleet.on_scrape(0, Duration::from_secs(10), Ok(sample(1.0, 0.0)));
    assert_eq!(fleet.learned_capacity(0), 10.0, "a new process starts from its nominal capacity");
    // A scrape that merely failed in between changes nothing.
    for s in 11..19u64 {
        fleet.on_scrape(0, Duration::from_secs(s), Ok(sample(1.0 + 3.0 * (s - 10) as f64, 2.0 + s as f64)));
    }
    let cut = fleet.learned_capacity(0);
    fleet.on_scrape(0, Duration::from_secs(19), Err("scrape timed out after 1s".into()));
    fleet.on_scrape(0, Duration::from_secs(20), Ok(sample(1.0 + 3.0 * 10.0, 2.0 + 19.0)));
    assert!(fleet.learned_capacity(0) <= cut, "no restart, no reset");
}

/// A window in which the engine filled up or drained is not a point of its latency curve: a
/// flood at start-up (600 requests held, TTFT twenty times the settled one) leaves the fitted
/// curve where the settled windows put it; the same latencies with the population steady do
/// move it, so the test can tell.
#[test]
fn a_flooded_window_is_not_a_point_of_the_curve() {
    // Cumulative vLLM-style counters: `ttft_ms` is the mean TTFT of each window's requests.
    let run = |windows: &[(f64, f64, f64)]| -> Fleet {
        let mut fleet = fleet(1);
        let (mut finished, mut ttft_sum) = (0.0, 0.0);
        for (s, &(rps, ttft_ms, held)) in windows.iter().enumerate() {
            finished += rps;
            ttft_sum += rps * ttft_ms / 1000.0;
            let sample = EngineSample {
                flavor: EngineFlavor::Vllm,
                requests_finished: Some(finished),
                ttft: ilb_planning::signals::Histogram::from_parts(
                    vec![(f64::INFINITY, finished)],
                    ttft_sum,
                    finished,
                ),
                running: Some(held),
                waiting: Some(0.0),
                ..EngineSample::default()
            };
            fleet.on_scrape(0, Duration::from_secs(s as u64), Ok(vec![(ModelName::new("m"), sample)]));
        }
        fleet
    };
    let settled = [(5.0, 60.0, 4.0); 36];
    let at = |fleet: &Fleet, load: f64| fleet.latency_profiles(&[0])[0].latency_ms(load, 10.0);
    let mut flooded = settled[..30].to_vec();
    flooded.extend([(6.0, 1200.0, 300.0), (6.0, 1200.0, 600.0), (6.0, 1200.0, 4.0)]);
    flooded.extend([(5.0, 60.0, 4.0); 3]);
    let mut steady_but_slow = settled[..30].to_vec();
    steady_but_slow.extend([(6.0, 1200.0, 4.0); 3]);
    steady_but_slow.extend([(5.0, 60.0, 4.0); 3]);
    let (settled, flooded, slow) = (run(&settled), run(&flooded), run(&steady_but_slow));
    for load in [5.0, 6.0, 8.0] {
        let (s, f, w) = (at(&settled, load), at(&flooded, load), at(&slow, load));
        assert!((f / s - 1.0).abs() < 0.02, "at {load} req/s: flooded {f:.1} ms against settled {s:.1}");
        assert!(w > 1.2 * s, "at {load} req/s the same latencies, settled, count: {w:.1} against {s:.1}");
    }
}

/// The answers' lengths are learned from what the engines expose: the mean from every engine's
/// token and request counters, the law's shape from vLLM's histogram of generated tokens per
/// request. Answers that all run 150 tokens have a short tail, which an exponential of the same
/// mean would not.
#[test]
fn the_answers_lengths_are_learned_from_the_engines_histograms() {
    use ilb_planning::profile::DecodeLengths;
    use ilb_planning::signals::Histogram;
    let mut fleet = fleet(2);
    let bounds =
        [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, f64::INFINITY];
    // `finished` requests of 150 tokens so far; e0 exposes the histogram, e1 counters only.
    let sample = |finished: f64, histogram: bool| {
        let generated = histogram.then(|| {
            let buckets = bounds.iter().map(|&le| (le, if le >= 150.0 { finished } else { 0.0 })).collect();
            Histogram::from_parts(buckets, 150.0 * finished, finished).unwrap()
        });
        let sample = EngineSample {
            flavor: EngineFlavor::Vllm,
            requests_finished: Some(finished),
            generation_tokens: Some(150.0 * finished),
            output_tokens: generated,
            ..EngineSample::default()
        };
        vec![(ModelName::new("m"), sample)]
    };
    let prior = fleet.output_tokens("m");
    assert_eq!(
        fleet.decode_lengths("m"),
        DecodeLengths::exponential(prior - 1.0),
        "no data: the configured mean"
    );
    for s in 0..=60u64 {
        let now = Duration::from_secs(s);
        fleet.on_scrape(0, now, Ok(sample(2.0 * s as f64, true)));
        fleet.on_scrape(1, now, Ok(sample(2.0 * s as f64, false)));
    }
    let mean = fleet.output_tokens("m");
    assert!((mean - 150.0).abs() < 0.1 * 150.0, "learned mean {mean} (configured {prior})");
    let law = fleet.decode_lengths("m");
    assert!((law.mean() - (mean - 1.0)).abs() < 1e-9 * mean, "{} against {mean}", law.mean());
    let exponential = DecodeLengths::exponential(mean - 1.0);
    for decode in [250.0, 400.0] {
        assert!(
            law.survival(decode) < 0.5 * exponential.survival(decode),
            "P(L > {decode}): {} against the exponential's {}",
            law.survival(decode),
            exponential.survival(decode)
        );
    }
    // Restarted: its histogram starts from zero, taken as the window's; nothing is lost.
    fleet.on_scrape(0, Duration::from_secs(61), Ok(sample(2.0, true)));
    fleet.on_scrape(0, Duration::from_secs(62), Ok(sample(4.0, true)));
    let after = fleet.decode_lengths("m");
    assert!(after.survival(250.0) < 0.5 * exponential.survival(250.0));
}

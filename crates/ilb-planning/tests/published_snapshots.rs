//! Whatever numbers a fleet's config and its data planes' reports carry, every snapshot the
//! control plane would publish passes the data plane's validation and compiles into a routing
//! table: configs and reports that the control plane accepts cannot make it publish what every
//! data plane would refuse (a `NaN` weight written as `null`, say).

use ilb_core::report::{ClassDemand, Report};
use ilb_core::snapshot::Snapshot;
use ilb_core::table::RoutingTable;
use ilb_core::{ClassId, ClusterId, ModelName};
use ilb_planning::config::{Engine, FleetConfig, Profile};
use ilb_planning::fleet::Fleet;
use ilb_planning::planner::Planner;
use proptest::prelude::*;
use std::time::Duration;

/// Numbers as operators and hostile clients write them: ordinary ones, and the extremes.
fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => 0.01f64..500.0,
        1 => prop::sample::select(vec![
            0.0, -1.0, 1e-300, 1e-3, 1e6, 1e7, 1e300, 1e308, f64::MAX, f64::INFINITY, f64::NAN,
        ]),
    ]
}

fn replicas() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..4, 1 => prop::sample::select(vec![100_000, 100_001, u32::MAX])]
}

#[derive(Debug, Clone)]
struct Case {
    profile: [f64; 5],
    engines: Vec<(u32, Option<f64>, usize)>,
    base_ms: f64,
    demand: Vec<f64>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        [number(), number(), number(), number(), number()],
        prop::collection::vec((replicas(), prop::option::of(number()), 0usize..2), 1..5),
        number(),
        prop::collection::vec(number(), 2),
    )
        .prop_map(|(profile, engines, base_ms, demand)| Case { profile, engines, base_ms, demand })
}

fn config(case: &Case) -> FleetConfig {
    let mut config: FleetConfig = toml::from_str(
        r#"
        [[regions]]
        id = "r0"
        lat = 50.0
        lon = 8.0
        [[regions]]
        id = "r1"
        lat = 40.0
        lon = -74.0
        [[clusters]]
        id = "a"
        region = "r0"
        [[clusters]]
        id = "b"
        region = "r1"
        "#,
    )
    .unwrap();
    let [capacity_rps, ttft_t0_ms, ttft_b_ms, tbot_t0_ms, tbot_b_ms] = case.profile;
    config
        .profiles
        .insert("p".into(), Profile { capacity_rps, ttft_t0_ms, ttft_b_ms, tbot_t0_ms, tbot_b_ms });
    config.network.base_ms = case.base_ms;
    config.engines = case
        .engines
        .iter()
        .enumerate()
        .map(|(i, &(replicas, capacity_rps, region))| Engine {
            id: format!("e{i}"),
            url: format!("http://127.0.0.1:{}", 9000 + i),
            model: "m".into(),
            region: format!("r{region}"),
            profile: "p".into(),
            replicas,
            capabilities: vec![],
            residency: vec![],
            capacity_rps,
            max_in_flight: None,
        })
        .collect();
    config
}

fn report(cluster: &str, rps: f64) -> Report {
    Report {
        cluster: ClusterId::new(cluster),
        instance: format!("{cluster}-1"),
        sequence: 1,
        period_ms: 1000,
        snapshot_version: 0,
        demand: vec![ClassDemand {
            model: ModelName::new("m"),
            class: ClassId::new("default"),
            requests: 0,
            shed: 0,
            rps,
            by_priority: None,
        }],
        engines: vec![],
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_published_snapshot_passes_the_data_planes_validation(case in case()) {
        let config = config(&case);
        if config.validate().is_err() {
            return Ok(());
        }
        let mut fleet = Fleet::new(config.clone());
        let now = Duration::from_secs(1);
        for (cluster, &rps) in ["a", "b"].iter().zip(&case.demand) {
            let report = report(cluster, rps);
            // What the API refuses never reaches the fleet.
            if report.validate().is_ok() {
                fleet.on_report(now, report).unwrap();
            }
        }
        let mut planner = Planner::for_config(&config);
        let round = planner.plan(&fleet, now);
        for (cluster, snapshot) in round.snapshots(&fleet, 7, 1) {
            let json = serde_json::to_vec(&snapshot).unwrap();
            let parsed = Snapshot::from_json(&json);
            prop_assert!(parsed.is_ok(), "cluster {cluster}: {:?}\n{}", parsed.err(), String::from_utf8_lossy(&json));
            let compiled = RoutingTable::compile(&parsed.unwrap(), None);
            prop_assert!(compiled.is_ok(), "cluster {cluster}: {:?}", compiled.err());
        }
    }
}

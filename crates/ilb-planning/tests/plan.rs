//! The brief's worked example through the real planning path: config → fleet (with data-plane
//! reports) → optimizer problems → solutions → published snapshots; and, whatever numbers a
//! fleet's config and its data planes' reports carry, every snapshot the planner would publish
//! passes the data planes' validation.

use ilb_core::priority::Priority;
use ilb_core::report::{ClassDemand, PriorityRps, Report};
use ilb_core::snapshot::Snapshot;
use ilb_core::table::RoutingTable;
use ilb_core::{ClassId, ClusterId, ModelName};
use ilb_optimizer::Solver;
use ilb_planning::config::{Engine, FleetConfig, Profile};
use ilb_planning::fleet::Fleet;
use ilb_planning::plan;
use ilb_planning::planner::Planner;
use proptest::prelude::*;
use std::time::Duration;

/// The worked example with fixed loopback engine URLs.
fn worked_example() -> String {
    include_str!("fixtures/worked-example.toml")
        .replace("{url-a}", "http://127.0.0.1:9000")
        .replace("{url-b}", "http://127.0.0.1:9001")
        .replace("{url-c}", "http://127.0.0.1:9002")
}

fn report(cluster: &str, rps: f64) -> Report {
    Report {
        replica: None,
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

#[test]
fn worked_example_spills_b_to_c() {
    let config: FleetConfig = toml::from_str(&worked_example()).unwrap();
    config.validate().unwrap();
    let mut fleet = Fleet::new(config);
    let now = Duration::from_secs(1);
    for (cluster, rps) in [("a", 90.0), ("b", 120.0), ("c", 40.0)] {
        fleet.on_report(now, report(cluster, rps)).unwrap();
    }
    let (plans, unplanned) = plan::build(&fleet.planning_inputs(now));
    assert_eq!((plans.len(), unplanned.len()), (1, 0));
    let solution = Solver::default().solve(&plans[0].problem).unwrap();
    assert!(solution.gap <= 1e-3, "gap {}", solution.gap);
    let snapshots = plan::snapshots(&fleet.config, &plans, &[Some(&solution)], 7, 0);
    let b = &snapshots["b"].models[0].classes[0];
    let weight = |class: &ilb_core::snapshot::ClassRoutes, engine: &str| {
        class.weights.iter().find(|w| w.engine.as_str() == engine).map_or(0.0, |w| w.weight)
    };
    // OPTIMIZER.md: about 30.7 of B's 120 req/s go to engine C.
    let b_to_c = weight(b, "engine-c") * 120.0;
    assert!((b_to_c - 30.7).abs() < 1.0, "B sends {b_to_c} req/s to C");
    assert!((solution.mean_latency_ms - 198.2).abs() < 1.0, "mean latency {}", solution.mean_latency_ms);
    for (j, e) in solution.engines.iter().enumerate() {
        let capacity = plans[0].problem.engines[j].capacity_rps;
        assert!(e.load_rps <= 0.95 * capacity + 1e-6, "engine {j} over capacity");
    }
    assert_eq!(snapshots["b"].version.0, 7);
    // Every snapshot passes the data plane's validation.
    for s in snapshots.values() {
        s.validate().unwrap();
    }
}

/// Snapshots tell the data planes how long a request of the class stays in flight on each
/// engine: its round trip, TTFT and `expected_output_tokens` × TBOT at the planned load, under
/// either objective (under `ttft` the plan's expected latency is the TTFT alone).
#[test]
fn snapshots_carry_each_engines_in_flight_time() {
    for objective in ["ttft", "ttft_plus_decode"] {
        let text = worked_example()
            .replace("ttft_b_ms = 15.0", "ttft_b_ms = 15.0\ntbot_t0_ms = 20.0\ntbot_b_ms = 2.0")
            .replace("objective = \"ttft\"", &format!("objective = \"{objective}\""));
        let config: FleetConfig = toml::from_str(&text).unwrap();
        config.validate().unwrap();
        let mut fleet = Fleet::new(config);
        let now = Duration::from_secs(1);
        for (cluster, rps) in [("a", 90.0), ("b", 120.0), ("c", 40.0)] {
            fleet.on_report(now, report(cluster, rps)).unwrap();
        }
        let (plans, _) = plan::build(&fleet.planning_inputs(now));
        let solution = Solver::default().solve(&plans[0].problem).unwrap();
        let snapshots = plan::snapshots(&fleet.config, &plans, &[Some(&solution)], 1, 0);
        let weights = &snapshots["b"].models[0].classes[0].weights;
        assert!(weights.len() >= 2);
        for w in weights {
            let (in_flight, network, expected) =
                (w.in_flight_ms.unwrap(), w.network_ms.unwrap(), w.expected_latency_ms.unwrap());
            // At least the unloaded TTFT and 128 tokens at 20 ms.
            assert!(in_flight >= network + 60.0 + 128.0 * 20.0, "{objective}: {w:?}");
            if objective == "ttft" {
                assert!(expected < 1000.0, "the TTFT alone: {w:?}");
            } else {
                assert!((in_flight - network - expected).abs() < 1e-6 * in_flight, "{objective}: {w:?}");
            }
        }
    }
}

#[test]
fn bad_configs_name_the_field() {
    let check = |edit: &dyn Fn(&str) -> String, expected: &str| {
        let text = edit(&worked_example());
        let error = match toml::from_str::<FleetConfig>(&text) {
            Err(e) => e.to_string(),
            Ok(c) => c.validate().unwrap_err().to_string(),
        };
        assert!(error.contains(expected), "{error:?} does not mention {expected:?}");
    };
    check(&|t| t.replace("rho = 0.95", "rho = 1.5"), "control_plane.rho");
    check(&|t| t.replace("rho = 0.95", "rho = 0.95\nstability_ms = -5.0"), "control_plane.stability_ms");
    check(
        &|t| t.replace("profile = \"gpu\"\ncapacity_rps = 80.0", "profile = \"tpu\""),
        "engines.engine-c.profile",
    );
    check(&|t| t.replace("url = \"http://127.0.0.1:9002\"", "url = \"ftp://x\""), "engines.engine-c.url");
    check(&|t| t.replace("id = \"engine-b\"", "id = \"engine-a\""), "duplicate id 'engine-a'");
    check(&|t| t.replace("[control_plane]", "[control_plane]\nsurprise = 1"), "unknown field `surprise`");
    check(&|t| t.replace("ttft_b_ms = 15.0", "ttft_b_ms = -1.0"), "profiles.gpu.ttft_b_ms");
    // Numbers whose products overflow are refused at the door (a fleet's capacity is
    // replicas × capacity_rps): the control plane once published `"weight": null` from these.
    check(
        &|t| t.replace("capacity_rps = 80.0", "capacity_rps = 1e308"),
        "engines.engine-c.capacity_rps: 1e308 is not in",
    );
    check(
        &|t| t.replace("capacity_rps = 100.0", "capacity_rps = 1e308"),
        "profiles.gpu.capacity_rps: 1e308 is not in",
    );
    check(
        &|t| t.replace("capacity_rps = 80.0", "replicas = 4294967295"),
        "engines.engine-c.replicas: 4294967295 is not in",
    );
    check(&|t| t.replace("ttft_t0_ms = 60.0", "ttft_t0_ms = inf"), "profiles.gpu.ttft_t0_ms: inf is not in");
}

/// A failed solve must not take a model away from the data planes: its classes route in
/// proportion to effective capacity until the next good solve.
#[test]
fn a_failed_solve_falls_back_to_capacity_weights() {
    let config: FleetConfig = toml::from_str(&worked_example()).unwrap();
    let fleet = Fleet::new(config);
    let (plans, _) = plan::build(&fleet.planning_inputs(Duration::from_secs(1)));
    let snapshots = plan::snapshots(&fleet.config, &plans, &[None], 3, 0);
    let b = &snapshots["b"].models[0].classes[0];
    let weights: Vec<f64> = b.weights.iter().map(|w| w.weight).collect();
    assert_eq!(weights, vec![100.0, 100.0, 80.0]);
    snapshots["b"].validate().unwrap();
}

/// A class whose demand comes in two priorities is planned as two parts with their own shed
/// prices: in overload the optimizer sheds the cheap part first (as the data plane does with
/// the class's shed fraction, lowest priority first), and another cluster's `normal` traffic
/// is shed before this class's `critical` traffic.
#[test]
fn overload_sheds_the_cheapest_priority_first() {
    let config: FleetConfig = toml::from_str(&worked_example()).unwrap();
    let mut fleet = Fleet::new(config);
    let now = Duration::from_secs(1);
    let mut b = report("b", 300.0);
    b.demand[0].by_priority = Some(PriorityRps { low: 150.0, critical: 150.0, ..PriorityRps::default() });
    for r in [report("a", 90.0), b, report("c", 40.0)] {
        fleet.on_report(now, r).unwrap();
    }
    let (plans, _) = plan::build(&fleet.planning_inputs(now));
    let plan = &plans[0];
    let b_idx = plan.classes.iter().position(|c| c.key.cluster == "b").unwrap();
    let ids: Vec<&str> = plan.parts_of(b_idx).map(|i| plan.problem.classes[i].id.as_str()).collect();
    assert_eq!(ids, ["b/default@low", "b/default@critical"]);
    let solution = Solver::default().solve(&plan.problem).unwrap();
    let outcome = plan.outcome(b_idx, Some(&solution));
    let shed =
        |priority: Priority| outcome.by_priority.iter().find(|p| p.0 == priority).map(|p| p.3).unwrap();
    // 430 req/s against 0.95 × 280 = 266 usable: 164 shed, all of b's 150 low first.
    assert!((outcome.planned_demand_rps - 300.0).abs() < 1e-9);
    assert!(shed(Priority::Low) > 149.0, "low shed {}", shed(Priority::Low));
    assert!(shed(Priority::Critical) < 0.5, "critical shed {}", shed(Priority::Critical));
    let others: f64 = plan
        .classes
        .iter()
        .enumerate()
        .filter(|(k, _)| *k != b_idx)
        .map(|(k, _)| plan.outcome(k, Some(&solution)).shed_rps)
        .sum();
    assert!(others > 10.0, "normal traffic elsewhere is shed before critical ({others} req/s)");
    // The published class sheds half its demand; weights of the admitted half sum to one.
    let snapshots = plan::snapshots(&fleet.config, &plans, &[Some(&solution)], 1, 0);
    let class = &snapshots["b"].models[0].classes[0];
    assert!((class.shed_fraction - 0.5).abs() < 0.01, "shed fraction {}", class.shed_fraction);
    let total: f64 = class.weights.iter().map(|w| w.weight).sum();
    assert!((total - 1.0).abs() < 1e-6, "weights sum to {total}");
}

/// A class the plan sheds entirely is still published routable, and on its nearest engine with
/// capacity, not spread by the prices of the round: equal weights (the old fallback) sent what
/// the data plane admits anyway across regions, and weights that follow the marginal prices
/// swung the class between regions from round to round.
#[test]
fn a_class_shed_entirely_routes_to_its_nearest_engine() {
    let config: FleetConfig = toml::from_str(&worked_example()).unwrap();
    let mut fleet = Fleet::new(config);
    let now = Duration::from_secs(1);
    let mut b = report("b", 50.0);
    b.demand[0].by_priority = Some(PriorityRps { low: 50.0, ..PriorityRps::default() });
    // 300 req/s of normal traffic elsewhere against 266 usable: all of b's low traffic goes.
    for r in [report("a", 200.0), b, report("c", 100.0)] {
        fleet.on_report(now, r).unwrap();
    }
    let (plans, _) = plan::build(&fleet.planning_inputs(now));
    let solution = Solver::default().solve(&plans[0].problem).unwrap();
    let snapshots = plan::snapshots(&fleet.config, &plans, &[Some(&solution)], 1, 0);
    let class = &snapshots["b"].models[0].classes[0];
    assert!(class.shed_fraction > 0.999, "shed fraction {}", class.shed_fraction);
    let weights: Vec<(&str, f64)> = class.weights.iter().map(|w| (w.engine.as_str(), w.weight)).collect();
    assert_eq!(weights, [("engine-a", 0.0), ("engine-b", 1.0), ("engine-c", 0.0)]);
    snapshots["b"].validate().unwrap();
}

/// Cluster b reports `rps` at `t` seconds (report sequence `t`); the planner builds that
/// round's problems.
fn build_after_b_reports(
    planner: &mut ilb_planning::planner::Planner,
    fleet: &mut Fleet,
    t: u64,
    rps: f64,
) -> ilb_planning::planner::Problems {
    let now = Duration::from_secs(t);
    let mut r = report("b", rps);
    r.sequence = t;
    fleet.on_report(now, r).unwrap();
    planner.build(fleet, now)
}

/// The planner keeps a band around each class's demand (3 σ of a Poisson EWMA: at 120 req/s
/// with 5 s smoothing, ±10.4 req/s). A measurement above it moves it only as far as it takes
/// to hold the measurement on its top edge; one below it, or a jump beyond twice its width,
/// re-centres it on the measurement. Each class is planned at its band's top, the headroom
/// above the centre shown in `headroom_rps`.
#[test]
fn demand_is_planned_at_the_top_of_a_band_that_rises_only_as_far_as_the_measurement_leaves_it() {
    let mut config: FleetConfig = toml::from_str(&worked_example()).unwrap();
    // Engines never scraped stay healthy for the whole test: their capacity does not change.
    config.control_plane.signal_stale_ms = 3_600_000;
    let mut fleet = Fleet::new(config);
    let mut planner = ilb_planning::planner::Planner::for_config(&fleet.config);
    // (centre, headroom) of cluster b's class.
    let mut planned = |fleet: &mut Fleet, sequence: u64, rps: f64| {
        let problems = build_after_b_reports(&mut planner, fleet, sequence, rps);
        let plan = &problems.plans[0];
        let b = plan.classes.iter().position(|c| c.key.cluster == "b").unwrap();
        let demand: f64 = plan.parts_of(b).map(|i| plan.problem.classes[i].demand_rps).sum();
        let headroom: f64 = plan.parts_of(b).map(|i| plan.problem.classes[i].headroom_rps).sum();
        (demand - headroom, headroom)
    };
    let band = |rps: f64| 3.0 * (rps / 10.0f64).sqrt();
    let near = |(centre, headroom): (f64, f64), want: f64, what: &str| {
        assert!((centre - want).abs() < 1e-9, "{what}: centre {centre}, want {want}");
        assert!((headroom - band(want)).abs() < 1e-9, "{what}: headroom {headroom}, want {}", band(want));
    };
    near(planned(&mut fleet, 1, 120.0), 120.0, "first measurement");
    near(planned(&mut fleet, 2, 128.0), 120.0, "within the band: held");
    near(planned(&mut fleet, 3, 112.0), 120.0, "within the band: held");
    near(planned(&mut fleet, 4, 135.0), 135.0 - band(135.0), "out of the band: moved to hold it on the edge");
    near(planned(&mut fleet, 5, 125.0), 135.0 - band(135.0), "back inside the moved band: held");
    near(planned(&mut fleet, 6, 110.0), 110.0, "out of the band downwards: re-centred");
    near(planned(&mut fleet, 7, 70.0), 70.0, "beyond twice the band: re-centred");
}

/// The prediction is for the traffic that arrives: a demand that rises within its band leaves
/// the plan as it was (the band's centre holds) but loads the engines more, and the predicted
/// latency says so.
#[test]
fn the_prediction_follows_the_measured_demand_within_the_band() {
    let mut config: FleetConfig = toml::from_str(&worked_example()).unwrap();
    config.control_plane.signal_stale_ms = 3_600_000;
    let mut fleet = Fleet::new(config);
    let mut planner = ilb_planning::planner::Planner::for_config(&fleet.config);
    for r in [report("a", 90.0), report("c", 40.0)] {
        fleet.on_report(Duration::from_secs(1), r).unwrap();
    }
    let mut round_at = |sequence: u64, rps: f64| {
        let problems = build_after_b_reports(&mut planner, &mut fleet, sequence, rps);
        planner.solve(problems)
    };
    let (held, risen) = (round_at(1, 120.0), round_at(2, 128.0));
    let demand = |round: &ilb_planning::planner::Round| -> Vec<f64> {
        round.plans[0].problem.classes.iter().map(|c| c.demand_rps).collect()
    };
    assert_eq!(demand(&held), demand(&risen), "within the band: the same problem");
    let (before, after) = (held.predicted_latency_ms().unwrap(), risen.predicted_latency_ms().unwrap());
    assert!(after > before * 1.001, "8 req/s more on the same plan: {before} ms → {after} ms");
}

/// Headroom is for bursts the fleet has room for: it takes at most a share of the usable
/// capacity left over by the demand expected, so a model beyond its capacity is planned without
/// any and the headroom does not displace traffic the plan would admit (300 req/s of normal
/// traffic against 266 usable sheds).
#[test]
fn a_model_beyond_its_capacity_is_planned_without_headroom() {
    let config: FleetConfig = toml::from_str(&worked_example()).unwrap();
    let mut fleet = Fleet::new(config);
    let now = Duration::from_secs(1);
    let mut planner = ilb_planning::planner::Planner::for_config(&fleet.config);
    for r in [report("a", 100.0), report("b", 50.0), report("c", 50.0)] {
        fleet.on_report(now, r).unwrap();
    }
    let round = planner.plan(&fleet, now);
    let band = |rps: f64| 3.0 * (rps / 10.0f64).sqrt();
    let headroom: f64 = round.plans[0].problem.classes.iter().map(|c| c.headroom_rps).sum();
    assert!((headroom - band(100.0) - 2.0 * band(50.0)).abs() < 1e-9, "room for all of it: {headroom}");
    let later = now + Duration::from_secs(1);
    for mut r in [report("a", 200.0), report("b", 50.0), report("c", 50.0)] {
        r.sequence = 2;
        fleet.on_report(later, r).unwrap();
    }
    let round = planner.plan(&fleet, later);
    let headrooms: Vec<f64> = round.plans[0].problem.classes.iter().map(|c| c.headroom_rps).collect();
    assert!(headrooms.iter().all(|&h| h == 0.0), "{headrooms:?}");
    let solution = round.solutions()[0].expect("solved");
    assert!(solution.shed_rps.iter().sum::<f64>() > 1.0, "over capacity: sheds");
    let demand: f64 = round.plans[0].problem.classes.iter().map(|c| c.demand_rps).sum();
    let measured: f64 = round.plans[0].classes.iter().map(|c| c.measured_demand_rps).sum();
    assert!((demand - measured).abs() < 1e-9, "planned {demand} vs measured {measured}");
}

/// Near capacity the headroom takes at most three quarters of the slack the centres leave under
/// ρ × capacity: all of it would put every engine at ρ × its capacity, a split in proportion
/// to capacity whatever the engines' latencies and distances.
#[test]
fn headroom_leaves_the_optimizer_part_of_the_slack_near_capacity() {
    let config: FleetConfig = toml::from_str(&worked_example()).unwrap();
    let mut fleet = Fleet::new(config);
    let now = Duration::from_secs(1);
    let mut planner = ilb_planning::planner::Planner::for_config(&fleet.config);
    // The brief's demand, 250 req/s, against 280 req/s of engines: 16 req/s of slack under
    // ρ = 0.95, less than the bands' 25 req/s of headroom.
    for r in [report("a", 90.0), report("b", 120.0), report("c", 40.0)] {
        fleet.on_report(now, r).unwrap();
    }
    let round = planner.plan(&fleet, now);
    let plan = &round.plans[0];
    let usable = 0.95 * plan.capacity_rps.iter().sum::<f64>();
    let headroom: f64 = plan.problem.classes.iter().map(|c| c.headroom_rps).sum();
    assert!((usable - 266.0).abs() < 1e-9, "{usable}");
    assert!((headroom - 0.75 * (usable - 250.0)).abs() < 1e-9, "three quarters of the slack: {headroom}");
    let solution = round.solutions()[0].expect("solved");
    // What `/v1/state` shows per class: the expected demand and the headroom on top of it.
    let outcomes: Vec<_> = (0..plan.classes.len()).map(|k| plan.outcome(k, Some(solution))).collect();
    let expected: f64 = outcomes.iter().map(|o| o.planned_demand_rps).sum();
    let shown: f64 = outcomes.iter().map(|o| o.headroom_rps).sum();
    assert!((expected - 250.0).abs() < 1e-9 && (shown - headroom).abs() < 1e-9, "{expected} + {shown}");
    let idle: Vec<f64> = (0..plan.engines.len())
        .map(|j| 0.95 * plan.problem.engines[j].capacity_rps - solution.engines[j].load_rps)
        .collect();
    assert!(idle.iter().sum::<f64>() > 3.9, "the plan leaves the rest of the slack: {idle:?}");
}

/// A demand that jumps by more than twice its noise band is a real change: its model is
/// solved without the stability strength until the measurement has settled (3 × 5 s
/// smoothing), so a surge spills at once; a drift out of the band by a little is not.
#[test]
fn a_real_change_of_demand_frees_its_model_of_the_stability_strength_for_a_while() {
    let mut config: FleetConfig = toml::from_str(&worked_example()).unwrap();
    assert_eq!(config.control_plane.smoothing_ms, 5000);
    // Engines never scraped stay healthy for the whole test: their capacity does not change.
    config.control_plane.signal_stale_ms = 3_600_000;
    let mut fleet = Fleet::new(config);
    let mut planner = ilb_planning::planner::Planner::for_config(&fleet.config);
    let mut changed =
        |fleet: &mut Fleet, t: u64, rps: f64| build_after_b_reports(&mut planner, fleet, t, rps).changed[0];
    assert!(changed(&mut fleet, 1, 120.0), "a new class");
    assert!(changed(&mut fleet, 2, 128.0), "still settling (until 16 s)");
    assert!(!changed(&mut fleet, 20, 125.0), "noise");
    assert!(!changed(&mut fleet, 21, 135.0), "out of the band (±11) by a little");
    assert!(changed(&mut fleet, 22, 170.0), "a jump of 35 req/s, beyond twice the band (±12.4 at 170)");
    assert!(changed(&mut fleet, 30, 170.0), "settling until 37 s");
    assert!(!changed(&mut fleet, 38, 170.0), "settled");
    // An engine that stops counting (its scrapes stale) changes the fleet: free again.
    fleet.config.control_plane.signal_stale_ms = 1000;
    assert!(changed(&mut fleet, 40, 170.0), "engines' capacities changed");
    assert!(changed(&mut fleet, 50, 170.0), "settling until 55 s");
    assert!(!changed(&mut fleet, 56, 170.0), "settled");
}

/// Shed prices follow the objective's scale: configured at a few ms (below any request's
/// latency), the plan would shed a fleet at half its capacity; with the default floor each
/// class's prices rise together until `normal` is twice its slowest unloaded latency (class a:
/// engine c at 90 ms network + 60 ms), and nothing is shed.
#[test]
fn shed_prices_are_raised_to_the_objectives_scale() {
    for floor in [2.0, 0.0] {
        let mut config: FleetConfig = toml::from_str(&worked_example()).unwrap();
        config.control_plane.shed_penalty_ms =
            [("low", 1.0), ("normal", 5.0), ("high", 15.0), ("critical", 50.0)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
        config.control_plane.shed_price_floor = floor;
        config.validate().unwrap();
        let mut fleet = Fleet::new(config);
        let now = Duration::from_secs(1);
        for (cluster, rps) in [("a", 45.0), ("b", 60.0), ("c", 20.0)] {
            fleet.on_report(now, report(cluster, rps)).unwrap();
        }
        let (plans, _) = plan::build(&fleet.planning_inputs(now));
        let problem = &plans[0].problem;
        let price = |id: &str| problem.classes.iter().find(|c| c.id == id).unwrap().shed_penalty_ms;
        let solution = Solver::default().solve(problem).unwrap();
        let shed: f64 = solution.shed_rps.iter().sum();
        if floor > 0.0 {
            assert!((price("a/default") - 300.0).abs() < 1e-9, "a: {}", price("a/default"));
            // b's slowest engine is c: 70 ms + 60 ms.
            assert!((price("b/default") - 260.0).abs() < 1e-9, "b: {}", price("b/default"));
            assert!(shed < 1e-6, "{shed} req/s shed at half capacity");
        } else {
            assert_eq!(price("a/default"), 5.0);
            assert!(shed > 100.0, "only {shed} of 125 req/s shed at a 5 ms price");
        }
    }
}

// Configs and reports that the control plane accepts cannot make it publish what every data
// plane would refuse (a `NaN` weight written as `null`, say).

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

/// The tail term (`control_plane.tail_weight`) keeps long answers off an engine that decodes
/// slowly: two engines with the same unloaded mean, one quick to the first token and slow per
/// token, the other the reverse. The plan with the tail sends the slow decoder less than the
/// mean alone does, at a small cost in the mean, and the mixture's p99 falls.
#[test]
fn the_tail_term_keeps_long_answers_off_the_slow_decoder() {
    use ilb_optimizer::{Class, Engine, Latency, NetworkMatrix, Problem};
    use ilb_planning::profile::{
        combine_with_tail, mixture_quantile, DecodeLengths, LatencyProfile, Objective, Tail,
    };
    let tokens = 40.0;
    let lengths = DecodeLengths::exponential(tokens);
    let capacity = 100.0;
    let queueing = |t0_ms, b_ms| LatencyProfile::Queueing { t0_ms, b_ms };
    // (TTFT, TBOT): 20 + 40 × 20 = 340 + 40 × 12 = 820 ms unloaded.
    let engines = [(queueing(20.0, 5.0), queueing(20.0, 2.0)), (queueing(340.0, 5.0), queueing(12.0, 1.2))];
    let objective = Objective::TtftPlusDecode { expected_output_tokens: tokens };
    let solve = |tail: Option<Tail>| {
        let latency = |(ttft, tbot): &(LatencyProfile, LatencyProfile)| match combine_with_tail(
            ttft, tbot, objective, tail, capacity,
        ) {
            LatencyProfile::Queueing { t0_ms, b_ms } => Latency::Queueing { t0_ms, b_ms },
            LatencyProfile::Piecewise(knots) => {
                Latency::Piecewise(knots.iter().map(|&(y, l)| [y, l]).collect())
            }
        };
        let problem = Problem {
            rho: 0.95,
            classes: vec![Class {
                id: "c".into(),
                demand_rps: 120.0,
                shed_penalty_ms: 1e6,
                headroom_rps: 0.0,
            }],
            engines: engines
                .iter()
                .enumerate()
                .map(|(j, e)| Engine { id: format!("e{j}"), capacity_rps: capacity, latency: latency(e) })
                .collect(),
            network_ms: NetworkMatrix::from_fn(1, 2, |_, _| Some(0.0)).unwrap(),
        };
        let solution = Solver::default().solve(&problem).unwrap();
        assert!(solution.gap <= 1e-3);
        solution.engines.iter().map(|e| e.load_rps).collect::<Vec<f64>>()
    };
    // The mean and the p99 of a plan, on the engines' true curves.
    let judge = |loads: &[f64]| {
        let parts: Vec<(f64, f64, f64)> = engines
            .iter()
            .zip(loads)
            .map(|((ttft, tbot), &y)| (y, ttft.latency_ms(y, capacity), tbot.latency_ms(y, capacity)))
            .collect();
        let mean = parts.iter().map(|&(y, a, b)| y * (a + tokens * b)).sum::<f64>() / 120.0;
        (mean, mixture_quantile(&parts, &lengths, 0.99).unwrap())
    };
    let plain = solve(None);
    let (plain_mean, plain_p99) = judge(&plain);
    let mut before = (plain[0], plain_p99);
    // The default weight, then a heavier one: each moves more off the slow decoder.
    for weight in [2.0, 10.0] {
        let tailed = solve(Some(Tail { threshold_ms: plain_p99, weight, lengths: &lengths }));
        let (tailed_mean, tailed_p99) = judge(&tailed);
        assert!(
            tailed[0] < before.0 - 0.5,
            "weight {weight}: slow decoder's load {} → {}",
            before.0,
            tailed[0]
        );
        assert!(tailed_p99 < before.1, "weight {weight}: p99 {} → {tailed_p99}", before.1);
        assert!(tailed_mean < 1.01 * plain_mean, "weight {weight}: mean {plain_mean} → {tailed_mean}");
        before = (tailed[0], tailed_p99);
    }
}

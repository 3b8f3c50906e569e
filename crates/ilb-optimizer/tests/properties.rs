//! Properties over generated problems: demand conserved, capacity respected, weights a
//! distribution per class, forbidden pairs unused, equal inputs give bit-identical outputs,
//! certified gap within the bar; plus the degenerate inputs and validation errors.

mod common;

use ilb_optimizer::gen::{generate, perturb_demand, GenConfig};
use ilb_optimizer::{
    solve, Class, Engine, Latency, NetworkMatrix, Problem, ProblemError, Solver, SolverOptions,
};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

fn config_strategy() -> impl Strategy<Value = GenConfig> {
    (1usize..8, 1usize..25, any::<u64>(), 0.2f64..1.6, 0.0f64..0.6, 0.0f64..1.0, 0.5f64..1.0).prop_map(
        |(n, m, seed, load, resident, piecewise, rho)| GenConfig {
            n_classes: n,
            n_engines: m,
            seed,
            load_factor: load,
            resident_fraction: resident,
            piecewise_fraction: piecewise,
            rho,
            noise: None,
            fleet: None,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, rng_seed: RngSeed::Fixed(1), ..ProptestConfig::default() })]

    #[test]
    fn solutions_are_feasible_certified_and_deterministic(config in config_strategy()) {
        let problem = generate(&config);
        let options = SolverOptions::default();
        let (a, warm_a) = solve(&problem, None, &options).unwrap();
        let (b, warm_b) = solve(&problem, None, &options).unwrap();
        common::check_invariants(&problem, &a);
        prop_assert!(a.gap <= 1e-3, "gap {}", a.gap);
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(&warm_a, &warm_b);
        // A warm re-solve after a small change stays feasible and deterministic too.
        let changed = perturb_demand(&problem, config.seed, 0.01);
        let (c, _) = solve(&changed, Some(&warm_a), &options).unwrap();
        let (d, _) = solve(&changed, Some(&warm_b), &options).unwrap();
        common::check_invariants(&changed, &c);
        prop_assert!(c.gap <= 1e-3, "warm gap {}", c.gap);
        prop_assert_eq!(c, d);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, rng_seed: RngSeed::Fixed(2), ..ProptestConfig::default() })]

    /// The same properties on instances large enough for the coarse cold start.
    #[test]
    fn clustered_cold_starts_are_feasible_certified_and_deterministic(
        (n, m, seed, load, piecewise) in (1usize..14, 64usize..260, any::<u64>(), 0.2f64..1.6, 0.0f64..1.0)
    ) {
        let config = GenConfig { load_factor: load, piecewise_fraction: piecewise, ..GenConfig::new(n, m, seed) };
        let problem = generate(&config);
        let options = SolverOptions::default();
        let (a, warm) = solve(&problem, None, &options).unwrap();
        let (b, _) = solve(&problem, None, &options).unwrap();
        common::check_invariants(&problem, &a);
        // The coarse start needs 64 engines some class may use (a resident class may not).
        let usable = (0..m).filter(|&j| (0..n).any(|k| problem.network_ms.get(k, j).is_some())).count();
        prop_assert!(a.coarse_engines.is_some() || usable < 64, "the coarse start was not used");
        prop_assert!(a.gap <= 1e-3, "gap {}", a.gap);
        prop_assert_eq!(&a, &b);
        let changed = perturb_demand(&problem, seed, 0.01);
        let (c, _) = solve(&changed, Some(&warm), &options).unwrap();
        common::check_invariants(&changed, &c);
        prop_assert!(c.gap <= 1e-3, "warm gap {}", c.gap);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, rng_seed: RngSeed::Fixed(3), ..ProptestConfig::default() })]

    /// The same properties on the noisy network model (no exact clusters, no identical rows).
    #[test]
    fn noisy_instances_are_feasible_certified_and_deterministic(
        (n, m, seed, load, piecewise) in (1usize..14, 1usize..260, any::<u64>(), 0.2f64..1.6, 0.0f64..1.0)
    ) {
        let config = GenConfig { piecewise_fraction: piecewise, ..GenConfig::noisy(n, m, seed).with_load(load) };
        let problem = generate(&config);
        let options = SolverOptions::default();
        let (a, warm_a) = solve(&problem, None, &options).unwrap();
        let (b, warm_b) = solve(&problem, None, &options).unwrap();
        common::check_invariants(&problem, &a);
        prop_assert!(a.gap <= 1e-3, "gap {}", a.gap);
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(&warm_a, &warm_b);
        let changed = perturb_demand(&problem, seed, 0.01);
        let (c, _) = solve(&changed, Some(&warm_a), &options).unwrap();
        let (d, _) = solve(&changed, Some(&warm_b), &options).unwrap();
        common::check_invariants(&changed, &c);
        prop_assert!(c.gap <= 1e-3, "warm gap {}", c.gap);
        prop_assert_eq!(c, d);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, rng_seed: RngSeed::Fixed(4), ..ProptestConfig::default() })]

    /// The same properties on the real-looking fleet (four hardware classes, sixteen regions with
    /// mismatched demand and capacity, residency and random forbidden pairs, lognormal demand).
    #[test]
    fn fleet_instances_are_feasible_certified_and_deterministic(
        (n, m, seed, load, piecewise) in (1usize..40, 1usize..400, any::<u64>(), 0.2f64..1.3, 0.0f64..0.6)
    ) {
        let config = GenConfig { piecewise_fraction: piecewise, ..GenConfig::fleet(n, m, seed).with_load(load) };
        let problem = generate(&config);
        prop_assert_eq!(&problem, &generate(&config));
        let options = SolverOptions::default();
        let (a, warm_a) = solve(&problem, None, &options).unwrap();
        let (b, warm_b) = solve(&problem, None, &options).unwrap();
        common::check_invariants(&problem, &a);
        prop_assert!(a.gap <= 1e-3, "gap {}", a.gap);
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(&warm_a, &warm_b);
        let changed = perturb_demand(&problem, seed, 0.01);
        let (c, _) = solve(&changed, Some(&warm_a), &options).unwrap();
        let (d, _) = solve(&changed, Some(&warm_b), &options).unwrap();
        common::check_invariants(&changed, &c);
        prop_assert!(c.gap <= 1e-3, "warm gap {}", c.gap);
        prop_assert_eq!(c, d);
    }
}

/// The fleet at the issue's sizes' smaller end, 72 % and 108 % load: its features are there (many
/// forbidden pairs, an eightfold capacity spread, shedding at 108 %), the solve is certified, equal
/// inputs give equal outputs, and chained warm re-solves stay certified and deterministic.
#[test]
fn fleet_instances_are_certified_and_stable() {
    for config in [GenConfig::fleet(100, 5_000, 1), GenConfig::fleet(100, 5_000, 2).with_load(1.08)] {
        let problem = generate(&config);
        let forbidden = (0..100)
            .flat_map(|k| (0..5_000).map(move |j| (k, j)))
            .filter(|&(k, j)| problem.network_ms.get(k, j).is_none())
            .count() as f64
            / 500_000.0;
        assert!((0.05..0.2).contains(&forbidden), "{forbidden} of the pairs forbidden");
        let caps = problem.engines.iter().map(|e| e.capacity_rps);
        let spread = caps.clone().fold(0.0, f64::max) / caps.fold(f64::INFINITY, f64::min);
        assert!(spread > 8.0, "capacity spread {spread}");
        let options = SolverOptions::default();
        let (a, warm) = solve(&problem, None, &options).unwrap();
        common::check_invariants(&problem, &a);
        assert!(a.gap <= 5e-4, "{config:?}: gap {}", a.gap);
        // The fitted coarse start, from a grouped problem of about two classes per region.
        assert!(a.coarse_classes.is_some_and(|g| g <= 40), "{:?}", a.coarse_classes);
        let shed: f64 = a.shed_rps.iter().sum();
        assert_eq!(shed > 0.0, config.load_factor > 1.0, "shed {shed}");
        let (b, _) = solve(&problem, None, &options).unwrap();
        assert_eq!(a, b);
        let (mut warm, mut current) = (warm, problem);
        for round in 0..2 {
            current = perturb_demand(&current, round, 0.01);
            let (next, next_warm) = solve(&current, Some(&warm), &options).unwrap();
            let (again, _) = solve(&current, Some(&warm), &options).unwrap();
            common::check_invariants(&current, &next);
            assert!(next.gap <= 5e-4, "round {round}: gap {}", next.gap);
            assert_eq!(next, again);
            warm = next_warm;
        }
    }
}

fn class(id: &str, demand: f64) -> Class {
    Class { id: id.into(), demand_rps: demand, shed_penalty_ms: 10_000.0, headroom_rps: 0.0 }
}

fn engine(id: &str, capacity: f64) -> Engine {
    Engine { id: id.into(), capacity_rps: capacity, latency: Latency::Queueing { t0_ms: 60.0, b_ms: 15.0 } }
}

#[test]
fn degenerate_inputs_are_handled() {
    // No classes at all.
    let empty = Problem {
        rho: 0.9,
        classes: vec![],
        engines: vec![engine("e", 10.0)],
        network_ms: NetworkMatrix::from_rows(&[]).unwrap(),
    };
    let (s, _) = solve(&empty, None, &SolverOptions::default()).unwrap();
    assert!(s.routes.is_empty() && s.objective == 0.0 && s.gap == 0.0);
    // A class without demand, a class with no allowed engine, an engine without capacity.
    let problem = Problem {
        rho: 0.9,
        classes: vec![class("zero", 0.0), class("stranded", 5.0), class("normal", 20.0)],
        engines: vec![engine("dead", 0.0), engine("live", 50.0)],
        network_ms: NetworkMatrix::from_rows(&[
            vec![Some(5.0), Some(5.0)],
            vec![None, None],
            vec![Some(1.0), Some(10.0)],
        ])
        .unwrap(),
    };
    let (s, _) = solve(&problem, None, &SolverOptions::default()).unwrap();
    common::check_invariants(&problem, &s);
    assert_eq!(s.shed_rps, vec![0.0, 5.0, 0.0]);
    assert_eq!(s.routes.len(), 1);
    assert_eq!((s.routes[0].class, s.routes[0].engine, s.routes[0].weight), (2, 1, 1.0));
    assert_eq!(s.engines[0].load_rps, 0.0);
    assert!(s.gap <= 1e-3);
}

#[test]
fn invalid_problems_are_rejected() {
    let good = || Problem {
        rho: 0.9,
        classes: vec![class("a", 1.0)],
        engines: vec![engine("e", 10.0)],
        network_ms: NetworkMatrix::from_rows(&[vec![Some(1.0)]]).unwrap(),
    };
    let mut p = good();
    p.rho = 1.5;
    assert_eq!(p.validate(), Err(ProblemError::Rho(1.5)));
    let mut p = good();
    p.engines[0].capacity_rps = -1.0;
    assert!(matches!(p.validate(), Err(ProblemError::EngineField { .. })));
    let mut p = good();
    p.classes[0].demand_rps = f64::NAN;
    assert!(matches!(p.validate(), Err(ProblemError::ClassField { .. })));
    let mut p = good();
    p.classes[0].headroom_rps = -0.5;
    assert!(matches!(p.validate(), Err(ProblemError::ClassField { field: "headroom_rps", .. })));
    let mut p = good();
    p.classes.push(class("a", 2.0));
    assert!(matches!(p.validate(), Err(ProblemError::DuplicateId { .. })));
    p.classes[1].id = "b".into();
    assert!(matches!(solve(&p, None, &SolverOptions::default()), Err(ProblemError::NetworkRows { .. })));
    let mut p = good();
    p.engines.push(engine("f", 1.0));
    assert!(matches!(p.validate(), Err(ProblemError::NetworkColumns { .. })));
    let mut p = good();
    p.engines[0].latency = Latency::Piecewise(vec![]);
    assert!(matches!(p.validate(), Err(ProblemError::Piecewise { .. })));
    assert!(matches!(
        NetworkMatrix::from_rows(&[vec![Some(1.0)], vec![]]),
        Err(ProblemError::RaggedRow { row: 1, .. })
    ));
    assert!(matches!(NetworkMatrix::from_rows(&[vec![Some(-1.0)]]), Err(ProblemError::NetworkValue { .. })));
    assert!(Problem::from_json(r#"{"rho": 0.9, "classes": [], "engines": [], "network_ms": [], "x": 1}"#)
        .is_err());
}

#[test]
fn json_round_trip() {
    let text = r#"{"rho": 0.95,
        "classes": [{"id": "a", "demand_rps": 90.0, "shed_penalty_ms": 10000.0}],
        "engines": [{"id": "e1", "capacity_rps": 100.0, "latency": {"queueing": {"t0_ms": 60.0, "b_ms": 15.0}}},
                    {"id": "e2", "capacity_rps": 50.0, "latency": {"piecewise": [[0, 50], [40, 90]]}}],
        "network_ms": [[5.0, null]]}"#;
    let problem = Problem::from_json(text).unwrap();
    assert_eq!(problem.network_ms.get(0, 1), None);
    let back = Problem::from_json(&serde_json::to_string(&problem).unwrap()).unwrap();
    assert_eq!(problem, back);
}

/// A cold solve of a large instance starts from the clustered coarse problem (one engine per
/// region) and then needs only a few Newton steps on the full one. Measurement noise on every
/// pair below the clustering tolerance still clusters; noise well above it falls back to the
/// plain cold start. Every variant is certified.
#[test]
fn cold_start_from_clusters() {
    let problem = generate(&GenConfig::new(100, 5_000, 1));
    let (solution, _) = solve(&problem, None, &SolverOptions::default()).unwrap();
    common::check_invariants(&problem, &solution);
    assert!(solution.gap <= 5e-4, "gap {}", solution.gap);
    let regions = 16;
    assert!(solution.coarse_engines.is_some_and(|c| c <= regions), "{:?}", solution.coarse_engines);
    assert!(solution.newton_steps <= 6, "{} Newton steps after the coarse start", solution.newton_steps);

    let noisy = |amplitude_ms: f64| {
        let mut problem = generate(&GenConfig::new(20, 200, 3));
        let mut state = 0x1234_5678u64;
        let matrix = &problem.network_ms;
        problem.network_ms = NetworkMatrix::from_fn(matrix.n_classes(), matrix.n_engines(), |k, j| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            matrix.get(k, j).map(|v| v + amplitude_ms * (state >> 40) as f64 / (1u64 << 24) as f64)
        })
        .unwrap();
        let (solution, _) = solve(&problem, None, &SolverOptions::default()).unwrap();
        common::check_invariants(&problem, &solution);
        assert!(solution.gap <= 5e-4, "noise {amplitude_ms} ms: gap {}", solution.gap);
        solution.coarse_engines
    };
    assert!(noisy(0.2).is_some_and(|c| c <= 2 * regions));
    // 5 ms of jitter: nothing clusters exactly, engines are grouped by their nearest group and
    // the fitted coarse problem seeds the full solve (at most one cluster per class here).
    assert!(noisy(5.0).is_some_and(|c| c <= 20), "{:?}", noisy(5.0));
}

/// The noisy network model (sites jittered around their region, 0–3 ms on every pair) at 72 %
/// and 108 % load: certified, the fitted coarse start used, equal inputs give equal outputs, and
/// warm re-solves after ±1 % demand changes stay certified and move little traffic.
#[test]
fn noisy_instances_are_certified_and_stable() {
    for config in [GenConfig::noisy(100, 5_000, 1), GenConfig::noisy(100, 5_000, 2).with_load(1.08)] {
        let problem = generate(&config);
        let options = SolverOptions::default();
        let (a, warm) = solve(&problem, None, &options).unwrap();
        common::check_invariants(&problem, &a);
        assert!(a.gap <= 5e-4, "{config:?}: gap {}", a.gap);
        assert!(a.coarse_engines.is_some_and(|c| c <= 100), "{:?}", a.coarse_engines);
        assert!(a.coarse_classes.is_some_and(|g| g <= 40), "{:?}", a.coarse_classes);
        let (b, _) = solve(&problem, None, &options).unwrap();
        assert_eq!(a, b);
        let (mut warm, mut current) = (warm, problem);
        for round in 0..2 {
            current = perturb_demand(&current, round, 0.01);
            let (next, next_warm) = solve(&current, Some(&warm), &options).unwrap();
            common::check_invariants(&current, &next);
            assert!(next.gap <= 5e-4, "round {round}: gap {}", next.gap);
            let moved = next.traffic_moved.unwrap();
            assert!(moved <= 0.1, "round {round}: {:.2} % moved", 100.0 * moved);
            warm = next_warm;
        }
    }
}

/// A warm start keeps the engines' processed curves and reuses them only for engines that are
/// the same bit for bit: changing one engine's curve (or the capacity) gives the same solution as
/// a warm start without the cache (a serde round trip drops it).
#[test]
fn warm_start_curve_cache_follows_the_engines() {
    let problem = generate(&GenConfig::noisy(20, 300, 3));
    let options = SolverOptions::default();
    let (_, warm) = solve(&problem, None, &options).unwrap();
    let uncached: ilb_optimizer::WarmStart =
        serde_json::from_str(&serde_json::to_string(&warm).unwrap()).unwrap();
    assert_eq!(warm, uncached);
    let mut changed_curve = perturb_demand(&problem, 1, 0.01);
    changed_curve.engines[7].latency = match &changed_curve.engines[7].latency {
        Latency::Queueing { t0_ms, b_ms } => Latency::Queueing { t0_ms: t0_ms + 5.0, b_ms: *b_ms },
        Latency::Piecewise(points) => Latency::Piecewise(points.iter().map(|p| [p[0], p[1] + 5.0]).collect()),
    };
    let mut changed_capacity = perturb_demand(&problem, 2, 0.01);
    changed_capacity.engines[3].capacity_rps *= 0.5;
    let same = perturb_demand(&problem, 3, 0.01);
    for next in [changed_curve, changed_capacity, same] {
        let (cached, _) = solve(&next, Some(&warm), &options).unwrap();
        let (fresh, _) = solve(&next, Some(&uncached), &options).unwrap();
        assert_eq!(cached, fresh);
        assert!(cached.gap <= 5e-4, "gap {}", cached.gap);
    }
}

/// The stability requirement: after a ±1 % demand change on a 100 × 5,000 instance a warm
/// re-solve moves at most 2 % of the traffic.
#[test]
fn warm_resolve_moves_little_traffic() {
    let problem = generate(&GenConfig::new(100, 5_000, 11));
    let mut solver = Solver::new(SolverOptions::default());
    let first = solver.solve(&problem).unwrap();
    assert!(first.gap <= 1e-3);
    assert_eq!(first.traffic_moved, None);
    let mut current = problem;
    for round in 0..3 {
        current = perturb_demand(&current, round, 0.01);
        let next = solver.solve(&current).unwrap();
        assert!(next.gap <= 1e-3, "round {round}: gap {}", next.gap);
        let moved = next.traffic_moved.unwrap();
        assert!(moved <= 0.02, "round {round}: {:.2} % moved", 100.0 * moved);
    }
}

/// With a stability strength the solver keeps its split while moving would not pay for itself
/// (a ±1 % demand change), re-evaluated on the new demand, feasible, and with an honest gap; it
/// moves once the old split no longer fits (an engine would overflow) or the gain is large.
#[test]
fn stability_strength_keeps_the_split_until_moving_pays() {
    let problem = generate(&GenConfig::new(20, 200, 5));
    let options = SolverOptions { stability_ms: 200.0, ..SolverOptions::default() };
    let mut solver = Solver::new(options);
    let first = solver.solve(&problem).unwrap();
    let changed = perturb_demand(&problem, 3, 0.01);
    let kept = solver.solve(&changed).unwrap();
    common::check_invariants(&changed, &kept);
    assert_eq!(kept.routes.len(), first.routes.len());
    for (a, b) in kept.routes.iter().zip(&first.routes) {
        assert_eq!((a.class, a.engine, a.weight), (b.class, b.engine, b.weight));
    }
    assert!(kept.gap <= 1e-2, "stability costs {} here", kept.gap);
    // The optimum itself would have moved some traffic.
    let (free, _) = solve(&changed, None, &SolverOptions::default()).unwrap();
    assert!(free.objective <= kept.objective);

    // Demand up 30 %: the old split overflows engines, so the solver moves.
    let mut surge = changed.clone();
    for c in &mut surge.classes {
        c.demand_rps *= 1.3;
    }
    let moved = solver.solve(&surge).unwrap();
    common::check_invariants(&surge, &moved);
    assert!(moved.gap <= 1e-3, "gap {}", moved.gap);
    assert!(moved.traffic_moved.unwrap() > 0.01);

    // Without a strength nothing is held back.
    let mut plain = Solver::new(SolverOptions::default());
    plain.solve(&problem).unwrap();
    let optimum = plain.solve(&changed).unwrap();
    assert!(optimum.gap <= 1e-3);
    assert!(optimum.routes.iter().zip(&first.routes).any(|(a, b)| a.weight != b.weight));
}

/// With a relative stability tolerance (and no strength) the solver keeps its split while the
/// old split's cost on the new problem is within the tolerance of the new optimum's, and its
/// gap then stays within the tolerance plus the solve's own; a change that costs more moves.
#[test]
fn stability_tolerance_keeps_the_split_within_its_cost() {
    let problem = generate(&GenConfig::new(20, 200, 5));
    let options = SolverOptions { stability_tolerance: 0.01, ..SolverOptions::default() };
    let mut solver = Solver::new(options);
    let first = solver.solve(&problem).unwrap();
    let changed = perturb_demand(&problem, 3, 0.002);
    let kept = solver.solve(&changed).unwrap();
    common::check_invariants(&changed, &kept);
    let weights = |s: &ilb_optimizer::Solution| -> Vec<_> {
        s.routes.iter().map(|r| (r.class, r.engine, r.weight)).collect()
    };
    assert_eq!(weights(&kept), weights(&first), "a 0.2 % demand change moved traffic");
    assert!(kept.gap <= 0.01 + 1e-3, "gap {}", kept.gap);
    let (free, _) = solve(&changed, None, &SolverOptions::default()).unwrap();
    assert!(kept.objective <= free.objective * 1.01 + 1e-9);

    // Demand up 30 %: the old split no longer fits, so the solver moves.
    let mut surge = changed.clone();
    for c in &mut surge.classes {
        c.demand_rps *= 1.3;
    }
    let moved = solver.solve(&surge).unwrap();
    common::check_invariants(&surge, &moved);
    assert!(moved.traffic_moved.unwrap() > 0.01);
}

/// Classes b (60 req/s) and c (`c_demand`) and engines e1, e2, e3 of `capacities`, all with the
/// same queueing curve, ρ = 0.9; `rows` are the classes' network latencies (None: forbidden).
fn two_classes(rows: [[Option<f64>; 3]; 2], capacities: [f64; 3], c_demand: f64) -> Problem {
    let engine = |id: &str, capacity_rps: f64| Engine {
        id: id.into(),
        capacity_rps,
        latency: Latency::Queueing { t0_ms: 100.0, b_ms: 1.0 },
    };
    let class = |id: &str, demand_rps: f64| Class {
        id: id.into(),
        demand_rps,
        shed_penalty_ms: 10_000.0,
        headroom_rps: 0.0,
    };
    Problem {
        rho: 0.9,
        classes: vec![class("b", 60.0), class("c", c_demand)],
        engines: vec![engine("e1", capacities[0]), engine("e2", capacities[1]), engine("e3", capacities[2])],
        network_ms: NetworkMatrix::from_fn(2, 3, |k, j| rows[k][j]).unwrap(),
    }
}

/// Class `k`'s published (engine, weight) pairs.
fn class_weights(s: &ilb_optimizer::Solution, k: usize) -> Vec<(usize, f64)> {
    s.class_routes(k).iter().map(|r| (r.engine, r.weight)).collect()
}

/// The tolerance holds classes one at a time: when one class must move (its demand outgrew its
/// nearby engine, so it spills onto a twin engine another class shares), the other class keeps
/// its weights even though the optimum would rebalance it across the twins, since that
/// rebalancing saves less than the tolerance. The whole previous split no longer fits, so
/// before this rule both classes moved.
#[test]
fn stability_tolerance_holds_the_classes_that_need_not_move() {
    // b reaches the twins e1 and e2 equally; c prefers its own e3 and can spill onto e2.
    let rows = [[Some(10.0), Some(10.0), None], [None, Some(10.0), Some(5.0)]];
    let problem = |c_demand: f64| two_classes(rows, [100.0, 100.0, 25.0], c_demand);
    let options = SolverOptions { stability_tolerance: 0.001, ..SolverOptions::default() };
    let mut solver = Solver::new(options);
    let first = solver.solve(&problem(15.0)).unwrap();
    assert!(
        class_weights(&first, 1).iter().all(|&(j, _)| j == 2),
        "c starts on e3 alone: {:?}",
        first.routes
    );

    let grown = problem(29.0);
    let kept = solver.solve(&grown).unwrap();
    common::check_invariants(&grown, &kept);
    assert_eq!(class_weights(&kept, 0), class_weights(&first, 0), "b moved");
    assert!(
        class_weights(&kept, 1).iter().any(|&(j, w)| j == 1 && w > 0.2),
        "c must spill: {:?}",
        kept.routes
    );
    assert!(kept.gap <= 0.001 + 1e-3, "gap {}", kept.gap);
    // The optimum itself rebalances b across the twins.
    let (free, _) = solve(&grown, None, &SolverOptions::default()).unwrap();
    let moved: f64 =
        class_weights(&free, 0).iter().zip(class_weights(&first, 0)).map(|(a, b)| (a.1 - b.1).abs()).sum();
    assert!(moved > 0.1, "the optimum moves {:.3} of b", moved / 2.0);
    assert!(kept.objective <= free.objective * 1.001 + 1e-9);
}

/// A class holding its weights need only fit its engines without half its headroom (the margin
/// the planner adds above the demand it expects): when a noise step of the demand estimate
/// would overflow the class's full engine, the overflow (at most half its headroom there) is
/// planned on the engine with room, and the published weights stay. Without headroom, or with a
/// step beyond half of it, the class moves.
#[test]
fn a_held_class_plans_the_headroom_that_does_not_fit_elsewhere() {
    let engine = |id: &str| Engine {
        id: id.into(),
        capacity_rps: 50.0 / 0.9,
        latency: Latency::Queueing { t0_ms: 100.0, b_ms: 1.0 },
    };
    let problem = |centre: f64, headroom: f64| Problem {
        rho: 0.9,
        classes: vec![Class {
            id: "a".into(),
            demand_rps: centre + headroom,
            shed_penalty_ms: 10_000.0,
            headroom_rps: headroom,
        }],
        engines: vec![engine("near"), engine("far")],
        network_ms: NetworkMatrix::from_rows(&[vec![Some(5.0), Some(100.0)]]).unwrap(),
    };
    let options = SolverOptions { stability_ms: 100.0, ..SolverOptions::default() };
    let mut solver = Solver::new(options.clone());
    let first = solver.solve(&problem(40.0, 8.0)).unwrap();
    assert_eq!(class_weights(&first, 0), vec![(0, 1.0)], "a starts on its near engine alone");

    // The estimate steps up: 43 + 8 overflows the near engine's 50 req/s.
    let stepped = problem(43.0, 8.0);
    let kept = solver.solve(&stepped).unwrap();
    common::check_invariants(&stepped, &kept);
    let published: Vec<(usize, f64)> =
        class_weights(&kept, 0).into_iter().filter(|&(_, w)| w > 0.0).collect();
    assert_eq!(published, vec![(0, 1.0)], "a moved: {:?}", kept.routes);
    assert!(
        kept.engines[1].load_rps >= 1.0 - 1e-6,
        "the overflow is planned on the far engine: {:?}",
        kept.engines
    );

    // The same demand with no headroom: all of it is expected, so a moves; and so it does when
    // the step overflows the near engine by more than half the headroom (47 + 8 by 5).
    for (before, after) in
        [(problem(48.0, 0.0), problem(51.0, 0.0)), (problem(40.0, 8.0), problem(47.0, 8.0))]
    {
        let mut solver = Solver::new(options.clone());
        solver.solve(&before).unwrap();
        let moved = solver.solve(&after).unwrap();
        common::check_invariants(&after, &moved);
        assert!(class_weights(&moved, 0).iter().any(|&(j, w)| j == 1 && w > 0.01), "{:?}", moved.routes);
    }
}

/// A class the stability rule holds keeps its weights even where a moving class's new split
/// took the room they need: the moving class takes that traffic elsewhere. Here b fills its
/// nearby engine e1 and spills onto e2; c outgrows its own e3, and the optimum spills c onto e1
/// and moves as much of b from e1 to e2 (c is closer to e1 than b's detour costs). b's previous
/// weights plus c's new spill would overflow e1, so before this rule b moved too.
#[test]
fn a_held_class_keeps_the_room_a_moving_class_would_take() {
    let rows = [[Some(10.0), Some(100.0), None], [Some(5.0), Some(120.0), Some(2.0)]];
    let problem = |c_demand: f64| two_classes(rows, [50.0, 100.0, 25.0], c_demand);
    let options = SolverOptions { stability_ms: 100.0, ..SolverOptions::default() };
    let mut solver = Solver::new(options);
    let first = solver.solve(&problem(15.0)).unwrap();
    assert!(
        class_weights(&first, 1).iter().all(|&(j, _)| j == 2),
        "c starts on e3 alone: {:?}",
        first.routes
    );

    let grown = problem(30.0);
    let (free, _) = solve(&grown, None, &SolverOptions::default()).unwrap();
    let on_e1 = |s: &ilb_optimizer::Solution, k: usize| {
        s.class_routes(k).iter().find(|r| r.engine == 0).map_or(0.0, |r| r.rps)
    };
    assert!(on_e1(&free, 1) > 1.0, "the optimum spills c onto e1: {:?}", free.routes);
    assert!(
        on_e1(&first, 0) + on_e1(&free, 1) > 45.0,
        "b's weights and c's new spill fit e1: {:?}",
        free.routes
    );
    let kept = solver.solve(&grown).unwrap();
    common::check_invariants(&grown, &kept);
    assert_eq!(class_weights(&kept, 0), class_weights(&first, 0), "b moved: {:?}", kept.routes);
    assert!(
        on_e1(&kept, 1) <= 45.0 - on_e1(&first, 0) + 1e-9,
        "c takes more of e1 than b leaves: {:?}",
        kept.routes
    );
    assert!(kept.class_routes(1).iter().any(|r| r.engine == 1 && r.rps > 1.0), "c spills: {:?}", kept.routes);
}

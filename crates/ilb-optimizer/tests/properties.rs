//! Properties over generated problems: demand conserved, capacity respected, weights a
//! distribution per class, forbidden pairs unused, equal inputs give bit-identical outputs,
//! certified gap within the bar; plus the degenerate inputs and validation errors.

mod common;

use ilb_optimizer::gen::{generate, perturb_demand, GenConfig};
use ilb_optimizer::{
    solve, Class, Engine, Latency, NetworkMatrix, Problem, ProblemError, Solver, SolverOptions,
};
use proptest::prelude::*;

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
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

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

fn class(id: &str, demand: f64) -> Class {
    Class { id: id.into(), demand_rps: demand, shed_penalty_ms: 10_000.0 }
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

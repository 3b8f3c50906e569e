//! The worked example of OPTIMIZER.md: three regions, checked against an independent Clarabel
//! solve and against routing in proportion to capacity.

mod common;

use ilb_optimizer::{solve, Class, Curve, Engine, Latency, NetworkMatrix, Problem, SolverOptions};

fn example() -> Problem {
    let classes = [("A", 90.0), ("B", 120.0), ("C", 40.0)]
        .iter()
        .map(|(id, d)| Class {
            id: id.to_string(),
            demand_rps: *d,
            shed_penalty_ms: 10_000.0,
            headroom_rps: 0.0,
        })
        .collect();
    let engines = [("A", 100.0), ("B", 100.0), ("C", 80.0)]
        .iter()
        .map(|(id, c)| Engine {
            id: id.to_string(),
            capacity_rps: *c,
            latency: Latency::Queueing { t0_ms: 60.0, b_ms: 15.0 },
        })
        .collect();
    let net = [[5.0, 40.0, 90.0], [40.0, 5.0, 70.0], [90.0, 70.0, 5.0]];
    Problem {
        rho: 0.95,
        classes,
        engines,
        network_ms: NetworkMatrix::from_fn(3, 3, |k, j| Some(net[k][j])).unwrap(),
    }
}

#[test]
fn worked_example_matches_clarabel() {
    let problem = example();
    let (solution, _) = solve(&problem, None, &SolverOptions::default()).unwrap();
    common::check_invariants(&problem, &solution);
    let reference = common::clarabel_solve(&problem);
    let rel = (solution.objective - reference.objective).abs() / reference.objective;
    assert!(rel < 1e-3, "objective {} vs clarabel {}", solution.objective, reference.objective);
    assert!(solution.gap <= 1e-3, "gap {}", solution.gap);
    assert!(solution.lower_bound <= reference.objective * (1.0 + 1e-9));
    for j in 0..3 {
        assert!((solution.engines[j].load_rps - reference.loads[j]).abs() < 0.5, "engine {j}");
    }
    // B sends about 30.7 req/s to engine C, A about 0.6; every engine near 89 % load.
    let b_to_c: f64 = solution.class_routes(1).iter().filter(|r| r.engine == 2).map(|r| r.rps).sum();
    let a_to_c: f64 = solution.class_routes(0).iter().filter(|r| r.engine == 2).map(|r| r.rps).sum();
    assert!((b_to_c - 30.7).abs() < 1.0, "B→C {b_to_c}");
    assert!((a_to_c - 0.6).abs() < 0.5, "A→C {a_to_c}");
    for (j, cap) in [100.0, 100.0, 80.0].iter().enumerate() {
        let utilisation = solution.engines[j].load_rps / cap;
        assert!((utilisation - 0.89).abs() < 0.01, "engine {j} at {utilisation}");
    }
    assert!((solution.mean_latency_ms - 198.2).abs() < 0.5, "mean {}", solution.mean_latency_ms);
    assert!(solution.shed_rps.iter().all(|&s| s == 0.0));
}

#[test]
fn proportional_routing_is_worse() {
    let problem = example();
    let capacity: f64 = problem.engines.iter().map(|e| e.capacity_rps).sum();
    let mut cost = 0.0;
    let mut load = [0.0; 3];
    for (k, class) in problem.classes.iter().enumerate() {
        for (j, engine) in problem.engines.iter().enumerate() {
            let x = class.demand_rps * engine.capacity_rps / capacity;
            cost += x * problem.network_ms.get(k, j).unwrap();
            load[j] += x;
        }
    }
    for (j, engine) in problem.engines.iter().enumerate() {
        cost += Curve::new(&engine.latency, engine.capacity_rps, problem.rho).cost(load[j]);
    }
    let proportional = cost / problem.total_demand_rps();
    assert!((proportional - 226.7).abs() < 0.5, "proportional {proportional}");
    let (solution, _) = solve(&problem, None, &SolverOptions::default()).unwrap();
    assert!(solution.mean_latency_ms < proportional - 25.0);
}

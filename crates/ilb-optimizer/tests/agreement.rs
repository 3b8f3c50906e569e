//! Agreement with an independent exact solve (Clarabel) on generated small and medium
//! instances, normal and overloaded (forcing shedding), with queueing and fitted curves.

mod common;

use ilb_optimizer::gen::{generate, GenConfig};
use ilb_optimizer::{solve, SolverOptions};

fn check(config: GenConfig) {
    let problem = generate(&config);
    let (solution, _) = solve(&problem, None, &SolverOptions::default()).unwrap();
    common::check_invariants(&problem, &solution);
    let reference = common::clarabel_solve(&problem);
    let rel = (solution.objective - reference.objective) / reference.objective;
    assert!(
        rel.abs() <= 1e-3,
        "{config:?}: objective {} vs clarabel {}",
        solution.objective,
        reference.objective
    );
    assert!(solution.gap <= 1e-3, "{config:?}: certified gap {}", solution.gap);
    // The certificate is a true lower bound: never above the exact optimum (up to its tolerance).
    assert!(solution.lower_bound <= reference.objective * (1.0 + 1e-7), "{config:?}: bound above optimum");
}

#[test]
fn small_instances_agree() {
    for seed in 0..6 {
        check(GenConfig::new(4, 6, seed));
        check(GenConfig::new(4, 6, seed).overloaded());
    }
}

#[test]
fn medium_instances_agree() {
    for seed in 0..3 {
        check(GenConfig::new(12, 60, seed));
        check(GenConfig::new(12, 60, 100 + seed).overloaded());
    }
}

#[test]
fn all_piecewise_curves_agree() {
    for seed in 0..3 {
        let mut config = GenConfig::new(8, 30, seed);
        config.piecewise_fraction = 1.0;
        check(config.clone());
        check(config.overloaded());
    }
}

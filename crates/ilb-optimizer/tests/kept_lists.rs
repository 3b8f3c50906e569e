//! A warm re-solve extracts its candidate lists from the wider ones the previous re-solve kept
//! (when the network matrix, the grouping and the classes and engines in play are the same)
//! instead of scanning the matrix. The extracted lists are those a rebuild builds, so the results
//! must be bit for bit those of the same warm start without the kept lists (a serialised state
//! does not carry them), whether the matrix is shared, rebuilt from the same values, or changed.
use ilb_optimizer::gen::{generate, perturb_demand, GenConfig};
use ilb_optimizer::{solve, NetworkMatrix, Problem, Solution, SolverOptions, WarmStart};

fn without_cache(warm: &WarmStart) -> WarmStart {
    serde_json::from_str(&serde_json::to_string(warm).unwrap()).unwrap()
}

fn bits(s: &Solution) -> String {
    serde_json::to_string(s).unwrap()
}

fn check_chain(p0: Problem) {
    let options = SolverOptions::default();
    let (_, mut warm) = solve(&p0, None, &options).unwrap();
    let mut p = p0;
    for step in 0..6u64 {
        // ±1 % steps, one ±15 % step (prices move beyond the kept lists' margin), a matrix rebuilt
        // from the same values (compared, not shared) and a changed matrix.
        let mut next = perturb_demand(&p, 100 + step, if step == 3 { 0.15 } else { 0.01 });
        if step == 2 {
            next.network_ms = NetworkMatrix::from_rows(&next.network_ms.to_rows()).unwrap();
        }
        if step == 4 {
            let mut rows = next.network_ms.to_rows();
            if let Some(v) = rows[0].iter_mut().flatten().next() {
                *v += 0.25;
            }
            next.network_ms = NetworkMatrix::from_rows(&rows).unwrap();
        }
        let (a, warm_a) = solve(&next, Some(&warm), &options).unwrap();
        let (b, warm_b) = solve(&next, Some(&without_cache(&warm)), &options).unwrap();
        assert_eq!(bits(&a), bits(&b), "step {step}");
        assert_eq!(
            serde_json::to_string(&warm_a).unwrap(),
            serde_json::to_string(&warm_b).unwrap(),
            "step {step}"
        );
        assert!(a.gap <= 1e-3, "step {step}: gap {}", a.gap);
        warm = warm_a;
        p = next;
    }
}

#[test]
fn kept_lists_give_the_same_results_fleet() {
    check_chain(generate(&GenConfig::fleet(40, 600, 3)));
}

#[test]
fn kept_lists_give_the_same_results_noisy_overloaded() {
    check_chain(generate(&GenConfig::noisy(30, 400, 2).with_load(1.08)));
}

#[test]
fn kept_lists_give_the_same_results_clustered() {
    // Merged classes: the group matrix is built anew each solve.
    check_chain(generate(&GenConfig::new(40, 500, 1)));
}

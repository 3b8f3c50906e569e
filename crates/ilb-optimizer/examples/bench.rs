//! Benchmark of the optimizer on generated instances, cold and warm (after a ±1 % demand
//! change), printing one table row per instance. "1st warm" re-solves from a cold solve; "warm" is
//! the steady state, re-solving from a solve that was itself warm (every later control cycle). Run with
//! `cargo run --release -p ilb-optimizer --example bench` (add `-- quick` for the small sizes).
//! Arguments filter the rows: `clustered`, `noisy` or `fleet` (the generator's two network models
//! and the real-looking fleet; all by default), and sizes such as `100x5000`.
//! Timing uses the wall clock, read only in this example's `clock` function.

use ilb_optimizer::gen::{generate, perturb_demand, GenConfig};
use ilb_optimizer::{solve, Problem, Solution, SolverOptions, WarmStart};

#[allow(clippy::disallowed_methods)]
fn clock() -> std::time::Instant {
    std::time::Instant::now()
}

#[allow(clippy::disallowed_methods)]
fn since(start: std::time::Instant) -> std::time::Duration {
    start.elapsed()
}

/// Best and median of `repeats` runs, in ms.
fn time<T>(repeats: usize, mut f: impl FnMut() -> T) -> ((f64, f64), T) {
    let mut times = Vec::with_capacity(repeats);
    let mut out = None;
    for _ in 0..repeats {
        let start = clock();
        let value = f();
        times.push(since(start).as_secs_f64() * 1e3);
        out = Some(value);
    }
    times.sort_by(f64::total_cmp);
    ((times[0], times[times.len() / 2]), out.expect("repeats > 0"))
}

fn run(name: &str, problem: &Problem, repeats: usize) {
    let options = SolverOptions::default();
    let (cold_ms, (cold, warm)): ((f64, f64), (Solution, WarmStart)) =
        time(repeats, || solve(problem, None, &options).expect("valid problem"));
    let changed = perturb_demand(problem, 7, 0.01);
    // First re-solve after a cold one: the proximal centre moves from nothing to the routes.
    let (first_ms, _) = time(repeats, || solve(&changed, Some(&warm), &options).expect("valid problem"));
    // Steady state (every later cycle): the previous solve was itself warm.
    let (_, settled) = solve(problem, Some(&warm), &options).expect("valid problem");
    let (warm_ms, (after, _)) =
        time(repeats, || solve(&changed, Some(&settled), &options).expect("valid problem"));
    let (_, (cold_after, _)) = time(1, || solve(&changed, None, &options).expect("valid problem"));
    let cold_moved = moved_between(&cold, &cold_after, problem.total_demand_rps());
    let shed: f64 = cold.shed_rps.iter().sum::<f64>() / problem.total_demand_rps();
    println!(
        "| {name:<22} | {:>7.2} / {:>7.2} | {:>7.1e} | {:>3}/{:<3} | {:>6.2} | {:>6.2} / {:>6.2} | {:>7.1e} | {:>2}/{:<2} | {:>5.2} % | {:>5.2} % | {:>4.1} % | {:>7.2} |",
        cold_ms.0,
        cold_ms.1,
        cold.gap,
        cold.newton_steps,
        cold.passes,
        first_ms.0,
        warm_ms.0,
        warm_ms.1,
        after.gap,
        after.newton_steps,
        after.passes,
        100.0 * after.traffic_moved.unwrap_or(f64::NAN),
        100.0 * cold_moved,
        100.0 * shed,
        cold.mean_latency_ms,
    );
}

/// Traffic moved between two independent solutions of the same-shaped problem.
fn moved_between(a: &Solution, b: &Solution, total: f64) -> f64 {
    let mut map = std::collections::BTreeMap::new();
    for r in &a.routes {
        *map.entry((r.class, r.engine)).or_insert(0.0) += r.rps;
    }
    for r in &b.routes {
        *map.entry((r.class, r.engine)).or_insert(0.0) -= r.rps;
    }
    map.values().map(|v: &f64| v.abs()).sum::<f64>() / 2.0 / total
}

#[allow(clippy::disallowed_methods)] // an example program reads its argv
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |a: &str| args.iter().any(|x| x == a);
    let quick = has("quick");
    let (clustered, noisy, fleet) = match (has("clustered"), has("noisy"), has("fleet")) {
        (false, false, false) => (true, true, true),
        other => other,
    };
    let wanted: Vec<&String> = args.iter().filter(|a| a.contains('x')).collect();
    println!(
        "| instance | cold ms best / median | cold gap | steps/passes | 1st warm ms | warm ms best / median | warm gap | steps/passes | moved warm | moved cold | shed | mean ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let sizes: &[(usize, usize, usize)] = if quick {
        &[(3, 3, 50), (20, 500, 20)]
    } else {
        &[(3, 3, 200), (20, 500, 21), (100, 5_000, 7), (200, 20_000, 5)]
    };
    for &(n, m, repeats) in sizes {
        if !wanted.is_empty() && !wanted.iter().any(|w| **w == format!("{n}x{m}")) {
            continue;
        }
        if clustered {
            let normal = generate(&GenConfig::new(n, m, 1));
            run(&format!("{n}x{m}"), &normal, repeats);
            let overloaded = generate(&GenConfig::new(n, m, 2).overloaded());
            run(&format!("{n}x{m} overloaded"), &overloaded, repeats);
        }
        if noisy {
            let normal = generate(&GenConfig::noisy(n, m, 1));
            run(&format!("{n}x{m} noisy"), &normal, repeats);
            let overloaded = generate(&GenConfig::noisy(n, m, 2).with_load(1.08));
            run(&format!("{n}x{m} noisy 108%"), &overloaded, repeats);
        }
        if fleet {
            let normal = generate(&GenConfig::fleet(n, m, 1));
            run(&format!("{n}x{m} fleet"), &normal, repeats);
            let overloaded = generate(&GenConfig::fleet(n, m, 2).with_load(1.08));
            run(&format!("{n}x{m} fleet 108%"), &overloaded, repeats);
        }
    }
}

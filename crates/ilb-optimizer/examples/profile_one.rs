//! Solves one generated instance cold, then warm many times (for profilers):
//! `profile_one N M [REPEATS] [overloaded] [noisy | fleet] [cold] [chained] [seed=S]` (`cold`: only the
//! cold solve, REPEATS times; `chained`: see the settling below; the seed defaults to 1, or 2
//! when overloaded).
//! The solves being measured run inside `measured`, so that an instruction count can be limited
//! to them: `valgrind --tool=callgrind --toggle-collect='*measured*' target/release/examples/profile_one ...`
//! (warm: a cold solve and one settling warm solve run outside it, then REPEATS warm re-solves
//! after a ±1 % demand change, each from the settled state).
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

/// The solves being measured (kept out of line so that profilers can select them by name).
#[inline(never)]
fn measured(problem: &Problem, warm: Option<&WarmStart>, repeats: usize) -> Solution {
    let mut s = None;
    for _ in 0..repeats {
        s = Some(solve(problem, warm, &SolverOptions::default()).expect("valid").0);
    }
    s.expect("ran")
}

#[allow(clippy::disallowed_methods)] // an example program reads its argv
fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (n, m) = (args.first().copied().unwrap_or(100), args.get(1).copied().unwrap_or(5000));
    let flag = |f: &str| std::env::args().any(|a| a == f);
    let (overloaded, noisy, fleet) = (flag("overloaded"), flag("noisy"), flag("fleet"));
    let seed = std::env::args().find_map(|a| a.strip_prefix("seed=").and_then(|s| s.parse().ok()));
    let p = match (noisy, overloaded) {
        _ if fleet => {
            let config = GenConfig::fleet(n, m, seed.unwrap_or(if overloaded { 2 } else { 1 }));
            generate(&if overloaded { config.with_load(1.08) } else { config })
        }
        (false, false) => generate(&GenConfig::new(n, m, seed.unwrap_or(1))),
        (false, true) => generate(&GenConfig::new(n, m, seed.unwrap_or(2)).overloaded()),
        (true, false) => generate(&GenConfig::noisy(n, m, seed.unwrap_or(1))),
        (true, true) => generate(&GenConfig::noisy(n, m, seed.unwrap_or(2)).with_load(1.08)),
    };
    if flag("cold") {
        let repeats = args.get(2).copied().unwrap_or(1);
        let start = clock();
        let s = measured(&p, None, repeats);
        println!(
            "cold {:.1} ms gap {:.1e} steps {} passes {} rebuilds {} coarse {:?} × {:?} objective {:e}",
            since(start).as_secs_f64() * 1e3 / repeats as f64,
            s.gap,
            s.newton_steps,
            s.passes,
            s.rebuilds,
            s.coarse_classes,
            s.coarse_engines,
            s.objective
        );
        return;
    }
    let start = clock();
    let (s, w) = solve(&p, None, &SolverOptions::default()).expect("valid");
    let cold_ms = since(start).as_secs_f64() * 1e3;
    // Settle: one warm re-solve of the same problem re-centres the proximal term on the routes
    // (`chained`: of a ±1 % change of it instead, so that the measured re-solve follows one like
    // it, as in a control loop).
    let p = if flag("chained") { perturb_demand(&p, 6, 0.01) } else { p };
    let (settle, w) = solve(&p, Some(&w), &SolverOptions::default()).expect("valid");
    let q = perturb_demand(&p, 7, 0.01);
    let repeats = args.get(2).copied().unwrap_or(20);
    let start = clock();
    let t = measured(&q, Some(&w), repeats);
    let warm_ms = since(start).as_secs_f64() * 1e3 / repeats as f64;
    // ε of each solve: a warm re-solve starts at the previous one's (its lists' width follows it).
    println!(
        "cold {cold_ms:.1} ms gap {:.1e} steps {} passes {} rebuilds {} ε {:.3}; settle steps {} passes {} ε {:.3}; warm {warm_ms:.1} ms gap {:.1e} steps {} passes {} rebuilds {} ε {:.3} objective {:e}",
        s.gap, s.newton_steps, s.passes, s.rebuilds, s.epsilon, settle.newton_steps, settle.passes, settle.epsilon,
        t.gap, t.newton_steps, t.passes, t.rebuilds, t.epsilon, t.objective
    );
}

//! Solves one generated instance cold, then warm many times (for profilers):
//! `profile_one N M [REPEATS] [overloaded] [noisy] [cold]` (`cold`: only the cold solve, REPEATS times).
use ilb_optimizer::gen::{generate, perturb_demand, GenConfig};
use ilb_optimizer::{solve, SolverOptions};

#[allow(clippy::disallowed_methods)]
fn clock() -> std::time::Instant {
    std::time::Instant::now()
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (n, m) = (args.first().copied().unwrap_or(100), args.get(1).copied().unwrap_or(5000));
    let flag = |f: &str| std::env::args().any(|a| a == f);
    let (overloaded, noisy) = (flag("overloaded"), flag("noisy"));
    let p = match (noisy, overloaded) {
        (false, false) => generate(&GenConfig::new(n, m, 1)),
        (false, true) => generate(&GenConfig::new(n, m, 2).overloaded()),
        (true, false) => generate(&GenConfig::noisy(n, m, 1)),
        (true, true) => generate(&GenConfig::noisy(n, m, 2).with_load(1.08)),
    };
    if flag("cold") {
        let repeats = args.get(2).copied().unwrap_or(1);
        let start = clock();
        let mut s = None;
        for _ in 0..repeats {
            s = Some(solve(&p, None, &SolverOptions::default()).expect("valid").0);
        }
        let s = s.expect("ran");
        println!(
            "cold {:.1} ms gap {:.1e} steps {} passes {} rebuilds {} coarse {:?}",
            start.elapsed().as_secs_f64() * 1e3 / repeats as f64,
            s.gap,
            s.newton_steps,
            s.passes,
            s.rebuilds,
            s.coarse_engines
        );
        return;
    }
    let start = clock();
    let (s, w) = solve(&p, None, &SolverOptions::default()).expect("valid");
    let cold_ms = start.elapsed().as_secs_f64() * 1e3;
    // Settle: one warm re-solve of the same problem re-centres the proximal term on the routes.
    let (_, w) = solve(&p, Some(&w), &SolverOptions::default()).expect("valid");
    let q = perturb_demand(&p, 7, 0.01);
    let start = clock();
    let mut t = None;
    for _ in 0..args.get(2).copied().unwrap_or(20) {
        t = Some(solve(&q, Some(&w), &SolverOptions::default()).expect("valid").0);
    }
    let warm_ms = start.elapsed().as_secs_f64() * 1e3 / args.get(2).copied().unwrap_or(20) as f64;
    let t = t.expect("ran");
    println!(
        "cold {cold_ms:.1} ms gap {:.1e} steps {} passes {} rebuilds {}; warm {warm_ms:.1} ms gap {:.1e} steps {} passes {}",
        s.gap, s.newton_steps, s.passes, s.rebuilds, t.gap, t.newton_steps, t.passes
    );
}

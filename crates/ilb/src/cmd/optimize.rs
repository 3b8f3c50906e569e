//! `ilb optimize PROBLEM.json`: solve one routing problem offline and print the solution as
//! JSON on stdout. The problem format is documented in crates/ilb-optimizer/README.md; `-` reads
//! stdin. A malformed or inconsistent problem exits non-zero with the reason on stderr.
//!
//! `--bench N` measures instead: N cold solves, then N warm ones, each after a seeded ±1 %
//! demand change from the previous problem and warm-started from the previous solution, and
//! prints one JSON object with the times, the largest certified gap and the Newton steps.

use anyhow::Context;
use ilb_optimizer::gen::perturb_demand;
use ilb_optimizer::{solve, Problem, Solution, Solver, SolverOptions};
use serde::Serialize;
use std::io::Read;

#[derive(clap::Args, Debug)]
pub struct OptimizeArgs {
    /// Problem file (JSON), or `-` for stdin.
    problem: String,
    /// Pretty-print the output.
    #[arg(long)]
    pretty: bool,
    /// Benchmark instead of printing the solution: N cold solves and N warm re-solves (each
    /// after a seeded ±1 % demand change), printed as one JSON object.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    bench: Option<u32>,
}

#[derive(Serialize)]
struct Output<'a> {
    routes: Vec<RouteOut<'a>>,
    shed: Vec<ShedOut<'a>>,
    engine_load_rps: Vec<f64>,
    engines: Vec<EngineOut<'a>>,
    objective: f64,
    lower_bound: f64,
    gap: f64,
    mean_latency_ms: f64,
    solve_ms: f64,
}

#[derive(Serialize)]
struct RouteOut<'a> {
    class: &'a str,
    engine: &'a str,
    rps: f64,
    weight: f64,
}

#[derive(Serialize)]
struct ShedOut<'a> {
    class: &'a str,
    rps: f64,
}

#[derive(Serialize)]
struct EngineOut<'a> {
    engine: &'a str,
    load_rps: f64,
    expected_latency_ms: f64,
    marginal_price_ms: f64,
    capacity_binds: bool,
}

pub fn run(args: OptimizeArgs) -> anyhow::Result<()> {
    let text = if args.problem == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading the problem from stdin")?;
        text
    } else {
        std::fs::read_to_string(&args.problem).with_context(|| format!("reading {}", args.problem))?
    };
    let source = if args.problem == "-" { "stdin" } else { args.problem.as_str() };
    let problem = Problem::from_json(&text).with_context(|| format!("problem from {source}"))?;
    if let Some(runs) = args.bench {
        let report = bench(&problem, runs as usize).context("solving")?;
        let json =
            if args.pretty { serde_json::to_string_pretty(&report) } else { serde_json::to_string(&report) }?;
        println!("{json}");
        return Ok(());
    }
    let mut solver = Solver::new(SolverOptions::default());
    let start = crate::clock::wall();
    let solution = solver.solve(&problem).context("solving")?;
    let solve_ms = crate::clock::wall_since(start).as_secs_f64() * 1e3;
    let output = render(&problem, &solution, solve_ms);
    let json =
        if args.pretty { serde_json::to_string_pretty(&output) } else { serde_json::to_string(&output) }?;
    println!("{json}");
    Ok(())
}

#[derive(Serialize, Debug)]
struct BenchReport {
    runs: usize,
    cold_ms: Stats,
    warm_ms: Stats,
    /// The largest certified gap over every solve.
    max_gap: f64,
    newton_steps: Steps,
    /// Largest `traffic_moved` of a warm solve.
    max_traffic_moved: f64,
}

#[derive(Serialize, Debug)]
struct Stats {
    min: f64,
    median: f64,
}

#[derive(Serialize, Debug)]
struct Steps {
    cold: Vec<usize>,
    warm: Vec<usize>,
}

fn stats(mut times: Vec<f64>) -> Stats {
    times.sort_by(f64::total_cmp);
    Stats { min: times[0], median: times[times.len() / 2] }
}

/// N cold solves of `problem`, then a chain of N warm ones: solve i sees the demand of solve
/// i − 1 changed by a factor in [0.99, 1.01] per class (seed i) and starts from its solution.
fn bench(problem: &Problem, runs: usize) -> Result<BenchReport, ilb_optimizer::ProblemError> {
    let options = SolverOptions::default();
    let (mut cold_ms, mut warm_ms) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    let mut steps = Steps { cold: Vec::with_capacity(runs), warm: Vec::with_capacity(runs) };
    let (mut max_gap, mut max_moved) = (0.0f64, 0.0f64);
    let mut warm = None;
    for _ in 0..runs {
        let start = crate::clock::wall();
        let (solution, state) = solve(problem, None, &options)?;
        cold_ms.push(crate::clock::wall_since(start).as_secs_f64() * 1e3);
        steps.cold.push(solution.newton_steps);
        max_gap = max_gap.max(solution.gap);
        warm = Some(state);
    }
    let mut current = problem.clone();
    for i in 0..runs {
        current = perturb_demand(&current, i as u64, 0.01);
        let start = crate::clock::wall();
        let (solution, state) = solve(&current, warm.as_ref(), &options)?;
        warm_ms.push(crate::clock::wall_since(start).as_secs_f64() * 1e3);
        steps.warm.push(solution.newton_steps);
        max_gap = max_gap.max(solution.gap);
        max_moved = max_moved.max(solution.traffic_moved.unwrap_or(0.0));
        warm = Some(state);
    }
    Ok(BenchReport {
        runs,
        cold_ms: stats(cold_ms),
        warm_ms: stats(warm_ms),
        max_gap,
        newton_steps: steps,
        max_traffic_moved: max_moved,
    })
}

fn render<'a>(problem: &'a Problem, solution: &Solution, solve_ms: f64) -> Output<'a> {
    let class_id = |k: usize| problem.classes[k].id.as_str();
    let engine_id = |j: usize| problem.engines[j].id.as_str();
    Output {
        routes: solution
            .routes
            .iter()
            .map(|r| RouteOut {
                class: class_id(r.class),
                engine: engine_id(r.engine),
                rps: r.rps,
                weight: r.weight,
            })
            .collect(),
        shed: solution
            .shed_rps
            .iter()
            .enumerate()
            .filter(|(_, &s)| s > 0.0)
            .map(|(k, &rps)| ShedOut { class: class_id(k), rps })
            .collect(),
        engine_load_rps: solution.engine_load_rps(),
        engines: solution
            .engines
            .iter()
            .enumerate()
            .map(|(j, e)| EngineOut {
                engine: engine_id(j),
                load_rps: e.load_rps,
                expected_latency_ms: e.expected_latency_ms,
                marginal_price_ms: e.marginal_price_ms,
                capacity_binds: e.capacity_binds,
            })
            .collect(),
        objective: solution.objective,
        lower_bound: solution.lower_bound,
        gap: solution.gap,
        mean_latency_ms: solution.mean_latency_ms,
        solve_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{"rho": 0.95,
     "classes": [{"id": "A", "demand_rps": 90.0, "shed_penalty_ms": 10000.0},
                 {"id": "B", "demand_rps": 120.0, "shed_penalty_ms": 10000.0},
                 {"id": "C", "demand_rps": 40.0, "shed_penalty_ms": 10000.0}],
     "engines": [{"id": "eA", "capacity_rps": 100.0, "latency": {"queueing": {"t0_ms": 60.0, "b_ms": 15.0}}},
                 {"id": "eB", "capacity_rps": 100.0, "latency": {"queueing": {"t0_ms": 60.0, "b_ms": 15.0}}},
                 {"id": "eC", "capacity_rps": 80.0, "latency": {"piecewise": [[0, 60], [40, 70], [76, 120]]}}],
     "network_ms": [[5, 40, 90], [40, 5, 70], [90, 70, null]]}"#;

    #[test]
    fn output_names_classes_and_engines_and_has_every_field() {
        let problem = Problem::from_json(EXAMPLE).unwrap();
        let solution = Solver::default().solve(&problem).unwrap();
        let value = serde_json::to_value(render(&problem, &solution, 0.5)).unwrap();
        for field in [
            "routes",
            "shed",
            "engine_load_rps",
            "objective",
            "lower_bound",
            "gap",
            "mean_latency_ms",
            "solve_ms",
        ] {
            assert!(value.get(field).is_some(), "missing {field}");
        }
        let routes = value["routes"].as_array().unwrap();
        assert!(routes.iter().any(|r| r["class"] == "B" && r["engine"] == "eC"));
        assert!(routes.iter().all(|r| !(r["class"] == "C" && r["engine"] == "eC")), "forbidden pair used");
        assert!(value["gap"].as_f64().unwrap() <= 1e-3);
    }

    #[test]
    fn bench_reports_times_gap_and_steps() {
        let problem = Problem::from_json(EXAMPLE).unwrap();
        let report = bench(&problem, 3).unwrap();
        let value = serde_json::to_value(&report).unwrap();
        for field in ["cold_ms", "warm_ms"] {
            let (min, median) =
                (value[field]["min"].as_f64().unwrap(), value[field]["median"].as_f64().unwrap());
            assert!(min >= 0.0 && min <= median, "{field}: {min} {median}");
        }
        assert_eq!(report.newton_steps.cold.len(), 3);
        assert_eq!(report.newton_steps.warm.len(), 3);
        assert!(report.max_gap <= 1e-3, "{}", report.max_gap);
        // Equal inputs, equal solves: every cold solve takes the same steps.
        assert!(report.newton_steps.cold.iter().all(|&s| s == report.newton_steps.cold[0]));
    }

    #[test]
    fn inconsistent_problems_are_rejected_with_a_reason() {
        let ragged = EXAMPLE.replace("[90, 70, null]", "[90, 70]");
        let err = Problem::from_json(&ragged).unwrap_err().to_string();
        assert!(err.contains("row 2 has 2 entries"), "{err}");
        let rows = EXAMPLE.replace(", [90, 70, null]]", "]");
        let err = Problem::from_json(&rows).unwrap_err().to_string();
        assert!(err.contains("2 rows but there are 3 classes"), "{err}");
    }
}

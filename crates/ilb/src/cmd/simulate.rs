//! `ilb simulate SCENARIO.toml`: runs a fleet scenario in virtual time with every routing
//! policy it lists, prints the comparison table, and optionally writes the JSON results and
//! SVG plots. With several scenarios or `--seeds`, runs every scenario with every seed and
//! prints, per scenario, Markdown tables of mean (min–max) over the seeds. The simulator
//! itself (`ilb-fleet-sim`) does no IO; this module reads the scenario files and writes the
//! outputs.

use anyhow::Context;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// Scenario files (TOML; see docs/simulate.md), e.g. `scenarios/*.toml`.
    #[arg(required_unless_present = "random", conflicts_with = "random")]
    scenarios: Vec<PathBuf>,
    /// Instead of scenario files: generate this many random fleets from `--seed` (default 1)
    /// and print ilb's wins and losses against every baseline over them.
    #[arg(long, conflicts_with = "seeds")]
    random: Option<u64>,
    /// With `--random`: write each generated fleet's scenario TOML into this directory.
    #[arg(long, requires = "random")]
    dump: Option<PathBuf>,
    /// Run every scenario with each of these seeds (comma-separated) and print mean (min–max)
    /// tables over them (default: each scenario's own `seed`, one run).
    #[arg(long, value_delimiter = ',')]
    seeds: Option<Vec<u64>>,
    /// Runs in parallel (each run is single-threaded). Default 1.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write SVG plots into this directory (created if missing).
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Policies to compare, comma-separated (default: the scenario's list).
    #[arg(long, value_delimiter = ',')]
    policies: Option<Vec<String>>,
    /// Simulated seconds (default: the scenario's `duration_s`; the warm-up shrinks in proportion).
    #[arg(long)]
    duration: Option<f64>,
    /// Random seed (default: the scenario's `seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// Data planes per front-end cluster (default: the scenario's `[control] data_planes`).
    #[arg(long)]
    data_planes: Option<u32>,
    /// How a cluster's data planes share what they decide: `none`, `peers` or `control-plane`
    /// (default: the scenario's `[control] data_plane_sharing`).
    #[arg(long)]
    sharing: Option<ilb_fleet_sim::scenario::Sharing>,
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if let Some(n) = args.random {
        return run_random(&args, n);
    }
    if args.scenarios.len() > 1 || args.seeds.is_some() {
        return run_many(args);
    }
    let path = &args.scenarios[0];
    let scenario = read(path)?;
    let options = ilb_fleet_sim::Options {
        duration_s: args.duration,
        seed: args.seed,
        policies: args.policies,
        calibration_s: None,
        data_planes: args.data_planes,
        sharing: args.sharing,
    };
    let comparison = ilb_fleet_sim::simulate(&scenario, &options)?;
    print!("{}", ilb_fleet_sim::report::table(&comparison));
    if let Some(path) = &args.json {
        let json = ilb_fleet_sim::report::json(&comparison)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(dir) = &args.plots {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, svg) in ilb_fleet_sim::plot::all(&comparison)? {
            let path = dir.join(name);
            std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    Ok(())
}

fn read(path: &PathBuf) -> anyhow::Result<ilb_fleet_sim::Scenario> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading scenario {}", path.display()))?;
    ilb_fleet_sim::Scenario::from_toml(&text).with_context(|| format!("scenario {}", path.display()))
}

/// Every scenario × every seed, `jobs` runs at a time; Markdown tables per scenario on stdout,
/// each run's wall-clock time on stderr.
fn run_many(args: SimulateArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.plots.is_none(), "--plots needs a single scenario and seed");
    anyhow::ensure!(args.seed.is_none() || args.seeds.is_none(), "give --seed or --seeds, not both");
    let scenarios = args.scenarios.iter().map(read).collect::<anyhow::Result<Vec<_>>>()?;
    let mut jobs = Vec::new();
    for (i, scenario) in scenarios.iter().enumerate() {
        let seeds = args.seeds.clone().unwrap_or_else(|| vec![args.seed.unwrap_or(scenario.file.seed)]);
        for seed in seeds {
            jobs.push((i, seed));
        }
    }
    let runs: Vec<(&ilb_fleet_sim::Scenario, ilb_fleet_sim::Options, String)> = jobs
        .iter()
        .map(|&(i, seed)| {
            let options = ilb_fleet_sim::Options {
                duration_s: args.duration,
                seed: Some(seed),
                policies: args.policies.clone(),
                calibration_s: None,
                data_planes: args.data_planes,
                sharing: args.sharing,
            };
            (&scenarios[i], options, format!("{} seed {seed}", args.scenarios[i].display()))
        })
        .collect();
    let results = simulate_all(&runs, args.jobs)?;
    let (done, failed) = survivors(jobs.iter().zip(results).map(|(&(i, _), result)| result.map(|c| (i, c))));
    let mut by_scenario: Vec<Vec<ilb_fleet_sim::Comparison>> = scenarios.iter().map(|_| Vec::new()).collect();
    for (i, comparison) in done {
        by_scenario[i].push(comparison);
    }
    by_scenario.retain(|runs| !runs.is_empty());
    for runs in &by_scenario {
        println!("{}", ilb_fleet_sim::report::seeds(runs));
    }
    println!("Summary (mean over seeds of each run's mean end-to-end latency):\n");
    for runs in &by_scenario {
        println!("- {}", ilb_fleet_sim::report::versus(runs, "ilb", "feedback"));
    }
    if let Some(path) = &args.json {
        let all: Vec<&ilb_fleet_sim::Comparison> = by_scenario.iter().flatten().collect();
        let json = serde_json::to_string_pretty(&all)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    failed.map_or(Ok(()), Err)
}

/// The runs that succeeded, in order, and an error counting the failures if there were any
/// (each one is on stderr): one failed run must not lose a batch's others.
fn survivors<T>(results: impl IntoIterator<Item = anyhow::Result<T>>) -> (Vec<T>, Option<anyhow::Error>) {
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    for result in results {
        match result {
            Ok(value) => done.push(value),
            Err(e) => {
                eprintln!("error: {e:#}");
                failed.push(e);
            }
        }
    }
    let error = failed.first().map(|first| {
        anyhow::anyhow!(
            "{} of {} runs failed and are left out of the results, the first: {first:#}",
            failed.len(),
            done.len() + failed.len()
        )
    });
    (done, error)
}

/// Runs every (scenario, options, label) of `runs`, `jobs` at a time, each run's wall-clock
/// time on stderr; the results in the order of `runs`.
fn simulate_all(
    runs: &[(&ilb_fleet_sim::Scenario, ilb_fleet_sim::Options, String)],
    jobs: usize,
) -> anyhow::Result<Vec<anyhow::Result<ilb_fleet_sim::Comparison>>> {
    let results: Mutex<Vec<Option<anyhow::Result<ilb_fleet_sim::Comparison>>>> =
        Mutex::new(runs.iter().map(|_| None).collect());
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, runs.len().max(1)) {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some((scenario, options, label)) = runs.get(k) else { break };
                let watch = ilb_fleet_sim::clock::Stopwatch::start();
                let result = ilb_fleet_sim::simulate(scenario, options).with_context(|| label.clone());
                eprintln!(
                    "{label}: {:.1} s wall clock{}",
                    watch.elapsed_s(),
                    if result.is_ok() { "" } else { " (failed)" }
                );
                if let Ok(mut slots) = results.lock() {
                    slots[k] = Some(result);
                }
            });
        }
    });
    let results = results.into_inner().map_err(|_| anyhow::anyhow!("a simulation thread panicked"))?;
    results.into_iter().map(|r| r.ok_or_else(|| anyhow::anyhow!("a simulation thread panicked"))).collect()
}

/// `--random N`: N generated fleets, every policy on each; the win/loss table on stdout.
fn run_random(args: &SimulateArgs, n: u64) -> anyhow::Result<()> {
    anyhow::ensure!(args.plots.is_none(), "--plots needs a single scenario and seed");
    let seed = args.seed.unwrap_or(1);
    let mut scenarios = Vec::new();
    for index in 0..n {
        let file = ilb_fleet_sim::scenario::random_fleet(seed, index);
        if let Some(dir) = &args.dump {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join(format!("{}.toml", file.name));
            let text = format!("# {}\n{}", file.description, toml::to_string(&file)?);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        scenarios.push(ilb_fleet_sim::Scenario::new(file).with_context(|| format!("random fleet {index}"))?);
    }
    let options = ilb_fleet_sim::Options {
        duration_s: args.duration,
        seed: None,
        policies: args.policies.clone(),
        calibration_s: None,
        data_planes: args.data_planes,
        sharing: args.sharing,
    };
    let runs: Vec<_> = scenarios.iter().map(|s| (s, options.clone(), s.file.name.clone())).collect();
    let (results, failed) = survivors(simulate_all(&runs, args.jobs)?);
    print!("{}", ilb_fleet_sim::report::random_batch(&results));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&results)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    failed.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_run_leaves_the_others_and_is_counted() {
        let results = vec![Ok(1), Err(anyhow::anyhow!("calibration failed")), Ok(3)];
        let (done, failed) = survivors(results);
        assert_eq!(done, vec![1, 3]);
        let message = format!("{:#}", failed.expect("an error"));
        assert!(
            message.contains("1 of 3 runs failed") && message.contains("calibration failed"),
            "{message}"
        );
        let (done, failed) = survivors(vec![Ok::<_, anyhow::Error>(1)]);
        assert_eq!(done, vec![1]);
        assert!(failed.is_none());
    }
}

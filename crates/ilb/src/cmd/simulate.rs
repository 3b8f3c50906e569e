//! `ilb simulate SCENARIO.toml`: runs a fleet scenario in virtual time with every routing
//! policy it lists, prints the comparison table, and optionally writes the JSON results and
//! SVG plots. The simulator itself (`ilb-fleet-sim`) does no IO; this module reads the
//! scenario file and writes the outputs.

use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// Scenario file (TOML; see docs/simulate.md).
    scenario: PathBuf,
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
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.scenario)
        .with_context(|| format!("reading scenario {}", args.scenario.display()))?;
    let scenario = ilb_fleet_sim::Scenario::from_toml(&text)
        .with_context(|| format!("scenario {}", args.scenario.display()))?;
    let options = ilb_fleet_sim::Options {
        duration_s: args.duration,
        seed: args.seed,
        policies: args.policies,
        calibration_s: None,
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

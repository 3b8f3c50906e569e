//! Speed benchmark: about one million requests over 1,000 engines with the `ilb` policy (the
//! most expensive: scrapes, reports, solves and snapshot compiles), on one core.
//!
//! `cargo run --release -p ilb-fleet-sim --example sim_bench`

use ilb_fleet_sim::clock::Stopwatch;
use ilb_fleet_sim::{simulate, Options, Scenario};
use std::fmt::Write;

fn scenario() -> String {
    let mut s = String::from(
        r#"
name = "bench"
duration_s = 22.0
warmup_s = 2.0
seed = 1
policies = ["ilb"]

[workload]
turns_mean = 3.0
think_s = 2.0
system_prompt_tokens = 64
first_prompt_tokens = { mean = 128, min = 16, max = 512 }
followup_tokens = { mean = 32, min = 4, max = 256 }
output_tokens = { mean = 32, min = 32, max = 32, dist = "fixed" }
max_context_tokens = 4096

[control]
calibration_s = 20.0
"#,
    );
    for r in 0..10 {
        let (lat, lon) = (-60.0 + 12.0 * r as f64, -170.0 + 34.0 * r as f64);
        let _ = write!(
            s,
            "\n[[regions]]\nid = \"r{r}\"\nlat = {lat}\nlon = {lon}\n\n[[clusters]]\nid = \"r{r}\"\nregion = \"r{r}\"\ndemand = [{{ rps = 8500.0 }}]\n\n[[engines]]\ngroup = \"r{r}\"\nregion = \"r{r}\"\ncount = 100\nhardware = \"h100\"\nreplicas = 1\n"
        );
    }
    s
}

fn main() {
    let scenario = match Scenario::from_toml(&scenario()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench scenario: {e}");
            std::process::exit(1);
        }
    };
    let watch = Stopwatch::start();
    match simulate(&scenario, &Options::default()) {
        Ok(c) => {
            let elapsed = watch.elapsed_s();
            let ilb = &c.policies["ilb"];
            println!(
                "{} engines, {} requests after warm-up ({} completed; failed: {} no engine, {} refused), \
                 {elapsed:.1} s wall clock (calibration included)",
                scenario.engines.len(),
                ilb.arrivals,
                ilb.completed,
                ilb.failed_no_engine,
                ilb.failed_refused,
            );
            print!("{}", ilb_fleet_sim::report::table(&c));
        }
        Err(e) => {
            eprintln!("bench: {e}");
            std::process::exit(1);
        }
    }
}

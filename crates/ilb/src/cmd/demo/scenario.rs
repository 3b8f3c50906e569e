//! `ilb demo --scenario FILE`: a fleet-simulator scenario run live on loopback. Its engines
//! become simulated engines, its clusters data planes, its demand streams traffic (following
//! the scenario's demand curves in real time), and the control plane is configured exactly as
//! the fleet simulator configures it for that scenario (calibrated profiles included).
//!
//! A scenario sized for a data centre does not fit one small machine, so demand and engine
//! throughput are scaled together by `--scale`: engines run `1/scale` slower (a slowdown
//! fault), demand is multiplied by `scale`, and the control plane's profiles follow; the
//! routing problem keeps its shape, latencies stretch by `1/scale`.

use super::args::DemoArgs;
use super::stack::{addr, serve_stack, spawn_engine};
use crate::traffic::Target;
use anyhow::{bail, Context};
use ilb_engine_sim::Faults;
use ilb_fleet_sim::{calibrate, fleet_config, workload, Scenario};
use std::path::Path;
use std::sync::Arc;

/// Most engines a live scenario may have (each is a real HTTP server with its own driver).
const MAX_LIVE_ENGINES: usize = 32;
/// Initial total demand the default scale aims at, req/s.
const TARGET_RPS: f64 = 40.0;

pub async fn run(args: DemoArgs, path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let scenario =
        Scenario::from_toml(&text).with_context(|| format!("invalid scenario {}", path.display()))?;
    if scenario.engines.len() > MAX_LIVE_ENGINES {
        bail!(
            "{} has {} engines; the live demo runs at most {MAX_LIVE_ENGINES} (use `ilb simulate {}` for fleets this size)",
            path.display(),
            scenario.engines.len(),
            path.display()
        );
    }
    let initial: f64 = (0..scenario.streams.len()).map(|s| workload::demand_rps(&scenario, s, 0.0)).sum();
    let scale = match args.scale {
        Some(s) if s.is_finite() && s > 0.0 && s <= 1.0 => s,
        Some(s) => bail!("--scale must be in (0, 1], got {s}"),
        None => (TARGET_RPS / initial.max(1e-9)).min(1.0),
    };
    println!("calibrating the control plane's profiles against the engine model (virtual time)...");
    let calibrations = calibrate::calibrate_all(&scenario).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut fleet = fleet_config::build(&scenario, &calibrations).map_err(|e| anyhow::anyhow!("{e}"))?;
    fleet.control_plane.listen = addr(args.port_base).to_string();
    for profile in fleet.profiles.values_mut() {
        // Engines run 1/scale slower: capacity scales down, queueing times stretch.
        profile.capacity_rps *= scale;
        for ms in
            [&mut profile.ttft_t0_ms, &mut profile.ttft_b_ms, &mut profile.tbot_t0_ms, &mut profile.tbot_b_ms]
        {
            *ms /= scale;
        }
    }

    let mut engines = Vec::with_capacity(scenario.engines.len());
    let mut labels = Vec::with_capacity(scenario.engines.len());
    for (i, spec) in scenario.engines.iter().enumerate() {
        let engine =
            spawn_engine(&args, i, &spec.id, &scenario.models[spec.model], spec.profile.clone()).await?;
        if scale < 1.0 {
            engine
                .set_faults(Faults { slowdown: 1.0 / scale, ..Faults::default() })
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        fleet.engines[i].url = engine.url();
        labels.push(format!("{} in {}", spec.hardware, scenario.regions[spec.region]));
        engines.push(engine);
    }
    fleet.validate().context("scenario's control-plane config")?;
    println!(
        "scenario {}: {} engines, {} clusters, demand {:.0} req/s scaled by {scale:.3} to {:.1} req/s",
        scenario.file.name,
        engines.len(),
        scenario.clusters.len(),
        initial,
        initial * scale
    );

    let clusters: Vec<String> = scenario.clusters.iter().map(|(id, _)| id.clone()).collect();
    let model = scenario.models.first().cloned().unwrap_or_default();
    let load = args.load;
    let scenario = Arc::new(scenario);
    let targets = move |data_planes: &[ilb_dataplane::DataPlane]| -> Vec<Target> {
        (0..scenario.streams.len())
            .map(|s| {
                let stream = &scenario.streams[s];
                let mut headers = vec![("x-ilb-priority".to_owned(), stream.priority.clone())];
                if let Some(rule) = stream.class_rule.map(|r| &scenario.file.classes[r]) {
                    if !rule.require.is_empty() {
                        headers.push(("x-ilb-require".to_owned(), rule.require.join(",")));
                    }
                    if let Some(zone) = &rule.residency {
                        headers.push(("x-ilb-residency".to_owned(), zone.clone()));
                    }
                }
                let sc = Arc::clone(&scenario);
                Target {
                    cluster: scenario.clusters[stream.cluster].0.clone(),
                    url: data_planes[stream.cluster].url(),
                    model: scenario.models[stream.model].clone(),
                    rate: Arc::new(move |t| workload::demand_rps(&sc, s, t) * scale * load),
                    headers,
                }
            })
            .collect()
    };
    serve_stack(&args, fleet, engines, labels, clusters, &model, targets).await
}

//! The control plane's [`FleetConfig`] for a scenario: regions, network, one front-end cluster
//! per scenario cluster, the class rules, one calibrated profile per hardware type and every
//! engine (in the simulator's order, so fleet engine indices are simulator engine indices).

use crate::calibrate::{key, Calibration};
use crate::scenario::Scenario;
use crate::SimError;
use ilb_planning::config::{
    Cluster, ControlPlaneSettings, Engine, FleetConfig, ObjectiveSetting, Profile, Region,
};

/// Builds and validates the control plane's config.
pub fn build(scenario: &Scenario, calibrations: &[Calibration]) -> Result<FleetConfig, SimError> {
    let file = &scenario.file;
    let control = &file.control;
    let ms = |s: f64| (s * 1e3).round().max(1.0) as u64;
    let mut network = file.network.clone();
    network.use_measured = false;
    let config = FleetConfig {
        control_plane: ControlPlaneSettings {
            scrape_interval_ms: ms(control.scrape_period_s),
            solve_interval_ms: ms(control.solve_period_s),
            // An engine is unhealthy once one and a half scrape periods pass without a
            // successful scrape, so a failure is planned around within two solve periods.
            signal_stale_ms: ms(1.5 * control.scrape_period_s),
            report_timeout_ms: ms(10.0 * control.report_period_s),
            smoothing_ms: ms(control.smoothing_s),
            rho: control.rho,
            stability_ms: control.stability_ms,
            stability_tolerance: control.stability_tolerance,
            demand_band_sigmas: control.demand_band_sigmas,
            tail_weight: control.tail_weight,
            objective: if control.objective == "ttft" {
                ObjectiveSetting::Ttft
            } else {
                ObjectiveSetting::TtftPlusDecode
            },
            // No `expected_output_tokens`: the planner learns the output length from the
            // engines' counters, as the product does; the default is only its starting point.
            shed_penalty_ms: control.shed_penalty_ms.clone(),
            shed_price_floor: control.shed_price_floor,
            measured_curves: if control.measured_curves {
                calibrations.iter().map(|c| (c.key.clone(), c.curves.clone())).collect()
            } else {
                Default::default()
            },
            ..ControlPlaneSettings::default()
        },
        regions: file.regions.iter().map(|r| Region { id: r.id.clone(), lat: r.lat, lon: r.lon }).collect(),
        network,
        clusters: scenario
            .clusters
            .iter()
            .map(|(id, region)| Cluster { id: id.clone(), region: scenario.regions[*region].clone() })
            .collect(),
        classes: file.classes.clone(),
        profiles: calibrations
            .iter()
            .map(|c| {
                let profile = Profile {
                    capacity_rps: c.capacity_rps_per_replica,
                    ttft_t0_ms: c.ttft_t0_ms,
                    ttft_b_ms: c.ttft_b_ms,
                    tbot_t0_ms: c.tbot_t0_ms,
                    tbot_b_ms: c.tbot_b_ms,
                };
                (c.key.clone(), profile)
            })
            .collect(),
        engines: scenario
            .engines
            .iter()
            .map(|e| Engine {
                id: e.id.clone(),
                url: format!("http://{}.sim:8000", e.id),
                model: scenario.models[e.model].clone(),
                region: scenario.regions[e.region].clone(),
                profile: key(&e.hardware, &e.profile),
                replicas: e.profile.replicas,
                capabilities: e.capabilities.clone(),
                residency: e.residency.clone(),
                capacity_rps: None,
                max_in_flight: None,
            })
            .collect(),
        engine_groups: Vec::new(),
    };
    config.validate().map_err(|e| SimError::Config(e.to_string()))?;
    Ok(config)
}

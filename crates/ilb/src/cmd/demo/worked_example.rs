//! `ilb demo` without `--engine` or `--scenario`: the brief's worked example. Simulated engines
//! in three regions (cluster B's demand exceeds its local engine, so part of it should spill to
//! engine C), a data plane per region, generated conversations, and the changing fleet of
//! `fleet`.

use super::args::DemoArgs;
use super::fleet;
use super::stack::{addr, serve_stack, spawn_engine, OUTPUT_TOKENS};
use crate::traffic::Target;
use anyhow::Context;
use ilb_dataplane::DataPlane;
use ilb_engine_sim::{EngineHandle, HardwareProfile};
use ilb_planning::config::{
    Cluster, ControlPlaneSettings, Engine, FleetConfig, LinkLatency, NetworkSettings, Profile,
};
use std::collections::BTreeMap;

const MODEL: &str = "demo-model";
/// Mean prompt tokens of the generated conversations, for capacity planning.
const PROMPT_TOKENS: f64 = 250.0;
/// Planned capacity is this share of an engine's saturation throughput.
const TARGET_UTILISATION: f64 = 0.8;

struct Region {
    name: &'static str,
    profile: HardwareProfile,
}

fn regions() -> [Region; 3] {
    // C runs an older, slower card: 80 % of A's and B's throughput, as in the worked example.
    let slow = HardwareProfile {
        name: "l4-slow".into(),
        prefill_token_us: 260.0,
        decode_seq_us: 300.0,
        ..HardwareProfile::l4()
    };
    [
        Region { name: "a", profile: HardwareProfile { replicas: 1, ..HardwareProfile::l4() } },
        Region { name: "b", profile: HardwareProfile { replicas: 1, ..HardwareProfile::l4() } },
        Region { name: "c", profile: HardwareProfile { replicas: 1, ..slow } },
    ]
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let regions = regions();
    let mut engines: Vec<EngineHandle> = Vec::new();
    for (i, region) in regions.iter().enumerate() {
        let id = format!("engine-{}", region.name);
        engines.push(spawn_engine(&args, i, &id, MODEL, region.profile.clone()).await?);
    }
    let capacity: Vec<f64> = regions
        .iter()
        .map(|r| TARGET_UTILISATION * r.profile.engine_capacity_rps(PROMPT_TOKENS, OUTPUT_TOKENS as f64))
        .collect();
    let fleet = fleet_config(&args, &regions, &engines, &capacity);
    fleet.validate().context("demo fleet config")?;
    let labels: Vec<String> = regions
        .iter()
        .zip(&capacity)
        .map(|(r, cap)| {
            format!("{} × {}, planned capacity {cap:.1} req/s", r.profile.replicas, r.profile.name)
        })
        .collect();
    let base = capacity[0] * args.load;
    let targets = move |data_planes: &[DataPlane]| -> Vec<Target> {
        ["a", "b", "c"]
            .iter()
            .zip(data_planes)
            .zip([0.9, 1.2, 0.4])
            .map(|((name, dp), share)| Target::constant(name, dp.url(), MODEL, base * share))
            .collect()
    };
    let clusters: Vec<String> = regions.iter().map(|r| r.name.to_owned()).collect();
    // Two engines that register themselves: one leaves at 80 s, one joins at 30 s.
    let profiles = [
        (format!("{}-c", regions[2].profile.name), regions[2].profile.clone()),
        (format!("{}-b", regions[1].profile.name), regions[1].profile.clone()),
    ];
    let changes =
        tokio::spawn(fleet::run(args.clone(), MODEL, format!("http://{}", addr(args.port_base)), profiles));
    let result = serve_stack(&args, fleet, engines, labels, clusters, MODEL, targets).await;
    changes.abort();
    result
}

fn fleet_config(
    args: &DemoArgs,
    regions: &[Region],
    engines: &[EngineHandle],
    capacity: &[f64],
) -> FleetConfig {
    // The worked example's network latencies (ms); loopback adds none, so they are modelled.
    let links = [
        ("a", "a", 5.0),
        ("a", "b", 40.0),
        ("a", "c", 90.0),
        ("b", "b", 5.0),
        ("b", "c", 70.0),
        ("c", "c", 5.0),
    ];
    let mut profiles = BTreeMap::new();
    for (region, cap) in regions.iter().zip(capacity) {
        let p = &region.profile;
        // Offline TTFT prior: one idle iteration plus the prompt's prefill; the fit refines it.
        let t0 = p.iteration_base_ms + PROMPT_TOKENS * p.prefill_token_us / 1000.0;
        profiles.insert(
            format!("{}-{}", p.name, region.name),
            Profile {
                capacity_rps: cap / p.replicas as f64,
                ttft_t0_ms: t0,
                ttft_b_ms: t0 / 4.0,
                tbot_t0_ms: p.iteration_base_ms,
                tbot_b_ms: p.iteration_base_ms / 4.0,
            },
        );
    }
    FleetConfig {
        control_plane: ControlPlaneSettings {
            listen: addr(args.port_base).to_string(),
            scrape_interval_ms: 1000,
            solve_interval_ms: 2000,
            smoothing_ms: 4000,
            token: fleet::TOKEN.into(),
            ..ControlPlaneSettings::default()
        },
        regions: Vec::new(),
        network: NetworkSettings {
            use_measured: false,
            latency: links
                .iter()
                .map(|(f, t, ms)| LinkLatency { from: f.to_string(), to: t.to_string(), ms: *ms })
                .collect(),
            ..NetworkSettings::default()
        },
        clusters: regions.iter().map(|r| Cluster { id: r.name.into(), region: r.name.into() }).collect(),
        classes: Vec::new(),
        profiles,
        engines: regions
            .iter()
            .zip(engines)
            .map(|(r, e)| Engine {
                id: e.id().to_string(),
                url: e.url(),
                model: MODEL.into(),
                region: r.name.into(),
                profile: format!("{}-{}", r.profile.name, r.name),
                replicas: r.profile.replicas,
                capabilities: Vec::new(),
                residency: Vec::new(),
                capacity_rps: None,
                max_in_flight: None,
            })
            .collect(),
        engine_groups: Vec::new(),
    }
}

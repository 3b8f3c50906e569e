//! `ilb demo`: the whole system in one process on loopback — simulated engines in three regions
//! reproducing the brief's worked example (cluster B's demand exceeds its local engine, so part
//! of it should spill to engine C), the control plane, three data planes, and a traffic
//! generator of multi-turn conversations. Prints every URL, a `curl` and an `openai` snippet,
//! then a console summary every few seconds until Ctrl-C.
//!
//! `ilb demo --engine URL ...` runs the control plane and a data plane in front of engines the
//! user already has (vLLM, SGLang, llama.cpp, anything OpenAI-compatible): no simulated engines
//! and no generated traffic, models discovered from each engine's `/v1/models`.

use crate::traffic::{self, Target, TrafficConfig};
use anyhow::Context;
use ilb_controlplane::ControlPlane;
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use ilb_engine_sim::{EngineConfig, EngineHandle, HardwareProfile};
use ilb_planning::config::{
    Cluster, ControlPlaneSettings, Engine, FleetConfig, LinkLatency, NetworkSettings, Profile,
};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

const MODEL: &str = "demo-model";
/// Mean prompt and output tokens of the generated conversations, for capacity planning.
const PROMPT_TOKENS: f64 = 250.0;
const OUTPUT_TOKENS: u32 = 24;
/// Planned capacity is this share of an engine's saturation throughput.
const TARGET_UTILISATION: f64 = 0.8;

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Do not generate traffic (engines, control plane and data planes only).
    #[arg(long)]
    pub(crate) no_traffic: bool,
    /// Multiplies the generated demand (1.0 = the worked example: 90 % / 120 % / 40 % of engine A's capacity).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) load: f64,
    /// Control plane on this port, data planes on +1000.., engines on +2000...
    #[arg(long, default_value_t = 7000)]
    pub(crate) port_base: u16,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub(crate) seconds: Option<u64>,
    /// Seconds between console summaries.
    #[arg(long, default_value_t = 5)]
    pub(crate) report_every: u64,
    /// Run a fleet-simulator scenario live instead: its engines (at most 32) as simulated
    /// engines, its clusters as data planes, its demand as traffic. Demand and engine speed are
    /// scaled together (`--scale`) so the scenario fits this machine.
    #[arg(long, value_name = "FILE")]
    pub(crate) scenario: Option<std::path::PathBuf>,
    /// With --scenario: demand and engine throughput multiplier (default: whatever brings the
    /// scenario's initial demand to about 40 req/s). Latencies stretch by 1/scale.
    #[arg(long)]
    pub(crate) scale: Option<f64>,
    /// Run in front of an engine you already have (repeatable), instead of simulated ones: a
    /// control plane on `--port-base` and one data plane on `--port-base` + 1080, models
    /// discovered from each engine's `/v1/models`, no generated traffic.
    #[arg(long = "engine", value_name = "URL", conflicts_with = "scenario")]
    pub(crate) engines: Vec<String>,
    /// With `--engine`: the capacity planned for each engine, req/s (demand beyond the planned
    /// capacity of all engines is shed).
    #[arg(long, default_value_t = 50.0, value_name = "RPS")]
    pub(crate) engine_capacity_rps: f64,
}

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

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.load.is_finite() && args.load >= 0.0, "--load must be a non-negative number");
    anyhow::ensure!(args.port_base <= 60_000, "--port-base must leave room for +2002");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if !args.engines.is_empty() {
        return runtime.block_on(crate::cmd::demo_engines::run(args));
    }
    match args.scenario.clone() {
        Some(path) => runtime.block_on(crate::cmd::demo_scenario::run(args, &path)),
        None => runtime.block_on(demo(args)),
    }
}

pub fn addr(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Starts the demo's `index`-th simulated engine, on port `port_base + 2000 + index`.
pub(crate) async fn spawn_engine(
    args: &DemoArgs,
    index: usize,
    id: &str,
    model: &str,
    profile: HardwareProfile,
) -> anyhow::Result<EngineHandle> {
    let config = EngineConfig {
        id: ilb_core::EngineId::new(id),
        model: ilb_core::ModelName::new(model),
        profile,
        latency: true,
        seed: index as u64,
        ..EngineConfig::default()
    };
    let port = args.port_base + 2000 + index as u16;
    ilb_engine_sim::spawn(config, addr(port)).await.with_context(|| format!("engine on port {port}"))
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
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
    let changes = tokio::spawn(crate::cmd::demo_fleet::run(
        args.clone(),
        MODEL,
        format!("http://{}", addr(args.port_base)),
        profiles,
    ));
    let result = serve_stack(&args, fleet, engines, labels, clusters, MODEL, targets).await;
    changes.abort();
    result
}

/// Starts the control plane and one data plane per cluster in front of `engines`, prints
/// every URL, generates traffic from `targets`, and prints a summary every few seconds until
/// Ctrl-C or `--seconds`.
pub(crate) async fn serve_stack(
    args: &DemoArgs,
    fleet: FleetConfig,
    engines: Vec<EngineHandle>,
    engine_labels: Vec<String>,
    clusters: Vec<String>,
    model: &str,
    targets: impl FnOnce(&[DataPlane]) -> Vec<Target>,
) -> anyhow::Result<()> {
    let token = fleet.control_plane.token.clone();
    let cp = ControlPlane::start(fleet, addr(args.port_base)).await.context("control plane")?;
    let mut data_planes = Vec::new();
    for (i, cluster) in clusters.iter().enumerate() {
        let mut config = DataPlaneConfig::new(addr(args.port_base + 1000 + i as u16));
        config.cluster = Some(ilb_core::ClusterId::new(cluster));
        let source = SnapshotSource::Poll {
            url: format!("{}/v1/snapshots/{cluster}", cp.url()),
            interval: Duration::from_millis(500),
            long_poll: true,
        };
        let mut reports = ReportConfig::new(format!("{}/v1/reports", cp.url()), format!("demo-{cluster}"));
        reports.interval = Duration::from_millis(500);
        reports.token = Some(token.clone()).filter(|t| !t.is_empty());
        let dp = DataPlane::start_with_reports(config, source, Some(reports)).await.context("data plane")?;
        data_planes.push(dp);
    }

    println!("dashboard: {}/", cp.url());
    println!("control-plane: {}", cp.url());
    for (dp, cluster) in data_planes.iter().zip(&clusters) {
        println!("data-plane {cluster}: {}", dp.url());
    }
    for (engine, label) in engines.iter().zip(&engine_labels) {
        println!("engines {}: {} ({label})", engine.id(), engine.url());
    }
    let a = data_planes[0].url();
    println!();
    println!("try it:");
    println!(
        "  curl -s {a}/v1/chat/completions -H 'content-type: application/json' -H 'x-session-id: me' \\\n    -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}],\"max_tokens\":16}}' -D - "
    );
    println!("  python3 -c \"from openai import OpenAI; c = OpenAI(base_url='{a}/v1', api_key='none'); print(c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'hello'}}], max_tokens=16).choices[0].message.content)\"");
    let explain_cluster = clusters.get(1).or(clusters.first()).map_or("", String::as_str);
    println!("  curl -s '{}/v1/explain/weights?cluster={explain_cluster}&model={model}'", cp.url());
    println!("stop with Ctrl-C");
    println!();

    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let stats = Arc::new(traffic::Stats::default());
    let traffic_task = (!args.no_traffic).then(|| {
        let config = TrafficConfig {
            targets: targets(&data_planes),
            seed: 42,
            max_tokens: OUTPUT_TOKENS,
            new_conversation: 0.3,
            open_conversations: 64,
        };
        tokio::spawn(traffic::run(config, Arc::clone(&stats), stop_rx))
    });

    let deadline = args.seconds.map(|s| crate::clock::now() + Duration::from_secs(s));
    let mut ticker = tokio::time::interval(Duration::from_secs(args.report_every.max(1)));
    ticker.tick().await;
    let stop_signal = crate::cmd::stop_signal();
    tokio::pin!(stop_signal);
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop_signal => break,
            _ = until_deadline => break,
            _ = ticker.tick() => print_summary(&cp, &engines, &stats.take(), args.report_every.max(1)),
        }
    }
    println!("stopping");
    let _ = stop.send(true);
    if let Some(task) = traffic_task {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    for dp in data_planes {
        dp.shutdown().await;
    }
    cp.shutdown().await;
    for engine in engines {
        engine.shutdown().await;
    }
    Ok(())
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
            token: crate::cmd::demo_fleet::TOKEN.into(),
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

fn print_summary(cp: &ControlPlane, engines: &[EngineHandle], window: &traffic::Window, seconds: u64) {
    let view = cp.view();
    println!(
        "── {} requests/s sent, {} errors ─ snapshot {} ──",
        window.sent / seconds,
        window.errors,
        view.version
    );
    println!(
        "{:<10} {:>9} {:>11} {:>10} {:>10} {:>9}",
        "engine", "req/s", "mean TTFT", "mean e2e", "cache hit", "queue"
    );
    for engine in engines {
        let id = engine.id().to_string();
        let (n, ttft, e2e) = window.engines.get(&id).copied().unwrap_or_default();
        let stats = engine.stats();
        let mean = |sum: f64| if n > 0 { format!("{:.0} ms", sum / n as f64) } else { "-".into() };
        println!(
            "{:<10} {:>9.1} {:>11} {:>10} {:>9.0}% {:>9}",
            id,
            n as f64 / seconds as f64,
            mean(ttft),
            mean(e2e),
            stats.prefix_hit_rate * 100.0,
            stats.waiting
        );
    }
    if let Some(model) = view.models.first() {
        for class in &model.classes {
            let split: Vec<String> = class
                .routes
                .iter()
                .filter(|r| r.weight > 0.0005)
                .map(|r| format!("{} {:.0}%", r.engine, r.weight * 100.0))
                .collect();
            let observed: Vec<String> = window
                .routes
                .iter()
                .filter(|((c, _), _)| *c == class.cluster)
                .map(|((_, e), n)| format!("{e} {n}"))
                .collect();
            println!(
                "cluster {}: demand {:.1} req/s, plan [{}], observed [{}]",
                class.cluster,
                class.measured_demand_rps,
                split.join(", "),
                observed.join(", ")
            );
        }
        println!(
            "solve: {:.2} ms, gap {:.4}%, expected mean latency {:.0} ms",
            model.solve_ms,
            model.gap * 100.0,
            model.mean_latency_ms
        );
    }
}

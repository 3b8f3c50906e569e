//! What every mode of `ilb demo` shares: loopback addresses, the simulated engines, and the
//! stack in front of them (the control plane, a data plane per cluster, the printed URLs and
//! snippets, the generated traffic and the console summary until Ctrl-C or `--seconds`).

use super::args::DemoArgs;
use crate::traffic::{self, Target, TrafficConfig};
use anyhow::Context;
use ilb_controlplane::ControlPlane;
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use ilb_engine_sim::{EngineConfig, EngineHandle, HardwareProfile};
use ilb_planning::config::FleetConfig;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Output tokens each generated request asks for (the worked example plans capacity with it).
pub(crate) const OUTPUT_TOKENS: u32 = 24;

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

    let every = args.report_every.max(1);
    report_until_stopped(args, || print_summary(&cp, &engines, &stats.take(), every)).await;
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

/// Calls `report` every `--report-every` seconds until `--seconds` have passed (if given), Ctrl-C
/// or SIGTERM.
pub async fn report_until_stopped(args: &DemoArgs, mut report: impl FnMut()) {
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
            _ = ticker.tick() => report(),
        }
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

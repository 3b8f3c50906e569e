//! `ilb demo --engine URL ...`: the control plane and one data plane on loopback in front of
//! engines the user already runs (vLLM, SGLang, llama.cpp, anything OpenAI-compatible). Each
//! engine's models come from its `/v1/models`; the control plane scrapes its `/metrics`, plans,
//! and publishes weights the data plane follows. No traffic is generated: the printed `curl`
//! and `openai` snippets send the user's own. A summary of the plan and every engine's live
//! signals is printed every few seconds until Ctrl-C or `--seconds`.

use super::args::DemoArgs;
use super::stack::{addr, report_until_stopped};
use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use ilb_controlplane::ControlPlane;
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use ilb_planning::config::{
    Cluster, ControlPlaneSettings, Engine, FleetConfig, LinkLatency, NetworkSettings, Profile,
};
use std::collections::BTreeMap;
use std::time::Duration;

const CLUSTER: &str = "local";
const PROFILE: &str = "engine";
/// The data plane's port is `--port-base` plus this (8080 by default: away from vLLM's and
/// SGLang's usual 8000 and 30000).
const DATA_PLANE_OFFSET: u16 = 1080;

/// One engine of the fleet: a URL and one of the models it serves.
struct Found {
    id: String,
    url: String,
    model: String,
}

pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.engine_capacity_rps.is_finite() && args.engine_capacity_rps > 0.0,
        "--engine-capacity-rps must be a positive number"
    );
    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut found = Vec::new();
    for raw in &args.engines {
        let url = base_url(raw)?;
        let models = list_models(&client, &url).await?;
        let host = url.trim_start_matches("http://").to_owned();
        for (i, model) in models.iter().enumerate() {
            let id = if models.len() == 1 { host.clone() } else { format!("{host}-{}", i + 1) };
            found.push(Found { id, url: url.clone(), model: model.clone() });
        }
    }
    let mut ids = std::collections::HashSet::new();
    for f in &found {
        anyhow::ensure!(ids.insert(f.id.clone()), "--engine {} is given twice", f.url);
    }
    let fleet = fleet_config(&args, &found);
    fleet.validate().context("the fleet made from --engine")?;

    let cp = ControlPlane::start(fleet, addr(args.port_base))
        .await
        .with_context(|| format!("control plane on {}", addr(args.port_base)))?;
    let dp_addr = addr(args.port_base + DATA_PLANE_OFFSET);
    let mut config = DataPlaneConfig::new(dp_addr);
    config.cluster = Some(ilb_core::ClusterId::new(CLUSTER));
    let source = SnapshotSource::Poll {
        url: format!("{}/v1/snapshots/{CLUSTER}", cp.url()),
        interval: Duration::from_millis(500),
        long_poll: true,
    };
    let mut reports = ReportConfig::new(format!("{}/v1/reports", cp.url()), "demo-local".to_owned());
    reports.interval = Duration::from_millis(500);
    let dp = DataPlane::start_with_reports(config, source, Some(reports))
        .await
        .with_context(|| format!("data plane on {dp_addr}"))?;

    println!("dashboard: {}/", cp.url());
    println!("control-plane: {}", cp.url());
    println!("data-plane: {}", dp.url());
    for f in &found {
        println!("engine {}: {} (model {})", f.id, f.url, f.model);
    }
    let (a, model) = (dp.url(), &found[0].model);
    println!();
    println!("try it (no traffic is generated; every response says where it went in x-ilb-route):");
    println!(
        "  curl -s {a}/v1/chat/completions -H 'content-type: application/json' -H 'x-session-id: me' \\\n    -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}],\"max_tokens\":16}}' -D - "
    );
    println!("  python3 -c \"from openai import OpenAI; c = OpenAI(base_url='{a}/v1', api_key='none'); print(c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'hello'}}], max_tokens=16).choices[0].message.content)\"");
    println!("  curl -s '{}/v1/explain/weights?cluster={CLUSTER}&model={model}'", cp.url());
    println!("stop with Ctrl-C");
    println!();

    report_until_stopped(&args, || print_summary(&cp, &dp)).await;
    println!("stopping");
    dp.shutdown().await;
    cp.shutdown().await;
    Ok(())
}

/// `http://host:port` from what a user may type: a trailing `/` or `/v1` is dropped.
fn base_url(raw: &str) -> anyhow::Result<String> {
    let url = raw.trim().trim_end_matches('/');
    let url = url.strip_suffix("/v1").unwrap_or(url);
    anyhow::ensure!(
        url.starts_with("http://") && url.len() > "http://".len() && !url["http://".len()..].contains('/'),
        "--engine {raw}: expected an engine's base URL, http://host:port"
    );
    Ok(url.to_owned())
}

/// The model ids in the engine's `/v1/models` (`data[].id`, as OpenAI, vLLM, SGLang and
/// llama.cpp all answer).
async fn list_models(client: &Client<HttpConnector, Empty<Bytes>>, url: &str) -> anyhow::Result<Vec<String>> {
    let models_url = format!("{url}/v1/models");
    let request = http::Request::get(&models_url).body(Empty::new()).context("request")?;
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .with_context(|| format!("{models_url}: no answer in 10 s"))?
        .with_context(|| format!("cannot reach {models_url}: is the engine running?"))?;
    let status = response.status();
    let body =
        response.into_body().collect().await.with_context(|| format!("{models_url}: body"))?.to_bytes();
    anyhow::ensure!(status.is_success(), "{models_url} answered {status}");
    let value: serde_json::Value =
        serde_json::from_slice(&body).with_context(|| format!("{models_url}: not JSON"))?;
    let models: Vec<String> = value["data"]
        .as_array()
        .map(|data| data.iter().filter_map(|m| m["id"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    anyhow::ensure!(
        !models.is_empty(),
        "{models_url} lists no models (expected {{\"data\": [{{\"id\": ...}}]}})"
    );
    Ok(models)
}

fn fleet_config(args: &DemoArgs, found: &[Found]) -> FleetConfig {
    // A generic prior; the control plane refines the latency curves from what it observes.
    let mut profiles = BTreeMap::new();
    profiles.insert(
        PROFILE.to_owned(),
        Profile {
            capacity_rps: args.engine_capacity_rps,
            ttft_t0_ms: 100.0,
            ttft_b_ms: 25.0,
            tbot_t0_ms: 20.0,
            tbot_b_ms: 5.0,
        },
    );
    FleetConfig {
        control_plane: ControlPlaneSettings {
            listen: addr(args.port_base).to_string(),
            scrape_interval_ms: 1000,
            solve_interval_ms: 2000,
            smoothing_ms: 4000,
            // Nothing is shed for being slow (the default cost of a shed request is 10 s of
            // latency): a user trying ilb on their own engines expects every request served.
            shed_penalty_ms: ["low", "normal", "high", "critical"]
                .into_iter()
                .map(|p| (p.to_owned(), 3_600_000.0))
                .collect(),
            ..ControlPlaneSettings::default()
        },
        regions: Vec::new(),
        network: NetworkSettings {
            use_measured: false,
            latency: vec![LinkLatency { from: CLUSTER.into(), to: CLUSTER.into(), ms: 1.0 }],
            ..NetworkSettings::default()
        },
        clusters: vec![Cluster { id: CLUSTER.into(), region: CLUSTER.into() }],
        classes: Vec::new(),
        profiles,
        engines: found
            .iter()
            .map(|f| Engine {
                id: f.id.clone(),
                url: f.url.clone(),
                model: f.model.clone(),
                region: CLUSTER.into(),
                profile: PROFILE.into(),
                replicas: 1,
                capabilities: Vec::new(),
                residency: Vec::new(),
                capacity_rps: None,
                max_in_flight: None,
            })
            .collect(),
        engine_groups: Vec::new(),
    }
}

fn print_summary(cp: &ControlPlane, dp: &DataPlane) {
    let view = cp.view();
    let installed = dp.snapshot_version().map_or("none".to_owned(), |v| v.0.to_string());
    println!("── snapshot {} published, {installed} installed by the data plane ──", view.version);
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} ms"));
    for model in &view.models {
        let weights: BTreeMap<&str, f64> = model
            .classes
            .iter()
            .filter(|c| c.cluster == CLUSTER)
            .flat_map(|c| c.routes.iter().map(|r| (r.engine.as_str(), r.weight)))
            .collect();
        println!("model {}:", model.model);
        println!(
            "  {:<24} {:>8} {:>7} {:>8} {:>8} {:>7} {:>9} {:>9}  scrape",
            "engine", "kind", "weight", "running", "waiting", "req/s", "TTFT", "TBOT"
        );
        for e in &model.engines {
            let s = &e.signals;
            let scrape = match (&s.scrape_error, s.scrape_ok_age_ms) {
                (Some(err), _) => format!("error: {err}"),
                (None, Some(age)) => format!("ok {age} ms ago"),
                (None, None) => "not yet".to_owned(),
            };
            println!(
                "  {:<24} {:>8} {:>6.0}% {:>8.0} {:>8.0} {:>7} {:>9} {:>9}  {scrape}",
                e.id,
                s.kind,
                weights.get(e.id.as_str()).copied().unwrap_or(0.0) * 100.0,
                s.running,
                s.waiting,
                s.request_rate.map_or("-".to_owned(), |r| format!("{r:.1}")),
                ms(s.ttft_ms),
                ms(s.tbot_ms),
            );
        }
        if let Some(err) = &model.error {
            println!("  plan error: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::base_url;

    #[test]
    fn engine_urls_are_base_urls() {
        assert_eq!(base_url("http://127.0.0.1:8000").unwrap(), "http://127.0.0.1:8000");
        assert_eq!(base_url("http://127.0.0.1:8000/").unwrap(), "http://127.0.0.1:8000");
        assert_eq!(base_url("http://gpu-1:8000/v1/").unwrap(), "http://gpu-1:8000");
        assert!(base_url("127.0.0.1:8000").is_err());
        assert!(base_url("https://x:1").is_err());
        assert!(base_url("http://x:1/other").is_err());
        assert!(base_url("http://").is_err());
    }
}

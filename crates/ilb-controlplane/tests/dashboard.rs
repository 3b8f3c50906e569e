//! The dashboard end to end in a real browser: a control plane on loopback with three simulated
//! engines (the brief's worked example: 90/120/40 req/s from clusters a/b/c), light real traffic
//! on the engines so their TTFT signals exist, then headless Chromium loads the page, lets it
//! poll `/v1/state`, and the rendered DOM is checked against the live plan. A screenshot is
//! saved to `target/artifacts/dashboard.png`.
//!
//! Without `/usr/bin/chromium` the test prints a notice and passes, unless
//! `ILB_REQUIRE_BROWSER=1` (CI), where it fails.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod browser;

use browser::dom::{self, Element};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use ilb_controlplane::{ControlPlane, FleetConfig};
use ilb_core::report::{ClassDemand, Report};
use ilb_core::{ClassId, ClusterId, EngineId, ModelName};
use ilb_engine_sim::profile::HardwareProfile;
use ilb_engine_sim::server::{self, EngineConfig, EngineHandle};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

const DEMAND: [(&str, f64); 3] = [("a", 90.0), ("b", 120.0), ("c", 40.0)];
const ENGINES: [(&str, &str); 3] = [("engine-a", "a"), ("engine-b", "b"), ("engine-c", "c")];
/// A mixed fleet, as in production: the engines' TTFT lines differ on the chart.
fn hardware(region: &str) -> HardwareProfile {
    match region {
        "a" => HardwareProfile::a100(),
        "b" => HardwareProfile::h100(),
        _ => HardwareProfile::l4(),
    }
}

/// The worked example of tests/plan.rs, with fast scrape and solve intervals so the test
/// needs only a second or two of live signals. `{url-x}` is replaced by engine x's address.
const CONFIG: &str = include_str!("../../ilb-planning/tests/fixtures/worked-example.toml");

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

async fn request(client: &HttpClient, method: http::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut builder = http::Request::builder().method(method).uri(url);
    if body.is_some() {
        builder = builder.header(http::header::CONTENT_TYPE, "application/json");
    }
    let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let response = client.request(builder.body(Full::new(bytes)).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

async fn get_state(client: &HttpClient, base: &str) -> Value {
    let (status, state) = request(client, http::Method::GET, &format!("{base}/v1/state"), None).await;
    assert_eq!(status, 200, "GET /v1/state");
    state
}

/// One data plane per cluster reporting its demand every 300 ms (the control plane forgets
/// silent data planes, and the test must not depend on how long the browser takes).
async fn report_demand(client: HttpClient, base: String, mut stop: watch::Receiver<bool>) {
    for sequence in 1.. {
        for (cluster, rps) in DEMAND {
            let report = Report {
                replica: None,
                cluster: ClusterId::new(cluster),
                instance: format!("{cluster}-dp-1"),
                sequence,
                period_ms: 300,
                snapshot_version: 0,
                demand: vec![ClassDemand {
                    model: ModelName::new("m"),
                    class: ClassId::new("default"),
                    requests: (rps * 0.3) as u64,
                    shed: 0,
                    rps,
                    by_priority: None,
                }],
                engines: vec![],
            };
            let body = serde_json::to_value(&report).unwrap();
            let (status, answer) =
                request(&client, http::Method::POST, &format!("{base}/v1/reports"), Some(body)).await;
            assert_eq!(status, 202, "report refused: {answer}");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// A trickle of short chat completions against one engine, so it has TTFT, rates and KV usage
/// to scrape.
async fn traffic(client: HttpClient, url: String, worker: u64, mut stop: watch::Receiver<bool>) {
    let endpoint = format!("{url}/v1/chat/completions");
    for n in 0u64.. {
        let body = serde_json::json!({
            "model": "m",
            "max_tokens": 6,
            "messages": [{"role": "user", "content": format!("conversation {} turn {n}: tell me about load balancing", n % 5 + worker * 10)}],
        });
        tokio::select! {
            _ = request(&client, http::Method::POST, &endpoint, Some(body)) => {}
            _ = stop.changed() => return,
        }
    }
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn number(e: &Element, attr: &str) -> f64 {
    let raw = e.attr(attr).unwrap_or_else(|| panic!("<{} {:?}> has no {attr}", e.tag, e.attrs));
    raw.parse().unwrap_or_else(|_| panic!("{attr}={raw:?} is not a number"))
}

/// The plan is ready for the browser: it has the reported demand and every engine's TTFT.
fn ready(state: &Value) -> bool {
    let Some(model) = state["models"].get(0) else { return false };
    let demand_ok = DEMAND.iter().all(|(cluster, rps)| {
        model["classes"].as_array().into_iter().flatten().any(|c| {
            c["cluster"] == *cluster && (c["measured_demand_rps"].as_f64().unwrap_or(0.0) - rps).abs() < 1e-9
        })
    });
    let signals_ok = model["engines"].as_array().is_some_and(|engines| {
        engines.len() == ENGINES.len() && engines.iter().all(|e| e["signals"]["ttft_ms"].is_number())
    });
    model["error"].is_null() && demand_ok && signals_ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_renders_the_live_plan() {
    let Some(chromium) = browser::chromium() else { return };

    let mut engines: Vec<EngineHandle> = Vec::new();
    let mut config_text = CONFIG.to_owned();
    for (seed, (id, region)) in ENGINES.into_iter().enumerate() {
        let config = EngineConfig {
            id: EngineId::new(id),
            model: ModelName::new("m"),
            seed: seed as u64,
            profile: hardware(region),
            ..EngineConfig::default()
        };
        let engine = server::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
        config_text = config_text.replace(&format!("{{url-{region}}}"), &engine.url());
        engines.push(engine);
    }
    let config: FleetConfig = toml::from_str(&config_text).unwrap();
    config.validate().unwrap();
    let control_plane = ControlPlane::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = control_plane.url();
    let http = client();

    let (stop, stop_rx) = watch::channel(false);
    let mut background = tokio::task::JoinSet::new();
    background.spawn(report_demand(http.clone(), base.clone(), stop_rx.clone()));
    for engine in &engines {
        for worker in 0..2 {
            background.spawn(traffic(http.clone(), engine.url(), worker, stop_rx.clone()));
        }
    }

    let deadline = Instant::now() + Duration::from_secs(15);
    let mut state = get_state(&http, &base).await;
    while !ready(&state) {
        assert!(Instant::now() < deadline, "no plan with the reported demand and signals in time: {state:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        state = get_state(&http, &base).await;
    }
    let version_before = state["version"].as_u64().unwrap();

    let page = format!("{base}/");
    let html = {
        let (chromium, page) = (chromium.clone(), page.clone());
        tokio::task::spawn_blocking(move || {
            browser::run(&chromium, &page, Duration::from_millis(5000), browser::Output::Dom)
        })
        .await
        .unwrap()
    };
    let version_after = get_state(&http, &base).await["version"].as_u64().unwrap();
    let artifacts = workspace_root().join("target/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    std::fs::write(artifacts.join("dashboard.html"), &html).unwrap();
    std::fs::write(artifacts.join("state.json"), get_state(&http, &base).await.to_string()).unwrap();

    let root = dom::parse(&html);
    let body = root.first("body").expect("a body");
    assert_eq!(body.attr("data-state"), Some("live"), "page state; DOM in target/artifacts/dashboard.html");

    // The latest solve, as published while the browser ran.
    let solve = root.by_id("solve").expect("#solve");
    let version: u64 =
        number(solve.first("[data-field=version]").expect("solve version"), "data-value") as u64;
    assert!(
        (version_before..=version_after).contains(&version),
        "page shows version {version}, the control plane published {version_before}..={version_after}"
    );
    let gap = number(solve.first("[data-field=gap]").expect("solve gap"), "data-value");
    assert!((0.0..=1e-2).contains(&gap), "certified gap {gap}");
    let mean_latency = number(solve.first("[data-field=mean_latency]").expect("mean latency"), "data-value");
    assert!(mean_latency > 0.0, "mean latency {mean_latency}");

    // The weight matrix: one row per cluster, a weight per engine summing to one, and the
    // worked example's spill of B onto engine C.
    let heatmap = root.by_id("heatmap").expect("#heatmap");
    for (cluster, rps) in DEMAND {
        let row = heatmap
            .first(&format!("tr[data-cluster={cluster}]"))
            .unwrap_or_else(|| panic!("no heat-map row for cluster {cluster}"));
        assert!((number(row, "data-demand") - rps).abs() < 1e-6, "row {cluster} demand");
        let cells = row.select("td[data-weight]");
        assert_eq!(cells.len(), ENGINES.len(), "row {cluster} has a cell per engine");
        let total: f64 = cells.iter().map(|c| number(c, "data-weight")).sum();
        assert!((total - 1.0).abs() < 1e-3, "row {cluster} weights sum to {total}");
        for cell in &cells {
            let tip = cell.attr("data-tip").unwrap_or_default();
            assert!(tip.contains("network") && tip.contains("end to end"), "cell tooltip {tip:?}");
        }
    }
    let b_to_c = heatmap
        .first("tr[data-cluster=b]")
        .and_then(|r| r.first("td[data-engine=engine-c]"))
        .expect("cell b/c");
    assert!(number(b_to_c, "data-weight") > 0.05, "B spills onto engine C: {:?}", b_to_c.attrs);
    assert!(b_to_c.text().contains('%'), "the cell shows its weight: {:?}", b_to_c.text());

    // Every engine has a row with its load and signals, a card in its region, and a TTFT line.
    let table = root.by_id("engines").expect("#engines");
    let fleet = root.by_id("fleet").expect("#fleet");
    let ttft = root.by_id("ttft").expect("#ttft");
    for (id, region) in ENGINES {
        let row = table.first(&format!("tr[data-engine={id}]")).unwrap_or_else(|| panic!("no row for {id}"));
        assert!(number(row, "data-load") > 0.0, "{id} has planned load");
        assert_eq!(row.attr("data-healthy"), Some("true"), "{id} is healthy");
        let card = fleet
            .first(&format!("[data-region={region}]"))
            .and_then(|r| r.first(&format!("[data-engine={id}]")))
            .unwrap_or_else(|| panic!("no card for {id} in region {region}"));
        assert!(number(card, "data-util") > 0.0, "{id} card utilisation");
        assert!(ttft.first(&format!("[data-series={id}]")).is_some(), "no TTFT series for {id}");
    }
    assert_eq!(table.select("tr[data-engine]").len(), ENGINES.len());
    let data_planes = root.by_id("dataplanes").expect("#dataplanes");
    assert_eq!(data_planes.select("[data-instance]").len(), DEMAND.len(), "one live data plane per cluster");

    // The picture, for people.
    let png = artifacts.join("dashboard.png");
    let _ = std::fs::remove_file(&png);
    {
        let png = png.clone();
        tokio::task::spawn_blocking(move || {
            let shot = browser::Output::Screenshot { path: &png, width: 1400, height: 1000 };
            browser::run(&chromium, &page, Duration::from_millis(8000), shot)
        })
        .await
        .unwrap();
    }
    let bytes = std::fs::read(&png).expect("chromium wrote the screenshot");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 20_000,
        "screenshot is a real PNG ({} bytes)",
        bytes.len()
    );
    eprintln!("dashboard screenshot: {}", png.display());

    let _ = stop.send(true);
    while background.join_next().await.is_some() {}
    control_plane.shutdown().await;
    for engine in engines {
        engine.shutdown().await;
    }
}

/// The page must work offline: nothing loaded from elsewhere, and the ids the test uses exist.
#[test]
fn page_is_self_contained() {
    let page = ilb_controlplane::DASHBOARD_PAGE;
    for banned in ["src=\"http", "href=\"http", "url(http", "@import", "<link", "<script src", "//cdn"] {
        assert!(!page.contains(banned), "the page references an external resource ({banned:?})");
    }
    for id in
        ["id=\"solve\"", "id=\"heatmap\"", "id=\"engines\"", "id=\"fleet\"", "id=\"ttft\"", "id=\"model\""]
    {
        assert!(page.contains(id), "the page lacks {id}");
    }
}

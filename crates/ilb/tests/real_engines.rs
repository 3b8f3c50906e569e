//! Real engines behind ilb: a control plane whose fleet lists real llama.cpp and vLLM servers
//! (started by `scripts/real-engines.sh`), two data planes pulling snapshots from it, and the
//! official openai Python SDK (the current major and 1.x) driving them through a data plane.
//!
//! Checks: chat (plain, streamed with usage, tokens arriving incrementally), legacy completions,
//! the Responses API (plain and streamed), an unknown model as `NotFoundError`, 8 concurrent
//! streams; that the control plane scraped every engine's real `/metrics` and shows live signals
//! for each in `/v1/state` and `/v1/explain/weights`; that weights are published and the data
//! planes follow them; then one llama.cpp engine is killed mid-run (requests not yet streaming
//! succeed on another engine, the data plane ejects it, the plan drops it) and restarted (it
//! gets weight and traffic again).
//!
//! The engines come from `ILB_REAL_ENGINES` (`name=url,...`; names starting `llama` are
//! llama.cpp, `vllm` vLLM) and `ILB_REAL_ENGINES_SCRIPT` (kills and restarts), both printed by
//! `scripts/real-engines.sh env`; Python from `ILB_TEST_PYTHON` and `ILB_TEST_PYTHON_OPENAI1`.
//! Without them the test says so and passes, unless `ILB_REQUIRE_REAL_ENGINES=1` (CI), where
//! it fails. Run by hand:
//!
//! ```sh
//! scripts/real-engines.sh install && scripts/real-engines.sh start
//! eval "$(scripts/real-engines.sh env)"
//! ILB_TEST_PYTHON=target/ci-venv/bin/python cargo test -p ilb --test real_engines -- --nocapture
//! scripts/real-engines.sh stop
//! ```
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use ilb_controlplane::{ControlPlane, FleetConfig};
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;
use tokio::time::Instant;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

const CLUSTER: &str = "local";

#[derive(Clone, Debug)]
struct RealEngine {
    name: String,
    url: String,
    kind: &'static str,
    model: String,
}

struct Setup {
    engines: Vec<(String, String)>,
    script: String,
    pythons: Vec<String>,
}

fn required() -> bool {
    std::env::var("ILB_REQUIRE_REAL_ENGINES").as_deref() == Ok("1")
}

fn skip(why: &str) -> Option<Setup> {
    assert!(!required(), "ILB_REQUIRE_REAL_ENGINES=1 but {why}");
    eprintln!("skipping the real-engine test: {why} (run .ci/run, or see this file's doc)");
    None
}

fn setup() -> Option<Setup> {
    let Ok(list) = std::env::var("ILB_REAL_ENGINES") else {
        return skip("ILB_REAL_ENGINES is not set (scripts/real-engines.sh env prints it)");
    };
    let Ok(script) = std::env::var("ILB_REAL_ENGINES_SCRIPT") else {
        return skip("ILB_REAL_ENGINES_SCRIPT is not set");
    };
    let engines: Vec<(String, String)> = list
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (name, url) = pair.split_once('=').expect("ILB_REAL_ENGINES entries are name=url");
            (name.to_owned(), url.to_owned())
        })
        .collect();
    let mut pythons = Vec::new();
    for var in ["ILB_TEST_PYTHON", "ILB_TEST_PYTHON_OPENAI1"] {
        match std::env::var(var) {
            Ok(python) if imports_openai(&python) => pythons.push(python),
            Ok(python) => return skip(&format!("{var}={python} cannot import openai")),
            Err(_) if required() => panic!("ILB_REQUIRE_REAL_ENGINES=1 but {var} is not set"),
            Err(_) => eprintln!("{var} not set: that SDK version is not tried"),
        }
    }
    if pythons.is_empty() {
        return skip("no Python with the openai SDK (ILB_TEST_PYTHON)");
    }
    Some(Setup { engines, script, pythons })
}

fn imports_openai(python: &str) -> bool {
    Command::new(python).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success())
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// One request; the status, the `x-ilb-route` header and the body (JSON or a string).
async fn request(
    client: &HttpClient,
    url: &str,
    body: Option<&Value>,
    session: &str,
) -> (u16, String, Value) {
    let mut builder = http::Request::builder().uri(url).header("x-session-id", session);
    builder = match body {
        Some(_) => builder.method("POST").header("content-type", "application/json"),
        None => builder.method("GET"),
    };
    let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let response = tokio::time::timeout(
        Duration::from_secs(120),
        client.request(builder.body(Full::new(bytes)).unwrap()),
    )
    .await
    .unwrap_or_else(|_| panic!("{url}: no response in 120 s"))
    .unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = response.status().as_u16();
    let route = response.headers().get("x-ilb-route").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
    (status, route, value)
}

async fn get_json(client: &HttpClient, url: &str) -> Value {
    let (status, _, body) = request(client, url, None, "test").await;
    assert_eq!(status, 200, "GET {url}: {body}");
    body
}

/// Polls `check` every 200 ms until it returns `Some`, or panics with `what` after `limit`
/// (a guard against hangs only: it is generous for a loaded 2-core machine).
async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => panic!("{what}: not after {limit:?}; last: {last}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn discover(client: &HttpClient, name: &str, url: &str) -> RealEngine {
    let kind = match name {
        n if n.starts_with("llama") => "llamacpp",
        n if n.starts_with("vllm") => "vllm",
        n => panic!("engine name {n}: must start with llama or vllm"),
    };
    let models = get_json(client, &format!("{url}/v1/models")).await;
    let model =
        models["data"][0]["id"].as_str().unwrap_or_else(|| panic!("{url}/v1/models: {models}")).to_owned();
    RealEngine { name: name.to_owned(), url: url.to_owned(), kind, model }
}

/// The fleet: one region and cluster; a profile per engine kind, sized from what these engines
/// do on a 2-core machine (Gemma 270M on llama.cpp: ~23 tokens/s per stream, 4 slots; the tiny
/// Llama on vLLM: hundreds of tokens/s), generous so that the test's bursts are not shed.
fn fleet_toml(engines: &[RealEngine]) -> String {
    let mut toml = String::from(
        r#"
[control_plane]
listen = "127.0.0.1:0"
scrape_interval_ms = 500
solve_interval_ms = 1000
smoothing_ms = 2000
signal_stale_ms = 3000

# On a loaded 2-core machine a real engine's measured latency is seconds; with the default
# 10 s shedding cost the optimizer may shed light traffic as cheaper than serving it late. The
# test checks routing, not shedding: make shedding never worth it.
[control_plane.shed_penalty_ms]
low = 3600000.0
normal = 3600000.0
high = 3600000.0
critical = 3600000.0

[network]
use_measured = false
[[network.latency]]
from = "local"
to = "local"
ms = 1.0

[[clusters]]
id = "local"
region = "local"

[profiles.llamacpp]
capacity_rps = 6.0
ttft_t0_ms = 150.0
ttft_b_ms = 50.0
tbot_t0_ms = 45.0
tbot_b_ms = 10.0

[profiles.vllm]
capacity_rps = 40.0
ttft_t0_ms = 30.0
ttft_b_ms = 10.0
tbot_t0_ms = 3.0
tbot_b_ms = 1.0
"#,
    );
    for e in engines {
        toml.push_str(&format!(
            "\n[[engines]]\nid = \"{}\"\nurl = \"{}\"\nmodel = \"{}\"\nregion = \"local\"\nprofile = \"{}\"\n",
            e.name, e.url, e.model, e.kind
        ));
    }
    toml
}

fn run_python(python: &str, args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/check_real.py");
    let output = Command::new(python).arg(script).args(args).output().expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{python} check_real.py {args:?} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("real engine checks passed"), "{stdout}");
    eprint!("{stdout}");
    stdout
}

fn model_view<'a>(state: &'a Value, model: &str) -> Option<&'a Value> {
    state["models"].as_array()?.iter().find(|m| m["model"] == model)
}

fn engine_view<'a>(state: &'a Value, model: &str, engine: &str) -> Option<&'a Value> {
    model_view(state, model)?["engines"].as_array()?.iter().find(|e| e["id"] == engine)
}

fn weight(state: &Value, model: &str, engine: &str) -> Option<f64> {
    let m = model_view(state, model)?;
    let class = m["classes"].as_array()?.iter().find(|c| c["cluster"] == CLUSTER)?;
    class["routes"].as_array()?.iter().find(|r| r["engine"] == engine)?["weight"].as_f64()
}

/// A data plane's `/metrics` value of `name{engine="E"}`.
async fn dp_metric(client: &HttpClient, dp: &DataPlane, name: &str, engine: &str) -> Option<f64> {
    let (_, _, body) = request(client, &format!("{}/metrics", dp.url()), None, "test").await;
    let text = body.as_str()?.to_owned();
    let prefix = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(&format!("engine=\"{engine}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

fn chat(model: &str, tokens: u32, stream: bool) -> Value {
    serde_json::json!({
        "model": model, "max_tokens": tokens, "temperature": 0, "stream": stream,
        "messages": [{"role": "user", "content": "Name a colour."}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_engines_behind_ilb() {
    let Some(setup) = setup() else { return };
    let http = client();
    let mut engines = Vec::new();
    for (name, url) in &setup.engines {
        engines.push(discover(&http, name, url).await);
    }
    eprintln!("engines: {engines:?}");
    let mut by_model: BTreeMap<String, Vec<RealEngine>> = BTreeMap::new();
    for e in &engines {
        by_model.entry(e.model.clone()).or_default().push(e.clone());
    }
    // The model to kill an engine of: one served by two or more engines.
    let (victim_model, candidates) = by_model
        .iter()
        .find(|(_, es)| es.len() >= 2)
        .map(|(m, es)| (m.clone(), es.clone()))
        .expect("ILB_REAL_ENGINES needs two engines of one model (for the kill)");

    let fleet: FleetConfig = toml::from_str(&fleet_toml(&engines)).expect("fleet config parses");
    fleet.validate().expect("fleet config is valid");
    let cp = ControlPlane::start(fleet, "127.0.0.1:0".parse().unwrap()).await.expect("control plane starts");
    let mut dps = Vec::new();
    for i in 0..2 {
        let mut config = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
        config.cluster = Some(ilb_core::ClusterId::new(CLUSTER));
        // The test reads each answer's planned weight from `x-ilb-route`.
        config.route_header = ilb_dataplane::config::RouteHeader::Full;
        let source = SnapshotSource::Poll {
            url: format!("{}/v1/snapshots/{CLUSTER}", cp.url()),
            interval: Duration::from_millis(500),
            long_poll: true,
        };
        let mut reports = ReportConfig::new(format!("{}/v1/reports", cp.url()), format!("dp-{i}"));
        reports.interval = Duration::from_millis(500);
        dps.push(
            DataPlane::start_with_reports(config, source, Some(reports)).await.expect("data plane starts"),
        );
    }
    for dp in &dps {
        eventually("data plane installs a snapshot with every engine", Duration::from_secs(60), || async {
            match dp.installed() {
                Some(i) if i.table.engines.len() == engines.len() => Ok(()),
                other => Err(format!("{:?} engines", other.map(|i| i.table.engines.len()))),
            }
        })
        .await;
    }

    // The official SDK, each version, through a data plane (the 1.x one through the second).
    let specs: Vec<String> = by_model
        .iter()
        .map(|(model, es)| {
            // Chunks of a fast engine need a long stream to be seen apart.
            let tokens = if es.iter().all(|e| e.kind == "vllm") { 400 } else { 48 };
            format!("{model}={tokens}")
        })
        .collect();
    for (python, dp) in setup.pythons.iter().zip(dps.iter().cycle()) {
        let mut args = vec!["sdk".to_owned(), dp.url()];
        args.extend(specs.iter().cloned());
        let python = python.clone();
        tokio::task::spawn_blocking(move || {
            run_python(&python, &args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .await
        .unwrap();
    }

    // Every engine's real /metrics was scraped, and its signals are live in /v1/state and in
    // /v1/explain/weights, while light streamed traffic runs through both data planes.
    let (stop_load, load_stopped) = tokio::sync::watch::channel(false);
    let mut load = Vec::new();
    for (i, (model, dp)) in by_model.keys().flat_map(|m| dps.iter().map(move |dp| (m, dp))).enumerate() {
        let (http, url, model, stop) =
            (http.clone(), format!("{}/v1/chat/completions", dp.url()), model.clone(), load_stopped.clone());
        load.push(tokio::spawn(async move {
            for n in 0.. {
                if *stop.borrow() {
                    break;
                }
                let _ = request(&http, &url, Some(&chat(&model, 8, true)), &format!("load-{i}-{n}")).await;
            }
        }));
    }
    let state = eventually("every engine scraped, with live signals", Duration::from_secs(30), || async {
        let state = get_json(&http, &format!("{}/v1/state", cp.url())).await;
        for e in &engines {
            let view =
                engine_view(&state, &e.model, &e.name).ok_or(format!("{} not in /v1/state", e.name))?;
            let s = &view["signals"];
            if !s["scrape_error"].is_null() || s["scrape_ok_age_ms"].as_u64().is_none_or(|age| age >= 5000) {
                return Err(format!("{}: not scraped: {s}", e.name));
            }
            // The engine's kind is read from its real metric names.
            if s["kind"] != e.kind {
                return Err(format!("{}: kind {} from its /metrics, expected {}", e.name, s["kind"], e.kind));
            }
            // llama.cpp has no latency histograms: its TTFT comes from the data planes' reports.
            let ttft_source = if e.kind == "llamacpp" { "data_planes" } else { "engine" };
            if s["sources"]["ttft"] != ttft_source {
                return Err(format!(
                    "{}: TTFT from {}, expected {ttft_source}",
                    e.name, s["sources"]["ttft"]
                ));
            }
            for signal in ["request_rate", "ttft_ms", "tbot_ms"] {
                if !s[signal].as_f64().is_some_and(|v| v > 0.0) {
                    return Err(format!("{} ({}): no live {signal}: {s}", e.name, e.kind));
                }
            }
            // How long the answers are: vLLM's own histogram of generated tokens; for llama.cpp,
            // which has none, the data planes read each answer's count (`timings.predicted_n`).
            let answers = model_view(&state, &e.model)
                .map(|m| &m["answers"])
                .ok_or(format!("{}: no model in /v1/state", e.model))?;
            let counted_by =
                if e.kind == "llamacpp" { "counted_by_data_planes" } else { "counted_by_engines" };
            if !answers[counted_by].as_f64().is_some_and(|n| n > 0.0) {
                return Err(format!("{} ({}): no answers {counted_by}: {answers}", e.name, e.kind));
            }
        }
        Ok(state)
    })
    .await;
    for (model, es) in &by_model {
        let url = format!("{}/v1/explain/weights?cluster={CLUSTER}&model={model}", cp.url());
        let explain = get_json(&http, &url).await;
        for e in es {
            let view = explain["engines"].as_array().and_then(|v| v.iter().find(|v| v["id"] == e.name));
            let view = view.unwrap_or_else(|| panic!("{} not in {url}: {explain}", e.name));
            assert!(view["signals"]["scrape_ok_age_ms"].is_u64(), "{url}: {} not scraped: {view}", e.name);
            assert!(weight(&state, model, &e.name).is_some(), "{} has no route in the plan: {state}", e.name);
        }
        // The plan splits all of the model's traffic (with light demand the optimum may well
        // put it all on the faster engine).
        let total: f64 = es.iter().filter_map(|e| weight(&state, model, &e.name)).sum();
        assert!((total - 1.0).abs() < 1e-6, "{model}: weights sum to {total}: {state}");
    }
    let _ = stop_load.send(true);
    for task in load {
        task.await.unwrap();
    }

    // Weights are published and followed: each data plane routes on the plan the control plane
    // shows (same snapshot, same weights), and requests go only to engines with weight.
    for dp in &dps {
        for (model, es) in &by_model {
            eventually("a data plane routes on the published weights", Duration::from_secs(30), || async {
                let state = get_json(&http, &format!("{}/v1/state", cp.url())).await;
                let route = get_json(&http, &format!("{}/debug/route?model={model}&key=k", dp.url())).await;
                if route["snapshot"] != state["version"] {
                    return Err(format!(
                        "data plane on {}, control plane on {}",
                        route["snapshot"], state["version"]
                    ));
                }
                for e in es {
                    let planned = weight(&state, model, &e.name).unwrap_or(0.0);
                    let candidates = route["candidates"].as_array().cloned().unwrap_or_default();
                    let used = candidates.iter().find(|c| c["engine"] == e.name.as_str());
                    let used = used.and_then(|c| c["weight"].as_f64()).unwrap_or(0.0);
                    if (planned - used).abs() > 0.01 {
                        return Err(format!("{}: planned {planned}, data plane {used}", e.name));
                    }
                }
                Ok(())
            })
            .await;
            let url = format!("{}/v1/chat/completions", dp.url());
            for n in 0..4 {
                let (status, route, body) =
                    request(&http, &url, Some(&chat(model, 2, false)), &format!("w{n}")).await;
                assert_eq!(status, 200, "{body}");
                let w: f64 = route
                    .split("; ")
                    .find_map(|kv| kv.strip_prefix("weight="))
                    .and_then(|w| w.parse().ok())
                    .unwrap_or_else(|| panic!("x-ilb-route without a weight: {route}"));
                assert!(w > 0.0, "routed to an engine without weight: {route}");
            }
        }
    }

    // An idle pause longer than llama.cpp's keep-alive (5 s): pooled connections the engine
    // closed must not fail the next requests.
    tokio::time::sleep(Duration::from_secs(6)).await;
    for e in &engines {
        let url = format!("{}/v1/chat/completions", dps[0].url());
        let (status, route, body) = request(&http, &url, Some(&chat(&e.model, 4, false)), "after-idle").await;
        assert_eq!(status, 200, "after an idle pause, {}: {route} {body}", e.model);
    }

    // Kill one engine mid-run, the one with the most weight: requests not yet streaming
    // succeed on another.
    let state = get_json(&http, &format!("{}/v1/state", cp.url())).await;
    let victim = candidates
        .iter()
        .max_by(|a, b| {
            let w = |e: &RealEngine| weight(&state, &victim_model, &e.name).unwrap_or(0.0);
            w(a).total_cmp(&w(b))
        })
        .unwrap()
        .clone();
    eprintln!("killing {} (weight {:?})", victim.name, weight(&state, &victim_model, &victim.name));
    let kill = format!("bash {} kill {}", setup.script, victim.name);
    let python = setup.pythons[0].clone();
    let dp_url = dps[0].url();
    let model = victim_model.clone();
    let out = tokio::task::spawn_blocking(move || run_python(&python, &["failover", &dp_url, &model, &kill]))
        .await
        .unwrap();
    eprintln!("failover: {}", out.lines().find(|l| l.starts_with('{')).unwrap_or(""));
    // The data plane that sent them ejects it locally; the control plane plans it out.
    eventually("the killed engine is ejected by the data plane", Duration::from_secs(30), || async {
        match dp_metric(&http, &dps[0], "ilb_dataplane_engine_ejected", &victim.name).await {
            Some(v) if v >= 1.0 => Ok(()),
            other => Err(format!("ejected gauge {other:?}")),
        }
    })
    .await;
    eventually("the killed engine is planned out", Duration::from_secs(60), || async {
        let state = get_json(&http, &format!("{}/v1/state", cp.url())).await;
        match weight(&state, &victim_model, &victim.name) {
            Some(w) if w > 0.0 => Err(format!("weight {w}")),
            _ => Ok(()),
        }
    })
    .await;

    // Restarted, it comes back: weight in the plan, then traffic through the data plane.
    let status =
        Command::new("bash").args([setup.script.as_str(), "start", victim.name.as_str()]).status().unwrap();
    assert!(status.success(), "restarting {} failed", victim.name);
    eventually("the restarted engine gets weight again", Duration::from_secs(60), || async {
        let state = get_json(&http, &format!("{}/v1/state", cp.url())).await;
        match weight(&state, &victim_model, &victim.name) {
            Some(w) if w > 0.0 => Ok(()),
            other => Err(format!(
                "weight {other:?}; the engines as the control plane sees them: {:?}",
                candidates.iter().map(|e| engine_view(&state, &victim_model, &e.name)).collect::<Vec<_>>()
            )),
        }
    })
    .await;
    let url = format!("{}/v1/chat/completions", dps[0].url());
    let mut session = 0;
    eventually("the restarted engine serves requests again", Duration::from_secs(120), || {
        session += 1;
        let (http, url, model, victim) = (&http, &url, &victim_model, &victim.name);
        let session = format!("back-{session}");
        async move {
            let (status, route, body) = request(http, url, Some(&chat(model, 2, false)), &session).await;
            if status != 200 {
                return Err(format!("{status} {body}"));
            }
            match route.starts_with(&format!("engine={victim};")) {
                true => Ok(()),
                false => Err(route),
            }
        }
    })
    .await;

    for dp in dps {
        dp.shutdown().await;
    }
    cp.shutdown().await;
}

//! The control plane's publishing contract on loopback: a restart never publishes a version
//! older than one a data plane already holds, reports need the configured bearer token, and
//! snapshot requests honour `If-None-Match` (304) and `?wait=` long-polls that return as soon as
//! a newer version is published.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod wait;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use ilb_controlplane::ControlPlane;
use ilb_core::report::{ClassDemand, Report};
use ilb_core::{ClassId, ClusterId, ModelName};
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use ilb_engine_sim::{EngineConfig, EngineHandle};
use ilb_planning::config::FleetConfig;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Two engines (answering at once) for the fleet's scrapes.
async fn engines() -> Vec<EngineHandle> {
    let mut out = Vec::new();
    for i in 0..2 {
        let config = EngineConfig {
            id: ilb_core::EngineId::new(format!("engine-{i}")),
            model: ModelName::new("m"),
            latency: false,
            seed: i,
            ..EngineConfig::default()
        };
        out.push(ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    out
}

/// A two-cluster fleet like tests/plan.rs's, solving every `solve_ms`.
fn fleet(engines: &[EngineHandle], solve_ms: u64, token: &str) -> FleetConfig {
    let text = format!(
        r#"
[control_plane]
scrape_interval_ms = 200
solve_interval_ms = {solve_ms}
token = "{token}"
[network]
use_measured = false
latency = [
  {{ from = "a", to = "a", ms = 5.0 }}, {{ from = "a", to = "b", ms = 40.0 }}, {{ from = "b", to = "b", ms = 5.0 }},
]
[[clusters]]
id = "a"
region = "a"
[[clusters]]
id = "b"
region = "b"
[profiles.gpu]
capacity_rps = 100.0
ttft_t0_ms = 60.0
ttft_b_ms = 15.0
[[engines]]
id = "engine-0"
url = "{a}"
model = "m"
region = "a"
profile = "gpu"
[[engines]]
id = "engine-1"
url = "{b}"
model = "m"
region = "b"
profile = "gpu"
"#,
        a = engines[0].url(),
        b = engines[1].url(),
    );
    let config: FleetConfig = toml::from_str(&text).unwrap();
    config.validate().unwrap();
    config
}

struct Fetched {
    status: StatusCode,
    etag: Option<String>,
    body: String,
}

async fn fetch(client: &HttpClient, url: &str, headers: &[(header::HeaderName, &str)]) -> Fetched {
    try_fetch(client, url, headers).await.unwrap()
}

async fn try_fetch(
    client: &HttpClient,
    url: &str,
    headers: &[(header::HeaderName, &str)],
) -> Result<Fetched, hyper_util::client::legacy::Error> {
    let mut builder = Request::get(url);
    for (name, value) in headers {
        builder = builder.header(name, *value);
    }
    let response = client.request(builder.body(Full::new(Bytes::new())).unwrap()).await?;
    let status = response.status();
    let etag = response.headers().get(header::ETAG).map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Ok(Fetched { status, etag, body: String::from_utf8_lossy(&body).into_owned() })
}

fn version_of(fetched: &Fetched) -> u64 {
    let v: serde_json::Value = serde_json::from_str(&fetched.body).unwrap();
    let version = v["version"].as_u64().unwrap();
    assert_eq!(fetched.etag.as_deref(), Some(format!("\"{version}\"").as_str()), "ETag is the version");
    version
}

/// Polls the cluster's snapshot until one is published; returns it.
async fn first_snapshot(client: &HttpClient, cp_url: &str, cluster: &str) -> Fetched {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // After a restart on the same address the client's pooled connection to the old
        // control plane is dead: a failed request is retried like a 404.
        match try_fetch(client, &format!("{cp_url}/v1/snapshots/{cluster}"), &[]).await {
            Ok(fetched) if fetched.status == StatusCode::OK => return fetched,
            Ok(fetched) => assert_eq!(fetched.status, StatusCode::NOT_FOUND, "{}", fetched.body),
            Err(e) => eprintln!("retrying after: {e}"),
        }
        assert!(Instant::now() < deadline, "no snapshot published for '{cluster}' within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a control plane on `addr`, retrying while the port of a just-stopped one is released.
async fn start_on(config: FleetConfig, addr: SocketAddr) -> ControlPlane {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match ControlPlane::start(config.clone(), addr).await {
            Ok(cp) => return cp,
            Err(e) if Instant::now() < deadline => {
                eprintln!("re-binding {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("cannot re-bind {addr}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_never_publishes_an_older_version() {
    let engines = engines().await;
    let config = fleet(&engines, 200, "");
    let client = client();
    let cp = ControlPlane::start(config.clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = cp.local_addr();
    let mut dp_config = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
    dp_config.cluster = Some(ClusterId::new("a"));
    let source = SnapshotSource::Poll {
        url: format!("{}/v1/snapshots/a", cp.url()),
        interval: Duration::from_millis(50),
        long_poll: true,
    };
    let dp = DataPlane::start(dp_config, source).await.unwrap();

    let mut highest = version_of(&first_snapshot(&client, &cp.url(), "a").await);
    // Let a few rounds go by, so the data plane holds a version from well into the first run.
    wait::until("the data plane installs a second version", 1000, Duration::from_millis(10), || {
        dp.snapshot_version().is_some_and(|v| v.0 > highest)
    })
    .await;
    cp.shutdown().await;
    let held = dp.snapshot_version().unwrap().0;
    highest = highest.max(held);

    for restart in 1..=2 {
        let cp = start_on(config.clone(), addr).await;
        let published = version_of(&first_snapshot(&client, &cp.url(), "a").await);
        assert!(
            published > highest,
            "restart {restart} published version {published}, not above {highest} already held"
        );
        // The data plane (still polling the same address) moves on to it: never refused as stale.
        let what = format!("the data plane moves on to version {published} after restart {restart}");
        wait::until(&what, 1000, Duration::from_millis(10), || {
            dp.snapshot_version().is_some_and(|v| v.0 >= published)
        })
        .await;
        eprintln!(
            "restart {restart}: data plane held {highest}, the new control plane published {published}"
        );
        highest = dp.snapshot_version().unwrap().0.max(published);
        cp.shutdown().await;
    }
    dp.shutdown().await;
}

fn report_body() -> String {
    let report = Report {
        replica: None,
        cluster: ClusterId::new("a"),
        instance: "dp-1".into(),
        sequence: 1,
        period_ms: 1000,
        snapshot_version: 0,
        demand: vec![ClassDemand {
            model: ModelName::new("m"),
            class: ClassId::new("default"),
            requests: 10,
            shed: 0,
            rps: 10.0,
            by_priority: None,
        }],
        engines: vec![],
    };
    serde_json::to_string(&report).unwrap()
}

#[tokio::test]
async fn reports_need_the_configured_bearer_token() {
    let engines = engines().await;
    let cp =
        ControlPlane::start(fleet(&engines, 60_000, "s3cret"), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let client = client();
    let post = |authorization: Option<&str>| {
        let mut builder = Request::post(format!("{}/v1/reports", cp.url()))
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(value) = authorization {
            builder = builder.header(header::AUTHORIZATION, value);
        }
        let request = builder.body(Full::new(Bytes::from(report_body()))).unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    for authorization in
        [None, Some("Bearer wrong"), Some("s3cret"), Some("Bearer s3cret2"), Some("Basic s3cret")]
    {
        let (status, body) = post(authorization).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{authorization:?}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], "unauthorized");
    }
    let (status, body) = post(Some("Bearer s3cret")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    // Reading snapshots needs no token.
    assert_eq!(first_snapshot(&client, &cp.url(), "a").await.status, StatusCode::OK);
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_none_match_is_304_and_long_polls_wake_on_publish() {
    let engines = engines().await;
    let client = client();

    // Solving once a minute: after the first round nothing new is published during the test.
    let idle =
        ControlPlane::start(fleet(&engines, 60_000, ""), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let current = first_snapshot(&client, &idle.url(), "a").await;
    let etag = current.etag.clone().unwrap();
    let url = format!("{}/v1/snapshots/a", idle.url());
    let started = Instant::now();
    let unchanged = fetch(&client, &url, &[(header::IF_NONE_MATCH, &etag)]).await;
    let immediate = started.elapsed();
    assert_eq!(unchanged.status, StatusCode::NOT_MODIFIED);
    assert!(unchanged.body.is_empty());
    let stale = fetch(&client, &url, &[(header::IF_NONE_MATCH, "\"1\"")]).await;
    assert_eq!(stale.status, StatusCode::OK, "an old ETag gets the current snapshot");
    let started = Instant::now();
    let waited = fetch(&client, &format!("{url}?wait=500ms"), &[(header::IF_NONE_MATCH, &etag)]).await;
    let waited_for = started.elapsed();
    assert_eq!(waited.status, StatusCode::NOT_MODIFIED);
    assert!(
        waited_for >= Duration::from_millis(450),
        "a long-poll without news returned after {waited_for:?}"
    );
    idle.shutdown().await;

    // Solving every 300 ms: a two-second long-poll returns with the next round.
    let busy = ControlPlane::start(fleet(&engines, 300, ""), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let current = first_snapshot(&client, &busy.url(), "a").await;
    let (version, etag) = (version_of(&current), current.etag.clone().unwrap());
    let started = Instant::now();
    let url = format!("{}/v1/snapshots/a?wait=2s", busy.url());
    let newer = fetch(&client, &url, &[(header::IF_NONE_MATCH, &etag)]).await;
    let woke_after = started.elapsed();
    assert_eq!(newer.status, StatusCode::OK, "{}", newer.body);
    assert!(version_of(&newer) > version);
    eprintln!(
        "If-None-Match: 304 in {} ms; long-poll without news: 304 after {} ms of a 500 ms wait; \
         long-poll with a solve every 300 ms: newer version after {} ms of a 2 s wait",
        immediate.as_millis(),
        waited_for.as_millis(),
        woke_after.as_millis()
    );
    assert!(
        woke_after < Duration::from_millis(1200),
        "long-poll returned after {woke_after:?}, not on publish"
    );
    busy.shutdown().await;
}

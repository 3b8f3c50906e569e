//! Data planes of one cluster that report to a control plane share what they decide through
//! it, without naming each other (`api::relay`): conversations one of them placed reach the
//! other in the answers to its reports.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod wait;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use ilb_controlplane::ControlPlane;
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use ilb_engine_sim::EngineConfig;
use ilb_planning::config::FleetConfig;
use std::time::Duration;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn get(client: &HttpClient, url: &str) -> String {
    let request = http::Request::get(url).body(Full::new(Bytes::new())).unwrap();
    let body = client.request(request).await.unwrap().into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_that_report_to_a_control_plane_learn_each_others_conversations() {
    let mut engines = Vec::new();
    for (i, id) in ["e1", "e2"].into_iter().enumerate() {
        let config = EngineConfig {
            id: ilb_core::EngineId::new(id),
            model: ilb_core::ModelName::new("m"),
            seed: i as u64,
            ..EngineConfig::default()
        };
        engines.push(ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    let text = format!(
        r#"
[control_plane]
listen = "127.0.0.1:0"
scrape_interval_ms = 500
solve_interval_ms = 500
[[clusters]]
id = "a"
region = "a"
[profiles.p]
capacity_rps = 50.0
ttft_t0_ms = 40.0
ttft_b_ms = 10.0
[[engines]]
id = "e1"
url = "{}"
model = "m"
region = "a"
profile = "p"
[[engines]]
id = "e2"
url = "{}"
model = "m"
region = "a"
profile = "p"
"#,
        engines[0].url(),
        engines[1].url()
    );
    let config: FleetConfig = toml::from_str(&text).unwrap();
    config.validate().unwrap();
    let cp = ControlPlane::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let mut data_planes = Vec::new();
    for instance in ["a-1", "a-2"] {
        let mut dp_config = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
        dp_config.cluster = Some(ilb_core::ClusterId::new("a"));
        let source = SnapshotSource::Poll {
            url: format!("{}/v1/snapshots/a", cp.url()),
            interval: Duration::from_millis(200),
            long_poll: true,
        };
        let mut reports = ReportConfig::new(format!("{}/v1/reports", cp.url()), instance.into());
        reports.interval = Duration::from_millis(100);
        data_planes.push(DataPlane::start_with_reports(dp_config, source, Some(reports)).await.unwrap());
    }
    wait::until("both data planes have a snapshot", 500, Duration::from_millis(20), || {
        data_planes.iter().all(|dp| dp.snapshot_version().is_some())
    })
    .await;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    for i in 0..10 {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi {i}"}}],"max_tokens":2}}"#);
        let request = http::Request::post(format!("{}/v1/chat/completions", data_planes[0].url()))
            .header("content-type", "application/json")
            .header("x-session-id", format!("conversation-{i}"))
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }
    // The ten placements come back to the second data plane in the answers to its reports.
    let learned = "ilb_dataplane_replica_entries_learned_total";
    let metrics_url = format!("{}/metrics", data_planes[1].url());
    let mut last = 0.0;
    for _ in 0..500 {
        last = metric(&get(&client, &metrics_url).await, learned);
        if last >= 10.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(last >= 10.0, "the second data plane learned {last} entries");
    let first = metric(&get(&client, &format!("{}/metrics", data_planes[0].url())).await, learned);
    assert_eq!(first, 0.0, "the first placed them itself: nothing to learn");
    for dp in data_planes {
        dp.shutdown().await;
    }
    cp.shutdown().await;
}

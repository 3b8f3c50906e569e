//! Set-up shared by the control-plane tests that run one fleet on loopback: simulated engines,
//! the fleet's TOML around them, a data plane pulling a cluster's snapshots from the control
//! plane, and an HTTP client that reads whole bodies. `fleet_support` builds on it.
#![allow(dead_code)]

use crate::wait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use ilb_engine_sim::{EngineConfig, EngineHandle, HardwareProfile};
use ilb_planning::config::FleetConfig;
use std::time::Duration;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// `GET url`, the whole body; panics on any failure.
pub async fn get(client: &HttpClient, url: &str) -> Bytes {
    client.get(url.parse().unwrap()).await.unwrap().into_body().collect().await.unwrap().to_bytes()
}

/// `n` simulated engines `e0`, `e1`, … of model `m` with `profile` (engine i seeded with i).
pub async fn engines(n: u64, profile: &HardwareProfile) -> Vec<EngineHandle> {
    let mut engines = Vec::new();
    for i in 0..n {
        let config = EngineConfig {
            id: ilb_core::EngineId::new(format!("e{i}")),
            model: ilb_core::ModelName::new("m"),
            profile: profile.clone(),
            seed: i,
            ..EngineConfig::default()
        };
        engines.push(ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    engines
}

/// The fleet of `engines` as `[[engines]]` `e0`, `e1`, … of model `m` in region `r` with
/// profile `sim` (50 req/s, TTFT 50 + 15·y/(c − y) ms), one cluster `a` there, and
/// `control_plane` after `listen` in the `[control_plane]` table (its own sub-tables may follow).
pub fn fleet(engines: &[EngineHandle], control_plane: &str) -> FleetConfig {
    let engines: String = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let url = e.url();
            format!("[[engines]]\nid = \"e{i}\"\nurl = \"{url}\"\nmodel = \"m\"\nregion = \"r\"\nprofile = \"sim\"\n")
        })
        .collect();
    let text = format!(
        r#"
[control_plane]
listen = "127.0.0.1:0"
{control_plane}
[[clusters]]
id = "a"
region = "r"
[profiles.sim]
capacity_rps = 50.0
ttft_t0_ms = 50.0
ttft_b_ms = 15.0
{engines}"#
    );
    let config: FleetConfig = toml::from_str(&text).unwrap();
    config.validate().unwrap();
    config
}

/// A data plane of `cluster` long-polling `cp_url` for its snapshots (interval 200 ms),
/// reporting as `reports` says when given; returned once it has installed a snapshot.
pub async fn data_plane(cp_url: &str, cluster: &str, reports: Option<ReportConfig>) -> DataPlane {
    let mut config = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
    config.cluster = Some(ilb_core::ClusterId::new(cluster));
    let source = SnapshotSource::Poll {
        url: format!("{cp_url}/v1/snapshots/{cluster}"),
        interval: Duration::from_millis(200),
        long_poll: true,
    };
    let dp = DataPlane::start_with_reports(config, source, reports).await.unwrap();
    wait::until("the data plane has a snapshot", 1000, Duration::from_millis(20), || {
        dp.snapshot_version().is_some()
    })
    .await;
    dp
}

/// Reports to `cp_url` as `instance` every 250 ms.
pub fn reports(cp_url: &str, instance: &str) -> ReportConfig {
    let mut reports = ReportConfig::new(format!("{cp_url}/v1/reports"), instance.into());
    reports.interval = Duration::from_millis(250);
    reports
}

//! TLS between the planes and to engines, on loopback with certificates made at test time:
//! scrapes of https engines, mutual TLS (a data plane without a client certificate is refused;
//! one with a certificate pulls snapshots, reports, and is named by its certificate in
//! `/v1/state`), and the API's certificate rotating under load.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use ilb_controlplane::ApiTls;
use ilb_controlplane::ControlPlane;
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use ilb_engine_sim::{EngineConfig, EngineHandle};
use ilb_planning::config::FleetConfig;
use ilb_tls::testing::TestCa;
use ilb_tls::{ClientAuth, ClientOptions, ClientTls, Identity, ServerTls};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

fn tls_client(ca: &TestCa, identity: Option<Identity>) -> ClientTls {
    ClientTls::new(&ClientOptions { roots: vec![ca.der()], identity }).unwrap()
}

fn https_client(tls: &ClientTls) -> HttpsClient {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.config_without_alpn())
        .https_only()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

async fn get(client: &HttpsClient, url: &str) -> Result<(StatusCode, String), String> {
    let req = Request::get(url).body(Full::new(Bytes::new())).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .map_err(|_| "hung".to_owned())?
        .map_err(|e| format!("{e:?}"))?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Two https engines (answering at once) with certificates from `ca`.
async fn tls_engines(ca: &TestCa) -> Vec<EngineHandle> {
    let mut out = Vec::new();
    for i in 0..2 {
        let config = EngineConfig {
            id: ilb_core::EngineId::new(format!("engine-{i}")),
            model: ilb_core::ModelName::new("m"),
            latency: false,
            seed: i,
            tls: Some(ServerTls::new(&ca.issue(&["127.0.0.1"]).identity(), ClientAuth::None).unwrap()),
            ..EngineConfig::default()
        };
        out.push(ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    out
}

fn fleet(engines: &[EngineHandle]) -> FleetConfig {
    let text = format!(
        r#"
[control_plane]
scrape_interval_ms = 200
solve_interval_ms = 300
[[clusters]]
id = "a"
region = "a"
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
region = "a"
profile = "gpu"
"#,
        a = engines[0].url(),
        b = engines[1].url(),
    );
    let config: FleetConfig = toml::from_str(&text).unwrap();
    config.validate().unwrap();
    config
}

/// A data plane of cluster `a` pulling from and reporting to `cp_url` over https.
async fn data_plane(cp_url: &str, tls: ClientTls, engine_tls: ClientTls, instance: &str) -> DataPlane {
    let mut config = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
    config.cluster = Some(ilb_core::ClusterId::new("a"));
    config.control_plane_tls = Some(tls);
    config.engine_tls = Some(engine_tls);
    config.https_only = true;
    let source = SnapshotSource::Poll {
        url: format!("{cp_url}/v1/snapshots/a"),
        interval: Duration::from_millis(100),
        long_poll: true,
    };
    let mut reports = ReportConfig::new(format!("{cp_url}/v1/reports"), instance.into());
    reports.interval = Duration::from_millis(200);
    DataPlane::start_with_reports(config, source, Some(reports)).await.unwrap()
}

/// A hang guard counted in polls (600 × 50 ms), not a wall-clock bound.
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..600 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gave up after 600 polls waiting until {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_between_the_planes_and_https_scrapes() {
    let fleet_ca = TestCa::new("fleet ca");
    let dp_ca = TestCa::new("data plane ca");
    let engines = tls_engines(&fleet_ca).await;
    let cp_cert = fleet_ca.issue(&["127.0.0.1"]).identity();
    let tls = ApiTls {
        listener: Some(ServerTls::new(&cp_cert, ClientAuth::Required(vec![dp_ca.der()])).unwrap()),
        scrape: Some(tls_client(&fleet_ca, None)),
    };
    let cp =
        ControlPlane::start_with_tls(fleet(&engines), "127.0.0.1:0".parse().unwrap(), tls).await.unwrap();
    assert!(cp.url().starts_with("https://"));
    let dp_identity = dp_ca.issue_client("spiffe://ilb/dp/a-1").identity();
    let with_cert = data_plane(
        &cp.url(),
        tls_client(&fleet_ca, Some(dp_identity.clone())),
        tls_client(&fleet_ca, None),
        "a-1",
    )
    .await;
    let without_cert =
        data_plane(&cp.url(), tls_client(&fleet_ca, None), tls_client(&fleet_ca, None), "a-2").await;

    // Scrapes over https succeed.
    until("both https engines are scraped", async || {
        cp.view()
            .models
            .first()
            .is_some_and(|m| m.engines.iter().all(|e| e.signals.scrape_ok_age_ms.is_some()))
    })
    .await;
    until("the data plane with a certificate installs a snapshot", async || {
        with_cert.snapshot_version().is_some()
    })
    .await;
    let installed = with_cert.installed().unwrap();
    assert!(installed.table.engines.iter().all(|e| e.url.starts_with("https://")));
    // Its requests go to the https engines.
    let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
    let req = Request::post(format!("{}/v1/chat/completions", with_cert.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let response: http::Response<hyper::body::Incoming> = client.request(req).await.unwrap();
    assert_eq!(response.status(), 200);

    // Its reports arrive and name it by its certificate.
    let state_client = https_client(&tls_client(&fleet_ca, Some(dp_identity)));
    until("/v1/state names the data plane by its certificate", async || {
        let (_, body) = get(&state_client, &format!("{}/v1/state", cp.url())).await.unwrap();
        let state: serde_json::Value = serde_json::from_str(&body).unwrap();
        state["data_planes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|dp| dp["instance"] == "a-1" && dp["identity"] == "spiffe://ilb/dp/a-1")
    })
    .await;
    // The one without a certificate is refused: no snapshot, no report.
    assert!(
        without_cert.snapshot_version().is_none(),
        "a data plane without a client certificate got a snapshot"
    );
    let anonymous = https_client(&tls_client(&fleet_ca, None));
    assert!(get(&anonymous, &format!("{}/v1/snapshots/a", cp.url())).await.is_err(), "handshake refused");
    let (_, body) = get(&state_client, &format!("{}/v1/state", cp.url())).await.unwrap();
    assert!(!body.contains("\"a-2\""), "{body}");
    with_cert.shutdown().await;
    without_cert.shutdown().await;
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_client_certificates_guard_snapshots_and_reports() {
    let fleet_ca = TestCa::new("fleet ca");
    let dp_ca = TestCa::new("data plane ca");
    let engines = tls_engines(&fleet_ca).await;
    let cp_cert = fleet_ca.issue(&["127.0.0.1"]).identity();
    let tls = ApiTls {
        listener: Some(ServerTls::new(&cp_cert, ClientAuth::Optional(vec![dp_ca.der()])).unwrap()),
        scrape: Some(tls_client(&fleet_ca, None)),
    };
    let cp =
        ControlPlane::start_with_tls(fleet(&engines), "127.0.0.1:0".parse().unwrap(), tls).await.unwrap();
    let anonymous = https_client(&tls_client(&fleet_ca, None));
    assert_eq!(get(&anonymous, &format!("{}/health", cp.url())).await.unwrap().0, 200);
    let (status, body) = get(&anonymous, &format!("{}/v1/snapshots/a", cp.url())).await.unwrap();
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("client_certificate_required"), "{body}");
    let named =
        https_client(&tls_client(&fleet_ca, Some(dp_ca.issue_client("spiffe://ilb/dp/a-9").identity())));
    until("a client with a certificate gets the snapshot", async || {
        get(&named, &format!("{}/v1/snapshots/a", cp.url())).await.unwrap().0 == 200
    })
    .await;
    cp.shutdown().await;
}

/// The certificate a full handshake with `addr` is served.
async fn served_certificate(addr: std::net::SocketAddr, ca: &TestCa) -> ilb_tls::CertificateDer<'static> {
    let tls = tls_client(ca, None);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let stream = tls.connector().connect(ilb_tls::server_name("127.0.0.1").unwrap(), tcp).await.unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_certificate_rotates_under_load_without_failures() {
    let ca = TestCa::new("cp ca");
    let engines = tls_engines(&ca).await;
    let first = ca.issue(&["127.0.0.1"]).identity();
    let second = ca.issue(&["127.0.0.1"]).identity();
    let listener = ServerTls::new(&first, ClientAuth::None).unwrap();
    let tls = ApiTls { listener: Some(listener.clone()), scrape: Some(tls_client(&ca, None)) };
    let cp =
        ControlPlane::start_with_tls(fleet(&engines), "127.0.0.1:0".parse().unwrap(), tls).await.unwrap();
    let client = https_client(&tls_client(&ca, None));
    let snapshot_url = format!("{}/v1/snapshots/a", cp.url());
    until("a snapshot is published", async || get(&client, &snapshot_url).await.unwrap().0 == 200).await;
    assert_eq!(&served_certificate(cp.local_addr(), &ca).await, first.certificate());

    // A long poll in flight across the rotation (it returns at the next publish, or 304 after 5 s).
    let long_poll = {
        let client = https_client(&tls_client(&ca, None));
        let req = Request::get(&snapshot_url).body(Full::new(Bytes::new())).unwrap();
        let current = client.request(req).await.unwrap();
        let etag = current.headers()[http::header::ETAG].clone();
        let req = Request::get(format!("{snapshot_url}?wait=5s"))
            .header(http::header::IF_NONE_MATCH, etag)
            .body(Full::new(Bytes::new()))
            .unwrap();
        tokio::spawn(async move {
            let response = client.request(req).await.map_err(|e| e.to_string())?;
            let status = response.status();
            response.into_body().collect().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((status, String::new()))
        })
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for w in 0..3 {
        let client = https_client(&tls_client(&ca, None));
        let url = if w == 0 { format!("{}/v1/state", cp.url()) } else { snapshot_url.clone() };
        let (ok, failed, stop) = (Arc::clone(&ok), Arc::clone(&failed), Arc::clone(&stop));
        load.push(tokio::spawn(async move {
            let stopped = stop.notified();
            tokio::pin!(stopped);
            loop {
                tokio::select! {
                    result = get(&client, &url) => match result {
                        Ok((status, _)) if status == 200 => ok.fetch_add(1, Relaxed),
                        other => {
                            eprintln!("failed: {other:?}");
                            failed.fetch_add(1, Relaxed)
                        }
                    },
                    _ = &mut stopped => break,
                };
            }
        }));
    }
    until("load runs", async || ok.load(Relaxed) >= 20).await;
    listener.reload(&second).unwrap();
    let at_rotation = ok.load(Relaxed);
    assert_eq!(&served_certificate(cp.local_addr(), &ca).await, second.certificate());
    until("load goes on after the rotation", async || ok.load(Relaxed) >= at_rotation + 20).await;
    stop.notify_waiters();
    for task in load {
        task.await.unwrap();
    }
    assert_eq!(failed.load(Relaxed), 0, "no request failed across the rotation");
    let (status, _) = long_poll.await.unwrap().expect("the long poll survived the rotation");
    assert!(status == 200 || status == 304, "{status}");
    cp.shutdown().await;
}

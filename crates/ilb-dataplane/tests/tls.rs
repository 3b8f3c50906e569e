//! TLS on both of the data plane's hops, on loopback with certificates made at test time:
//! https engines (the engine simulator's TLS listener) with connection reuse and session
//! resumption, engines whose certificate is wrong (ejected with the reason, traffic goes to the
//! healthy one), an https-only data plane, and the client listener's certificate rotating under
//! load.

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use ilb_core::EngineId;
use ilb_dataplane::{DataPlane, SnapshotSource};
use ilb_tls::testing::{TestCa, Validity};
use ilb_tls::{ClientAuth, ClientOptions, ClientTls, ServerTls};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

fn trusting(ca: &TestCa) -> ClientTls {
    ClientTls::new(&ClientOptions { roots: vec![ca.der()], identity: None }).unwrap()
}

fn https_client(tls: &ClientTls) -> HttpsClient {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.config_without_alpn())
        .https_or_http()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

/// A simulated engine `id` serving https with `cert` (answers at once unless `latency`).
async fn tls_engine(id: &str, cert: &ilb_tls::Identity, latency: bool) -> ilb_engine_sim::EngineHandle {
    let config = ilb_engine_sim::EngineConfig {
        id: EngineId::new(id),
        model: ilb_core::ModelName::new("m"),
        profile: quick_profile(),
        latency,
        tls: Some(ServerTls::new(cert, ClientAuth::None).unwrap()),
        ..Default::default()
    };
    ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

async fn send_https(
    client: &HttpsClient,
    req: http::Request<Full<Bytes>>,
) -> Result<(http::StatusCode, http::HeaderMap, String), String> {
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .map_err(|_| "request hung".to_owned())?
        .map_err(|e| format!("{e:?}"))?;
    let (parts, body) = response.into_parts();
    let bytes = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .map_err(|_| "body hung".to_owned())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((parts.status, parts.headers, String::from_utf8_lossy(&bytes).into_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_engines_stream_and_reuse_one_handshake() {
    let ca = TestCa::new("engines ca");
    let cert = ca.issue(&["127.0.0.1"]).identity();
    let engines = vec![tls_engine("e0", &cert, false).await, tls_engine("e1", &cert, false).await];
    assert!(engines[0].url().starts_with("https://127.0.0.1:"));
    let mut config = config();
    config.engine_tls = Some(trusting(&ca));
    let dp = data_plane(config, &sim_snapshot(1, &engines)).await;
    let client = client();
    // One client connection, one session key: every request takes the same engine, and the
    // data plane's connection to it is reused.
    let mut routed = None;
    for i in 0..30 {
        let req =
            post(&dp.url(), "/v1/chat/completions", &sim_body("same", false, 4), &[("x-session-id", "s1")]);
        let (status, headers, body) = send(&client, req).await;
        assert_eq!(status, 200, "request {i}: {body}");
        assert!(body.contains("chat.completion"), "{body}");
        let engine = routed_engine(&headers).unwrap();
        assert_eq!(routed.get_or_insert(engine.clone()), &engine);
    }
    let idx = engine_index(&dp, routed.as_deref().unwrap());
    let state = Arc::clone(&dp.installed().unwrap().engines[idx]);
    let full = state.origin.tls_handshakes[0].load(Relaxed);
    let resumed = state.origin.tls_handshakes[1].load(Relaxed);
    assert_eq!(full + resumed, 1, "30 sequential requests share one TLS connection");

    // Streaming over TLS, through to [DONE].
    let req = post(&dp.url(), "/v1/chat/completions", &sim_body("same", true, 16), &[("x-session-id", "s1")]);
    let (status, _, body) = send(&client, req).await;
    assert_eq!(status, 200);
    assert_eq!(stream_end(&body), StreamEnd::Done, "{body}");
    let (_, metrics) = get(&client, &format!("{}/metrics", dp.url())).await;
    assert!(metrics.contains("ilb_dataplane_engine_tls_handshakes_total{engine=\""), "{metrics}");

    // A reconnect resumes: drop the idle connections, then send again.
    let before = state.origin.tls_handshakes[1].load(Relaxed);
    state.pool.sweep(u64::MAX, &Default::default());
    let req = post(&dp.url(), "/v1/chat/completions", &sim_body("same", false, 4), &[("x-session-id", "s1")]);
    assert_eq!(send(&client, req).await.0, 200);
    assert_eq!(
        state.origin.tls_handshakes[1].load(Relaxed),
        before + 1,
        "the new connection resumed the session"
    );
    dp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_engine_certificates_are_ejected_with_their_reason() {
    let ca = TestCa::new("trusted ca");
    let other = TestCa::new("unknown ca");
    let engines = vec![
        tls_engine("e0", &ca.issue(&["127.0.0.1"]).identity(), false).await,
        tls_engine("e1", &other.issue(&["127.0.0.1"]).identity(), false).await,
        tls_engine("e2", &ca.issue(&["engine.example"]).identity(), false).await,
        tls_engine("e3", &ca.issue_with(&["127.0.0.1"], Validity::Expired).identity(), false).await,
    ];
    let mut config = config();
    config.engine_tls = Some(trusting(&ca));
    config.guard.max_ejected_fraction = 1.0;
    config.retry_budget.min_per_sec = 1000.0;
    config.max_attempts = 4;
    let dp = data_plane(config, &sim_snapshot(1, &engines)).await;
    let client = client();
    let ejected = |dp: &DataPlane| {
        let installed = dp.installed().unwrap();
        ["e1", "e2", "e3"].iter().all(|id| installed.engines[engine_index(dp, id)].is_ejected())
    };
    let mut i = 0;
    while !ejected(&dp) {
        assert!(i < 400, "the engines with bad certificates were not all ejected");
        let req = post(&dp.url(), "/v1/chat/completions", &sim_body(&format!("k{i}"), false, 4), &[]);
        // Retries reach e0; a request may still fail while the guard is learning.
        let _ = tokio::time::timeout(Duration::from_secs(30), send(&client, req)).await.expect("no hang");
        i += 1;
    }
    let (_, body) = get(&client, &format!("{}/debug/route?model=m&key=any", dp.url())).await;
    let route: serde_json::Value = serde_json::from_str(&body).unwrap();
    let reason = |id: &str| {
        let c = route["candidates"].as_array().unwrap().iter().find(|c| c["engine"] == id).unwrap();
        (c["skip"].clone(), c["tls_failure"]["reason"].clone())
    };
    assert_eq!(
        reason("e1"),
        (serde_json::json!("ejected by local guard"), serde_json::json!("unknown_issuer"))
    );
    assert_eq!(reason("e2").1, "name_mismatch");
    assert_eq!(reason("e3").1, "expired");
    assert_eq!(reason("e0"), (serde_json::Value::Null, serde_json::Value::Null));
    let (_, metrics) = get(&client, &format!("{}/metrics", dp.url())).await;
    for (engine, label) in [("e1", "unknown_issuer"), ("e2", "name_mismatch"), ("e3", "expired")] {
        let line =
            format!("ilb_dataplane_engine_tls_failures_total{{engine=\"{engine}\",reason=\"{label}\"}}");
        assert!(metrics.contains(&line), "missing {line} in\n{metrics}");
    }
    // Now everything goes to the healthy engine, and the bad ones stay out (their probes fail
    // the same way).
    for i in 0..20 {
        let req = post(&dp.url(), "/v1/chat/completions", &sim_body(&format!("after{i}"), false, 4), &[]);
        let (status, headers, body) = send(&client, req).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(routed_engine(&headers).as_deref(), Some("e0"));
    }
    assert!(ejected(&dp));
    dp.shutdown().await;
}

#[tokio::test]
async fn an_https_only_data_plane_refuses_plain_engines() {
    let mut config = config();
    config.https_only = true;
    let dp = DataPlane::start(config, SnapshotSource::Manual).await.unwrap();
    let plain =
        snapshot(1, &[("a", "https://127.0.0.1:1".into(), 1.0), ("b", "http://127.0.0.1:2".into(), 1.0)]);
    let error = dp.install(&plain).unwrap_err().to_string();
    assert!(error.contains("'b'") && error.contains("https-only"), "{error}");
    let tls = snapshot(2, &[("a", "https://127.0.0.1:1".into(), 1.0)]);
    dp.install(&tls).unwrap();
    dp.shutdown().await;
}

/// The certificate a new TLS connection to `addr` is served, in a full handshake (a client
/// with no session to resume: a resumed session keeps the certificate it was made with).
async fn served_certificate(addr: std::net::SocketAddr, ca: &TestCa) -> ilb_tls::CertificateDer<'static> {
    let tls = trusting(ca);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let stream = tls.connector().connect(ilb_tls::server_name("127.0.0.1").unwrap(), tcp).await.unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_certificate_rotates_under_load_without_failures() {
    let ca = TestCa::new("listener ca");
    let first = ca.issue(&["127.0.0.1"]).identity();
    let second = ca.issue(&["127.0.0.1"]).identity();
    let engines = sim_engines(2, quick_profile()).await;
    let listener = ServerTls::new(&first, ClientAuth::None).unwrap();
    let mut config = config();
    config.listener_tls = Some(listener.clone());
    let dp = data_plane(config, &sim_snapshot(1, &engines)).await;
    assert!(dp.url().starts_with("https://"));
    let tls = trusting(&ca);
    assert_eq!(&served_certificate(dp.local_addr(), &ca).await, first.certificate());

    // A stream that starts before the rotation and ends after it (40 tokens, ~160 ms), on a
    // raw TLS connection to see its bytes.
    let tcp = tokio::net::TcpStream::connect(dp.local_addr()).await.unwrap();
    let mut live = tls.connector().connect(ilb_tls::server_name("127.0.0.1").unwrap(), tcp).await.unwrap();
    let body = sim_body("live", true, 40);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    live.write_all(head.as_bytes()).await.unwrap();
    let mut first_bytes = [0u8; 12];
    live.read_exact(&mut first_bytes).await.unwrap();
    assert_eq!(&first_bytes, b"HTTP/1.1 200");

    // Load: four clients, each on its own kept-alive connections, until told to stop.
    let stop = Arc::new(tokio::sync::Notify::new());
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for w in 0..4 {
        let (client, url) = (https_client(&tls), dp.url());
        let (ok, failed, stop) = (Arc::clone(&ok), Arc::clone(&failed), Arc::clone(&stop));
        load.push(tokio::spawn(async move {
            let stopped = stop.notified();
            tokio::pin!(stopped);
            for i in 0.. {
                let req = post(&url, "/v1/chat/completions", &sim_body(&format!("w{w}-{i}"), i % 2 == 0, 4), &[]);
                tokio::select! {
                    result = send_https(&client, req) => match result {
                        Ok((status, _, body)) if status == 200 && !body.is_empty() => ok.fetch_add(1, Relaxed),
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
    assert!(eventually(Duration::from_secs(30), || ok.load(Relaxed) >= 20).await, "load did not start");
    listener.reload(&second).unwrap();
    let at_rotation = ok.load(Relaxed);
    assert_eq!(&served_certificate(dp.local_addr(), &ca).await, second.certificate());
    assert!(
        eventually(Duration::from_secs(30), || ok.load(Relaxed) >= at_rotation + 20).await,
        "load did not go on after the rotation"
    );
    // New clients (new connections) under load get the new certificate too.
    let fresh = https_client(&tls);
    let req = post(&dp.url(), "/v1/chat/completions", &sim_body("fresh", false, 4), &[]);
    assert_eq!(send_https(&fresh, req).await.unwrap().0, 200);
    stop.notify_waiters();
    for task in load {
        task.await.unwrap();
    }
    assert_eq!(failed.load(Relaxed), 0, "no request failed across the rotation");

    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), live.read_to_end(&mut rest)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains("data: [DONE]"), "the stream begun before the rotation ended cleanly: {text}");
    dp.shutdown().await;
}

//! The fast guard's data-plane side against a stand-in control plane on loopback: engines it
//! holds get no requests while the snapshot still routes to them, `/debug/route` says why, and
//! the holds fail open once the control plane has stopped answering for `STALE_AFTER`.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

mod support;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use ilb_dataplane::{holds, DataPlane, SnapshotSource};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio::net::TcpListener;

const HOLDS: &str = r#"{"version":7,"held":[{"engine":"e1","reason":"asleep"}]}"#;

/// Serves the snapshot and the holds (version 7: e1 asleep, long-polled with `wait`) until
/// `gone` is set; then answers 503 to everything.
async fn control_plane(snapshot: String, gone: Arc<AtomicBool>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (snapshot, gone) = (snapshot.clone(), gone.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let (snapshot, gone) = (snapshot.clone(), gone.clone());
                    async move {
                        let status = |code| {
                            let mut r = Response::new(Full::new(Bytes::new()));
                            *r.status_mut() = code;
                            r
                        };
                        let query = request.uri().query().unwrap_or("").to_owned();
                        let response = if gone.load(SeqCst) {
                            status(StatusCode::SERVICE_UNAVAILABLE)
                        } else if request.uri().path() == "/v1/engine-holds" {
                            if query.contains("version=7") {
                                // Unchanged: hold the poll a little, then 304.
                                tokio::time::sleep(Duration::from_millis(300)).await;
                                status(if gone.load(SeqCst) {
                                    StatusCode::SERVICE_UNAVAILABLE
                                } else {
                                    StatusCode::NOT_MODIFIED
                                })
                            } else {
                                Response::new(Full::new(Bytes::from_static(HOLDS.as_bytes())))
                            }
                        } else if request.uri().path().starts_with("/v1/snapshots/") {
                            if query.contains("wait=") && request.headers().contains_key("if-none-match") {
                                tokio::time::sleep(Duration::from_millis(300)).await;
                                status(StatusCode::NOT_MODIFIED)
                            } else {
                                let mut r = Response::new(Full::new(Bytes::from(snapshot)));
                                r.headers_mut().insert("etag", "\"1\"".parse().unwrap());
                                r
                            }
                        } else {
                            status(StatusCode::NOT_FOUND)
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_engines_are_skipped_and_holds_fail_open() {
    let (e0, e1) = (MockEngine::start("e0").await, MockEngine::start("e1").await);
    let snap = snapshot(1, &[("e0", e0.url(), 0.5), ("e1", e1.url(), 0.5)]);
    let gone = Arc::new(AtomicBool::new(false));
    let cp = control_plane(serde_json::to_string(&snap).unwrap(), gone.clone()).await;
    let source = SnapshotSource::Poll {
        url: format!("http://{cp}/v1/snapshots/test"),
        interval: Duration::from_millis(100),
        long_poll: true,
    };
    let dp = DataPlane::start(config(), source).await.unwrap();
    assert!(eventually(Duration::from_secs(20), || dp.snapshot_version().is_some()).await, "no snapshot");
    let held = |dp: &DataPlane| dp.installed().unwrap().engines[engine_index(dp, "e1")].is_held();
    assert!(eventually(Duration::from_secs(20), || held(&dp)).await, "e1 never held");
    assert_eq!(debug_skip(&dp, "e1").await, "held by the control plane: asleep");
    assert!(debug_skip(&dp, "e0").await.is_null());

    let client = client();
    let before = e1.requests.load(SeqCst);
    for i in 0..40 {
        let (status, headers, _) =
            send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body(&format!("k{i}")), &[])).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(routed_engine(&headers).as_deref(), Some("e0"), "a held engine was picked");
    }
    assert_eq!(e1.requests.load(SeqCst), before, "the held engine got requests");

    // The control plane goes away: the holds are released after STALE_AFTER, not kept forever.
    gone.store(true, SeqCst);
    let started = tokio::time::Instant::now();
    assert!(
        eventually(holds::STALE_AFTER + Duration::from_secs(20), || !held(&dp)).await,
        "holds were kept without a control plane"
    );
    assert!(
        started.elapsed() >= holds::STALE_AFTER - Duration::from_secs(1),
        "released before they went stale"
    );
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..40 {
        let (_, headers, _) =
            send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body(&format!("j{i}")), &[])).await;
        seen.extend(routed_engine(&headers));
    }
    assert!(seen.contains("e1"), "the released engine got nothing: {seen:?}");
    dp.shutdown().await;
}

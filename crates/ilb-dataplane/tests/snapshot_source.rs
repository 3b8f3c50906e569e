//! A control plane that keeps offering a snapshot the data plane refuses: the data plane keeps
//! routing on its installed snapshot, backs off instead of re-polling at once, counts every
//! refusal by reason and says it is degraded in `/health`.

mod support;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use ilb_dataplane::{DataPlane, SnapshotSource};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio::net::TcpListener;

/// Answers every snapshot request at once with `body` and a fresh tag, whatever the data plane
/// sends (the worst case: no long poll, no `If-None-Match`); counts the requests.
async fn control_plane(body: &'static str, polls: Arc<AtomicU64>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let polls = polls.clone();
            tokio::spawn(async move {
                let service = service_fn(move |_request: hyper::Request<hyper::body::Incoming>| {
                    let n = polls.fetch_add(1, SeqCst);
                    async move {
                        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                        r.headers_mut().insert("etag", format!("\"{n}\"").parse().unwrap());
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    address
}

fn metric(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {sample} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_snapshot_is_counted_reported_and_backed_off_from() {
    // A snapshot whose weight the control plane wrote as null (it was NaN).
    const NULL_WEIGHT: &str = r#"{"format":1,"version":99,"cluster":"test","created_unix_ms":1,"utilisation":0.5,
        "engines":[{"id":"e0","url":"http://127.0.0.1:9"}],
        "models":[{"model":"m","classes":[{"id":"default","weights":[{"engine":"e0","weight":null}],"shed_fraction":0}]}]}"#;
    let polls = Arc::new(AtomicU64::new(0));
    let cp = control_plane(NULL_WEIGHT, polls.clone()).await;
    let source = SnapshotSource::Poll {
        url: format!("http://{cp}/v1/snapshots/test"),
        interval: Duration::from_millis(100),
        long_poll: true,
    };
    let e0 = MockEngine::start("e0").await;
    let dp = DataPlane::start(config(), source).await.unwrap();
    dp.install(&snapshot(1, &[("e0", e0.url(), 1.0)])).unwrap();
    assert!(eventually(Duration::from_secs(20), || polls.load(SeqCst) >= 2).await, "never polled twice");

    // Backing off, the data plane polls a handful of times in two seconds (0.25–0.5 s, then
    // 0.5–1 s, ...): without it, thousands. (A slow machine can only make it fewer.)
    let before = polls.load(SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = polls.load(SeqCst) - before;
    assert!(during <= 8, "{during} polls in 2 s after refusals");

    let client = client();
    let (status, health) = get(&client, &format!("{}/health", dp.url())).await;
    assert_eq!(status, StatusCode::OK, "routing goes on with the installed snapshot");
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(health["snapshot_version"], 1);
    let reason = health["snapshot_rejected"]["reason"].as_str().unwrap();
    assert!(reason.contains("null"), "{reason}");

    let (_, metrics) = get(&client, &format!("{}/metrics", dp.url())).await;
    assert!(metric(&metrics, "ilb_dataplane_snapshot_rejections_total{reason=\"malformed\"}") >= 2.0);
    assert_eq!(metric(&metrics, "ilb_dataplane_snapshot_rejections_total{reason=\"stale\"}"), 0.0);

    // Requests are still served from the installed snapshot.
    let (status, _, _) = send(&client, post(&dp.url(), "/v1/chat/completions", &chat_body("k"), &[])).await;
    assert_eq!(status, StatusCode::OK);

    // A good snapshot clears the degraded state.
    dp.install(&snapshot(100, &[("e0", e0.url(), 1.0)])).unwrap();
    let (_, health) = get(&client, &format!("{}/health", dp.url())).await;
    assert!(health.contains("\"status\":\"ok\""), "{health}");
    dp.shutdown().await;
}

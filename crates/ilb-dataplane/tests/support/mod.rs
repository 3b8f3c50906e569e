//! Test support: a scriptable mock engine and a small HTTP client, both on loopback.
//!
//! The mock engine's behaviour is chosen per request by headers (the data plane forwards them
//! unchanged): `x-mock-status`, `x-mock-chunks`, `x-mock-delay-ms`, `x-mock-die-after`,
//! `x-mock-hang`, `x-mock-gate` (stream the first chunk, then wait for the test to open the gate).

#![allow(dead_code)]

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ilb_core::snapshot::{ClassRoutes, EngineEntry, EngineWeight, ModelRoutes, Snapshot, FORMAT};
use ilb_core::{ClassId, ClusterId, EngineId, ModelName, SnapshotVersion};
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

/// A mock engine on an ephemeral loopback port.
pub struct MockEngine {
    pub name: String,
    pub addr: SocketAddr,
    pub requests: Arc<AtomicU64>,
    /// Streams whose client went away before the stream finished.
    pub cancelled: Arc<AtomicU64>,
    pub gate: Arc<Notify>,
    /// When set, every generation request hangs (accepted, never answered).
    pub hang: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl MockEngine {
    pub async fn start(name: &str) -> MockEngine {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let cancelled = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Notify::new());
        let hang = Arc::new(AtomicBool::new(false));
        let (n, r, c, g) = (name.to_owned(), requests.clone(), cancelled.clone(), gate.clone());
        let h = hang.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                stream.set_nodelay(true).unwrap();
                let (n, r, c, g, h) = (n.clone(), r.clone(), c.clone(), g.clone(), h.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let (n, r, c, g, h) = (n.clone(), r.clone(), c.clone(), g.clone(), h.clone());
                        async move { Ok::<_, Infallible>(respond(&n, &r, &c, &g, &h, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        MockEngine { name: name.to_owned(), addr, requests, cancelled, gate, hang, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting (already-open connections keep going until dropped).
    pub fn kill(&self) {
        self.task.abort();
    }
}

fn header_u64(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.headers().get(name)?.to_str().ok()?.parse().ok()
}

async fn respond(
    name: &str,
    requests: &AtomicU64,
    cancelled: &Arc<AtomicU64>,
    gate: &Arc<Notify>,
    hang: &AtomicBool,
    req: Request<Incoming>,
) -> Response<ChannelBody> {
    requests.fetch_add(1, SeqCst);
    if req.uri().path() == "/health" {
        return Response::new(ChannelBody::full("ok"));
    }
    if req.uri().path() == "/v1/models" {
        return Response::new(ChannelBody::full(r#"{"object":"list","data":[{"id":"m","object":"model"}]}"#));
    }
    if req.headers().contains_key("x-mock-hang") || hang.load(SeqCst) {
        std::future::pending::<()>().await;
    }
    let status = header_u64(&req, "x-mock-status").unwrap_or(200) as u16;
    let chunks = header_u64(&req, "x-mock-chunks");
    let delay = Duration::from_millis(header_u64(&req, "x-mock-delay-ms").unwrap_or(0));
    let die_after = header_u64(&req, "x-mock-die-after");
    let gated = req.headers().contains_key("x-mock-gate");
    let echo_headers = format!("{:?}", req.headers().keys().map(|k| k.as_str()).collect::<Vec<_>>());
    let traceparent = req.headers().get("traceparent").cloned();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("x-engine", name)
        .header("x-seen-headers", echo_headers);
    if let Some(tp) = traceparent {
        builder = builder.header("x-seen-traceparent", tp);
    }
    let Some(chunks) = chunks else {
        // Non-streaming: echo the request body so tests can check it arrived unchanged.
        builder = builder.header("content-type", "application/json");
        return builder.body(ChannelBody::full(body)).unwrap();
    };
    let (tx, rx) = mpsc::channel(4);
    let (cancelled, gate) = (cancelled.clone(), gate.clone());
    tokio::spawn(async move {
        for i in 0..chunks {
            if die_after == Some(i) {
                // Let hyper flush what was sent before the connection is torn down.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = tx.send(Err(std::io::Error::other("engine died"))).await;
                return;
            }
            if i == 1 && gated {
                gate.notified().await;
            }
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let event = format!("data: {{\"chunk\":{i}}}\n\n");
            if tx.send(Ok(Bytes::from(event))).await.is_err() {
                cancelled.fetch_add(1, SeqCst);
                return;
            }
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    builder.header("content-type", "text/event-stream").body(ChannelBody::Channel(rx)).unwrap()
}

pub enum ChannelBody {
    Full(Option<Bytes>),
    Channel(mpsc::Receiver<Result<Bytes, std::io::Error>>),
}

impl ChannelBody {
    fn full(b: impl Into<Bytes>) -> Self {
        ChannelBody::Full(Some(b.into()))
    }
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ChannelBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ChannelBody::Channel(rx) => rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data))),
        }
    }
}

/// A snapshot routing model `m` over `engines` with the given weights.
pub fn snapshot(version: u64, engines: &[(&str, String, f64)]) -> Snapshot {
    Snapshot {
        format: FORMAT,
        version: SnapshotVersion(version),
        created_unix_ms: 0,
        cluster: ClusterId::new("test"),
        utilisation: 0.0,
        engines: engines
            .iter()
            .map(|(id, url, _)| EngineEntry {
                id: EngineId::new(*id),
                url: url.clone(),
                region: String::new(),
                capabilities: vec![],
                residency: vec![],
                max_in_flight: 0,
            })
            .collect(),
        models: vec![ModelRoutes {
            model: ModelName::new("m"),
            classes: vec![ClassRoutes {
                id: ClassId::new("default"),
                require: vec![],
                residency: None,
                weights: engines
                    .iter()
                    .map(|(id, _, w)| EngineWeight {
                        engine: EngineId::new(*id),
                        weight: *w,
                        expected_latency_ms: None,
                        network_ms: None,
                    })
                    .collect(),
                shed_fraction: 0.0,
            }],
        }],
    }
}

pub fn config() -> DataPlaneConfig {
    let mut c = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
    c.timeouts.first_byte = Duration::from_secs(5);
    c.timeouts.idle = Duration::from_secs(5);
    c
}

pub async fn data_plane(config: DataPlaneConfig, snapshot: &Snapshot) -> DataPlane {
    let dp = DataPlane::start(config, SnapshotSource::Manual).await.unwrap();
    dp.install(snapshot).unwrap();
    dp
}

pub type TestClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub fn post(url: &str, path: &str, body: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::post(format!("{url}{path}")).header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::copy_from_slice(body.as_bytes()))).unwrap()
}

pub fn chat_body(session: &str) -> String {
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hello {session}"}}],"max_tokens":4}}"#)
}

/// Sends a request and reads the whole response.
pub async fn send(client: &TestClient, req: Request<Full<Bytes>>) -> (StatusCode, http::HeaderMap, String) {
    let resp = client.request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    (parts.status, parts.headers, String::from_utf8_lossy(&bytes).into_owned())
}

pub async fn get(client: &TestClient, url: &str) -> (StatusCode, String) {
    let req = Request::get(url).body(Full::new(Bytes::new())).unwrap();
    let (s, _, b) = send(client, req).await;
    (s, b)
}

/// Polls `check` until it holds or `deadline` passes.
pub async fn eventually(deadline: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + deadline;
    while tokio::time::Instant::now() < end {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

pub fn engine_of(headers: &http::HeaderMap) -> String {
    headers.get("x-engine").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default()
}

//! Test support: a scriptable mock engine and a small HTTP client, both on loopback.
//!
//! The mock engine's behaviour is chosen per request by headers (the data plane forwards them
//! unchanged): `x-mock-status`, `x-mock-chunks`, `x-mock-delay-ms`, `x-mock-die-after`,
//! `x-mock-hang`, `x-mock-gate` (stream the first chunk, then wait for the test to open the gate),
//! `x-mock-close` (answer with `connection: close`, closing the connection after the response),
//! `x-mock-max-body` (answer 413 at once, without reading it, to a body declared longer than
//! this many bytes, as an engine with a body limit does). Every answer names the method and
//! path the engine saw (`x-seen-method`, `x-seen-path`).
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines
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
    /// TCP connections accepted.
    pub connections: Arc<AtomicU64>,
    /// TCP connections that ended (closed by the data plane, or broken).
    pub closed: Arc<AtomicU64>,
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
        let connections = Arc::new(AtomicU64::new(0));
        let accepted = connections.clone();
        let closed = Arc::new(AtomicU64::new(0));
        let ended = closed.clone();
        let cancelled = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Notify::new());
        let hang = Arc::new(AtomicBool::new(false));
        let (n, r, c, g) = (name.to_owned(), requests.clone(), cancelled.clone(), gate.clone());
        let h = hang.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                accepted.fetch_add(1, SeqCst);
                stream.set_nodelay(true).unwrap();
                let (n, r, c, g, h) = (n.clone(), r.clone(), c.clone(), g.clone(), h.clone());
                let ended = ended.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let (n, r, c, g, h) = (n.clone(), r.clone(), c.clone(), g.clone(), h.clone());
                        async move { Ok::<_, Infallible>(respond(&n, &r, &c, &g, &h, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    ended.fetch_add(1, SeqCst);
                });
            }
        });
        MockEngine { name: name.to_owned(), addr, requests, connections, closed, cancelled, gate, hang, task }
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
        // vLLM's shape: its own fields beside OpenAI's.
        return Response::new(ChannelBody::full(
            r#"{"object":"list","data":[{"id":"m","object":"model","created":1700000000,"owned_by":"vllm",
                "root":"/models/m","parent":null,"max_model_len":4096,
                "permission":[{"id":"modelperm-1","object":"model_permission","allow_sampling":true}]}]}"#,
        ));
    }
    let declared = header_u64(&req, "content-length");
    if header_u64(&req, "x-mock-max-body").is_some_and(|max| declared.is_some_and(|len| len > max)) {
        // Refused before reading the body: hyper closes the connection with it unread.
        let error = r#"{"error":{"message":"engine says too large","type":"invalid_request_error","param":null,"code":null}}"#;
        return Response::builder()
            .status(StatusCode::PAYLOAD_TOO_LARGE)
            .header("x-engine", name)
            .header("content-type", "application/json")
            .body(ChannelBody::full(error))
            .unwrap();
    }
    if req.headers().contains_key("x-mock-hang") || hang.load(SeqCst) {
        std::future::pending::<()>().await;
    }
    let status = header_u64(&req, "x-mock-status").unwrap_or(200) as u16;
    let chunks = header_u64(&req, "x-mock-chunks");
    let delay = Duration::from_millis(header_u64(&req, "x-mock-delay-ms").unwrap_or(0));
    let die_after = header_u64(&req, "x-mock-die-after");
    let gated = req.headers().contains_key("x-mock-gate");
    let close = req.headers().contains_key("x-mock-close");
    let method = req.method().clone();
    let path_and_query = req.uri().path_and_query().map_or("/".to_owned(), |pq| pq.as_str().to_owned());
    let echo_headers = format!("{:?}", req.headers().keys().map(|k| k.as_str()).collect::<Vec<_>>());
    let traceparent = req.headers().get("traceparent").cloned();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("x-engine", name)
        .header("x-seen-method", method.as_str())
        .header("x-seen-path", path_and_query)
        .header("x-seen-headers", echo_headers);
    if let Some(tp) = traceparent {
        builder = builder.header("x-seen-traceparent", tp);
    }
    if close {
        builder = builder.header("connection", "close");
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
                        in_flight_ms: None,
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

/// A POST with a JSON content type unless `headers` name another.
pub fn post(url: &str, path: &str, body: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::post(format!("{url}{path}"));
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
        b = b.header("content-type", "application/json");
    }
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

// Helpers for tests/faults.rs: simulated engines, raw sockets and SSE outcomes.

/// `n` simulated engines (ids `e0`, `e1`, ...) serving model `m` on loopback, with the
/// engine model's latency so that streams last long enough to be killed mid-way.
pub async fn sim_engines(
    n: usize,
    profile: ilb_engine_sim::HardwareProfile,
) -> Vec<ilb_engine_sim::EngineHandle> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let config = ilb_engine_sim::EngineConfig {
            id: EngineId::new(format!("e{i}")),
            model: ModelName::new("m"),
            profile: profile.clone(),
            latency: true,
            seed: 100 + i as u64,
            ..ilb_engine_sim::EngineConfig::default()
        };
        out.push(ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    out
}

/// A snapshot routing model `m` over simulated engines at equal weights (ids `e0`, `e1`, ...).
pub fn sim_snapshot(version: u64, engines: &[ilb_engine_sim::EngineHandle]) -> Snapshot {
    let ids: Vec<String> = (0..engines.len()).map(|i| format!("e{i}")).collect();
    let list: Vec<(&str, String, f64)> =
        engines.iter().zip(&ids).map(|(e, id)| (id.as_str(), e.url(), 1.0)).collect();
    snapshot(version, &list)
}

/// The engine id in an `x-ilb-route` header, if any.
pub fn routed_engine(headers: &http::HeaderMap) -> Option<String> {
    let route = headers.get("x-ilb-route")?.to_str().ok()?;
    route.split("; ").find_map(|part| part.strip_prefix("engine=")).map(str::to_owned)
}

/// How a streamed (SSE) response body ended.
#[derive(Debug, PartialEq)]
pub enum StreamEnd {
    /// Every event is `data: ...` and the last one is `data: [DONE]`.
    Done,
    /// Every event is `data: ...` and the last one is an OpenAI error object.
    ErrorEvent(serde_json::Value),
    /// Anything else (truncated, not SSE, an error event that is not the last one).
    Malformed(String),
}

pub fn stream_end(text: &str) -> StreamEnd {
    if !text.ends_with("\n\n") {
        return StreamEnd::Malformed(format!("does not end at an event boundary: {:?}", tail(text)));
    }
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let Some((last, earlier)) = events.split_last() else {
        return StreamEnd::Malformed("no events".into());
    };
    if let Some(bad) = events.iter().find(|e| !e.starts_with("data: ")) {
        return StreamEnd::Malformed(format!("not an SSE data event: {bad:?}"));
    }
    if let Some(bad) = earlier.iter().find(|e| e.contains("\"error\"")) {
        return StreamEnd::Malformed(format!("error event before the end: {bad:?}"));
    }
    let data = &last["data: ".len()..];
    if data == "[DONE]" {
        return StreamEnd::Done;
    }
    match serde_json::from_str::<serde_json::Value>(data) {
        Ok(v) if v["error"]["message"].is_string() && v["error"]["code"].is_string() => {
            StreamEnd::ErrorEvent(v)
        }
        _ => StreamEnd::Malformed(format!("last event is neither [DONE] nor an error: {data:?}")),
    }
}

fn tail(text: &str) -> &str {
    let start = text.char_indices().rev().nth(80).map_or(0, |(i, _)| i);
    &text[start..]
}

/// Reads from a raw socket until the peer closes it (EOF or reset) or `limit` passes.
/// Returns what was read and whether the peer closed.
pub async fn read_until_close(stream: &mut tokio::net::TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let end = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(end, stream.read(&mut buf)).await {
            Err(_) => return (out, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Status code and body of a raw HTTP/1.1 response with a `content-length` body.
pub fn parse_raw_response(bytes: &[u8]) -> Option<(u16, String)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// One chat request on a fresh connection (so it goes through the data plane's accept loop),
/// returning its status and how long it took. Panics if it is not served within 20 s (a
/// starved or hung data plane, not a slow machine).
pub async fn fresh_request(url: &str, key: &str) -> (StatusCode, Duration) {
    let started = tokio::time::Instant::now();
    let req = post(url, "/v1/chat/completions", &chat_body(key), &[("x-session-id", key)]);
    let sent = tokio::time::timeout(Duration::from_secs(20), send(&client(), req)).await;
    let (status, _, _) = sent.expect("a fresh request was not served within 20 s");
    (status, started.elapsed())
}

/// Iterations of 4 ms and one token each: a 40-token stream lasts about 160 ms, long enough to
/// be cut in the middle.
pub fn quick_profile() -> ilb_engine_sim::HardwareProfile {
    ilb_engine_sim::HardwareProfile {
        name: "faults".into(),
        max_num_seqs: 64,
        max_num_batched_tokens: 4096,
        kv_blocks: 8192,
        iteration_base_ms: 4.0,
        prefill_token_us: 1.0,
        decode_seq_us: 1.0,
        replicas: 1,
    }
}

/// A chat request body for the simulated engines.
pub fn sim_body(key: &str, stream: bool, max_tokens: u32) -> String {
    format!(
        r#"{{"model":"m","stream":{stream},"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"fault test {key}"}}]}}"#
    )
}

/// A session key that the data plane would route to `engine` right now (with current loads).
pub async fn key_routed_to(dp: &DataPlane, engine: &str, prefix: &str) -> String {
    let client = client();
    for i in 0..200 {
        let key = format!("{prefix}-{i}");
        let (_, body) = get(&client, &format!("{}/debug/route?model=m&key={key}", dp.url())).await;
        let route: serde_json::Value = serde_json::from_str(&body).unwrap();
        if route["picked"] == engine {
            return key;
        }
    }
    panic!("no key of 200 routes to {engine}")
}

/// The index of engine `id` in the installed state.
pub fn engine_index(dp: &DataPlane, id: &str) -> usize {
    dp.installed().unwrap().engines.iter().position(|e| e.id.as_str() == id).unwrap()
}

/// The `skip` reason `/debug/route` gives for `engine`.
pub async fn debug_skip(dp: &DataPlane, engine: &str) -> serde_json::Value {
    let (_, body) = get(&client(), &format!("{}/debug/route?model=m&key=any", dp.url())).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let candidates = v["candidates"].as_array().unwrap();
    candidates.iter().find(|c| c["engine"] == engine).unwrap()["skip"].clone()
}

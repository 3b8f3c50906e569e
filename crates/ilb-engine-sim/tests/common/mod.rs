//! Test helpers: engines with fast profiles, a minimal hyper client, SSE parsing, metric lookup.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::Response;
use hyper_util::rt::TokioIo;
use ilb_engine_sim::{spawn, EngineConfig, EngineHandle, HardwareProfile};
use tokio::net::TcpStream;

pub const MODEL: &str = "test-model";

/// A profile whose iterations take a few milliseconds, so latency tests stay short.
pub fn fast_profile() -> HardwareProfile {
    HardwareProfile {
        name: "test-fast".into(),
        iteration_base_ms: 2.0,
        prefill_token_us: 20.0,
        decode_seq_us: 50.0,
        replicas: 1,
        ..HardwareProfile::a100()
    }
}

pub fn config(profile: HardwareProfile, latency: bool) -> EngineConfig {
    EngineConfig {
        model: MODEL.into(),
        profile,
        latency,
        seed: 7,
        default_max_tokens: 8,
        ..EngineConfig::default()
    }
}

pub async fn engine(profile: HardwareProfile, latency: bool) -> EngineHandle {
    spawn(config(profile, latency), loopback()).await.expect("spawn engine")
}

pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Sends one request on a fresh connection and returns the response with its body unread.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<Response<Incoming>> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))?;
    Ok(sender.send_request(request).await?)
}

/// Sends a request and reads the whole body.
pub async fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let response = send(addr, method, path, body).await.expect("request");
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8(bytes.to_vec()).expect("utf-8"))
}

pub async fn call_json(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let (status, text) = call(addr, method, path, body).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|error| panic!("{error}: {text:?}")))
}

/// Splits an SSE body into its `data:` payloads.
pub fn sse_events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            event.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE event: {event:?}")).to_owned()
        })
        .collect()
}

/// Value of the sample line `name{labels} value` in a Prometheus text document.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|value| value.parse().ok())
}

/// Polls `condition` every 5 ms until it holds or `deadline` passes.
pub async fn eventually(deadline: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + deadline;
    while tokio::time::Instant::now() < end {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    condition()
}

pub fn chat_body(content: &str, max_tokens: Option<u32>, stream: bool, include_usage: bool) -> String {
    let mut body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": content}],
        "stream": stream,
    });
    if let Some(max) = max_tokens {
        body["max_tokens"] = max.into();
    }
    if include_usage {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    body.to_string()
}

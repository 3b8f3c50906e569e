//! A llama.cpp-like engine end to end on loopback: its `/metrics` is the live llama.cpp capture
//! (no request counter, no latency histograms; its token counter counts the tokens served), its
//! chat endpoint streams SSE chunks with known delays, framed as llama.cpp frames them (a
//! role-only chunk, the tokens, a closing chunk with the finish reason and `timings`, `[DONE]`,
//! as a live capture in `crates/ilb-dataplane/src/testdata/` shows).
//! Streamed through a real data plane that reports to a real control plane, the control
//! plane's `/v1/state` must show the engine as `llamacpp`, with its TTFT, time between tokens and
//! request rate measured by the data planes (and close to the delays the engine used), while
//! running and waiting come from the engine; and the answers, all of one length, planned with a
//! law of that shape (counted by the data planes), not the exponential.
#![allow(clippy::disallowed_methods)] // tests read their fixtures from files

mod support;
mod wait;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use ilb_controlplane::ControlPlane;
use ilb_planning::config::FleetConfig;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const FIRST_CHUNK: Duration = Duration::from_millis(120);
const GAP: Duration = Duration::from_millis(30);
const CHUNKS: usize = 6;

/// A streamed body fed by a channel.
struct Chunks(mpsc::Receiver<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

enum Reply {
    Full(Full<Bytes>),
    Stream(Chunks),
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Reply::Full(b) => Pin::new(b).poll_frame(cx),
            Reply::Stream(s) => Pin::new(s).poll_frame(cx),
        }
    }
}

/// One llama.cpp stream chunk (the shape of the live capture), with `extra` fields after the
/// standard ones.
fn chunk(delta: &str, finish: &str, extra: &str) -> String {
    format!(
        "data: {{\"choices\":[{{\"finish_reason\":{finish},\"index\":0,\"delta\":{delta}}}],\"created\":1754524122,\"id\":\"chatcmpl-x\",\"model\":\"gemma-3-270m\",\"system_fingerprint\":\"b0-unknown\",\"object\":\"chat.completion.chunk\"{extra}}}\n\n"
    )
}

async fn fake_llamacpp() -> SocketAddr {
    let capture = std::fs::read_to_string(format!(
        "{}/../ilb-planning/tests/fixtures/llamacpp_busy.txt",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let predicted = Arc::new(AtomicU64::new(60));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (capture, predicted) = (capture.clone(), Arc::clone(&predicted));
            tokio::spawn(async move {
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let predicted = Arc::clone(&predicted);
                    let metrics = capture.replace(
                        "llamacpp:tokens_predicted_total 60",
                        &format!("llamacpp:tokens_predicted_total {}", predicted.load(Ordering::Relaxed)),
                    );
                    async move {
                        let full = |s: String| Reply::Full(Full::new(Bytes::from(s)));
                        let response = match request.uri().path() {
                            "/metrics" => Response::new(full(metrics)),
                            "/health" => Response::new(full(r#"{"status":"ok"}"#.into())),
                            "/v1/chat/completions" => {
                                let _ = request.into_body().collect().await;
                                let (tx, rx) = mpsc::channel(8);
                                tokio::spawn(async move {
                                    tokio::time::sleep(FIRST_CHUNK).await;
                                    for i in 0..CHUNKS {
                                        let mut event = String::new();
                                        if i == 0 {
                                            event =
                                                chunk(r#"{"role":"assistant","content":null}"#, "null", "");
                                        } else {
                                            tokio::time::sleep(GAP).await;
                                        }
                                        event += &chunk(&format!(r#"{{"content":"t{i}"}}"#), "null", "");
                                        if tx.send(Bytes::from(event)).await.is_err() {
                                            return;
                                        }
                                    }
                                    predicted.fetch_add(CHUNKS as u64, Ordering::Relaxed);
                                    let timings = format!(
                                        r#","timings":{{"cache_n":0,"prompt_n":27,"prompt_ms":124.6,"predicted_n":{CHUNKS},"predicted_ms":82.6}}"#
                                    );
                                    let _ = tx.send(Bytes::from(chunk("{}", r#""length""#, &timings))).await;
                                    let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                                });
                                Response::builder()
                                    .header("content-type", "text/event-stream")
                                    .body(Reply::Stream(Chunks(rx)))
                                    .unwrap()
                            }
                            _ => {
                                let mut r = Response::new(full(String::new()));
                                *r.status_mut() = StatusCode::NOT_FOUND;
                                r
                            }
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
async fn llamacpp_latency_comes_from_the_data_planes() {
    let engine = fake_llamacpp().await;
    let text = format!(
        r#"
[control_plane]
listen = "127.0.0.1:0"
scrape_interval_ms = 250
solve_interval_ms = 250
smoothing_ms = 1000
expected_output_tokens = 6.0
[[clusters]]
id = "a"
region = "r"
[profiles.p]
capacity_rps = 20.0
ttft_t0_ms = 50.0
ttft_b_ms = 15.0
[[engines]]
id = "llama"
url = "http://{engine}"
model = "gemma-3-270m"
region = "r"
profile = "p"
"#
    );
    let config: FleetConfig = toml::from_str(&text).unwrap();
    config.validate().unwrap();
    let cp = ControlPlane::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dp = support::data_plane(&cp.url(), "a", Some(support::reports(&cp.url(), "a-1"))).await;

    let client = support::client();
    let mut sent = 0;
    let state = loop {
        // A few concurrent streams per round.
        let rounds: Vec<_> = (0..4)
            .map(|i| {
                let body = format!(
                    r#"{{"model":"gemma-3-270m","stream":true,"messages":[{{"role":"user","content":"hi {sent} {i}"}}]}}"#
                );
                let request = http::Request::post(format!("{}/v1/chat/completions", dp.url()))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .unwrap();
                let client = client.clone();
                tokio::spawn(async move {
                    let response = client.request(request).await.unwrap();
                    assert_eq!(response.status(), 200);
                    let body = response.into_body().collect().await.unwrap().to_bytes();
                    assert!(body.ends_with(b"data: [DONE]\n\n"));
                })
            })
            .collect();
        for r in rounds {
            r.await.unwrap();
        }
        sent += 4;
        let body = support::get(&client, &format!("{}/v1/state", cp.url())).await;
        let state: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let signals = &state["models"][0]["engines"][0]["signals"];
        let ready = signals["sources"]["ttft"] == "data_planes"
            && signals["sources"]["tbot"] == "data_planes"
            && signals["sources"]["request_rate"] == "data_planes"
            && signals["request_rate"].as_f64().is_some_and(|r| r > 0.0);
        let counted = state["models"][0]["answers"]["counted_by_data_planes"].as_f64().unwrap_or(0.0);
        if ready && sent >= 40 && counted >= 120.0 {
            break state;
        }
        // A bound on the work sent, not on elapsed time: it only catches signals that never come.
        assert!(sent < 2000, "signals never came from the data planes after {sent} requests: {signals}");
    };
    let signals = &state["models"][0]["engines"][0]["signals"];
    eprintln!("{signals}");
    assert_eq!(signals["kind"], "llamacpp");
    assert_eq!(signals["sources"]["running"], "engine");
    assert_eq!(signals["running"], 4.0);
    assert_eq!(signals["waiting"], 2.0);
    let ttft = signals["ttft_ms"].as_f64().unwrap();
    let tbot = signals["tbot_ms"].as_f64().unwrap();
    let first = FIRST_CHUNK.as_secs_f64() * 1000.0;
    let gap = GAP.as_secs_f64() * 1000.0;
    // At least the engine's own delays; the bound above only guards against nonsense.
    assert!(ttft >= first && ttft < first * 10.0, "ttft {ttft} ms for a first chunk after {first} ms");
    assert!(tbot >= gap && tbot < gap * 10.0, "tbot {tbot} ms for chunks {gap} ms apart");
    // Every answer is 6 tokens (5 after the first), which the data planes read from the
    // `timings` llama.cpp sends; planned as an exponential of that mean, the p99 would be 4.6 × the mean
    // and the p99 / p50 ratio 6.6. The law is the histogram's (answers uniform within 5–10
    // tokens) mixed with the prior's exponential, worth 20 answers.
    let answers = &state["models"][0]["answers"];
    eprintln!("{answers}");
    assert_eq!(answers["counted_by_engines"], 0.0);
    let mean = answers["mean_output_tokens"].as_f64().unwrap();
    // From the token counter over the data planes' request rate, two windows that need not align.
    assert!((5.0..=8.0).contains(&mean), "mean output tokens {mean}");
    let (p50, p99) =
        (answers["decode_tokens_p50"].as_f64().unwrap(), answers["decode_tokens_p99"].as_f64().unwrap());
    assert!(p99 < 2.5 * p50 && p99 < 2.5 * (mean - 1.0), "decode tokens p50 {p50}, p99 {p99}: {answers}");
    // The data plane shows the same count on its /metrics: every answer, 6 tokens each (the
    // last ones counted as their streams close, which may follow the client's last byte).
    let series_in = |metrics: &str, series: &str| {
        metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse::<f64>().ok())
    };
    let count = "ilb_dataplane_output_tokens_count{engine=\"llama\"}";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let metrics = support::get(&client, &format!("{}/metrics", dp.url())).await;
        let metrics = String::from_utf8(metrics.to_vec()).unwrap();
        if series_in(&metrics, count) == Some(sent as f64) || tokio::time::Instant::now() > deadline {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let value = |series: &str| series_in(&metrics, series);
    let answered = value(count);
    assert_eq!(answered, Some(sent as f64), "{metrics}");
    assert_eq!(value("ilb_dataplane_output_tokens_sum{engine=\"llama\"}"), Some(6.0 * sent as f64));
    assert_eq!(value("ilb_dataplane_output_tokens_bucket{engine=\"llama\",le=\"5\"}"), Some(0.0));
    assert_eq!(value("ilb_dataplane_output_tokens_bucket{engine=\"llama\",le=\"10\"}"), answered);
    dp.shutdown().await;
    cp.shutdown().await;
}

//! The demo's traffic generator: open-loop Poisson arrivals per front-end cluster, made of
//! multi-turn conversations (each turn resends the history, so prefixes repeat and the
//! affinity key keeps a conversation on the engine that caches it), streamed so the time to
//! first token is measured as a client sees it.

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Request rate as a function of the seconds since the traffic started.
pub type Rate = Arc<dyn Fn(f64) -> f64 + Send + Sync>;

/// Where to send what.
#[derive(Clone)]
pub struct Target {
    pub cluster: String,
    pub url: String,
    pub model: String,
    pub rate: Rate,
    /// Extra request headers (priority, constraints).
    pub headers: Vec<(String, String)>,
}

impl Target {
    pub fn constant(cluster: &str, url: String, model: &str, rps: f64) -> Target {
        Target {
            cluster: cluster.into(),
            url,
            model: model.into(),
            rate: Arc::new(move |_| rps),
            headers: Vec::new(),
        }
    }
}

#[derive(Clone)]
pub struct TrafficConfig {
    pub targets: Vec<Target>,
    pub seed: u64,
    pub max_tokens: u32,
    /// Probability that an arrival starts a new conversation instead of continuing one.
    pub new_conversation: f64,
    /// Conversations kept open per cluster.
    pub open_conversations: usize,
}

/// Counters since the last [`Stats::take`].
#[derive(Clone, Debug, Default)]
pub struct Window {
    /// (cluster, engine) → requests.
    pub routes: BTreeMap<(String, String), u64>,
    /// engine → (requests, TTFT sum ms, e2e sum ms).
    pub engines: BTreeMap<String, (u64, f64, f64)>,
    pub errors: u64,
    /// Requests refused with 429 or 503 (planned shedding, overload).
    pub shed: u64,
    pub sent: u64,
}

#[derive(Default)]
pub struct Stats {
    window: Mutex<Window>,
}

impl Stats {
    pub fn take(&self) -> Window {
        std::mem::take(&mut *self.window.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn record(&self, f: impl FnOnce(&mut Window)) {
        f(&mut self.window.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Conversation {
    id: String,
    messages: Vec<(String, String)>,
}

/// Runs until `shutdown` flips.
pub async fn run(config: TrafficConfig, stats: Arc<Stats>, shutdown: watch::Receiver<bool>) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, target) in config.targets.iter().cloned().enumerate() {
        let (client, config, stats, shutdown) =
            (client.clone(), config.clone(), Arc::clone(&stats), shutdown.clone());
        tasks.spawn(cluster_loop(client, config, target, config_seed(i), stats, shutdown));
    }
    while tasks.join_next().await.is_some() {}
}

fn config_seed(i: usize) -> u64 {
    0x5EED_0000 + i as u64
}

async fn cluster_loop(
    client: HttpClient,
    config: TrafficConfig,
    target: Target,
    seed: u64,
    stats: Arc<Stats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut rng = rand_pcg::Pcg64::seed_from_u64(config.seed ^ seed);
    let conversations: Arc<Mutex<Vec<Conversation>>> = Arc::default();
    let started = crate::clock::now();
    let mut next = started;
    let mut counter = 0u64;
    loop {
        // Exponential inter-arrival times: a Poisson process at the current rate (re-read
        // at each arrival, so time-varying demand is followed).
        let rate = (target.rate)(next.duration_since(started).as_secs_f64());
        let gap = -(1.0 - rng.gen::<f64>()).ln() / rate.max(1e-3);
        next += Duration::from_secs_f64(gap.min(10.0));
        if rate <= 1e-3 {
            // No demand now: check again later without sending.
            tokio::select! {
                _ = tokio::time::sleep_until(next) => continue,
                _ = shutdown.changed() => return,
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = shutdown.changed() => return,
        }
        counter += 1;
        let (id, messages) = {
            let mut open = conversations.lock().unwrap_or_else(|p| p.into_inner());
            let start_new = open.is_empty() || rng.gen::<f64>() < config.new_conversation;
            let idx = if start_new {
                let conversation = Conversation {
                    id: format!("{}-{counter}", target.cluster),
                    messages: vec![(
                        "system".into(),
                        format!("You are assistant number {}. Be concise.", counter % 7),
                    )],
                };
                if open.len() < config.open_conversations {
                    open.push(conversation);
                    open.len() - 1
                } else {
                    let slot = rng.gen_range(0..open.len());
                    open[slot] = conversation;
                    slot
                }
            } else {
                rng.gen_range(0..open.len())
            };
            let c = &mut open[idx];
            let turn = c.messages.len() / 2 + 1;
            c.messages
                .push(("user".into(), format!("Question {turn} in conversation {}: tell me more.", c.id)));
            (c.id.clone(), c.messages.clone())
        };
        let (client, config, target, stats, conversations) =
            (client.clone(), config.clone(), target.clone(), Arc::clone(&stats), Arc::clone(&conversations));
        tokio::spawn(async move {
            stats.record(|w| w.sent += 1);
            match one_request(&client, &config, &target, &id, &messages).await {
                Ok((engine, ttft_ms, e2e_ms, reply)) => {
                    stats.record(|w| {
                        *w.routes.entry((target.cluster.clone(), engine.clone())).or_default() += 1;
                        let e = w.engines.entry(engine).or_default();
                        e.0 += 1;
                        e.1 += ttft_ms;
                        e.2 += e2e_ms;
                    });
                    let mut open = conversations.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(c) = open.iter_mut().find(|c| c.id == id) {
                        c.messages.push(("assistant".into(), reply));
                    }
                }
                Err(e) if e == "status 429 Too Many Requests" || e == "status 503 Service Unavailable" => {
                    stats.record(|w| w.shed += 1);
                }
                Err(e) => {
                    tracing::debug!(cluster = %target.cluster, error = %e, "demo request failed");
                    stats.record(|w| w.errors += 1);
                }
            }
        });
    }
}

/// Sends one streamed chat completion; returns (engine, TTFT ms, e2e ms, reply text).
async fn one_request(
    client: &HttpClient,
    config: &TrafficConfig,
    target: &Target,
    session: &str,
    messages: &[(String, String)],
) -> Result<(String, f64, f64, String), String> {
    let body = serde_json::json!({
        "model": target.model,
        "messages": messages.iter().map(|(r, c)| serde_json::json!({"role": r, "content": c})).collect::<Vec<_>>(),
        "max_tokens": config.max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let mut builder = Request::post(format!("{}/v1/chat/completions", target.url))
        .header("content-type", "application/json")
        .header("x-session-id", session);
    for (name, value) in &target.headers {
        builder = builder.header(name, value);
    }
    let request = builder.body(Full::new(Bytes::from(body.to_string()))).map_err(|e| e.to_string())?;
    let started = crate::clock::now();
    let response = tokio::time::timeout(Duration::from_secs(60), client.request(request))
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let engine = response
        .headers()
        .get("x-ilb-route")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.trim().strip_prefix("engine="))
        .unwrap_or("?")
        .to_owned();
    let timings = read_stream(response.into_body(), started).await?;
    let e2e_ms = crate::clock::since(started).as_secs_f64() * 1000.0;
    Ok((engine, timings.ttft_ms.unwrap_or(e2e_ms), e2e_ms, timings.text))
}

/// What a streamed chat completion's client saw.
pub struct StreamTimings {
    /// From the request to the first chunk with content, ms.
    pub ttft_ms: Option<f64>,
    /// From the request to the last chunk with content, ms.
    pub last_content_ms: f64,
    /// Chunks with content.
    pub content_chunks: u32,
    /// The usage chunk's `completion_tokens`, when the engine sent one.
    pub completion_tokens: Option<u64>,
    pub text: String,
}

/// Reads an OpenAI-style SSE stream to its end, timing its content chunks from `started`.
pub async fn read_stream(
    mut body: hyper::body::Incoming,
    started: tokio::time::Instant,
) -> Result<StreamTimings, String> {
    let mut timings = StreamTimings {
        ttft_ms: None,
        last_content_ms: 0.0,
        content_chunks: 0,
        completion_tokens: None,
        text: String::new(),
    };
    let mut buffer = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        let Ok(data) = frame.into_data() else { continue };
        buffer.extend_from_slice(&data);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            let line = String::from_utf8_lossy(&event);
            let Some(payload) = line.trim().strip_prefix("data: ") else { continue };
            if payload == "[DONE]" {
                continue;
            }
            let value: serde_json::Value = serde_json::from_str(payload).map_err(|e| e.to_string())?;
            if value.get("error").is_some() {
                return Err(format!("stream error: {payload}"));
            }
            if let Some(tokens) = value["usage"]["completion_tokens"].as_u64() {
                timings.completion_tokens = Some(tokens);
            }
            if let Some(delta) = value["choices"][0]["delta"]["content"].as_str() {
                if !delta.is_empty() {
                    let at_ms = crate::clock::since(started).as_secs_f64() * 1000.0;
                    timings.ttft_ms.get_or_insert(at_ms);
                    timings.last_content_ms = at_ms;
                    timings.content_chunks += 1;
                }
                timings.text.push_str(delta);
            }
        }
    }
    Ok(timings)
}

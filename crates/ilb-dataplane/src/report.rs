//! The reporter: every period, tells the control plane what this data plane saw — demand per
//! traffic class (smoothed req/s), and per engine the attempts, errors, mean time to first byte
//! and duration through the proxy, the mean time to the first chunk of streamed responses and
//! between their chunks (the latency the control plane plans on for engines that expose no
//! latency histograms, such as llama.cpp), in-flight count and a measured round-trip time.
//!
//! Without `--peer`, each report also carries what this data plane decided since the previous
//! one (new and moved conversations and stored responses, not its requests in flight: `replicas`),
//! and the control plane's answer carries what the cluster's other data planes reported, which
//! this one learns as it would a peer's message (`ilb_controlplane::api::relay`).
//!
//! Reporting is best effort and off the request path: a control plane that is down only means
//! reports are dropped; routing goes on with the installed snapshot.

use crate::clock;
use crate::engines::EngineCounters;
use crate::shared::Shared;
use crate::state::Installed;
use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt, Full, Limited};
use ilb_core::metrics::OUTPUT_TOKEN_BUCKETS;
use ilb_core::priority::{PerPriority, Priority};
use ilb_core::report::{ClassDemand, EngineObservation, PriorityRps, Report, ReportAnswer, TokenCounts};
use ilb_core::{ClassId, EngineId, ModelName};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub use crate::config::ReportConfig;

#[derive(Default, Clone, Copy)]
struct EngineMark {
    attempts: u64,
    failures: u64,
    ttfb_us: u64,
    ttfb_n: u64,
    duration_us: u64,
    duration_n: u64,
    first_chunk_us: u64,
    first_chunk_n: u64,
    chunk_gap_us: u64,
    chunk_gap_n: u64,
    output_tokens: [u64; OUTPUT_TOKEN_BUCKETS.len() + 1],
    output_tokens_sum: u64,
}

struct ClassMark {
    arrivals: u64,
    shed: u64,
    rps: Option<f64>,
    /// Arrivals and smoothed rate per priority.
    by_priority: PerPriority<u64>,
    priority_rps: Option<PerPriority<f64>>,
}

/// The smoothed rate after a period with `rate`: the first period's rate as it is.
fn smooth(previous: Option<f64>, rate: f64, alpha: f64) -> f64 {
    match previous {
        None => rate,
        Some(prev) => prev + alpha * (rate - prev),
    }
}

/// What the reporter carries from one period to the next: each engine's and class's counters
/// as last read, the smoothed rates, the round trips, and the next engines to probe.
#[derive(Default)]
struct Marks {
    engines: HashMap<EngineId, EngineMark>,
    classes: HashMap<(ModelName, ClassId), ClassMark>,
    rtt: HashMap<EngineId, f64>,
    next_probe: usize,
}

/// Runs until shutdown.
pub async fn run(shared: Arc<Shared>, config: ReportConfig, mut shutdown: watch::Receiver<bool>) {
    let mut marks = Marks::default();
    let mut cursors = crate::replicas::Cursors::default();
    let mut scratch = Vec::new();
    let relay = shared.config.peers.is_empty();
    let mut sequence = 0u64;
    let mut last = clock::now();
    let mut interval = tokio::time::interval(config.interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(installed) = shared.routing.current() else { continue };
        let now = clock::now();
        let period = now.duration_since(last);
        last = now;
        let secs = period.as_secs_f64().max(1e-3);
        let alpha = 1.0 - (-secs / config.smoothing.as_secs_f64().max(1e-3)).exp();
        marks.probe_round_trips(&shared, &installed, config.rtt_probes_per_period).await;
        sequence += 1;
        let report = Report {
            cluster: installed.table.cluster.clone(),
            instance: config.instance.clone(),
            sequence,
            period_ms: period.as_millis() as u64,
            snapshot_version: installed.table.version.0,
            demand: marks.demand(&installed, secs, alpha),
            engines: marks.observations(&installed),
            // Placements and stored responses only: counts a report period old sent every
            // replica's new conversations to the engine that had looked idle a second ago (the
            // fleet simulator's `replicas` scenario: p99 909 ms with them, 792 without, one data
            // plane 732).
            replica: relay.then(|| crate::replicas::collect(&shared, &mut cursors, &mut scratch)),
        };
        // To every replica at once: one that hangs must not delay the others.
        let sends = std::iter::once(&config.url).chain(&config.also).map(|url| {
            let (shared, config, report) = (&shared, &config, &report);
            async move {
                match send(shared, url, config, report).await {
                    Ok(answer) => {
                        for deltas in &answer.replicas {
                            if let Err(e) = crate::replicas::learn(shared, deltas) {
                                tracing::debug!(%url, error = %e, "relayed deltas not learned");
                            }
                        }
                    }
                    Err(e) => tracing::debug!(%url, error = %e, "report not delivered"),
                }
            }
        });
        futures_util::future::join_all(sends).await;
    }
}

impl Marks {
    /// Measures the round trip to the next `count` engines (a few per period, in turn).
    async fn probe_round_trips(&mut self, shared: &Shared, installed: &Installed, count: usize) {
        let n = installed.engines.len();
        for i in 0..count.min(n) {
            let engine = &installed.engines[(self.next_probe + i) % n];
            if let Some(ms) = measure_rtt(shared, &engine.origin.base_url).await {
                let e = self.rtt.entry(engine.id.clone()).or_insert(ms);
                *e += 0.3 * (ms - *e);
            }
        }
        self.next_probe = (self.next_probe + count) % n.max(1);
    }

    /// Each class's arrivals and sheds since the last period, and its smoothed rates (in all
    /// and per priority).
    fn demand(&mut self, installed: &Installed, secs: f64, alpha: f64) -> Vec<ClassDemand> {
        let mut demand = Vec::new();
        for model in installed.table.models() {
            for class in &model.classes {
                let state = &installed.classes[class.seq];
                let (arrivals, shed) = (state.arrivals.load(Relaxed), state.shed.load(Relaxed));
                let by_priority = state.priority.arrivals.map(|count| count.load(Relaxed));
                let mark = self.classes.entry((model.name.clone(), class.id.clone())).or_insert(ClassMark {
                    arrivals,
                    shed,
                    rps: None,
                    by_priority,
                    priority_rps: None,
                });
                let requests = arrivals.saturating_sub(mark.arrivals);
                let rps = smooth(mark.rps, requests as f64 / secs, alpha);
                let priority_rps = PerPriority::from_fn(|p: Priority| {
                    let rate = by_priority[p].saturating_sub(mark.by_priority[p]) as f64 / secs;
                    smooth(mark.priority_rps.map(|r| r[p]), rate, alpha)
                });
                demand.push(ClassDemand {
                    model: model.name.clone(),
                    class: class.id.clone(),
                    requests,
                    shed: shed.saturating_sub(mark.shed),
                    rps,
                    by_priority: Some(PriorityRps::from_array(priority_rps.0)),
                });
                *mark = ClassMark {
                    arrivals,
                    shed,
                    rps: Some(rps),
                    by_priority,
                    priority_rps: Some(priority_rps),
                };
            }
        }
        demand
    }

    /// What the proxy saw of each engine since the last period.
    fn observations(&mut self, installed: &Installed) -> Vec<EngineObservation> {
        let observations = installed
            .engines
            .iter()
            .map(|engine| {
                let current = EngineMark::read(&engine.counters);
                let before = self.engines.insert(engine.id.clone(), current).unwrap_or(current);
                // An engine that left the snapshot and came back has fresh counters: count
                // from zero rather than subtract past it.
                let before = if current.attempts < before.attempts
                    || current.ttfb_n < before.ttfb_n
                    || current.duration_n < before.duration_n
                {
                    EngineMark::default()
                } else {
                    before
                };
                let mean_ms = |sum: u64, n: u64| (n > 0).then(|| sum as f64 / n as f64 / 1000.0);
                EngineObservation {
                    engine: engine.id.clone(),
                    requests: current.attempts.saturating_sub(before.attempts),
                    errors: current.failures.saturating_sub(before.failures),
                    ttfb_ms: mean_ms(current.ttfb_us - before.ttfb_us, current.ttfb_n - before.ttfb_n),
                    duration_ms: mean_ms(
                        current.duration_us - before.duration_us,
                        current.duration_n - before.duration_n,
                    ),
                    first_chunk_ms: mean_ms(
                        current.first_chunk_us - before.first_chunk_us,
                        current.first_chunk_n - before.first_chunk_n,
                    ),
                    streams: current.first_chunk_n - before.first_chunk_n,
                    chunk_gap_ms: mean_ms(
                        current.chunk_gap_us - before.chunk_gap_us,
                        current.chunk_gap_n - before.chunk_gap_n,
                    ),
                    chunk_gaps: current.chunk_gap_n - before.chunk_gap_n,
                    rtt_ms: self.rtt.get(&engine.id).copied(),
                    in_flight: engine.in_flight.load(Relaxed) as u64,
                    output_tokens: token_counts(&current, &before),
                }
            })
            .collect();
        // Forget the marks of engines that left, so they do not pile up as the fleet changes.
        self.engines.retain(|id, _| installed.engines.iter().any(|e| e.id == *id));
        observations
    }
}

/// The answers' generated tokens counted since `before`, if any ended.
fn token_counts(current: &EngineMark, before: &EngineMark) -> Option<TokenCounts> {
    let buckets: Vec<u64> = current
        .output_tokens
        .iter()
        .zip(&before.output_tokens)
        .map(|(now, then)| now.saturating_sub(*then))
        .collect();
    let counts =
        TokenCounts { buckets, sum: current.output_tokens_sum.saturating_sub(before.output_tokens_sum) };
    (counts.count() > 0).then_some(counts)
}

impl EngineMark {
    fn read(c: &EngineCounters) -> EngineMark {
        let (output_tokens, output_tokens_sum) = c.output_tokens.read();
        EngineMark {
            attempts: c.attempts.load(Relaxed),
            failures: c.failures.load(Relaxed),
            ttfb_us: c.ttfb.sum_micros(),
            ttfb_n: c.ttfb.count(),
            duration_us: c.duration.sum_micros(),
            duration_n: c.duration.count(),
            first_chunk_us: c.first_chunk.sum_micros(),
            first_chunk_n: c.first_chunk.count(),
            chunk_gap_us: c.chunk_gap.sum_micros(),
            chunk_gap_n: c.chunk_gap.count(),
            output_tokens,
            output_tokens_sum,
        }
    }
}

/// Posts `report`; the control plane's answer (the other data planes' deltas), which an older
/// control plane that answers without them leaves empty.
async fn send(
    shared: &Shared,
    url: &str,
    config: &ReportConfig,
    report: &Report,
) -> Result<ReportAnswer, String> {
    let body = serde_json::to_vec(report).map_err(|e| e.to_string())?;
    let mut request = Request::post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    if let Some(token) = &config.token {
        let value = header::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|e| e.to_string())?;
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    let response = tokio::time::timeout(Duration::from_secs(5), shared.control_plane_client.request(request))
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| crate::error::error_chain(&e))?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let body = tokio::time::timeout(
        Duration::from_secs(5),
        Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect(),
    )
    .await
    .map_err(|_| "answer timed out".to_owned())?
    .map_err(|e| format!("reading the answer: {e}"))?
    .to_bytes();
    let answer: ReportAnswer = serde_json::from_slice(&body).unwrap_or_default();
    for deltas in &answer.replicas {
        deltas.validate().map_err(|e| format!("relayed deltas: {e}"))?;
    }
    Ok(answer)
}

/// Largest answer to a report read: the deltas of many replicas.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Round trip of `GET /health`, ms.
async fn measure_rtt(shared: &Shared, base_url: &str) -> Option<f64> {
    let request = Request::get(format!("{base_url}/health")).body(Full::new(Bytes::new())).ok()?;
    let started = clock::now();
    let response =
        tokio::time::timeout(Duration::from_secs(1), shared.client.request(request)).await.ok()?.ok()?;
    let ms = clock::since(started).as_secs_f64() * 1000.0;
    response.status().is_success().then_some(ms)
}

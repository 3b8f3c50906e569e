//! Background tasks that keep the routing state current without touching the request path:
//! the snapshot poller (HTTP with ETag and long-poll), quick-mode discovery (build a snapshot
//! from engines' `/v1/models`), and the prober that readmits ejected engines.

use crate::error::error_chain;
use crate::shared::{HttpClient, Shared};
use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use ilb_core::snapshot::{
    ClassRoutes, EngineEntry, EngineWeight, ModelRoutes, Snapshot, FORMAT, MAX_SNAPSHOT_BYTES,
};
use ilb_core::{ClassId, ClusterId, EngineId, ModelName, SnapshotVersion};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub use crate::config::SnapshotSource;

/// Polls the first of `urls` (one per control-plane replica, each a snapshot URL) until
/// shutdown, installing every new snapshot, and moves to the next replica as soon as the one
/// it pulls from fails to answer (refused, reset, an error status, or no answer within the
/// long-poll's bound). A replica's snapshot older than the installed one is refused (see
/// `state.rs`) and its tag remembered, so the long poll waits for that replica's next, newer
/// version rather than fetching the old one again. After a whole round of failures it pauses
/// `interval`.
pub async fn poll(
    shared: Arc<Shared>,
    urls: Vec<String>,
    interval: Duration,
    long_poll: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    if urls.is_empty() {
        return;
    }
    let mut active = 0usize;
    let mut failures_in_a_row = 0usize;
    let mut etag: Option<String> = None;
    let mut rejected_in_a_row = 0u32;
    let wait = Duration::from_secs(25);
    loop {
        let url = &urls[active];
        let target = if long_poll {
            format!("{url}{}wait={}s", if url.contains('?') { '&' } else { '?' }, wait.as_secs())
        } else {
            url.clone()
        };
        let timeout = if long_poll { wait + Duration::from_secs(10) } else { Duration::from_secs(10) };
        let fetched = tokio::select! {
            r = tokio::time::timeout(timeout, fetch(&shared.control_plane_client, &target, etag.as_deref())) => r,
            _ = shutdown.changed() => return,
        };
        let mut failed = true;
        match fetched {
            Err(_) => tracing::warn!(%url, "snapshot poll timed out"),
            Ok(Err(e)) => tracing::warn!(%url, error = %e, "snapshot poll failed"),
            Ok(Ok(None)) => failed = false,
            Ok(Ok(Some((bytes, new_etag)))) => {
                failed = false;
                // Whatever happens to it, this version was seen: the long poll waits for the
                // next one rather than fetching it again.
                etag = new_etag;
                match shared.install_json(&bytes) {
                    Ok(()) => rejected_in_a_row = 0,
                    Err(e @ crate::state::InstallError::Stale { .. }) => {
                        tracing::debug!(%url, error = %e, "snapshot older than the installed one; waiting for a newer one");
                    }
                    Err(e) => {
                        // A control plane that keeps offering a snapshot this data plane refuses
                        // (or ignores the tag) must not make it spin: back off.
                        rejected_in_a_row += 1;
                        let pause = rejection_backoff(rejected_in_a_row, shared.trace_seed);
                        tracing::warn!(%url, error = %e, retry_in_ms = pause.as_millis() as u64, "snapshot rejected; keeping the installed one");
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = shutdown.changed() => return,
                        }
                    }
                }
            }
        }
        if failed {
            failures_in_a_row += 1;
            if urls.len() > 1 {
                active = (active + 1) % urls.len();
                etag = None;
                tracing::warn!(url = %urls[active], "pulling snapshots from another control-plane replica");
            }
        } else {
            failures_in_a_row = 0;
        }
        // A long poll returns as soon as there is news; otherwise (or after a round of
        // errors) pace.
        if (failed && failures_in_a_row >= urls.len()) || (!failed && !long_poll) {
            failures_in_a_row = 0;
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// The first pause after a refused snapshot; it doubles with each refusal in a row...
const REJECTION_BACKOFF_BASE: Duration = Duration::from_millis(500);
/// ...up to this bound.
const REJECTION_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The pause after the `n`-th refused snapshot in a row (n ≥ 1): exponential up to
/// [`REJECTION_BACKOFF_MAX`], each drawn in [½, 1] of its bound with a jitter that differs
/// between data planes (`seed`), so that a fleet of them does not poll in lockstep.
fn rejection_backoff(n: u32, seed: u64) -> Duration {
    let bound = REJECTION_BACKOFF_BASE.saturating_mul(1 << (n.max(1) - 1).min(16)).min(REJECTION_BACKOFF_MAX);
    let unit = (ilb_core::slots::mix(seed ^ u64::from(n)) >> 11) as f64 / (1u64 << 53) as f64;
    bound.mul_f64(0.5 + 0.5 * unit)
}

/// GET with `If-None-Match` through `client`; `Ok(None)` on 304.
pub(crate) async fn fetch(
    client: &HttpClient,
    url: &str,
    etag: Option<&str>,
) -> Result<Option<(Bytes, Option<String>)>, String> {
    let mut request = Request::get(url).body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
    if let Some(tag) = etag.and_then(|t| header::HeaderValue::from_str(t).ok()) {
        request.headers_mut().insert(header::IF_NONE_MATCH, tag);
    }
    let response = client.request(request).await.map_err(|e| error_chain(&e))?;
    let status = response.status();
    if status == StatusCode::NOT_MODIFIED {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(format!("status {status}"));
    }
    let new_etag = response.headers().get(header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = Limited::new(response.into_body(), MAX_SNAPSHOT_BYTES)
        .collect()
        .await
        .map_err(|e| format!("reading body: {e}"))?
        .to_bytes();
    Ok(Some((body, new_etag)))
}

/// Quick mode: asks every engine for its models and installs an equal-weight snapshot; asks
/// again every `interval` (sooner while some engine has not answered).
pub async fn discover(
    shared: Arc<Shared>,
    engines: Vec<String>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut known: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut objects: BTreeMap<String, crate::shared::ModelObjects> = BTreeMap::new();
    let mut installed: Option<BTreeMap<String, Vec<String>>> = None;
    let mut version = 0u64;
    loop {
        let mut all_answered = true;
        for url in &engines {
            match fetch(&shared.client, &format!("{}/v1/models", url.trim_end_matches('/')), None).await {
                Ok(Some((body, _))) => match parse_model_list(&body) {
                    Some(models) => {
                        known.insert(url.clone(), models.keys().cloned().collect());
                        objects.insert(url.clone(), models);
                    }
                    None => {
                        all_answered = false;
                        tracing::warn!(engine = %url, "engine's /v1/models is not an OpenAI model list");
                    }
                },
                _ => {
                    all_answered = false;
                    tracing::debug!(engine = %url, "engine did not answer /v1/models yet");
                }
            }
        }
        // The first engine (in URL order) that lists a model speaks for its fields.
        let mut served = crate::shared::ModelObjects::new();
        for models in objects.values() {
            for (id, object) in models {
                served.entry(id.clone()).or_insert_with(|| object.clone());
            }
        }
        if **shared.model_objects.load() != served {
            shared.model_objects.store(Arc::new(served));
        }
        if !known.is_empty() && installed.as_ref() != Some(&known) {
            version += 1;
            match shared.install(&equal_weight_snapshot(&known, version)) {
                Ok(()) => installed = Some(known.clone()),
                Err(e) => tracing::warn!(error = %e, "discovered snapshot rejected"),
            }
        }
        let pause = if all_answered { interval } else { Duration::from_millis(500) };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// An OpenAI model list's objects by id, each kept whole (engines add their own fields).
fn parse_model_list(body: &[u8]) -> Option<crate::shared::ModelObjects> {
    #[derive(serde::Deserialize)]
    struct List {
        data: Vec<serde_json::Map<String, serde_json::Value>>,
    }
    let list: List = serde_json::from_slice(body).ok()?;
    list.data.into_iter().map(|object| Some((object.get("id")?.as_str()?.to_owned(), object))).collect()
}

/// One class per model, every engine that serves it at weight 1.
pub fn equal_weight_snapshot(engines: &BTreeMap<String, Vec<String>>, version: u64) -> Snapshot {
    let mut by_model: BTreeMap<&str, Vec<EngineWeight>> = BTreeMap::new();
    let mut entries = Vec::new();
    for (url, models) in engines {
        let origin = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")).unwrap_or(url);
        let id = EngineId::new(origin.trim_end_matches('/'));
        for model in models {
            by_model.entry(model).or_default().push(EngineWeight {
                engine: id.clone(),
                weight: 1.0,
                expected_latency_ms: None,
                network_ms: None,
                in_flight_ms: None,
            });
        }
        entries.push(EngineEntry {
            id,
            url: url.clone(),
            region: String::new(),
            capabilities: Vec::new(),
            residency: Vec::new(),
            max_in_flight: 0,
        });
    }
    Snapshot {
        format: FORMAT,
        version: SnapshotVersion(version),
        created_unix_ms: crate::clock::unix_ms(),
        cluster: ClusterId::new("local"),
        utilisation: 0.0,
        engines: entries,
        models: by_model
            .into_iter()
            .map(|(model, weights)| ModelRoutes {
                model: ModelName::new(model),
                classes: vec![ClassRoutes {
                    id: ClassId::new("default"),
                    require: Vec::new(),
                    residency: None,
                    weights,
                    shed_fraction: 0.0,
                }],
            })
            .collect(),
    }
}

/// Readmits ejected engines whose `/health` answers 200 once their back-off has passed.
pub async fn probe_ejected(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(shared.config.probe_interval) => {}
            _ = shutdown.changed() => return,
        }
        let now = shared.now_ms();
        shared.pool_clock.set_ms(now);
        let Some(installed) = shared.routing.current() else { continue };
        for engine in installed.engines.iter() {
            engine.pool.sweep(now, &shared.config.upstream_pool);
        }
        for engine in installed.engines.iter().filter(|e| e.probe_due(now)) {
            // Push the next probe out first so a slow probe is not started twice.
            engine.probe_failed(now, &shared.config.guard);
            let (shared, engine) = (Arc::clone(&shared), Arc::clone(engine));
            tokio::spawn(async move {
                let url = format!("{}/health", engine.origin.base_url);
                let healthy = matches!(
                    tokio::time::timeout(Duration::from_secs(1), fetch(&shared.client, &url, None)).await,
                    Ok(Ok(Some(_)))
                );
                if healthy {
                    tracing::info!(engine = %engine.id, "engine readmitted after a healthy probe");
                    engine.readmit(&shared.config.guard);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_backoff_doubles_to_its_bound_with_jitter() {
        for seed in [0, 1, 0xdead_beef] {
            for n in 1..40 {
                let bound = (REJECTION_BACKOFF_BASE * 2u32.pow((n - 1).min(16))).min(REJECTION_BACKOFF_MAX);
                let pause = rejection_backoff(n, seed);
                assert!(pause >= bound / 2 && pause <= bound, "n={n}: {pause:?} against {bound:?}");
            }
        }
        assert_ne!(rejection_backoff(3, 1), rejection_backoff(3, 2), "data planes draw different pauses");
    }
}

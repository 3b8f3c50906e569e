//! The data planes of one front-end cluster share what they decide (`--peer URL`).
//!
//! A cluster runs several data planes behind one Service and each request may reach any of
//! them. Each one's affinity table, stored-response table and in-flight counts cover only the
//! requests it saw, so a follow-up that reaches another replica than the one that placed its
//! conversation lands where that replica's hash and counts say, away from its KV cache, and
//! each replica places new conversations by a quarter of the load. So each data plane sends its
//! peers ([`ilb_core::deltas::Deltas`]), whenever a request starts or ends (at most once per
//! [`MIN_GAP`]) and at least every `peer_interval` (200 ms by default):
//!
//! - the affinity keys it placed or moved, and the response ids whose engine it learned, from
//!   the tables' journals (`ilb_core::affinity`), each with the engine it names now;
//! - its requests in flight per engine, which each peer adds to its own counts when it picks
//!   (`EngineState::peer_in_flight`, `ClassState::peer_in_flight`) until the sender falls
//!   silent for [`stale_after`].
//!
//! Sending on every change, not once a period, is for conversations that start together: with
//! four replicas in front of two real engines, two conversations starting 2 ms apart at two
//! replicas both went to the same engine when each counted the other's load only from the
//! last period's message. A peer folds a message into its counts when it arrives.
//!
//! No consensus: the last writer wins, and a lost delta costs one cache miss, never a failed
//! request. The request path only pays for its table writes (one swap, and for a new or moved
//! key one add and one store) and one more atomic load per candidate; sending, receiving and
//! folding run here, in a background task and on the admin listener. A peer that hangs holds
//! one delivery for at most `peer_timeout` and is skipped while it does; a malformed or
//! oversized message is refused with a 400 or 413 and a logged warning.
//!
//! Peers are base URLs. An `http://` host name counts as every address it resolves to
//! (re-resolved every [`RESOLVE_EVERY`]), so one headless-Service name covers all replicas;
//! this data plane's own messages come back to it and are recognised by their instance name.

use crate::body::{json_response, ProxyBody};
use crate::shared::{PeerLoad, Shared};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use ilb_core::affinity::{affinity_tag, Change};
use ilb_core::deltas::{Deltas, DeltasError, MAX_BYTES};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Where peers `POST` their deltas (the admin listener, else the client listener).
pub const PATH: &str = "/v1/replicas/deltas";

/// Most peers whose load is kept; a message from a further one is refused.
const MAX_PEERS: usize = 256;

/// How often peer host names are resolved again.
pub(crate) const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// The shortest time between two messages: under constant change, 200 a second to each peer.
pub const MIN_GAP: Duration = Duration::from_millis(5);

/// How long a peer's in-flight figures count after its last message.
pub fn stale_after(shared: &Shared) -> Duration {
    shared.config.peer_interval * 5 + shared.config.peer_timeout
}

/// This process's name among the replicas (random per process).
fn instance(shared: &Shared) -> String {
    format!("{:016x}", shared.trace_seed)
}

/// `POST /v1/replicas/deltas`: learns a peer's message (204), or refuses it (400, 413) with a
/// logged warning.
pub async fn receive(shared: &Shared, req: Request<Incoming>) -> Response<ProxyBody> {
    if req.method() != Method::POST {
        let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
        return crate::error::ProxyError::MethodNotAllowed { method, path, allow: "POST" }.into_response();
    }
    let collect = Limited::new(req.into_body(), MAX_BYTES).collect();
    let parsed = match tokio::time::timeout(shared.config.timeouts.client_body, collect).await {
        Ok(Ok(body)) => Deltas::parse(&body.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(DeltasError::TooLarge(MAX_BYTES + 1)),
        Ok(Err(e)) => return refuse(shared, StatusCode::BAD_REQUEST, &format!("reading deltas: {e}")),
        Err(_) => return refuse(shared, StatusCode::REQUEST_TIMEOUT, "deltas body not sent in time"),
    };
    match parsed {
        Ok(deltas) => match learn(shared, &deltas) {
            Ok(()) => {
                let mut response = Response::new(ProxyBody::from(Bytes::new()));
                *response.status_mut() = StatusCode::NO_CONTENT;
                response
            }
            Err(e) => refuse(shared, StatusCode::TOO_MANY_REQUESTS, &e),
        },
        Err(e @ DeltasError::TooLarge(_)) => refuse(shared, StatusCode::PAYLOAD_TOO_LARGE, &e.to_string()),
        Err(e) => refuse(shared, StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

fn refuse(shared: &Shared, status: StatusCode, message: &str) -> Response<ProxyBody> {
    shared.peers.messages_refused.fetch_add(1, Relaxed);
    tracing::warn!(%status, error = %message, "replica deltas refused");
    let body = serde_json::json!({"error": {"message": message, "type": "invalid_request_error"}});
    json_response(status, &body)
}

/// Takes in a peer's message: its table entries (last writer wins) and its load. Its own
/// messages (sent to a name that resolves to it too) are ignored.
pub(crate) fn learn(shared: &Shared, deltas: &Deltas) -> Result<(), String> {
    if deltas.instance == instance(shared) {
        return Ok(());
    }
    let now_ms = shared.now_ms();
    {
        let mut loads = shared.peers.loads.lock().unwrap_or_else(|p| p.into_inner());
        if loads.len() >= MAX_PEERS && !loads.contains_key(&deltas.instance) {
            let stale = stale_after(shared).as_millis() as u64;
            loads.retain(|_, load| now_ms.saturating_sub(load.at_ms) <= stale);
            if loads.len() >= MAX_PEERS {
                return Err(format!("more than {MAX_PEERS} peers are sending deltas"));
            }
        }
        let in_flight = deltas.in_flight.clone();
        loads.insert(deltas.instance.clone(), PeerLoad { at_ms: now_ms, in_flight });
    }
    let now_s = (shared.pool_clock.ms() / 1000) as u32;
    for change in Deltas::changes(&deltas.affinity) {
        shared.affinity.learn(change, now_s);
    }
    for change in Deltas::changes(&deltas.responses) {
        shared.responses.learn(change, now_s);
    }
    let learned = (deltas.affinity.len() + deltas.responses.len()) as u64;
    shared.peers.entries_learned.fetch_add(learned, Relaxed);
    shared.peers.messages_received.fetch_add(1, Relaxed);
    fold_loads(shared);
    Ok(())
}

/// Sets the installed engines' and classes' peer counts from the peers' latest messages
/// (those older than [`stale_after`] count no more). Under the loads' lock, so that of two
/// folds at once the later one's figures stay.
pub(crate) fn fold_loads(shared: &Shared) {
    let Some(installed) = shared.routing.current() else { return };
    let now_ms = shared.now_ms();
    let stale = stale_after(shared).as_millis() as u64;
    let mut by_tag: HashMap<u32, u32> = HashMap::new();
    let mut loads = shared.peers.loads.lock().unwrap_or_else(|p| p.into_inner());
    loads.retain(|_, load| now_ms.saturating_sub(load.at_ms) <= stale);
    for (tag, count) in loads.values().flat_map(|load| load.in_flight.iter()) {
        let sum = by_tag.entry(*tag).or_default();
        *sum = sum.saturating_add(*count);
    }
    for engine in &installed.engines {
        let count = by_tag.get(&affinity_tag(engine.id.as_str())).copied().unwrap_or(0);
        engine.peer_in_flight.store(count, Relaxed);
    }
    // A class's figure sums its candidates' engines (an engine shared by several classes
    // counts the peers' requests of all of them: they do not say which class they were).
    for class in installed.table.models().flat_map(|model| model.classes.iter()) {
        let sum = class
            .candidates
            .iter()
            .map(|c| installed.engines[c.engine_idx].peer_in_flight.load(Relaxed))
            .fold(0u32, u32::saturating_add);
        installed.classes[class.seq].peer_in_flight.store(sum, Relaxed);
    }
}

/// Where the next message starts in each table's journal.
#[derive(Default)]
pub(crate) struct Cursors {
    affinity: u64,
    responses: u64,
}

/// What changed in this data plane's tables since the previous message, with no load: the
/// message relayed through the control plane, whose counts would be a report period old
/// (`report.rs`). [`with_load`] adds the counts for peers.
pub(crate) fn collect(shared: &Shared, cursors: &mut Cursors, scratch: &mut Vec<Change>) -> Deltas {
    let now_s = (shared.pool_clock.ms() / 1000) as u32;
    scratch.clear();
    shared.affinity.changes_since(&mut cursors.affinity, now_s, scratch);
    let affinity = Deltas::list(scratch);
    scratch.clear();
    shared.responses.changes_since(&mut cursors.responses, now_s, scratch);
    let responses = Deltas::list(scratch);
    Deltas { instance: instance(shared), affinity, responses, in_flight: Vec::new() }
}

/// `deltas` with this data plane's requests in flight per engine now.
fn with_load(shared: &Shared, mut deltas: Deltas) -> Deltas {
    deltas.in_flight = shared
        .routing
        .current()
        .map(|installed| {
            installed
                .engines
                .iter()
                .map(|e| (affinity_tag(e.id.as_str()), e.in_flight.load(Relaxed)))
                .filter(|&(_, n)| n > 0)
                .take(ilb_core::deltas::MAX_ENTRIES)
                .collect()
        })
        .unwrap_or_default();
    deltas
}

/// One place deltas go: a peer's address, and whether a delivery to it is under way.
struct Target {
    url: String,
    busy: AtomicBool,
    failing: AtomicBool,
}

/// Sends deltas to `peers` when this data plane's load changes (at most once per [`MIN_GAP`])
/// and at least every `peer_interval`, until shutdown; drops the loads of peers that fell
/// silent.
pub async fn run(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let peers = shared.config.peers.clone();
    let mut targets: HashMap<String, Arc<Target>> = HashMap::new();
    let mut resolved_at: Option<tokio::time::Instant> = None;
    let mut cursors = Cursors::default();
    let mut scratch = Vec::new();
    let mut deliveries = JoinSet::new();
    let mut tick = tokio::time::interval(shared.config.peer_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shared.peers.changed.notified() => {}
            _ = shutdown.changed() => return,
        }
        if resolved_at.is_none_or(|at| crate::clock::since(at) >= RESOLVE_EVERY) {
            resolved_at = Some(crate::clock::now());
            let urls = resolve(&peers).await;
            if !urls.is_empty() {
                targets = retarget(targets, urls);
            }
        }
        while deliveries.try_join_next().is_some() {}
        let deltas = with_load(&shared, collect(&shared, &mut cursors, &mut scratch));
        match serde_json::to_vec(&deltas) {
            Ok(body) => {
                let body = Bytes::from(body);
                for target in targets.values() {
                    deliver(&shared, target, body.clone(), &mut deliveries);
                }
            }
            Err(e) => tracing::error!(error = %e, "replica deltas not serialised"),
        }
        fold_loads(&shared);
        // Changes meanwhile leave the notification's permit: they go out after the gap.
        tokio::select! {
            () = tokio::time::sleep(MIN_GAP) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// The targets for `urls`, keeping the state of those already known.
fn retarget(mut old: HashMap<String, Arc<Target>>, urls: Vec<String>) -> HashMap<String, Arc<Target>> {
    urls.into_iter()
        .map(|url| {
            let target = old.remove(&url).unwrap_or_else(|| {
                Arc::new(Target {
                    url: url.clone(),
                    busy: AtomicBool::new(false),
                    failing: AtomicBool::new(false),
                })
            });
            (url, target)
        })
        .collect()
}

/// Every peer's delta URL: an `http://` host name as each of its addresses, anything else
/// as given. A name that does not resolve is logged and left out this time.
async fn resolve(peers: &[String]) -> Vec<String> {
    let mut urls = Vec::new();
    for peer in peers {
        let Ok(uri) = peer.parse::<http::Uri>() else { continue };
        let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_owned();
        let is_name = host.parse::<std::net::IpAddr>().is_err();
        if uri.scheme_str() != Some("http") || !is_name {
            urls.push(format!("{peer}{PATH}"));
            continue;
        }
        let port = uri.port_u16().unwrap_or(80);
        match tokio::net::lookup_host(format!("{host}:{port}")).await {
            Ok(addrs) => {
                let base = uri.path().trim_end_matches('/');
                urls.extend(addrs.map(|addr| format!("http://{addr}{base}{PATH}")));
            }
            Err(e) => tracing::warn!(peer = %peer, error = %e, "replica peer name did not resolve"),
        }
    }
    urls.sort();
    urls.dedup();
    urls
}

/// Posts `body` to `target` in its own task, unless the previous delivery is still under way
/// (a hanging peer holds one task for at most `peer_timeout`, and loses the deltas meanwhile).
fn deliver(shared: &Arc<Shared>, target: &Arc<Target>, body: Bytes, deliveries: &mut JoinSet<()>) {
    if target.busy.swap(true, Relaxed) {
        shared.peers.sends_skipped.fetch_add(1, Relaxed);
        return;
    }
    let (shared, target) = (Arc::clone(shared), Arc::clone(target));
    deliveries.spawn(async move {
        let sent = tokio::time::timeout(shared.config.peer_timeout, post(&shared, &target.url, body)).await;
        let result =
            sent.unwrap_or_else(|_| Err(format!("no answer within {:?}", shared.config.peer_timeout)));
        match result {
            Ok(()) => {
                shared.peers.messages_sent.fetch_add(1, Relaxed);
                if target.failing.swap(false, Relaxed) {
                    tracing::info!(peer = %target.url, "replica peer takes deltas again");
                }
            }
            Err(error) => {
                shared.peers.send_failures.fetch_add(1, Relaxed);
                if !target.failing.swap(true, Relaxed) {
                    tracing::warn!(peer = %target.url, %error, "replica deltas not delivered");
                }
            }
        }
        target.busy.store(false, Relaxed);
    });
}

async fn post(shared: &Shared, url: &str, body: Bytes) -> Result<(), String> {
    let request = Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let response = shared.client.request(request).await.map_err(|e| crate::error::error_chain(&e))?;
    let status = response.status();
    // Drain the (small) answer so that the connection is reused.
    let _ = Limited::new(response.into_body(), 64 << 10).collect().await;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("status {status}"))
    }
}

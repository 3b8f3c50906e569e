//! The control plane's HTTP API:
//!
//! | route | what |
//! |---|---|
//! | `GET /v1/snapshots/{cluster}` | the cluster's snapshot; `ETag`, `If-None-Match` → 304, `?wait=30s` long-polls for a newer one |
//! | `POST /v1/reports` | a data plane's report (bearer token if configured) |
//! | `GET /v1/engine-holds` | engines data planes must not send new requests to (asleep, no ready replica, unreachable); `?version=V&wait=5s` long-polls for a different set |
//! | `POST /v1/engines` | register an engine or renew its lease (bearer token, or a verified client certificate) |
//! | `DELETE /v1/engines/{id}` | remove a registered engine now (bearer token, or a verified client certificate) |
//! | `GET /v1/explain/weights?cluster=C&model=M` | every weight of the cluster and model, with the numbers behind it |
//! | `GET /v1/state` | the whole latest plan and fleet view |
//! | `GET /v1/problems/{model}` | the optimizer input of the latest solve, as `ilb optimize` reads it |
//! | `GET /health` | liveness |
//! | `GET /` | the live dashboard |
//! | `GET /metrics` | Prometheus metrics (`ilb_controlplane_*`) |
//!
//! [`engines`] serves `POST /v1/engines` and `DELETE /v1/engines/{id}`.
//!
//! With TLS ([`ApiTls`]) the listener terminates it with a rotatable certificate. With a
//! client CA, data planes authenticate with certificates: `GET /v1/snapshots/...` and
//! `POST /v1/reports` then need a verified client certificate (reports: or the bearer token,
//! if one is set), and the certificate's name is logged and shown in `/v1/state`.

mod engines;
pub mod relay;

use crate::events::Event;
use crate::publish::Publisher;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use ilb_core::report::Report;
use ilb_optimizer::Problem;
use ilb_planning::view::View;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// Largest report body accepted.
const MAX_REPORT_BYTES: usize = 8 << 20;
/// Longest long-poll wait a client may ask for.
const MAX_WAIT: Duration = Duration::from_secs(60);

pub struct ApiState {
    pub publisher: Publisher,
    pub events: mpsc::Sender<Event>,
    pub view: Mutex<Arc<View>>,
    /// The optimizer input of the latest solve per model, as `ilb optimize` reads it.
    pub problems: Mutex<Arc<BTreeMap<String, Problem>>>,
    /// Bearer token of the mutating endpoints; empty: reports need none, registration is off
    /// (unless the client presents a verified certificate).
    pub token: Mutex<String>,
    /// The data planes' fast guard (see [`crate::guard`]).
    pub holds: crate::guard::HoldsPublisher,
    /// The verified client certificate name each data plane's last report came with, by
    /// (cluster, instance).
    pub identities: Mutex<BTreeMap<(String, String), String>>,
    /// Whether the listener serves https.
    pub https: bool,
    /// What each cluster's data planes decided, from their reports to their answers.
    pub relay: relay::Relay,
}

/// TLS settings of a control plane.
#[derive(Clone, Debug, Default)]
pub struct ApiTls {
    /// Terminate TLS on the API listener (its certificate rotates through the handle). If it
    /// verifies client certificates, data planes authenticate with them.
    pub listener: Option<ilb_tls::ServerTls>,
    /// Trust settings for https engines' `/metrics`.
    pub scrape: Option<ilb_tls::ClientTls>,
}

/// Who is on the other end of a connection.
#[derive(Clone, Debug)]
struct Peer {
    /// The name in the client's verified certificate.
    identity: Option<Arc<str>>,
    /// Whether the listener verifies client certificates (then snapshots need one).
    verifies_clients: bool,
}

impl ApiState {
    pub fn view(&self) -> Arc<View> {
        Arc::clone(&self.view.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn set_view(&self, view: View) {
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(view);
    }

    pub fn set_problems(&self, problems: BTreeMap<String, Problem>) {
        *self.problems.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(problems);
    }

    /// Remembers the certificate name a data plane reported with; logs it when it is new or
    /// changed (not per report).
    fn note_identity(&self, report: &Report, identity: &str) {
        let key = (report.cluster.to_string(), report.instance.clone());
        let mut identities = self.identities.lock().unwrap_or_else(|p| p.into_inner());
        if identities.get(&key).map(String::as_str) != Some(identity) {
            tracing::info!(cluster = %key.0, instance = %key.1, identity, "data plane authenticated by client certificate");
            identities.insert(key, identity.to_owned());
        }
    }

    /// The view, its data planes named by their client certificates.
    fn view_with_identities(&self) -> View {
        let mut view = (*self.view()).clone();
        let identities = self.identities.lock().unwrap_or_else(|p| p.into_inner());
        for dp in &mut view.data_planes {
            dp.identity = identities.get(&(dp.cluster.clone(), dp.instance.clone())).cloned();
        }
        view
    }

    fn problems(&self) -> Arc<BTreeMap<String, Problem>> {
        Arc::clone(&self.problems.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

type Body = Full<Bytes>;

/// Serves the API until `shutdown` changes, terminating TLS with `tls` when given. Connections
/// are tracked, and closed before it returns: a control plane that has shut down must not
/// answer a kept-alive connection from its old state (a client would otherwise get a stale
/// snapshot from a replaced process).
pub async fn serve_tls(
    listener: TcpListener,
    state: Arc<ApiState>,
    tls: Option<ilb_tls::ServerTls>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            // Reap finished connections so the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = shutdown.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let tls = tls.clone();
        connections.spawn(async move {
            let Some(tls) = tls else {
                let peer = Peer { identity: None, verifies_clients: false };
                return serve_connection(stream, state, peer).await;
            };
            let stream = match tls.handshake(stream, Duration::from_secs(10)).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::debug!(%error, reason = error.reason(), "tls handshake with a client failed");
                    return;
                }
            };
            let identity =
                stream.get_ref().1.peer_certificates().and_then(|c| c.first()).map(ilb_tls::peer_identity);
            let peer = Peer { identity: identity.map(Arc::from), verifies_clients: tls.verifies_clients() };
            serve_connection(stream, state, peer).await
        });
    }
    connections.shutdown().await;
}

async fn serve_connection<S>(stream: S, state: Arc<ApiState>, peer: Peer)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let (state, peer) = (Arc::clone(&state), peer.clone());
        async move { Ok::<_, Infallible>(dispatch(state, &peer, req).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(10));
    let _ = builder.serve_connection(TokioIo::new(stream), service).await;
}

async fn dispatch(state: Arc<ApiState>, peer: &Peer, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/") | (&Method::GET, "/dashboard") => {
            let mut r = Response::new(Full::new(Bytes::from_static(crate::dashboard::PAGE.as_bytes())));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
            r
        }
        (&Method::GET, "/health") => json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(Full::new(Bytes::from(crate::telemetry::render(&state.view()))));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            r
        }
        (&Method::GET, "/v1/state") => json(StatusCode::OK, &state.view_with_identities()),
        (&Method::GET, "/v1/explain/weights") => explain(&state, &query),
        (&Method::GET, "/v1/engine-holds") if peer.verifies_clients && peer.identity.is_none() => error(
            StatusCode::UNAUTHORIZED,
            "client_certificate_required",
            "engine holds need a client certificate issued by the control plane's client CA",
        ),
        (&Method::GET, "/v1/engine-holds") => holds(&state, &query).await,
        (&Method::POST, "/v1/reports") => report(&state, peer, req).await,
        (&Method::POST, "/v1/engines") => engines::register(&state, peer.identity.is_some(), req).await,
        (&Method::DELETE, p) if p.starts_with("/v1/engines/") => {
            let id = p.trim_start_matches("/v1/engines/").to_owned();
            engines::deregister(&state, peer.identity.is_some(), &req, &id).await
        }
        (&Method::GET, p) if p.starts_with("/v1/problems/") => {
            let model = p.trim_start_matches("/v1/problems/");
            match state.problems().get(model) {
                Some(problem) => json(StatusCode::OK, problem),
                None => error(
                    StatusCode::NOT_FOUND,
                    "model_not_found",
                    &format!("no solve for model '{model}' yet"),
                ),
            }
        }
        (&Method::GET, p) if p.starts_with("/v1/snapshots/") => {
            if peer.verifies_clients && peer.identity.is_none() {
                return error(
                    StatusCode::UNAUTHORIZED,
                    "client_certificate_required",
                    "snapshots need a client certificate issued by the control plane's client CA",
                );
            }
            let cluster = p.trim_start_matches("/v1/snapshots/").to_owned();
            let if_none_match =
                req.headers().get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).map(str::to_owned);
            snapshot(&state, &cluster, if_none_match.as_deref(), &query).await
        }
        _ => error(StatusCode::NOT_FOUND, "not_found", &format!("no route for {} {path}", req.method())),
    }
}

pub fn json(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub(crate) fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    json(
        status,
        &serde_json::json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}}),
    )
}

/// The first value of query parameter `name`, percent- and `+`-decoded (`form_urlencoded`).
fn param<'a>(query: &'a str, name: &str) -> Option<std::borrow::Cow<'a, str>> {
    form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v)
}

/// `30s`, `500ms` or plain seconds.
fn parse_wait(s: &str) -> Option<Duration> {
    let d = if let Some(ms) = s.strip_suffix("ms") {
        Duration::from_millis(ms.parse().ok()?)
    } else {
        // Bounded before it becomes a Duration: `from_secs_f64(1e300)` panics.
        let seconds =
            s.strip_suffix('s').unwrap_or(s).parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)?;
        Duration::from_secs_f64(seconds.min(MAX_WAIT.as_secs_f64()))
    };
    Some(d.min(MAX_WAIT))
}

async fn snapshot(
    state: &ApiState,
    cluster: &str,
    if_none_match: Option<&str>,
    query: &str,
) -> Response<Body> {
    let wait = match param(query, "wait").map(|w| parse_wait(&w)) {
        None => Duration::ZERO,
        Some(Some(d)) => d,
        Some(None) => {
            return error(StatusCode::BAD_REQUEST, "invalid_wait", "wait must look like 30s or 500ms")
        }
    };
    let mut rounds = state.publisher.subscribe();
    let deadline = crate::clock::now() + wait;
    loop {
        let current = state.publisher.get(cluster);
        match (&current, if_none_match) {
            (Some(p), Some(tag)) if tag == p.etag => {}
            (Some(p), _) => {
                let mut r = Response::new(Full::new(p.body.clone()));
                let h = r.headers_mut();
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                if let Ok(v) = HeaderValue::from_str(&p.etag) {
                    h.insert(header::ETAG, v);
                }
                return r;
            }
            (None, _) if wait.is_zero() => {
                return error(
                    StatusCode::NOT_FOUND,
                    "unknown_cluster",
                    &format!("no snapshot for cluster '{cluster}' (yet)"),
                );
            }
            (None, _) => {}
        }
        // Unchanged (or not yet published): wait for the next round, up to the deadline.
        match tokio::time::timeout_at(deadline, rounds.changed()).await {
            Ok(Ok(())) => continue,
            _ => {
                if current.is_none() {
                    return error(
                        StatusCode::NOT_FOUND,
                        "unknown_cluster",
                        &format!("no snapshot for cluster '{cluster}' (yet)"),
                    );
                }
                let mut r = Response::new(Full::new(Bytes::new()));
                *r.status_mut() = StatusCode::NOT_MODIFIED;
                return r;
            }
        }
    }
}

/// The current holds at once, or (with `version` equal to the current one and `wait`) as soon
/// as they change, else 304 when the wait is over.
async fn holds(state: &ApiState, query: &str) -> Response<Body> {
    let wait = match param(query, "wait").map(|w| parse_wait(&w)) {
        None => Duration::ZERO,
        Some(Some(d)) => d,
        Some(None) => {
            return error(StatusCode::BAD_REQUEST, "invalid_wait", "wait must look like 30s or 500ms")
        }
    };
    let known = match param(query, "version").map(|v| v.parse::<u64>()) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(_)) => {
            return error(StatusCode::BAD_REQUEST, "invalid_version", "version must be an integer")
        }
    };
    let mut changes = state.holds.subscribe();
    let deadline = crate::clock::now() + wait;
    loop {
        let current = state.holds.current();
        if known != Some(current.holds.version) {
            let mut r = Response::new(Full::new(current.body.clone()));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return r;
        }
        if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() || wait.is_zero() {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            return r;
        }
    }
}

impl ApiState {
    /// Whether `req` carries the configured bearer token (always true without one).
    pub(crate) fn authorized<B>(&self, req: &Request<B>) -> bool {
        let token = self.token.lock().unwrap_or_else(|p| p.into_inner());
        if token.is_empty() {
            return true;
        }
        let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        given.and_then(|g| g.strip_prefix("Bearer ")) == Some(token.as_str())
    }

    pub(crate) fn has_token(&self) -> bool {
        !self.token.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }
}

async fn report(state: &ApiState, peer: &Peer, req: Request<Incoming>) -> Response<Body> {
    // A verified client certificate authenticates on its own; without one the bearer token
    // (if set) is required, and with client verification on, one of the two is.
    if peer.identity.is_none() && peer.verifies_clients && !state.has_token() {
        return error(
            StatusCode::UNAUTHORIZED,
            "client_certificate_required",
            "reports need a client certificate issued by the control plane's client CA",
        );
    }
    if peer.identity.is_none() && !state.authorized(&req) {
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "a valid bearer token is required");
    }
    let body = match Limited::new(req.into_body(), MAX_REPORT_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, "invalid_body", &format!("cannot read report: {e}"))
        }
    };
    let mut report = match Report::from_json(&body) {
        Ok(r) => r,
        Err(why) => return error(StatusCode::BAD_REQUEST, "invalid_report", &why),
    };
    if let Some(identity) = &peer.identity {
        state.note_identity(&report, identity);
    }
    // What this data plane decided goes to the relay, not to the planner.
    let (cluster, instance, deltas) =
        (report.cluster.to_string(), report.instance.clone(), report.replica.take());
    match state.events.try_send(Event::Report(Box::new(report))) {
        Ok(()) => {
            let replicas = state.relay.exchange(&cluster, &instance, deltas, crate::clock::now());
            let replicas: Vec<&ilb_core::deltas::Deltas> = replicas.iter().map(|d| &**d).collect();
            json(StatusCode::ACCEPTED, &serde_json::json!({"status": "accepted", "replicas": replicas}))
        }
        Err(_) => {
            error(StatusCode::SERVICE_UNAVAILABLE, "busy", "control loop is busy, report again next period")
        }
    }
}

fn explain(state: &ApiState, query: &str) -> Response<Body> {
    let (Some(cluster), Some(model)) = (param(query, "cluster"), param(query, "model")) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "query parameters 'cluster' and 'model' are required",
        );
    };
    let view = state.view();
    let (cluster, model) = (cluster.as_ref(), model.as_ref());
    let Some(m) = view.models.iter().find(|m| m.model == model) else {
        return error(StatusCode::NOT_FOUND, "model_not_found", &format!("no plan for model '{model}'"));
    };
    let classes: Vec<_> = m.classes.iter().filter(|c| c.cluster == cluster).collect();
    if classes.is_empty() {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_cluster",
            &format!("no classes for cluster '{cluster}'"),
        );
    }
    json(
        StatusCode::OK,
        &serde_json::json!({
            "version": view.version, "cluster": cluster, "model": model,
            "solve_ms": m.solve_ms, "gap": m.gap, "mean_latency_ms": m.mean_latency_ms, "traffic_moved": m.traffic_moved,
            "classes": classes, "engines": m.engines,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_poll_waits_are_bounded_whatever_the_query_says() {
        assert_eq!(parse_wait("25s"), Some(Duration::from_secs(25)));
        assert_eq!(parse_wait("250ms"), Some(Duration::from_millis(250)));
        for huge in ["1e300", "1e300s", "18446744073709551615ms"] {
            assert_eq!(parse_wait(huge), Some(MAX_WAIT), "{huge}");
        }
        for bad in ["-1", "nan", "inf", "x", "99999999999999999999999ms"] {
            assert_eq!(parse_wait(bad), None, "{bad}");
        }
    }
}

//! The HTTP front: the accept loop, per-connection limits, and the dispatch of paths to the
//! proxy, `/v1/models`, `/health` and `/debug/route`.

use crate::body::ProxyBody;
use crate::config::DataPlaneConfig;
use crate::engines::EngineState;
use crate::error::ProxyError;
use crate::state::{InstallError, RoutingState};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use ilb_core::classify::Endpoint;
use ilb_core::snapshot::Snapshot;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

/// The background tasks' HTTP client (probes, discovery, snapshots, reports): http, or https
/// with one of the data plane's client TLS configs.
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// State shared by every connection and background task of one data plane.
pub struct Shared {
    pub config: DataPlaneConfig,
    pub routing: RoutingState,
    /// For engines: probes, quick-mode discovery, round trips.
    pub client: HttpClient,
    /// For the control plane: snapshots and reports.
    pub control_plane_client: HttpClient,
    /// TLS to https engines on the request path.
    pub engine_tls: ilb_tls::ClientTls,
    pub budget: crate::budget::RetryBudget,
    pub waiters: crate::admission::Waiters,
    epoch: Instant,
    requests: AtomicU64,
    pub snapshot_installs: AtomicU64,
    pub snapshot_rejections: AtomicU64,
    /// Distinguishes this process's generated trace ids from other data planes'.
    pub trace_seed: u64,
    /// Coarse time for the idle connection pools, advanced by the prober (see `now_ms`).
    pub pool_clock: crate::upstream::CoarseClock,
    /// Which engine served each affinity key last; kept across snapshot installs.
    pub affinity: ilb_core::affinity::AffinityTable,
    /// Which engine stored each response id this data plane proxied (Responses API), so that
    /// a request naming it as `previous_response_id` goes there.
    pub responses: ilb_core::affinity::AffinityTable,
}

impl Shared {
    pub fn new(config: DataPlaneConfig) -> Shared {
        // No roots: an https peer without configured trust fails its handshake (unknown issuer).
        let untrusting = || {
            ilb_tls::ClientTls::new(&ilb_tls::ClientOptions::default())
                .expect("an empty client config builds")
        };
        let engine_tls = config.engine_tls.clone().unwrap_or_else(untrusting);
        let control_plane_tls = config.control_plane_tls.clone().unwrap_or_else(untrusting);
        let client = http_client(&config, &engine_tls);
        let control_plane_client = http_client(&config, &control_plane_tls);
        let affinity = ilb_core::affinity::AffinityTable::new(
            config.affinity_entries,
            config.affinity_ttl.as_secs().min(u64::from(u32::MAX)) as u32,
        );
        let responses = ilb_core::affinity::AffinityTable::new(
            config.affinity_entries,
            config.response_ttl.as_secs().min(u64::from(u32::MAX)) as u32,
        );
        Shared {
            responses,
            budget: crate::budget::RetryBudget::new(config.retry_budget.clone()),
            waiters: crate::admission::Waiters::default(),
            config,
            routing: RoutingState::default(),
            client,
            control_plane_client,
            engine_tls,
            epoch: Instant::now(),
            requests: AtomicU64::new(0),
            snapshot_installs: AtomicU64::new(0),
            snapshot_rejections: AtomicU64::new(0),
            trace_seed: ilb_core::slots::mix(crate::clock::unix_ms() ^ u64::from(std::process::id()) << 32),
            pool_clock: Default::default(),
            affinity,
        }
    }

    /// Installs a snapshot, logging the outcome (not on the request path).
    pub fn install(&self, snapshot: &Snapshot) -> Result<(), InstallError> {
        if self.config.https_only {
            if let Some(plain) = snapshot.engines.iter().find(|e| !e.url.starts_with("https://")) {
                self.snapshot_rejections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Err(InstallError::PlainEngine {
                    engine: plain.id.to_string(),
                    url: plain.url.clone(),
                });
            }
        }
        let expected = self.config.cluster.as_ref().map(|c| c.as_str());
        let installed = match self.routing.install(snapshot, expected, crate::clock::unix_ms()) {
            Ok(installed) => installed,
            Err(e) => {
                self.snapshot_rejections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Err(e);
            }
        };
        self.snapshot_installs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(
            version = %installed.table.version,
            engines = installed.table.engines.len(),
            models = installed.table.model_names().len(),
            "snapshot installed"
        );
        Ok(())
    }

    /// Milliseconds since this data plane started (monotonic).
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Time since this data plane started (monotonic).
    pub fn uptime(&self) -> std::time::Duration {
        self.epoch.elapsed()
    }

    pub fn next_request_id(&self) -> u64 {
        self.requests.fetch_add(1, Relaxed)
    }

    pub fn requests_total(&self) -> u64 {
        self.requests.load(Relaxed)
    }

    /// A failed attempt: the local guard may eject the engine.
    pub fn engine_failed(&self, engine: &EngineState) {
        let under_cap = || {
            self.routing.load().is_none_or(|installed| {
                // As Envoy does, one engine may always be ejected, whatever the fraction.
                let ejected = installed.engines.iter().filter(|e| e.is_ejected()).count();
                ejected == 0
                    || (ejected + 1) as f64
                        <= self.config.guard.max_ejected_fraction * installed.engines.len() as f64
            })
        };
        if engine.record_failure(self.now_ms(), &self.config.guard, under_cap) {
            tracing::warn!(engine = %engine.id, "engine ejected after consecutive failures");
        }
    }
}

/// A keep-alive client for http and https URLs, trusting what `tls` trusts.
fn http_client(config: &DataPlaneConfig, tls: &ilb_tls::ClientTls) -> HttpClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(config.timeouts.connect));
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.config_without_alpn())
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(std::time::Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector)
}

/// Accepts connections until `shutdown` flips, then lets open connections finish.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let connections = Arc::new(Semaphore::new(shared.config.max_connections));
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&connections).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = shutdown.changed() => return,
        };
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let shutdown = shutdown.clone();
        match shared.config.listener_tls.as_ref().map(|tls| tls.acceptor().clone()) {
            None => {
                tokio::spawn(async move {
                    let _permit = permit;
                    serve_connection(stream, shared, shutdown).await;
                });
            }
            Some(acceptor) => {
                tokio::spawn(async move {
                    let _permit = permit;
                    // The handshake gets the time a client has for its request head.
                    let handshake = acceptor.accept(stream);
                    match tokio::time::timeout(shared.config.timeouts.header_read, handshake).await {
                        Ok(Ok(tls)) => serve_connection(tls, shared, shutdown).await,
                        Ok(Err(error)) => {
                            let reason = ilb_tls::classify_io(&error).map_or("transport", |f| f.label());
                            tracing::debug!(%error, reason, "client tls handshake failed");
                        }
                        Err(_) => tracing::debug!("client tls handshake timed out"),
                    }
                });
            }
        }
    }
}

/// Requests started and responses finished on one client connection, and when the last
/// response finished. Only the connection's own task touches it (hyper calls the service and
/// drops response bodies inside the connection future), so the checks below cannot race.
struct Activity {
    opened: Instant,
    started: AtomicU64,
    finished: AtomicU64,
    /// Nanoseconds after `opened` when the last response finished.
    idle_since: AtomicU64,
}

impl Activity {
    /// When the connection started waiting for its next request head, if it is waiting.
    fn waiting_since(&self) -> Option<Instant> {
        let finished = self.finished.load(Relaxed);
        if self.started.load(Relaxed) != finished {
            return None;
        }
        Some(self.opened + std::time::Duration::from_nanos(self.idle_since.load(Relaxed)))
    }
}

/// A response body that counts itself finished when hyper drops it (written or abandoned).
struct Tracked {
    body: ProxyBody,
    activity: Arc<Activity>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let idle_since = self.activity.opened.elapsed().as_nanos() as u64;
        self.activity.idle_since.store(idle_since, Relaxed);
        self.activity.finished.fetch_add(1, Relaxed);
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Serves one client connection until it closes, idles past `header_read`, or shutdown.
///
/// The slowloris guard is one timer per connection, moved only when it fires, instead of
/// hyper's header-read timer (a boxed timer armed and cancelled for every request; measured 2%
/// of the CPU of a small request). As with hyper's, a connection waiting for a request head
/// (its first, or the next one after a response) is closed `header_read` after it began
/// waiting; a response in progress is never cut.
async fn serve_connection<S>(stream: S, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let header_read = shared.config.timeouts.header_read;
    let activity = Arc::new(Activity {
        opened: Instant::now(),
        started: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        idle_since: AtomicU64::new(0),
    });
    let service = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |req| {
            let shared = Arc::clone(&shared);
            let activity = Arc::clone(&activity);
            activity.started.fetch_add(1, Relaxed);
            async move {
                let response = dispatch(shared, req).await;
                Ok::<_, Infallible>(response.map(|body| Tracked { body, activity }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Flattened writes: head and small body (or a chunk and its framing) leave in one plain
    // write instead of a writev of several buffers, measurably cheaper for LLM-sized messages.
    builder.header_read_timeout(None).writev(false);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let idle = tokio::time::sleep_until(activity.opened + header_read);
    tokio::pin!(idle);
    let shutdown_changed = shutdown.changed();
    tokio::pin!(shutdown_changed);
    // The idle timer and the shutdown signal are polled only when one of them woke the task, not
    // on each of the connection's reads and writes: polling them there cost a timer waker
    // registration and a lock of the shutdown signal's mutex (shared by all connections) per
    // wake-up, several per request.
    let side = Arc::new(SideWaker { woken: AtomicBool::new(true), task: Mutex::new(None) });
    let side_waker = Waker::from(Arc::clone(&side));
    let mut task_waker: Option<Waker> = None;
    loop {
        let step = std::future::poll_fn(|cx| {
            if conn.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Step::Closed);
            }
            if !task_waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                task_waker = Some(cx.waker().clone());
                *side.lock_task() = Some(cx.waker().clone());
                side.woken.store(true, Release);
            }
            if !side.woken.swap(false, Acquire) {
                return Poll::Pending;
            }
            let mut side_cx = Context::from_waker(&side_waker);
            if idle.as_mut().poll(&mut side_cx).is_ready() {
                return Poll::Ready(Step::Idle);
            }
            if shutdown_changed.as_mut().poll(&mut side_cx).is_ready() {
                return Poll::Ready(Step::Shutdown);
            }
            Poll::Pending
        })
        .await;
        match step {
            Step::Closed => return,
            Step::Idle => {
                let now = Instant::now();
                match activity.waiting_since() {
                    // Dropping the connection closes it, as hyper's header timeout does.
                    Some(since) if since + header_read <= now => return,
                    Some(since) => idle.as_mut().reset(since + header_read),
                    None => idle.as_mut().reset(now + header_read),
                }
                // The moved timer must be polled to register its waker again.
                side.woken.store(true, Release);
            }
            Step::Shutdown => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
                return;
            }
        }
    }
}

/// What ended one wait of a connection's task.
enum Step {
    Closed,
    Idle,
    Shutdown,
}

/// The waker given to a connection's idle timer and shutdown signal: notes that one of them
/// fired, then wakes the connection's task.
struct SideWaker {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl SideWaker {
    fn lock_task(&self) -> std::sync::MutexGuard<'_, Option<Waker>> {
        self.task.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Wake for SideWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Release);
        if let Some(task) = self.lock_task().as_ref() {
            task.wake_by_ref();
        }
    }
}

async fn dispatch(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ProxyBody> {
    let path = req.uri().path();
    match (req.method(), Endpoint::from_path(path)) {
        (&Method::POST, Some(endpoint)) => crate::proxy::proxy(shared, endpoint, req).await,
        (&Method::GET, None) if path == "/v1/models" => models(&shared),
        (&Method::GET, None) if path == "/health" => health(&shared),
        (&Method::GET, None) if path == "/metrics" => {
            let mut r = Response::new(ProxyBody::from(Bytes::from(crate::telemetry::render(&shared))));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            r
        }
        (&Method::GET, None) if path == "/debug/route" => crate::debug::route(&shared, req.uri().query()),
        _ => ProxyError::NotFound { method: req.method().to_string(), path: path.to_owned() }.into_response(),
    }
}

pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::from(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn models(shared: &Shared) -> Response<ProxyBody> {
    let data: Vec<serde_json::Value> = shared
        .routing
        .load()
        .map(|installed| {
            installed
                .table
                .model_names()
                .iter()
                .map(|m| serde_json::json!({"id": m, "object": "model", "created": 0, "owned_by": "ilb"}))
                .collect()
        })
        .unwrap_or_default();
    json_response(StatusCode::OK, &serde_json::json!({"object": "list", "data": data}))
}

fn health(shared: &Shared) -> Response<ProxyBody> {
    match shared.routing.load() {
        Some(installed) => {
            let age_ms = crate::clock::unix_ms().saturating_sub(installed.table.created_unix_ms);
            json_response(
                StatusCode::OK,
                &serde_json::json!({
                    "status": "ok",
                    "snapshot_version": installed.table.version,
                    "snapshot_age_ms": age_ms,
                }),
            )
        }
        None => ProxyError::NoSnapshot.into_response(),
    }
}

//! The HTTP front: the accept loop, per-connection limits, and the dispatch of paths to the
//! proxy, stored responses (`stored`), `/v1/models` (`models`), `/health`, `/metrics` and
//! `/debug/route`. The client listener serves the OpenAI API; an admin listener, when
//! configured, serves `/metrics`, `/debug/route` and `/health`, and then the client listener no
//! longer serves the first two. Paths with dot segments or encoded slashes are refused before
//! anything is matched (`ilb_core::classify::check_path`); a known path with another method is
//! a 405 with `Allow`.

use crate::body::{json_response, ProxyBody};
use crate::clock;
use crate::error::ProxyError;
use crate::refusals::{self, Refusals};
use crate::shared::Shared;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ilb_core::classify::{self, Endpoint, StoredResponseOp};
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

/// Which listener a connection came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The OpenAI API (and, without an admin listener, the operator's endpoints).
    Client,
    /// The operator's endpoints only: `/metrics`, `/debug/route`, `/health`. Plain HTTP.
    Admin,
}

/// Accepts connections until `shutdown` flips, then lets open connections finish.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    role: Role,
    mut shutdown: watch::Receiver<bool>,
) {
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
        let tls = shared.config.listener_tls.as_ref().filter(|_| role == Role::Client);
        match tls.cloned() {
            None => {
                tokio::spawn(async move {
                    let _permit = permit;
                    serve_connection(stream, shared, role, shutdown).await;
                });
            }
            Some(tls) => {
                tokio::spawn(async move {
                    let _permit = permit;
                    // The handshake gets the time a client has for its request head.
                    match tls.handshake(stream, shared.config.timeouts.header_read).await {
                        Ok(tls) => serve_connection(tls, shared, role, shutdown).await,
                        Err(error) => {
                            tracing::debug!(%error, reason = error.reason(), "client tls handshake failed")
                        }
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
    fn new(opened: Instant) -> Activity {
        Activity {
            opened,
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
        }
    }

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
        let idle_since = clock::since(self.activity.opened).as_nanos() as u64;
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
async fn serve_connection<S>(stream: S, shared: Arc<Shared>, role: Role, mut shutdown: watch::Receiver<bool>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let header_read = shared.config.timeouts.header_read;
    let activity = Arc::new(Activity::new(clock::now()));
    let service = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |req| {
            let shared = Arc::clone(&shared);
            let activity = Arc::clone(&activity);
            activity.started.fetch_add(1, Relaxed);
            async move {
                let response = dispatch(shared, req, role).await;
                Ok::<_, Infallible>(response.map(|body| Tracked { body, activity }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Flattened writes: head and small body (or a chunk and its framing) leave in one plain
    // write instead of a writev of several buffers, measurably cheaper for LLM-sized messages.
    builder.header_read_timeout(None).writev(false);
    // hyper answers a head it cannot parse itself, without a body: `Refusals` gives that answer
    // an OpenAI-style body.
    let calls = {
        let activity = Arc::clone(&activity);
        move || activity.started.load(Relaxed)
    };
    let mut conn = builder.serve_connection(TokioIo::new(Refusals::new(stream, calls)), service);
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
            if std::pin::Pin::new(&mut conn).poll(cx).is_ready() {
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
                let now = clock::now();
                match activity.waiting_since() {
                    // Dropping the connection closes it, as hyper's header timeout does; a client
                    // that began a head and did not finish it is told so first (408).
                    Some(since) if since + header_read <= now => {
                        let parts = conn.into_parts();
                        if !parts.read_buf.is_empty() {
                            refuse_unfinished_head(parts.io.into_inner().into_inner(), header_read).await;
                        }
                        return;
                    }
                    Some(since) => idle.as_mut().reset(since + header_read),
                    None => idle.as_mut().reset(now + header_read),
                }
                // The moved timer must be polled to register its waker again.
                side.woken.store(true, Release);
            }
            Step::Shutdown => {
                std::pin::Pin::new(&mut conn).graceful_shutdown();
                let _ = conn.await;
                return;
            }
        }
    }
}

/// Tells a client that began a request head and did not finish it in `header_read` so (408),
/// giving it at most `header_read` more to take the answer.
async fn refuse_unfinished_head<S>(mut io: S, header_read: std::time::Duration)
where
    S: tokio::io::AsyncWrite + Unpin,
{
    let answer = refusals::header_timeout();
    let write = async {
        use tokio::io::AsyncWriteExt;
        io.write_all(&answer).await?;
        io.shutdown().await
    };
    // Bounded: a client that does not read gets no more time.
    let _ = tokio::time::timeout(header_read, write).await;
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

/// The data plane's own paths: what they are, on which listener.
enum Local {
    Health,
    Models,
    Metrics,
    Debug,
}

async fn dispatch(shared: Arc<Shared>, req: Request<Incoming>, role: Role) -> Response<ProxyBody> {
    let path = req.uri().path();
    let method = req.method();
    let client = role == Role::Client;
    // `models.retrieve` percent-encodes a model name's `/` (`org%2Fmodel`); the path is
    // answered here, never forwarded, so it needs no path check.
    if let Some(id) = path.strip_prefix("/v1/models/").filter(|_| client) {
        if method != Method::GET {
            return not_allowed(&req, "GET");
        }
        let id = percent_encoding::percent_decode_str(id).decode_utf8_lossy();
        return crate::models::retrieve(&shared, &id);
    }
    if let Err(e) = classify::check_path(path) {
        return ProxyError::InvalidPath(e.to_string()).into_response();
    }
    // Without an admin listener the operator's endpoints stay on the client listener; the
    // peers' deltas are one of them, never forwarded as an engine endpoint.
    let operator = !client || shared.config.admin_listen.is_none();
    if operator && path == crate::replicas::PATH {
        return crate::replicas::receive(&shared, req).await;
    }
    if client {
        if let Some(endpoint) = Endpoint::from_path(path) {
            if method != Method::POST {
                return not_allowed(&req, "POST");
            }
            return crate::proxy::proxy(shared, endpoint, req).await;
        }
        if let Some((op, id)) = StoredResponseOp::from_path(path) {
            if !op.allows(method.as_str()) {
                return not_allowed(&req, op.allow());
            }
            let id = id.to_owned();
            return crate::stored::forward(shared, &id, req).await;
        }
    }
    let local = match path {
        "/health" => Local::Health,
        "/v1/models" if client => Local::Models,
        "/metrics" if operator => Local::Metrics,
        "/debug/route" if operator => Local::Debug,
        _ => {
            return ProxyError::NotFound { method: method.to_string(), path: path.to_owned() }.into_response()
        }
    };
    if method != Method::GET {
        return not_allowed(&req, "GET");
    }
    match local {
        Local::Health => health(&shared),
        Local::Models => crate::models::list(&shared),
        Local::Metrics => {
            let mut r = Response::new(ProxyBody::from(Bytes::from(crate::telemetry::render(&shared))));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
            r
        }
        Local::Debug => crate::debug::route(&shared, req.uri().query()),
    }
}

fn not_allowed<B>(req: &Request<B>, allow: &'static str) -> Response<ProxyBody> {
    let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
    ProxyError::MethodNotAllowed { method, path, allow }.into_response()
}

/// `ok` while the installed snapshot is the newest offered; `degraded` (still 200: requests
/// are routed on the installed snapshot) after a newer one was refused, with the reason.
fn health(shared: &Shared) -> Response<ProxyBody> {
    let rejected = shared.snapshot_rejected.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match shared.routing.current() {
        Some(installed) => {
            let age_ms = crate::clock::unix_ms().saturating_sub(installed.table.created_unix_ms);
            let mut body = serde_json::json!({
                "status": if rejected.is_some() { "degraded" } else { "ok" },
                "snapshot_version": installed.table.version,
                "snapshot_age_ms": age_ms,
            });
            if let Some(r) = rejected {
                body["snapshot_rejected"] = serde_json::json!({"reason": r.reason, "unix_ms": r.unix_ms});
            }
            json_response(StatusCode::OK, &body)
        }
        None => ProxyError::NoSnapshot.into_response(),
    }
}

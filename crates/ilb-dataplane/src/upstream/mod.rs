//! Connections to engines: a small hand-written HTTP/1.1 client and a stack of idle
//! connections per engine.
//!
//! A request does its engine I/O inline, in its own task: it pops the most recently used idle
//! connection of the engine's [`Pool`] (or connects), writes the request in one call, reads the
//! response head, and its [`EngineBody`] reads the body as the client side polls it (`conn`).
//! No connection task, channel or cross-task wake-up is involved, which hyper's client
//! connection needed for every request. The wire format (request head, response head, chunked
//! and length bodies) lives apart from I/O (`codec`).
//!
//! A connection goes back to its pool only when its response body ended cleanly and the engine
//! allows reuse, so a half-read connection is never reused; a body dropped early closes its
//! connection. Idle time is read from a coarse clock that the background prober advances; the
//! stack is capped. When its engine leaves the snapshot the stack drains: idle connections
//! close at once, and each response still running closes its connection when it ends, so the
//! last one closes with the last in-flight response. Only engines of the installed snapshot
//! are ever connected to (a request that picked an engine on the previous snapshot may still
//! connect to it).

pub mod codec;
#[cfg(test)]
mod codec_diff_tests;
#[cfg(test)]
mod codec_tests;
mod conn;
#[cfg(test)]
mod conn_tests;
mod origin;

pub use codec::{CodecError, MAX_HEAD_BYTES};
pub use conn::{BodyError, Conn, EngineBody};
pub use origin::Origin;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, Uri};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// A request for an engine, borrowing the client's headers: they are written to the wire as
/// they are, less hop-by-hop headers, `Host` and `Content-Length` (see
/// `codec::encode_request_head`).
#[derive(Clone, Debug)]
pub struct UpstreamRequest<'a> {
    pub method: Method,
    /// Origin form: path and query.
    pub uri: Uri,
    /// The engine's authority, sent as `Host`.
    pub host: &'a HeaderValue,
    /// The client's headers.
    pub headers: &'a HeaderMap,
    /// A header ilb adds (a generated `traceparent`), its value as bytes that must be a valid
    /// header value (they are written as they are).
    pub extra: Option<(HeaderName, &'a [u8])>,
    pub body: Bytes,
}

/// How idle engine connections are kept.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// An idle connection unused for this long is closed.
    pub idle_timeout: Duration,
    /// Most idle connections kept per engine; more are closed when they come back.
    pub max_idle_per_engine: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig { idle_timeout: Duration::from_secs(90), max_idle_per_engine: 1024 }
    }
}

/// Why no response head came back from an engine.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("tcp connect error")]
    Connect(#[source] std::io::Error),
    #[error("tcp connect timed out after {0} ms")]
    ConnectTimeout(u64),
    #[error("writing the request failed")]
    Write(#[source] std::io::Error),
    #[error("reading the response failed")]
    Read(#[source] std::io::Error),
    #[error("connection closed before a response head")]
    Closed,
    #[error("malformed response")]
    Protocol(#[source] CodecError),
    /// The TLS handshake failed for a reason a person can act on (certificate, name, ...).
    #[error("{0}")]
    Tls(ilb_tls::Failure, #[source] std::io::Error),
    /// The TLS handshake broke off without a TLS-level reason (reset, closed).
    #[error("tls handshake failed")]
    Handshake(#[source] std::io::Error),
}

impl UpstreamError {
    pub(crate) fn from_handshake(error: std::io::Error) -> UpstreamError {
        match ilb_tls::classify_io(&error) {
            Some(failure) => UpstreamError::Tls(failure, error),
            None => UpstreamError::Handshake(error),
        }
    }

    /// The TLS failure reason, if this is one.
    pub fn tls_failure(&self) -> Option<ilb_tls::Failure> {
        match self {
            UpstreamError::Tls(failure, _) => Some(*failure),
            _ => None,
        }
    }
}

/// Milliseconds on a coarse clock shared by all pools of one data plane: advanced by a
/// background task, read by the request path without a clock call.
#[derive(Debug, Default)]
pub struct CoarseClock(AtomicU64);

impl CoarseClock {
    pub fn set_ms(&self, ms: u64) {
        self.0.store(ms, Relaxed);
    }

    pub fn ms(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Idle connections of one engine, most recently used on top.
#[derive(Debug, Default)]
pub struct Pool {
    idle: Mutex<Vec<Idle>>,
    /// The engine left the installed snapshot: its idle connections are closed, and those of
    /// responses still running are closed as they end instead of being kept.
    draining: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
struct Idle {
    conn: Conn,
    since_ms: u64,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The most recently used idle connection that is neither expired nor closed. Hot path.
    fn pop(&self, now_ms: u64, config: &PoolConfig) -> Option<Conn> {
        let timeout_ms = config.idle_timeout.as_millis() as u64;
        let mut idle = self.lock();
        while let Some(mut entry) = idle.pop() {
            if now_ms.saturating_sub(entry.since_ms) >= timeout_ms {
                // The stack is ordered by age: everything below is older still.
                let expired = std::mem::take(&mut *idle);
                drop(idle);
                drop(expired);
                return None;
            }
            if entry.conn.is_usable_idle() {
                return Some(entry.conn);
            }
        }
        None
    }

    /// Returns a connection whose last response ended cleanly; closes it instead while the
    /// engine drains. Hot path.
    pub fn push(&self, conn: Conn, now_ms: u64, config: &PoolConfig) {
        let mut idle = self.lock();
        // Read under the lock that `set_draining` takes too, so no connection slips in after
        // a drain emptied the stack.
        if idle.len() < config.max_idle_per_engine && !self.draining.load(Relaxed) {
            idle.push(Idle { conn, since_ms: now_ms });
        }
    }

    /// Starts (true) or ends (false, the engine is back) draining. Starting closes every idle
    /// connection now.
    pub fn set_draining(&self, draining: bool) {
        let closed = {
            let mut idle = self.lock();
            self.draining.store(draining, Relaxed);
            if draining {
                std::mem::take(&mut *idle)
            } else {
                Vec::new()
            }
        };
        drop(closed);
    }

    /// Whether the engine is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Relaxed)
    }

    /// Closes connections idle past the timeout or closed by the engine.
    pub fn sweep(&self, now_ms: u64, config: &PoolConfig) {
        let timeout_ms = config.idle_timeout.as_millis() as u64;
        let mut idle = self.lock();
        idle.retain_mut(|e| now_ms.saturating_sub(e.since_ms) < timeout_ms && e.conn.is_usable_idle());
    }

    /// Idle connections kept now.
    pub fn idle_len(&self) -> usize {
        self.lock().len()
    }
}

/// Sends `request` to the engine at `origin` on an idle connection of its `pool`, or a new
/// one, and reads the response head. The caller reads the body, and gives the connection back with [`Pool::push`] once
/// [`EngineBody::take_reusable_conn`] returns it. Hot path.
///
/// A pooled connection may have been closed by the engine while idle without this process
/// having seen it yet ([`Pool`] drops those it has seen, at no syscall cost otherwise). When a
/// pooled connection fails before any response byte was read (the write fails, or the first
/// read finds it closed or reset), the request goes out once more on a new connection to the
/// same engine. That resends a POST: an engine that crashed while working on it looks the same,
/// and then the new connection fails to connect or the request runs twice. It is what an idle
/// close produces, though, which is by far the common cause; hyper retried only requests it had
/// not written, which a close racing the write defeats. A new connection is never retried
/// here: the caller's retry rules (budget, another engine) apply.
///
/// An https engine is connected to with `tls`; a handshake that fails is recorded on its
/// origin (its reason shows in `/debug/route` and the metrics) and logged when the reason
/// changes.
pub async fn send(
    pool: &Pool,
    origin: &Origin,
    now_ms: u64,
    config: &PoolConfig,
    connect_timeout: Duration,
    tls: &ilb_tls::ClientTls,
    request: &UpstreamRequest<'_>,
) -> Result<Response<EngineBody>, UpstreamError> {
    if let Some(conn) = pool.pop(now_ms, config) {
        match conn.round_trip(request).await {
            Ok(response) => return Ok(response),
            Err(failed) if failed.unanswered => {
                let error = &failed.error;
                tracing::debug!(engine = %origin.id, %error, "idle engine connection closed; resending");
            }
            Err(failed) => return Err(failed.error),
        }
    }
    let (host, port) = origin.connect_addr();
    let conn = match Conn::connect(host, port, origin.tls_name(), tls, connect_timeout).await {
        Ok(conn) => conn,
        Err(error) => {
            if let Some(failure) = error.tls_failure() {
                if origin.record_tls_failure(failure) {
                    tracing::warn!(engine = %origin.id, url = %origin.base_url, reason = failure.label(), %failure, "tls handshake with engine failed");
                }
            }
            return Err(error);
        }
    };
    if let Some(resumed) = conn.tls_resumed() {
        origin.tls_handshakes[usize::from(resumed)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    conn.round_trip(request).await.map_err(|failed| failed.error)
}

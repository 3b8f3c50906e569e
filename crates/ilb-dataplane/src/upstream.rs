//! Connections to engines: a small stack of idle HTTP/1 connections per engine.
//!
//! hyper_util's pooled client does work per request that a proxy to a handful of known engines
//! does not need (a mutexed map keyed by scheme and authority, clock reads, a checkout future
//! and its `want` handshake). Here every [`EngineState`] owns a [`Pool`]: a request pops the
//! most recently used idle connection (or connects), and the connection goes back only when its
//! response body ended cleanly, so a half-read connection is never reused. Idle time is read
//! from a coarse clock that the background prober advances; the stack is capped, and it is
//! dropped with its engine's state when the engine leaves the snapshot, so it cannot grow
//! without bound. Only engines of the installed snapshot are ever connected to.

use crate::engines::EngineState;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// One engine connection's request handle; its connection runs on its own task.
pub type Sender = SendRequest<Full<Bytes>>;

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
    #[error("tcp connect error: {0}")]
    Connect(#[source] std::io::Error),
    #[error("tcp connect timed out after {0} ms")]
    ConnectTimeout(u64),
    #[error("handshake failed: {0}")]
    Handshake(#[source] hyper::Error),
    #[error("{0}")]
    Http(#[source] hyper::Error),
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
}

#[derive(Debug)]
struct Idle {
    sender: Sender,
    since_ms: u64,
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The most recently used idle connection that is neither closed nor expired. Hot path.
    fn pop(&self, now_ms: u64, config: &PoolConfig) -> Option<Sender> {
        let timeout_ms = config.idle_timeout.as_millis() as u64;
        let mut idle = self.lock();
        while let Some(entry) = idle.pop() {
            if entry.sender.is_closed() {
                continue;
            }
            if now_ms.saturating_sub(entry.since_ms) >= timeout_ms {
                // The stack is ordered by age: everything below is older still.
                let expired = std::mem::take(&mut *idle);
                drop(idle);
                drop(expired);
                return None;
            }
            return Some(entry.sender);
        }
        None
    }

    /// Returns a connection whose last response ended cleanly. Hot path.
    pub fn push(&self, sender: Sender, now_ms: u64, config: &PoolConfig) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.lock();
        if idle.len() < config.max_idle_per_engine {
            idle.push(Idle { sender, since_ms: now_ms });
        }
    }

    /// Closes connections idle past the timeout or closed by the engine.
    pub fn sweep(&self, now_ms: u64, config: &PoolConfig) {
        let timeout_ms = config.idle_timeout.as_millis() as u64;
        let mut idle = self.lock();
        if idle
            .first()
            .is_none_or(|e| now_ms.saturating_sub(e.since_ms) < timeout_ms && !e.sender.is_closed())
        {
            return;
        }
        idle.retain(|e| now_ms.saturating_sub(e.since_ms) < timeout_ms && !e.sender.is_closed());
    }

    /// Idle connections kept now.
    pub fn idle_len(&self) -> usize {
        self.lock().len()
    }
}

/// Sends `request` (origin-form URI, `Host` set) to `engine` on an idle connection, or a new one.
/// A request refused by a pooled connection before it was written (the engine closed it while
/// idle) goes out on the next connection; anything else is the caller's to retry. Hot path.
pub async fn send(
    engine: &EngineState,
    now_ms: u64,
    config: &PoolConfig,
    connect_timeout: Duration,
    mut request: Request<Full<Bytes>>,
) -> Result<(Response<Incoming>, Sender), UpstreamError> {
    while let Some(mut sender) = engine.pool.pop(now_ms, config) {
        // Just back from a finished response, the connection task may not have seen the end yet.
        if !sender.is_ready() && sender.ready().await.is_err() {
            continue;
        }
        match sender.try_send_request(request).await {
            Ok(response) => return Ok((response, sender)),
            Err(mut e) => match e.take_message() {
                Some(unsent) => request = unsent,
                None => return Err(UpstreamError::Http(e.into_error())),
            },
        }
    }
    let mut sender = connect(engine, connect_timeout).await?;
    let response = sender.send_request(request).await.map_err(UpstreamError::Http)?;
    Ok((response, sender))
}

/// Opens a connection to `engine` (TCP_NODELAY, bounded by `timeout`) and starts its task.
async fn connect(engine: &EngineState, timeout: Duration) -> Result<Sender, UpstreamError> {
    let (host, port) = engine.connect_addr();
    let stream = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(UpstreamError::Connect(e)),
        Err(_) => return Err(UpstreamError::ConnectTimeout(timeout.as_millis() as u64)),
    };
    let _ = stream.set_nodelay(true);
    // One flat write per request, as on the client side (see `server::serve_connection`).
    let (sender, connection) = http1::Builder::new()
        .writev(false)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(UpstreamError::Handshake)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "engine connection ended with an error");
        }
    });
    Ok(sender)
}

//! The response body the data plane sends to clients: either a small local body, or an
//! engine's body streamed through frame by frame as it arrives (never buffered).
//!
//! An engine's body is read from its connection by the client connection's own task as hyper
//! polls it ([`EngineBody`]); when it ends cleanly the connection goes back to its engine's
//! pool, and when the client goes away first the body, and with it the connection, is dropped,
//! which tells the engine to stop. The streamed body owns the request's [`InFlight`] guard, so
//! an engine's in-flight count drops when the stream *ends* (or the client goes away), not
//! when headers arrive. It also enforces the idle gap between chunks, and turns a broken
//! engine stream into a well-formed SSE error event followed by a clean end, so a streaming
//! client sees an error instead of a hang.

use crate::error::ProxyError;
use crate::proxy::InFlight;
use crate::upstream::EngineBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub enum ProxyBody {
    Local(Option<Bytes>),
    /// Boxed: measured cheaper than moving the whole body through hyper's layers by value,
    /// although it costs an allocation per response.
    Upstream(Box<UpstreamBody>),
}

impl From<Bytes> for ProxyBody {
    fn from(b: Bytes) -> Self {
        ProxyBody::Local(Some(b))
    }
}

impl ProxyBody {
    pub fn empty() -> Self {
        ProxyBody::Local(None)
    }
}

pub struct UpstreamBody {
    inner: EngineBody,
    /// Armed on the first `Pending` only: most small responses complete without ever waiting,
    /// and then no timer is registered at all.
    idle: Option<Pin<Box<Sleep>>>,
    idle_timeout: Duration,
    sse: bool,
    /// Whether everything forwarded so far ends at an SSE event boundary.
    at_boundary: bool,
    done: bool,
    /// When the last chunk of a streamed body arrived (SSE only), for the chunk-gap figures.
    last_chunk: Option<Instant>,
    in_flight: InFlight,
}

impl UpstreamBody {
    pub fn new(inner: EngineBody, idle_timeout: Duration, sse: bool, in_flight: InFlight) -> Self {
        let mut body =
            UpstreamBody {
            inner,
            idle: None,
            idle_timeout,
            sse,
            at_boundary: true,
            done: false,
            last_chunk: None,
            in_flight,
        };
        if body.inner.is_end_stream() {
            // An empty body (length 0): hyper will not poll it at all.
            body.end();
        }
        body
    }

    /// The engine's body ended cleanly: count the success and free its connection for reuse.
    fn end(&mut self) {
        self.done = true;
        self.in_flight.finish(true);
        if let Some(conn) = self.inner.take_reusable_conn() {
            self.in_flight.release_conn(conn);
        }
    }

    /// Ends the stream after a failure: an SSE error event for streams, an error otherwise.
    fn fail(&mut self, error: ProxyError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        self.in_flight.finish(false);
        if !self.sse {
            return Poll::Ready(Some(Err(error.into())));
        }
        let prefix = if self.at_boundary { "" } else { "\n\n" };
        let event = format!("{prefix}data: {}\n\n", error.body_json());
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Local(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Upstream(up) => up.poll_upstream(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Local(bytes) => bytes.is_none(),
            ProxyBody::Upstream(up) => up.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Local(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ProxyBody::Local(None) => SizeHint::with_exact(0),
            ProxyBody::Upstream(up) => up.inner.size_hint(),
        }
    }
}

impl UpstreamBody {
    /// Hot path for streamed responses.
    fn poll_upstream(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if !data.is_empty() {
                        self.at_boundary = data.ends_with(b"\n\n") || data.ends_with(b"\r\n\r\n");
                        if self.sse {
                            let now = Instant::now();
                            self.in_flight.stream_chunk(self.last_chunk, now);
                            self.last_chunk = Some(now);
                        }
                    }
                    if let Some(idle) = self.idle.as_mut() {
                        idle.as_mut().reset(Instant::now() + self.idle_timeout);
                    }
                }
                if self.inner.is_end_stream() {
                    // A body of known length ends with its last chunk: hyper stops polling once
                    // it has written that many bytes, so record the end now.
                    self.end();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let engine = self.in_flight.engine_id().to_owned();
                self.fail(ProxyError::EngineFailed { engine, detail: format!("stream broken: {e}") })
            }
            Poll::Ready(None) => {
                self.end();
                Poll::Ready(None)
            }
            Poll::Pending => {
                let timeout = self.idle_timeout;
                let idle = self.idle.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                ready!(idle.as_mut().poll(cx));
                let engine = self.in_flight.engine_id().to_owned();
                let timeout_ms = self.idle_timeout.as_millis() as u64;
                self.fail(ProxyError::EngineTimeout { engine, timeout_ms })
            }
        }
    }
}

//! OpenAI-shaped answers for requests refused before the service runs.
//!
//! hyper answers a request head it cannot parse itself (`proto/h1/role.rs`, `Server::on_error`,
//! written by `proto/h1/conn.rs`, `on_parse_error`): 400 for a bad request line, header or
//! framing (a NUL byte in a header, obs-fold, a `Transfer-Encoding` that does not end in
//! `chunked`, differing or negative `Content-Length`, an `HTTP/2.0` request line), 431 for a
//! head too large (more than 100 headers) and 414 for a target too long; always with an empty
//! body, and hyper has no hook to give that response one. [`Refusals`] wraps a client
//! connection's I/O and replaces such an automatic answer, on its way out, with the same status
//! and an OpenAI-style JSON body (`connection: close`: hyper closes the connection after it).
//!
//! An automatic answer is told apart by two facts: it is a response head written when every
//! request the service was given already had its response head written (each service call
//! writes exactly one final head, so a further head is hyper's own), and it has the shape hyper
//! gives it (status 4xx or 5xx, no header but `content-length: 0`, `date` and `connection`).
//! A miss (pipelined requests whose heads share a write) leaves hyper's answer as it is.
//!
//! The 408 for a head not sent in time ([`header_timeout`]) is written by the server itself,
//! after it takes the connection back from hyper.

use crate::error::ProxyError;
use bytes::Bytes;
use http::StatusCode;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A client connection's I/O that replaces hyper's bodiless automatic answers (see the module
/// doc). `calls` counts the requests handed to the service so far.
pub struct Refusals<S, F> {
    inner: S,
    calls: F,
    /// Final response heads written so far (one per service call).
    heads: u64,
    /// A replacement answer still being written, and how much of it is out.
    pending: Option<(Bytes, usize)>,
}

impl<S, F: Fn() -> u64> Refusals<S, F> {
    pub fn new(inner: S, calls: F) -> Self {
        Refusals { inner, calls, heads: 0, pending: None }
    }

    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: AsyncWrite + Unpin, F> Refusals<S, F> {
    /// Writes what is left of a replacement answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = self.pending.as_mut() {
            if *written == bytes.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin, F: Unpin> AsyncRead for Refusals<S, F> {
    #[inline]
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin, F: Fn() -> u64 + Unpin> AsyncWrite for Refusals<S, F> {
    /// Hot path: a response head costs a prefix check and a status parse; other writes a
    /// prefix check.
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if let Some(status) = response_status(buf) {
            if !status.is_informational() {
                if this.heads < (this.calls)() {
                    this.heads += 1;
                } else if let Some(answer) = automatic_answer(status, buf) {
                    // hyper's bytes are taken as written and dropped; the answer goes out instead.
                    this.pending = Some((answer, 0));
                    let _ = this.poll_pending(cx)?;
                    return Poll::Ready(Ok(buf.len()));
                }
            }
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// The status of a write that starts a response head (`HTTP/1.x NNN`).
fn response_status(buf: &[u8]) -> Option<StatusCode> {
    let rest = buf.strip_prefix(b"HTTP/1.")?;
    let code = rest.get(2..5)?;
    if rest.get(1) != Some(&b' ') {
        return None;
    }
    StatusCode::from_bytes(code).ok()
}

/// The answer that replaces hyper's automatic one, if `head` has that shape: an error status, a
/// complete head and no header but `content-length: 0`, `date` and `connection`.
fn automatic_answer(status: StatusCode, head: &[u8]) -> Option<Bytes> {
    if !(status.is_client_error() || status.is_server_error()) || !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.trim_end().split("\r\n");
    lines.next();
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        let expected = match name.to_ascii_lowercase().as_str() {
            "content-length" => value == "0",
            "date" | "connection" => true,
            _ => false,
        };
        if !expected {
            return None;
        }
    }
    Some(answer(&ProxyError::MalformedHead(status)))
}

/// A whole HTTP/1.1 response carrying `error`'s JSON body, closing the connection.
pub fn answer(error: &ProxyError) -> Bytes {
    let status = error.status();
    let body = error.body_json();
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    Bytes::from(out)
}

/// The 408 for a client that began a request head and did not finish it in time.
pub fn header_timeout() -> Bytes {
    answer(&ProxyError::HeaderTimeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn only_heads_beyond_the_service_calls_in_hyper_shape_are_replaced() {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = std::sync::Arc::clone(&calls);
        let mut io = Refusals::new(Vec::new(), move || counted.load(std::sync::atomic::Ordering::Relaxed));
        let automatic = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        // The service's own bodiless 4xx (an engine's, say) passes as it is.
        calls.store(1, std::sync::atomic::Ordering::Relaxed);
        io.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.unwrap();
        io.write_all(automatic).await.unwrap();
        // Body bytes that look like a head are not a head of their own.
        io.write_all(b"HTTP/1.1 404 x\r\nx-other: 1\r\n\r\n").await.unwrap();
        // A head beyond the service calls, in hyper's shape: replaced.
        io.write_all(automatic).await.unwrap();
        io.flush().await.unwrap();
        let out = String::from_utf8(io.into_inner()).unwrap();
        let mut parts = out.splitn(2, "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n");
        assert_eq!(parts.next(), Some("HTTP/1.1 100 Continue\r\n\r\n"));
        let rest = parts.next().unwrap();
        assert!(rest.starts_with("HTTP/1.1 404 x\r\nx-other: 1\r\n\r\nHTTP/1.1 400 Bad Request\r\ncontent-type: application/json"), "{rest}");
        let body = rest.split("\r\n\r\n").nth(2).unwrap();
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["error"]["code"], "malformed_request", "{rest}");
    }
}

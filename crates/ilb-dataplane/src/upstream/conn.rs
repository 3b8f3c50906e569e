//! One engine connection, owned by the request that uses it: the request's own task writes the
//! request and reads the response, so no other task is woken on the way (hyper's client
//! connection runs on a task of its own, and every request crossed to it and back).
//!
//! [`Conn::round_trip`] writes the request in one call and reads the response head;
//! [`EngineBody`] then owns the connection and reads the body as the client side polls it, so
//! streamed chunks go out as they arrive. A body that ended cleanly hands its connection back
//! for reuse ([`EngineBody::take_reusable_conn`]); a body dropped before its end drops (closes)
//! the connection, which tells the engine to stop generating.

use super::codec::{self, BodyDecoder, CodecError, Decoded};
use super::{UpstreamError, UpstreamRequest};
use bytes::{Bytes, BytesMut};
use http::Response;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Request bodies up to this size are copied behind the head and go out in the same write.
const INLINE_BODY_MAX: usize = 64 * 1024;
/// Room made in the read buffer before a read when little is left.
const READ_RESERVE: usize = 8 * 1024;
/// Buffers grown past these by a large request or response are not kept while the connection
/// idles (a pool holds up to a thousand connections per engine).
const KEEP_WRITE_BUF_MAX: usize = 16 * 1024;
const KEEP_READ_BUF_MAX: usize = 2 * READ_RESERVE;

/// An open HTTP/1.1 connection to an engine, between responses when idle in its pool.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    /// Bytes read and not yet consumed; empty between responses.
    read_buf: BytesMut,
    /// Kept across requests so that encoding a request does not allocate.
    write_buf: Vec<u8>,
}

/// A round trip that failed, and whether the engine provably did not answer: nothing of a
/// response was read and writing failed or the first read found the connection closed or
/// reset. That is what an engine closing an idle keep-alive connection produces.
#[derive(Debug)]
pub(super) struct Failed {
    pub error: UpstreamError,
    pub unanswered: bool,
}

impl Conn {
    /// Opens a connection (TCP_NODELAY), bounded by `timeout`.
    pub(super) async fn connect(host: &str, port: u16, timeout: Duration) -> Result<Conn, UpstreamError> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(UpstreamError::Connect(e)),
            Err(_) => return Err(UpstreamError::ConnectTimeout(timeout.as_millis() as u64)),
        };
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            read_buf: BytesMut::with_capacity(READ_RESERVE),
            write_buf: Vec::with_capacity(1024),
        })
    }

    /// Whether an idle connection may carry a request: nothing arrived while it was idle (an
    /// engine's close, reset, or stray bytes). Costs a syscall only when the reactor has seen
    /// the socket become readable; otherwise it is a flag check. Hot path.
    pub(super) fn is_usable_idle(&self) -> bool {
        if !self.read_buf.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    #[cfg(test)]
    pub(super) fn read_capacity(&self) -> usize {
        self.read_buf.capacity()
    }

    /// Writes `request` and reads the response head; the body is read through the returned
    /// response's [`EngineBody`], which owns this connection. Hot path.
    pub(super) async fn round_trip(
        mut self,
        request: &UpstreamRequest<'_>,
    ) -> Result<Response<EngineBody>, Failed> {
        let body = &request.body;
        let inline = body.len() <= INLINE_BODY_MAX;
        self.write_buf.clear();
        self.write_buf.reserve(1024 + if inline { body.len() } else { 0 });
        codec::encode_request_head(&mut self.write_buf, request);
        if inline {
            self.write_buf.extend_from_slice(body);
        }
        let mut written = self.stream.write_all(&self.write_buf).await;
        if self.write_buf.capacity() > KEEP_WRITE_BUF_MAX {
            self.write_buf = Vec::new();
        }
        if written.is_ok() && !inline {
            written = self.stream.write_all(body).await;
        }
        if let Err(e) = written {
            // The engine cannot have acted on a request it did not receive in full.
            return Err(Failed { error: UpstreamError::Write(e), unanswered: true });
        }

        let mut received = false;
        let head = loop {
            if !self.read_buf.is_empty() {
                match codec::parse_head(&mut self.read_buf) {
                    Ok(Some(head)) => break head,
                    Ok(None) => {}
                    Err(e) => return Err(Failed { error: UpstreamError::Protocol(e), unanswered: false }),
                }
            }
            reserve(&mut self.read_buf, READ_RESERVE);
            match self.stream.read_buf(&mut self.read_buf).await {
                Ok(0) => return Err(Failed { error: UpstreamError::Closed, unanswered: !received }),
                Ok(_) => received = true,
                Err(e) => {
                    let unanswered = !received && e.kind() == io::ErrorKind::ConnectionReset;
                    return Err(Failed { error: UpstreamError::Read(e), unanswered });
                }
            }
        };
        let body = EngineBody {
            decoder: BodyDecoder::new(head.framing),
            keep_alive: head.keep_alive,
            conn: Some(self),
        };
        let mut response = Response::new(body);
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = head.headers;
        Ok(response)
    }
}

/// Makes room for a read (a read into a full buffer would look like end of input).
fn reserve(buf: &mut BytesMut, want: usize) {
    if buf.capacity() - buf.len() < 512 {
        buf.reserve(want.max(512));
    }
}

/// Why an engine's response body broke off.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("read failed: {0}")]
    Read(io::Error),
    #[error("{0}")]
    Protocol(CodecError),
}

/// An engine's response body, read from the connection it owns as it is polled.
#[derive(Debug)]
pub struct EngineBody {
    /// `None` once the connection was taken back for reuse or dropped after an error.
    conn: Option<Conn>,
    decoder: BodyDecoder,
    /// Whether the engine allows another request on this connection after this body.
    keep_alive: bool,
}

impl EngineBody {
    /// The connection, if this body ended cleanly and the connection may carry another request.
    pub fn take_reusable_conn(&mut self) -> Option<Conn> {
        let clean = self.conn.as_ref().is_some_and(|c| c.read_buf.is_empty());
        if !(self.keep_alive && self.decoder.is_done() && clean) {
            return None;
        }
        let mut conn = self.conn.take()?;
        if conn.read_buf.capacity() > KEEP_READ_BUF_MAX {
            conn.read_buf = BytesMut::new();
        }
        Some(conn)
    }

    fn broken(&mut self, error: BodyError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.conn = None;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for EngineBody {
    type Data = Bytes;
    type Error = BodyError;

    /// Hands out what the buffer holds first (a small response usually arrived whole with its
    /// head, and then goes out in one frame without another read); reads only when it is
    /// empty. Hot path.
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else { return Poll::Ready(None) };
            match this.decoder.decode(&mut conn.read_buf) {
                Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Decoded::Done) => return Poll::Ready(None),
                Ok(Decoded::NeedMore) => {}
                Err(e) => return this.broken(BodyError::Protocol(e)),
            }
            let want = this.decoder.remaining().map_or(READ_RESERVE, |r| r.clamp(512, 64 * 1024) as usize);
            reserve(&mut conn.read_buf, want);
            let read = ready!(pin!(conn.stream.read_buf(&mut conn.read_buf)).poll(cx));
            match read {
                Ok(0) => {
                    if let Err(e) = this.decoder.eof() {
                        return this.broken(BodyError::Protocol(e));
                    }
                }
                Ok(_) => {}
                Err(e) => return this.broken(BodyError::Read(e)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

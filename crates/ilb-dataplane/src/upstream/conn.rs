//! One engine connection, owned by the request that uses it: the request's own task writes the
//! request and reads the response, so no other task is woken on the way (hyper's client
//! connection runs on a task of its own, and every request crossed to it and back).
//!
//! [`Conn::round_trip`] writes the request in one call and reads the response head;
//! [`EngineBody`] then owns the connection and reads the body as the client side polls it, so
//! streamed chunks go out as they arrive. A body that ended cleanly hands its connection back
//! for reuse ([`EngineBody::take_reusable_conn`]); a body dropped before its end drops (closes)
//! the connection, which tells the engine to stop generating.
//!
//! The connection is plain TCP or TLS ([`Stream`]); the codec sees bytes either way. The plain
//! path pays one `match` per read and write, nothing else.

use super::codec::{self, BodyDecoder, CodecError, Decoded};
use super::{UpstreamError, UpstreamRequest};
use bytes::{Bytes, BytesMut};
use http::Response;
use http_body::{Body, Frame, SizeHint};
use ilb_tls::tokio_rustls::client::TlsStream;
use ilb_tls::{ClientTls, ServerName};
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
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
    stream: Stream,
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
    /// Opens a connection (TCP_NODELAY) and, for an https engine (`tls_name` set), runs the
    /// TLS handshake with `tls` (resuming a cached session when it can); both together are
    /// bounded by `timeout`.
    pub(super) async fn connect(
        host: &str,
        port: u16,
        tls_name: Option<&ServerName<'static>>,
        tls: &ClientTls,
        timeout: Duration,
    ) -> Result<Conn, UpstreamError> {
        let timed_out = || UpstreamError::ConnectTimeout(timeout.as_millis() as u64);
        let deadline = crate::clock::now() + timeout;
        let tcp = match tokio::time::timeout_at(deadline, TcpStream::connect((host, port))).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(UpstreamError::Connect(e)),
            Err(_) => return Err(timed_out()),
        };
        let _ = tcp.set_nodelay(true);
        let stream = match tls_name {
            None => Stream::Plain(tcp),
            Some(name) => {
                let handshake = tls.connector().connect(name.clone(), tcp);
                match tokio::time::timeout_at(deadline, handshake).await {
                    Ok(Ok(stream)) => Stream::Tls(Box::new(stream)),
                    Ok(Err(e)) => return Err(UpstreamError::from_handshake(e)),
                    Err(_) => return Err(timed_out()),
                }
            }
        };
        Ok(Conn {
            stream,
            read_buf: BytesMut::with_capacity(READ_RESERVE),
            write_buf: Vec::with_capacity(1024),
        })
    }

    /// Whether an idle connection may carry a request: nothing arrived while it was idle (an
    /// engine's close, reset, or stray bytes). Costs a syscall only when the reactor has seen
    /// the socket become readable; otherwise it is a flag check. Hot path.
    pub(super) fn is_usable_idle(&mut self) -> bool {
        if !self.read_buf.is_empty() {
            return false;
        }
        match &mut self.stream {
            Stream::Plain(tcp) => {
                let mut probe = [0u8; 1];
                matches!(tcp.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            // TLS records may arrive while idle without making the connection unusable (TLS 1.3
            // session tickets): let rustls read and process them, and see whether any
            // application data, a close or an error came out. Read bytes of the response to
            // come cannot exist (no request is outstanding), so whatever is read is stray.
            Stream::Tls(tls) => {
                let mut probe = [0u8; 1];
                let mut buf = ReadBuf::new(&mut probe);
                let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
                matches!(Pin::new(&mut **tls).poll_read(&mut cx, &mut buf), Poll::Pending)
            }
        }
    }

    /// Whether this connection runs TLS, and if so whether its session was resumed.
    pub fn tls_resumed(&self) -> Option<bool> {
        match &self.stream {
            Stream::Plain(_) => None,
            Stream::Tls(tls) => Some(matches!(
                tls.get_ref().1.handshake_kind(),
                Some(ilb_tls::rustls::HandshakeKind::Resumed)
            )),
        }
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
        if written.is_ok() {
            // TLS may hold records that the socket did not take yet; a plain flush is a no-op.
            written = self.stream.flush().await;
        }
        // An engine may answer before it has read the whole request (413 for a body too large
        // for it, 400, 401) and close the connection, which fails the rest of the write: its
        // answer is the response, passed on like any other, and the connection is not reused.
        let wrote_all = written.is_ok();
        let head = match (self.read_head().await, written) {
            (Ok(head), _) => head,
            // The engine cannot have acted on a request it did not receive in full.
            (Err(_), Err(e)) => return Err(Failed { error: UpstreamError::Write(e), unanswered: true }),
            (Err(failed), Ok(())) => return Err(failed),
        };
        let keep_alive = head.keep_alive && wrote_all;
        let body = EngineBody { decoder: BodyDecoder::new(head.framing), keep_alive, conn: Some(self) };
        let mut response = Response::new(body);
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = head.headers;
        Ok(response)
    }

    /// Reads a response head. Hot path.
    async fn read_head(&mut self) -> Result<codec::Head, Failed> {
        let mut received = false;
        loop {
            if !self.read_buf.is_empty() {
                match codec::parse_head(&mut self.read_buf) {
                    Ok(Some(head)) => return Ok(head),
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
        }
    }
}

/// An engine connection's byte stream: plain TCP, or TLS over TCP (boxed: a rustls client
/// connection is large, and a plain connection should not carry its size).
#[derive(Debug)]
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    #[inline]
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    #[inline]
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
        }
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

/// `first` and every further body byte the buffer already holds, as one piece: copied
/// together only when there are more (then they are chunks of a chunked body, split by their
/// framing). Stops at the first thing that is not body data (more to read, the end, or a
/// malformed frame, which the next decode reports again: the decoder stays where it failed).
fn coalesce(decoder: &mut BodyDecoder, buf: &mut BytesMut, first: Bytes) -> Bytes {
    let mut joined: Option<BytesMut> = None;
    while let Ok(Decoded::Data(more)) = decoder.decode(buf) {
        let joined = joined.get_or_insert_with(|| {
            let mut out = BytesMut::with_capacity(first.len() + more.len() + buf.len());
            out.extend_from_slice(&first);
            out
        });
        joined.extend_from_slice(&more);
    }
    joined.map_or(first, BytesMut::freeze)
}

impl Body for EngineBody {
    type Data = Bytes;
    type Error = BodyError;

    /// Hands out what the buffer holds first (a small response usually arrived whole with its
    /// head, and then goes out in one frame without another read); reads only when it is
    /// empty. Every body byte already read goes out in the one frame (`coalesce`): chunks
    /// that arrived together (a stream's last token, finish and `[DONE]` events) pass the
    /// client side once, and none waits for a chunk still to come. Hot path.
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else { return Poll::Ready(None) };
            match this.decoder.decode(&mut conn.read_buf) {
                Ok(Decoded::Data(data)) => {
                    let data = coalesce(&mut this.decoder, &mut conn.read_buf, data);
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
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

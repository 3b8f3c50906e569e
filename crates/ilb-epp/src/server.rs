//! The gateway's HTTP/2 connections, served with `h2` in one task per connection: each
//! ext_proc stream is an [`Exchange`] polled by its connection's task (no task, channel or
//! tower stack per stream), gRPC framed by hand, Envoy's messages decoded with `inbound.rs`
//! and the answers encoded by `wire::Answer` (a body goes back as the slice it came in).
//! Other paths (`grpc.health.v1`) go to tonic-health's service, one task per call: they are rare.
//!
//! Why not tonic's server: per request the EPP answers four small messages on one gRPC stream,
//! and with hyper and tonic each stream cost a task, a boxed service future, tonic's encode and
//! decode stream state, and HTTP header maps and extensions built and dropped, which together
//! took more CPU than the pick and the h2 framing.

use crate::inbound::ProcessingRequest;
use crate::stream::{self, Step};
use crate::wire::Answer;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue};
use ilb_dataplane::Router;
use prost::Message;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tonic::codegen::Service;

/// The ext_proc method's path.
const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";

/// HTTP/2 settings of a gateway connection. Windows of 4 MiB per stream and 16 MiB per
/// connection (hyper's were 1 MiB each): a 200 KB prompt comes in without waiting for a
/// WINDOW_UPDATE, and updates are rare. Frames of up to 256 KiB, so that a body chunk Envoy
/// sends (at most 64 KiB) can arrive in one frame, in one piece.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;
const MAX_FRAME: u32 = 256 << 10;

/// Received bytes a stream keeps unreleased to the flow control while it runs: a small
/// request's messages (about 1 KiB in all) are never released one by one, since a stream that
/// ends gives its window back to the connection as it closes. A stream waiting on a pick
/// releases all it holds, so only streams being served hold any, under 16 KiB each: 1,024 of
/// them at once before the 16 MiB connection window would wait on them.
const RELEASE_AT: usize = 16 << 10;

/// The room `out` takes at a time: a pick, the body sent back and the response's answers
/// of a small request fit together.
const OUT_ROOM: usize = 2048;

/// What every connection's streams share.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) router: Arc<Router>,
    /// The largest message read: a request body chunk can be up to the body limit.
    pub(crate) max_message: usize,
    pub(crate) health: tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>,
}

/// Serves one gateway connection until it closes, or, once `shutdown` turns true, until its
/// open streams end (the gateway gets GOAWAY and opens new streams elsewhere).
pub(crate) async fn serve<T>(io: T, shared: Shared, mut shutdown: watch::Receiver<bool>)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME);
    let mut connection = match builder.handshake::<_, Bytes>(io).await {
        Ok(connection) => connection,
        Err(error) => {
            tracing::debug!(%error, "epp http/2 handshake failed");
            return;
        }
    };
    let mut exchanges = FuturesUnordered::new();
    let stop = async { shutdown.wait_for(|stop| *stop).await.map(|_| ()) };
    tokio::pin!(stop);
    let mut closing = false;
    std::future::poll_fn(|cx| loop {
        // The streams first, then the connection, which writes what they sent.
        while let Poll::Ready(Some(())) = exchanges.poll_next_unpin(cx) {}
        if !closing && stop.as_mut().poll(cx).is_ready() {
            closing = true;
            connection.graceful_shutdown();
        }
        let mut accepted = false;
        loop {
            match connection.poll_accept(cx) {
                Poll::Ready(Some(Ok((request, respond)))) => {
                    if request.uri().path() == PROCESS_PATH {
                        exchanges.push(Exchange::new(request.into_body(), respond, &shared));
                        accepted = true;
                    } else {
                        tokio::spawn(serve_other(request, respond, shared.health.clone()));
                    }
                }
                Poll::Ready(Some(Err(error))) => {
                    tracing::debug!(%error, "epp connection ended");
                    return Poll::Ready(());
                }
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => break,
            }
        }
        // New streams are polled at once (a stream pushed is not polled until asked).
        if !accepted {
            return Poll::Pending;
        }
    })
    .await;
}

/// One ext_proc stream: Envoy's messages in, each handled by its [`stream::Stream`], the
/// answers gathered and sent as one DATA frame per turn (those ready together go out together).
struct Exchange {
    recv: RecvStream,
    /// The response until its headers are sent, at the first poll.
    respond: Option<SendResponse<Bytes>>,
    /// The response, its headers sent (`None`: not yet, or the stream was reset before).
    send: Option<SendStream<Bytes>>,
    stream: stream::Stream,
    max_message: usize,
    /// Received bytes not yet a whole gRPC message.
    partial: BytesMut,
    /// Whole messages received, not yet handled (a DATA frame may carry several).
    received: Bytes,
    answers: Vec<Answer>,
    out: BytesMut,
    /// The pick under way; no message is read meanwhile.
    picking: Option<stream::Pick>,
    /// Envoy closed its side.
    recv_done: bool,
    /// Bytes received and not yet released to the flow control: released once per turn when
    /// over [`RELEASE_AT`] or when the stream waits on a pick, not per frame (a stream that
    /// ends gives its window back to the connection as it closes).
    unreleased: usize,
}

/// How an exchange ends: gRPC status 0, or an error status (code and message).
type Ending = Result<(), (u8, String)>;

impl Exchange {
    fn new(recv: RecvStream, respond: SendResponse<Bytes>, shared: &Shared) -> Exchange {
        Exchange {
            recv,
            respond: Some(respond),
            send: None,
            stream: stream::Stream::new(Arc::clone(&shared.router)),
            max_message: shared.max_message,
            partial: BytesMut::new(),
            received: Bytes::new(),
            answers: Vec::new(),
            out: BytesMut::new(),
            picking: None,
            recv_done: false,
            unreleased: 0,
        }
    }

    /// Runs the stream as far as it can go now: `Ready` with how it ends, or `Pending` with its
    /// answers so far sent.
    fn run(&mut self, cx: &mut Context<'_>) -> Poll<Ending> {
        // The response headers at the first poll, not when the stream is accepted: a gRPC client
        // may wait for them before it sends, and so they leave with the next write of the
        // connection rather than in a write of their own per accepted stream (h2 writes out what
        // is queued at each accept).
        if let Some(mut respond) = self.respond.take() {
            self.send = respond.send_response(grpc_response(), false).ok();
        }
        loop {
            if let Some(pick) = &mut self.picking {
                if self.stream.poll_pick(pick, cx, &mut self.answers).is_pending() {
                    self.release(0);
                    return Poll::Pending;
                }
                self.picking = None;
                self.encode_answers();
                if self.stream.done() {
                    return Poll::Ready(Ok(()));
                }
            }
            if let Some(message) = self.next_message()? {
                match self.stream.handle(message, &mut self.answers) {
                    Ok(Step::Answered) => {}
                    Ok(Step::Pick(pick)) => self.picking = Some(pick),
                    Err(error) => {
                        tracing::debug!(%error, "malformed ext_proc stream");
                        self.encode_answers();
                        return Poll::Ready(Err((INVALID_ARGUMENT, error.to_string())));
                    }
                }
                self.encode_answers();
                if self.stream.done() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if self.recv_done {
                if !self.partial.is_empty() {
                    return Poll::Ready(Err((INTERNAL, "the stream ended inside a message".into())));
                }
                return Poll::Ready(Ok(()));
            }
            match self.recv.poll_data(cx) {
                Poll::Ready(Some(Ok(data))) => {
                    self.unreleased += data.len();
                    // `received` is empty here: `next_message` moved any rest to `partial`.
                    if self.partial.is_empty() {
                        self.received = data;
                    } else {
                        self.partial.extend_from_slice(&data);
                    }
                }
                Poll::Ready(None) => self.recv_done = true,
                Poll::Ready(Some(Err(error))) => {
                    // Reset by the gateway, or the connection is gone: nobody to answer.
                    tracing::debug!(%error, "ext_proc stream ended");
                    return Poll::Ready(Err((CANCELLED, String::new())));
                }
                Poll::Pending => {
                    self.flush();
                    self.release(RELEASE_AT);
                    return Poll::Pending;
                }
            }
        }
    }

    /// Gives the bytes received back to the flow control once they are more than `keep`.
    fn release(&mut self, keep: usize) {
        if self.unreleased > keep {
            let _ = self.recv.flow_control().release_capacity(std::mem::take(&mut self.unreleased));
        }
    }

    /// The next whole message received, decoded. A message that came in one DATA frame is
    /// decoded in place; pieces are gathered in `partial` first.
    fn next_message(&mut self) -> Result<Option<ProcessingRequest>, (u8, String)> {
        if !self.partial.is_empty() {
            debug_assert!(self.received.is_empty());
            let Some(len) = self.message_len(&self.partial)? else { return Ok(None) };
            if self.partial.len() < 5 + len {
                self.partial.reserve(5 + len - self.partial.len());
                return Ok(None);
            }
            self.received = self.partial.split().freeze();
        }
        let whole = match self.message_len(&self.received)? {
            Some(len) if self.received.len() >= 5 + len => len,
            _ => {
                if !self.received.is_empty() {
                    self.partial.extend_from_slice(&self.received);
                    self.received = Bytes::new();
                }
                return Ok(None);
            }
        };
        let mut message = self.received.split_to(5 + whole);
        message.advance(5);
        ProcessingRequest::decode(message)
            .map(Some)
            .map_err(|error| (INVALID_ARGUMENT, format!("undecodable ext_proc message: {error}")))
    }

    /// The length of the gRPC message `bytes` starts with, once its 5-byte prefix is in.
    fn message_len(&self, bytes: &[u8]) -> Result<Option<usize>, (u8, String)> {
        let Some(prefix) = bytes.get(..5) else { return Ok(None) };
        if prefix[0] != 0 {
            // The EPP accepts no compression (it announces none).
            return Err((UNIMPLEMENTED, "compressed messages are not accepted".into()));
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > self.max_message {
            return Err((
                RESOURCE_EXHAUSTED,
                format!("message of {len} bytes, over the limit of {}", self.max_message),
            ));
        }
        Ok(Some(len))
    }

    /// Moves the answers into `out` (a long body chunk is sent as it is, after what precedes it).
    fn encode_answers(&mut self) {
        if self.answers.is_empty() {
            return;
        }
        // Room for several turns' answers at once: each turn's are split off `out` to be sent,
        // and the rest of the allocation serves the next turns.
        if self.out.capacity() - self.out.len() < OUT_ROOM / 4 {
            self.out.reserve(OUT_ROOM);
        }
        let mut answers = std::mem::take(&mut self.answers);
        for answer in answers.drain(..) {
            if let Some(body) = answer.encode(&mut self.out) {
                self.flush();
                self.send_data(body);
            }
        }
        self.answers = answers;
    }

    /// Sends what `out` holds.
    fn flush(&mut self) {
        if !self.out.is_empty() {
            let data = self.out.split().freeze();
            self.send_data(data);
        }
    }

    fn send_data(&mut self, data: Bytes) {
        if let Some(send) = &mut self.send {
            // An error means the stream was reset: the next read ends the exchange.
            let _ = send.send_data(data, false);
        }
    }

    /// Ends the response with `ending`'s gRPC status.
    fn end(&mut self, ending: Ending) {
        let (code, message) = match ending {
            Ok(()) => (0, String::new()),
            // Reset by the gateway: nothing to send.
            Err((CANCELLED, _)) => return,
            Err(error) => error,
        };
        self.flush();
        let mut trailers = HeaderMap::with_capacity(2);
        trailers.insert("grpc-status", HeaderValue::from(u16::from(code)));
        if !message.is_empty() {
            if let Ok(value) = HeaderValue::from_str(&percent_encode(&message)) {
                trailers.insert("grpc-message", value);
            }
        }
        if let Some(send) = &mut self.send {
            let _ = send.send_trailers(trailers);
        }
    }
}

impl Future for Exchange {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let ending = ready!(this.run(cx));
        this.end(ending);
        Poll::Ready(())
    }
}

// gRPC status codes.
const CANCELLED: u8 = 1;
const INVALID_ARGUMENT: u8 = 3;
const RESOURCE_EXHAUSTED: u8 = 8;
const UNIMPLEMENTED: u8 = 12;
const INTERNAL: u8 = 13;

fn grpc_response() -> http::Response<()> {
    let mut response = http::Response::new(());
    response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// `grpc-message`'s percent-encoding: printable ASCII but `%` as is, the rest escaped.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A call to another service (health), through tonic's service, in a task of its own.
async fn serve_other(
    request: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    mut health: tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>,
) {
    use http_body_util::BodyExt;
    let request = request.map(RecvBody);
    let Ok(response) = health.call(request).await;
    let (parts, mut body) = response.into_parts();
    let Ok(mut send) = respond.send_response(http::Response::from_parts(parts, ()), false) else { return };
    let mut ended = false;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            send.send_reset(h2::Reason::INTERNAL_ERROR);
            return;
        };
        let result = match frame.into_data() {
            Ok(data) => send.send_data(data, false),
            Err(frame) => match frame.into_trailers() {
                Ok(trailers) => {
                    ended = true;
                    send.send_trailers(trailers)
                }
                Err(_) => Ok(()),
            },
        };
        if result.is_err() {
            return;
        }
    }
    if !ended {
        let _ = send.send_data(Bytes::new(), true);
    }
}

/// An h2 request body as an `http_body::Body`.
struct RecvBody(RecvStream);

impl http_body::Body for RecvBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, h2::Error>>> {
        match ready!(self.0.poll_data(cx)) {
            Some(Ok(data)) => {
                let _ = self.0.flow_control().release_capacity(data.len());
                Poll::Ready(Some(Ok(http_body::Frame::data(data))))
            }
            Some(Err(error)) => Poll::Ready(Some(Err(error))),
            None => match ready!(self.0.poll_trailers(cx)) {
                Ok(Some(trailers)) => Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers)))),
                Ok(None) => Poll::Ready(None),
                Err(error) => Poll::Ready(Some(Err(error))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

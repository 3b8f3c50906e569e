//! ilb as the Endpoint Picker (EPP) of an Envoy gateway, per the Gateway API Inference
//! Extension's EPP protocol v1.0: a gRPC server implementing Envoy's
//! `envoy.service.ext_proc.v3.ExternalProcessor`, which tells the gateway which engine (and
//! which fallbacks, in order) should serve each request, in the `x-gateway-destination-endpoint`
//! header and the `envoy.lb` dynamic metadata.
//!
//! The decision is the data plane's own ([`ilb_dataplane::Router`]): the same classification,
//! snapshot, holds, guard, shedding and `ClassTable::select`; the gateway forwards the request.
//! The endpoint that served (`x-gateway-destination-endpoint-served`, from the gateway's
//! metadata on the response path) feeds the in-flight counts, the affinity table, the local
//! guard and the reports to the control plane. Health is served with `grpc.health.v1`:
//! `liveness` at once; `readiness`, the ext_proc service name and the server (`""`) once a
//! snapshot is installed.
//!
//! **Restarts without a gap.** The listener is bound with `SO_REUSEPORT` (as Envoy binds its
//! own): a new `ilb epp` on the same address starts accepting beside the old one, which then
//! [`Epp::shutdown`]s: its health turns `NOT_SERVING`, it stops accepting and sends HTTP/2
//! GOAWAY, so the gateway opens its next streams to the new process while the open ones finish.
//! (Linux allows this only between processes of one user.)
//!
//! **TLS.** With the data plane's listener TLS (`--tls-cert`/`--tls-key`, `[data_plane.tls]`)
//! the gRPC listener serves TLS with ALPN `h2` (`tls.rs`), its certificate rotating in place.
//!
//! **Invariant:** response bodies pass through unchanged, chunk by chunk as the gateway sent
//! them; request bodies are read whole (the pick needs the model and the prompt) and sent back
//! unchanged.

// No product function over `too-many-lines-threshold` (clippy.toml) lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod inbound;
mod io;
mod stream;
mod tls;
pub mod wire;

pub use stream::{Pick, Step, Stream, StreamError};

use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse;
use futures_util::StreamExt;
use ilb_dataplane::Router;
use inbound::ProcessingRequest;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tonic::codec::BufferSettings;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

/// The name of the ext_proc service, as health checks ask for it.
pub const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// How long [`Epp::shutdown`] lets open streams finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A running endpoint picker.
pub struct Epp {
    local_addr: SocketAddr,
    router: Arc<Router>,
    shutdown: watch::Sender<bool>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    readiness: tokio::task::JoinHandle<()>,
    health: tonic_health::server::HealthReporter,
}

impl Epp {
    /// Binds `listen` (with `SO_REUSEPORT`: a successor may bind it too) and serves the
    /// ext_proc and health services, picking with `router`.
    pub async fn start(listen: SocketAddr, router: Router) -> std::io::Result<Epp> {
        let listener = bind_shared(listen)?;
        let local_addr = listener.local_addr()?;
        let router = Arc::new(router);
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_service_status("liveness", tonic_health::ServingStatus::Serving).await;
        for service in ["readiness", EXT_PROC_SERVICE, ""] {
            health.set_service_status(service, tonic_health::ServingStatus::NotServing).await;
        }
        let (shutdown, shutdown_rx) = watch::channel(false);
        let readiness =
            tokio::spawn(follow_readiness(Arc::clone(&router), health.clone(), shutdown_rx.clone()));
        let service = ExtProc {
            router: Arc::clone(&router),
            max_message: router.config().max_body_bytes.saturating_add(64 << 10),
        };
        let routes = tonic::transport::Server::builder().add_service(health_service).add_service(service);
        let stopped = {
            let mut shutdown = shutdown_rx.clone();
            async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
            }
        };
        let server = match &router.config().listener_tls {
            // No Nagle: the answers are small writes that must leave at once (with it, a pick
            // waited ~40 ms for the gateway's delayed ACK).
            // Not vectored, so that the answers ready together share a write (io.rs).
            None => {
                let incoming = TcpIncoming::from(listener)
                    .with_nodelay(Some(true))
                    .map(|connection| connection.map(io::Unvectored));
                tokio::spawn(routes.serve_with_incoming_shutdown(incoming, stopped))
            }
            Some(tls) => {
                let timeout = router.config().timeouts.header_read;
                let incoming = tls::incoming(listener, tls.with_alpn(&[b"h2"]), timeout, shutdown_rx);
                tokio::spawn(routes.serve_with_incoming_shutdown(incoming, stopped))
            }
        };
        Ok(Epp { local_addr, router, shutdown, server, readiness, health })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Reports `NOT_SERVING`, stops accepting (open HTTP/2 connections get GOAWAY, so a
    /// gateway moves its new streams to a successor on the same address), gives open streams
    /// [`SHUTDOWN_GRACE`] to end (a streamed answer may take longer), then stops them and the
    /// router's tasks.
    pub async fn shutdown(mut self) {
        // The readiness task changes the status only when readiness changes: it leaves this.
        for service in ["readiness", EXT_PROC_SERVICE, ""] {
            self.health.set_service_status(service, tonic_health::ServingStatus::NotServing).await;
        }
        let _ = self.shutdown.send(true);
        let _ = (&mut self.readiness).await;
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut self.server).await {
            Ok(Ok(Err(error))) => tracing::warn!(%error, "epp server ended with an error"),
            Ok(Err(error)) => tracing::warn!(%error, "epp server task failed"),
            Ok(Ok(Ok(()))) => {}
            Err(_) => self.server.abort(),
        }
        if let Ok(router) = Arc::try_unwrap(self.router) {
            router.shutdown().await;
        }
    }
}

/// A listener on `addr` that another process of this user may also bind (`SO_REUSEPORT`).
fn bind_shared(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket =
        if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Sets readiness (and the ext_proc service's status) from whether a snapshot is installed.
async fn follow_readiness(
    router: Arc<Router>,
    health: tonic_health::server::HealthReporter,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ready = false;
    loop {
        let now_ready = router.installed().is_some();
        if now_ready != ready {
            ready = now_ready;
            let status = if ready {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            for service in ["readiness", EXT_PROC_SERVICE, ""] {
                health.set_service_status(service, status).await;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// The ext_proc service, as envoy-types' generated `ExternalProcessorServer` serves it but
/// reading Envoy's messages with `inbound.rs`'s lighter types. Each stream's answers are an
/// [`Exchange`], which reads Envoy's next message when the last answers have gone out (no task
/// or channel of its own: hyper already runs one task per HTTP/2 stream).
#[derive(Clone)]
struct ExtProc {
    router: Arc<Router>,
    /// The largest message read: a request body chunk can be up to the body limit.
    max_message: usize,
}

/// The ext_proc method's path.
const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";

impl NamedService for ExtProc {
    const NAME: &'static str = EXT_PROC_SERVICE;
}

impl<B> Service<http::Request<B>> for ExtProc
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != PROCESS_PATH {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let (router, max_message) = (Arc::clone(&self.router), self.max_message);
        Box::pin(async move {
            let mut grpc = Grpc::new(Codec).apply_max_message_size_config(Some(max_message), None);
            Ok(grpc.streaming(Process(router), request).await)
        })
    }
}

/// The ext_proc method: a stream of answers per stream of Envoy's messages.
struct Process(Arc<Router>);

impl StreamingService<ProcessingRequest> for Process {
    type Response = ProcessingResponse;
    type ResponseStream = Exchange;
    type Future = std::future::Ready<Result<Response<Exchange>, Status>>;

    fn call(&mut self, request: Request<Streaming<ProcessingRequest>>) -> Self::Future {
        std::future::ready(Ok(Response::new(Exchange {
            stream: stream::Stream::new(Arc::clone(&self.0)),
            inbound: request.into_inner(),
            pending: VecDeque::new(),
            picking: None,
            ended: false,
        })))
    }
}

/// Answers encoded with prost, Envoy's messages decoded into `inbound.rs`'s types. Buffers of
/// 2 KiB to start with (tonic's default is 8 KiB, two per stream): most messages are smaller,
/// and a buffer grows for a larger one.
#[derive(Clone, Copy, Default)]
struct Codec;

fn buffers() -> BufferSettings {
    BufferSettings::new(2 << 10, 32 << 10)
}

impl tonic::codec::Codec for Codec {
    type Encode = ProcessingResponse;
    type Decode = ProcessingRequest;
    type Encoder = tonic_prost::ProstEncoder<ProcessingResponse>;
    type Decoder = tonic_prost::ProstDecoder<ProcessingRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(buffers())
    }
}

/// One ext_proc stream in progress: Envoy's messages in, the answers not yet sent. A stream of
/// its own (not an `async` block re-made per message) so that nothing large moves per message.
pub struct Exchange {
    stream: stream::Stream,
    inbound: Streaming<ProcessingRequest>,
    pending: VecDeque<ProcessingResponse>,
    /// The pick under way; no message is read meanwhile.
    picking: Option<stream::Pick>,
    /// No message is read any more: an immediate response went out, or a malformed message
    /// ended the stream.
    ended: bool,
}

impl futures_util::Stream for Exchange {
    type Item = Result<ProcessingResponse, Status>;

    /// The next answer, reading Envoy's messages until there is one; `None` when Envoy closed
    /// the stream or it ended (after `INVALID_ARGUMENT` for a malformed message).
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(answer) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(answer)));
            }
            if let Some(pick) = &mut this.picking {
                let answers = ready!(this.stream.poll_pick(pick, cx));
                this.picking = None;
                this.pending.extend(answers);
                this.ended = this.stream.done();
                continue;
            }
            if this.ended {
                return Poll::Ready(None);
            }
            let message = match ready!(Pin::new(&mut this.inbound).poll_next(cx)) {
                Some(Ok(message)) => message,
                None => return Poll::Ready(None),
                Some(Err(status)) => {
                    tracing::debug!(%status, "ext_proc stream ended");
                    return Poll::Ready(None);
                }
            };
            match this.stream.handle(message) {
                Ok(stream::Step::Answers(answers)) => this.pending.extend(answers),
                Ok(stream::Step::Pick(pick)) => this.picking = Some(pick),
                Err(error) => {
                    tracing::debug!(%error, "malformed ext_proc stream");
                    this.ended = true;
                    return Poll::Ready(Some(Err(Status::invalid_argument(error.to_string()))));
                }
            }
            this.ended = this.stream.done();
        }
    }
}

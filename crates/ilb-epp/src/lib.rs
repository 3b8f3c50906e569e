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
// No unsafe code (the workspace's one `unsafe` is the optimizer's cache prefetch hint).
#![forbid(unsafe_code)]

pub mod inbound;
mod io;
mod protobuf;
mod server;
mod stream;
mod tls;
pub mod wire;

pub use stream::{Pick, Step, Stream, StreamError};

use futures_util::StreamExt;
use ilb_dataplane::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The name of the ext_proc service, as health checks ask for it.
pub const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// How long [`Epp::shutdown`] lets open streams finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A running endpoint picker.
pub struct Epp {
    local_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    router: Arc<Router>,
    shutdown: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    readiness: tokio::task::JoinHandle<()>,
    health: tonic_health::server::HealthReporter,
}

impl Epp {
    /// Binds `listen` (with `SO_REUSEPORT`: a successor may bind it too) and serves the
    /// ext_proc and health services, picking with `router`; and the router's operator
    /// endpoints on its config's `admin_listen`, if set (bound the same way).
    pub async fn start(listen: SocketAddr, mut router: Router) -> std::io::Result<Epp> {
        let listener = bind_shared(listen)?;
        let local_addr = listener.local_addr()?;
        let admin_addr = match router.config().admin_listen {
            Some(addr) => {
                let admin = bind_shared(addr)?;
                let addr = admin.local_addr()?;
                router.serve_admin(admin);
                Some(addr)
            }
            None => None,
        };
        let router = Arc::new(router);
        let health = tonic_health::server::HealthReporter::new();
        let health_service = tonic_health::pb::health_server::HealthServer::new(
            tonic_health::server::HealthService::from_health_reporter(health.clone()),
        );
        health.set_service_status("liveness", tonic_health::ServingStatus::Serving).await;
        for service in ["readiness", EXT_PROC_SERVICE, ""] {
            health.set_service_status(service, tonic_health::ServingStatus::NotServing).await;
        }
        let (shutdown, shutdown_rx) = watch::channel(false);
        let readiness =
            tokio::spawn(follow_readiness(Arc::clone(&router), health.clone(), shutdown_rx.clone()));
        let shared = server::Shared {
            router: Arc::clone(&router),
            max_message: router.config().max_body_bytes.saturating_add(64 << 10),
            health: health_service,
        };
        let server = match &router.config().listener_tls {
            // No Nagle: the answers are small writes that must leave at once (with it, a pick
            // waited ~40 ms for the gateway's delayed ACK).
            // Not vectored, so that the answers ready together share a write (io.rs).
            None => {
                let incoming = tonic::transport::server::TcpIncoming::from(listener)
                    .with_nodelay(Some(true))
                    .map(|connection| connection.map(io::Unvectored));
                tokio::spawn(accept(incoming, shared, shutdown_rx))
            }
            Some(tls) => {
                let timeout = router.config().timeouts.header_read;
                let incoming = tls::incoming(listener, tls.with_alpn(&[b"h2"]), timeout, shutdown_rx.clone());
                tokio::spawn(accept(incoming, shared, shutdown_rx))
            }
        };
        Ok(Epp { local_addr, admin_addr, router, shutdown, server, readiness, health })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where the operator's endpoints (`/metrics`, `/debug/route`, `/health`) are served, if
    /// the config's `admin_listen` asked for them.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
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
            Ok(Err(error)) => tracing::warn!(%error, "epp server task failed"),
            Ok(Ok(())) => {}
            // Dropping the task's connections' tasks (its `JoinSet`) ends their streams.
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

/// Serves the connections of `incoming`, one task each, until `shutdown`; then waits for them
/// to end (each has sent GOAWAY and finishes its open streams).
async fn accept<S, T, E>(incoming: S, shared: server::Shared, mut shutdown: watch::Receiver<bool>)
where
    S: futures_util::Stream<Item = Result<T, E>> + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    E: std::fmt::Display,
{
    let mut connections = JoinSet::new();
    let for_connections = shutdown.clone();
    // Boxed so that it can be dropped, closing the listener, at shutdown.
    let mut incoming = Box::pin(incoming);
    loop {
        tokio::select! {
            connection = incoming.next() => match connection {
                Some(Ok(io)) => {
                    connections.spawn(server::serve(io, shared.clone(), for_connections.clone()));
                }
                // Out of file descriptors and the like: back off instead of spinning.
                Some(Err(error)) => {
                    tracing::warn!(%error, "epp accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                None => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = async { shutdown.wait_for(|stop| *stop).await.map(|_| ()) } => break,
        }
    }
    drop(incoming);
    while connections.join_next().await.is_some() {}
}

//! The HTTP engine simulator: an OpenAI-compatible server on hyper 1 around one
//! [`EngineModel`], with vLLM metrics and fault injection. [`spawn`] starts one engine and
//! returns its [`EngineHandle`]; [`spawn_many`] starts several on consecutive ports.
//!
//! Tasks per engine: one accept loop (which also closes and re-binds the listener for the
//! `down` fault), one model driver (`driver`), and one task per connection.

mod api;
mod driver;
pub mod faults;
pub mod metrics;
mod respond;
mod responses;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use ilb_core::{EngineId, ModelName};
use rand::SeedableRng;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::model::EngineModel;
use crate::profile::{HardwareProfile, ProfileError};
use driver::ModelCell;
pub use faults::{Faults, FaultsError};
use metrics::Metrics;

/// One simulated engine's configuration.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Engine id, e.g. `sim-0`.
    pub id: EngineId,
    /// Served model name: requests naming another model get a 404, as from vLLM.
    pub model: ModelName,
    pub profile: HardwareProfile,
    /// Model latency (`true`) or answer at once without the model (`false`, for load tests).
    pub latency: bool,
    /// Seeds fault draws and output words.
    pub seed: u64,
    /// Largest accepted request body, bytes. Default 4 MiB.
    pub max_body_bytes: usize,
    /// Output tokens when the request gives no `max_tokens` (finish reason `stop`). Default 128.
    pub default_max_tokens: u32,
    /// Cap on `max_tokens` / `max_completion_tokens` (finish reason `length`). Default 4096.
    pub max_tokens_cap: u32,
    /// Dimensions of `/v1/embeddings` vectors. Default 32.
    pub embedding_dims: usize,
    /// Serve https with this (rotatable) certificate instead of plain http. Default none.
    pub tls: Option<ilb_tls::ServerTls>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            id: EngineId::new("sim"),
            model: ModelName::new("sim-model"),
            profile: HardwareProfile::default(),
            latency: true,
            seed: 0,
            max_body_bytes: 4 << 20,
            default_max_tokens: 128,
            max_tokens_cap: 4096,
            embedding_dims: 32,
            tls: None,
        }
    }
}

/// Why an engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Profile(#[from] ProfileError),
    #[error("invalid engine config: {0}")]
    Config(&'static str),
}

/// A point-in-time summary of one engine, for tests and the demo.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineStats {
    /// Requests finished normally (stop or length).
    pub requests_served: u64,
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    /// Mean time to first token over all requests, seconds (0 before the first).
    pub ttft_mean_seconds: f64,
    /// Prefix-cache hit tokens / queried tokens (0 before the first query).
    pub prefix_hit_rate: f64,
    pub prefix_queries_tokens: u64,
    pub prefix_hits_tokens: u64,
    /// Requests aborted (client gone mid-request).
    pub requests_aborted: u64,
}

pub(crate) struct Shared {
    config: EngineConfig,
    addr: SocketAddr,
    cell: Arc<ModelCell>,
    metrics: Arc<Metrics>,
    faults: Mutex<Faults>,
    rng: Mutex<rand_pcg::Pcg64>,
    next_request_id: AtomicU64,
    id_salt: u64,
    down: watch::Sender<bool>,
    /// Bumped to close every live connection (down fault, shutdown).
    close_connections: watch::Sender<u64>,
    /// Responses stored for `previous_response_id` (Responses API).
    responses: Mutex<responses::Store>,
}

impl Shared {
    fn stored_responses(&self) -> std::sync::MutexGuard<'_, responses::Store> {
        self.responses.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn faults(&self) -> Faults {
        self.faults.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn set_faults(&self, faults: Faults) -> Result<(), FaultsError> {
        faults.validate()?;
        {
            let mut state = self.cell.lock();
            state.model.set_slowdown(faults.slowdown);
            let ready = faults.ready_replicas.unwrap_or(self.config.profile.replicas);
            state.model.set_ready_replicas(ready as usize);
        }
        let down = faults.down;
        *self.faults.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = faults;
        self.down.send_if_modified(|current| std::mem::replace(current, down) != down);
        self.cell.wake.notify_one();
        Ok(())
    }

    fn draw_faults(&self, faults: &Faults, stream: bool) -> (bool, bool) {
        if faults.error_rate == 0.0 && (!stream || faults.drop_mid_stream == 0.0) {
            return (false, false);
        }
        let mut rng = self.rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        api::draw(&mut rng, faults, stream)
    }

    fn render_metrics(&self) -> String {
        let (stats, ready) = {
            let state = self.cell.lock();
            (state.model.stats(), state.model.ready_replicas())
        };
        self.metrics.render(self.config.model.as_str(), &stats, self.config.profile.replicas, ready as u32)
    }
}

/// A running engine. Dropping it stops the engine (as [`EngineHandle::shutdown`] without
/// waiting).
pub struct EngineHandle {
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl EngineHandle {
    pub fn id(&self) -> &EngineId {
        &self.shared.config.id
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// The bound address (the real port when spawned on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://ip:port` (`https://` with TLS), no trailing slash.
    pub fn url(&self) -> String {
        let scheme = if self.shared.config.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.shared.addr)
    }

    /// Replaces the fault document (same effect as `PUT /admin/faults`).
    pub fn set_faults(&self, faults: Faults) -> Result<(), FaultsError> {
        self.shared.set_faults(faults)
    }

    pub fn faults(&self) -> Faults {
        self.shared.faults()
    }

    pub fn stats(&self) -> EngineStats {
        let stats = self.shared.cell.lock().model.stats();
        let metrics = &self.shared.metrics;
        let counters = stats.counters;
        EngineStats {
            requests_served: metrics.served(),
            running: stats.running,
            waiting: stats.waiting,
            kv_usage: stats.kv_usage,
            ttft_mean_seconds: metrics.ttft.mean_seconds(),
            prefix_hit_rate: if counters.prefix_queries_tokens == 0 {
                0.0
            } else {
                counters.prefix_hits_tokens as f64 / counters.prefix_queries_tokens as f64
            },
            prefix_queries_tokens: counters.prefix_queries_tokens,
            prefix_hits_tokens: counters.prefix_hits_tokens,
            requests_aborted: metrics.finished_abort.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The `/metrics` document, without going through HTTP.
    pub fn metrics_text(&self) -> String {
        self.shared.render_metrics()
    }

    /// Stops accepting, closes every connection, stops the model driver, and waits for them.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// Starts one engine listening on `addr` (port 0 picks a free port).
pub async fn spawn(config: EngineConfig, addr: SocketAddr) -> Result<EngineHandle, Error> {
    if config.max_tokens_cap == 0 || config.default_max_tokens == 0 {
        return Err(Error::Config("max_tokens_cap and default_max_tokens must be at least 1"));
    }
    let model = EngineModel::new(&config.profile)?;
    let listener = bind(addr).map_err(|source| Error::Bind { addr, source })?;
    let addr = listener.local_addr().map_err(|source| Error::Bind { addr, source })?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (down, down_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        id_salt: xxhash_rust::xxh3::xxh3_64(config.id.as_str().as_bytes()),
        rng: Mutex::new(rand_pcg::Pcg64::seed_from_u64(config.seed)),
        config,
        addr,
        cell: Arc::new(ModelCell::new(model)),
        metrics: Arc::new(Metrics::default()),
        faults: Mutex::new(Faults::default()),
        next_request_id: AtomicU64::new(1),
        down,
        close_connections: watch::channel(0).0,
        responses: Mutex::default(),
    });
    let driver = tokio::spawn(driver::run(shared.cell.clone(), shared.metrics.clone(), shutdown_rx.clone()));
    let acceptor = tokio::spawn(accept_loop(shared.clone(), listener, down_rx, shutdown_rx));
    Ok(EngineHandle { shared, shutdown, tasks: vec![acceptor, driver] })
}

/// Starts `count` engines on consecutive ports from `first_addr` (each on a free port if its
/// port is 0). Engine `i` gets id `<config.id>-<i>` and seed `config.seed + i`.
pub async fn spawn_many(
    config: EngineConfig,
    first_addr: SocketAddr,
    count: usize,
) -> Result<Vec<EngineHandle>, Error> {
    let mut handles = Vec::with_capacity(count);
    for index in 0..count {
        let mut addr = first_addr;
        if first_addr.port() != 0 {
            let port = u16::try_from(usize::from(first_addr.port()) + index)
                .map_err(|_| Error::Config("engine ports run past 65535"))?;
            addr.set_port(port);
        }
        let engine_config = EngineConfig {
            id: EngineId::new(format!("{}-{index}", config.id)),
            seed: config.seed.wrapping_add(index as u64),
            ..config.clone()
        };
        handles.push(spawn(engine_config, addr).await?);
    }
    Ok(handles)
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    // Re-binding the same port after the `down` fault must not wait for TIME_WAIT sockets.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut down: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut listener = Some(listener);
    loop {
        if *down.borrow_and_update() {
            listener = None;
            shared.close_connections.send_modify(|generation| *generation += 1);
            let back_after = shared.faults().down_for_ms.map(Duration::from_millis);
            tokio::select! {
                changed = down.changed() => if changed.is_err() { return },
                _ = sleep_or_forever(back_after) => {
                    let faults = Faults { down: false, down_for_ms: None, ..shared.faults() };
                    let _ = shared.set_faults(faults);
                }
                _ = shutdown.changed() => return,
            }
            continue;
        }
        let active = match listener.take() {
            Some(active) => active,
            None => match bind(shared.addr) {
                Ok(active) => active,
                Err(error) => {
                    tracing::warn!(engine = %shared.config.id, %error, "re-binding failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        tokio::select! {
            accepted = active.accept() => {
                match accepted {
                    Ok((stream, _)) => serve_connection(&shared, stream),
                    Err(error) => {
                        // Typically EMFILE: back off instead of spinning.
                        tracing::debug!(engine = %shared.config.id, %error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                listener = Some(active);
            }
            _ = down.changed() => listener = Some(active),
            _ = shutdown.changed() => {
                shared.close_connections.send_modify(|generation| *generation += 1);
                return;
            }
        }
    }
}

async fn sleep_or_forever(duration: Option<Duration>) {
    match duration {
        Some(duration) => tokio::time::sleep(duration).await,
        None => std::future::pending().await,
    }
}

fn serve_connection(shared: &Arc<Shared>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut close = shared.close_connections.subscribe();
    let service_shared = shared.clone();
    let service = service_fn(move |request| {
        let shared = service_shared.clone();
        async move { Ok::<_, std::convert::Infallible>(api::handle(request, shared).await) }
    });
    let tls = shared.config.tls.clone();
    tokio::spawn(async move {
        match tls {
            None => {
                let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    result = connection => {
                        if let Err(error) = result {
                            tracing::trace!(%error, "connection ended with an error");
                        }
                    }
                    _ = close.changed() => {}
                }
            }
            Some(tls) => {
                let stream = tokio::select! {
                    accepted = tls.handshake(stream, Duration::from_secs(10)) => match accepted {
                        Ok(stream) => stream,
                        Err(error) => {
                            tracing::debug!(%error, reason = error.reason(), "tls handshake failed");
                            return;
                        }
                    },
                    _ = close.changed() => return,
                };
                let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    result = connection => {
                        if let Err(error) = result {
                            tracing::trace!(%error, "connection ended with an error");
                        }
                    }
                    _ = close.changed() => {}
                }
            }
        }
    });
}

//! The ilb data plane: an OpenAI-compatible proxy for one front-end cluster.
//!
//! For every request it classifies (model, constraints, priority, affinity key), picks an engine
//! by weighted consistent hashing on the installed routing snapshot, skips engines its local
//! guard has ejected or the control plane's fast guard holds (`holds`), forwards the request and streams the response back as it arrives.
//! Snapshots arrive in the background (polled from a control plane, discovered in quick mode,
//! or installed by the embedding program); the request path never waits for them.
//!
//! **Invariant:** the data plane never talks to the control plane on the request path, never
//! scrapes engine metrics, and never forwards to an address that is not in its snapshot.

// No product function over `too-many-lines-threshold` (clippy.toml) lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unsafe code (the workspace's one `unsafe` is the optimizer's cache prefetch hint).
#![forbid(unsafe_code)]

pub mod admission;
mod body;
pub mod budget;
mod clock;
pub mod config;
mod debug;
pub mod engines;
pub mod error;
pub mod holds;
mod in_flight;
mod models;
mod pick;
pub mod proxy;
mod refusals;
mod replicas;
pub mod report;
pub mod router;
mod server;
mod shared;
pub mod sources;
pub mod state;
mod stored;
mod telemetry;
mod tried;
pub mod upstream;

pub use config::{DataPlaneConfig, SnapshotSource, Timeouts};
pub use router::{RouteRequest, Router, Routing};

use ilb_core::snapshot::Snapshot;
use shared::Shared;
use state::InstallError;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

impl Router {
    /// Serves the operator's endpoints on `listener` (`/metrics`, `/debug/route`, `/health`, as
    /// a data plane's `admin_listen` does) until [`Router::shutdown`].
    pub fn serve_admin(&mut self, listener: TcpListener) {
        self.spawn(|shared, shutdown| server::serve(listener, shared, server::Role::Admin, shutdown));
    }
}

/// A running data plane.
pub struct DataPlane {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl DataPlane {
    /// Binds the listener and starts serving and the background tasks of `source`.
    pub async fn start(config: DataPlaneConfig, source: SnapshotSource) -> std::io::Result<DataPlane> {
        Self::start_with_reports(config, source, None).await
    }

    /// As [`DataPlane::start`], also reporting to a control plane.
    pub async fn start_with_reports(
        config: DataPlaneConfig,
        source: SnapshotSource,
        reports: Option<report::ReportConfig>,
    ) -> std::io::Result<DataPlane> {
        let listener = TcpListener::bind(config.listen).await?;
        let local_addr = listener.local_addr()?;
        let admin = match config.admin_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let admin_addr = admin.as_ref().map(TcpListener::local_addr).transpose()?;
        let shared = Arc::new(Shared::new(config));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        tasks.spawn(server::serve(listener, Arc::clone(&shared), server::Role::Client, shutdown_rx.clone()));
        if let Some(admin) = admin {
            tasks.spawn(server::serve(admin, Arc::clone(&shared), server::Role::Admin, shutdown_rx.clone()));
        }
        router::spawn_background(&shared, source, reports, &shutdown_rx, &mut tasks);
        Ok(DataPlane { shared, local_addr, admin_addr, shutdown, tasks })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin listener's address, if one was configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The admin listener's `http://ip:port`, if one was configured.
    pub fn admin_url(&self) -> Option<String> {
        self.admin_addr.map(|addr| format!("http://{addr}"))
    }

    /// `http://ip:port`, or `https://ip:port` with a TLS listener.
    pub fn url(&self) -> String {
        let scheme = if self.shared.config.listener_tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr)
    }

    /// Installs a snapshot now; an invalid or older one is rejected and the current one stays.
    pub fn install(&self, snapshot: &Snapshot) -> Result<(), InstallError> {
        self.shared.install(snapshot)
    }

    /// Parses, validates and installs a snapshot's JSON now (a `snapshot_file`); a refused
    /// one is counted and shown in `/health`, and the current one stays.
    pub fn install_json(&self, bytes: &[u8]) -> Result<(), InstallError> {
        self.shared.install_json(bytes)
    }

    /// The installed snapshot version, if any.
    pub fn snapshot_version(&self) -> Option<ilb_core::SnapshotVersion> {
        self.shared.routing.current().map(|i| i.table.version)
    }

    /// The installed state (for tests, reports and the demo's console).
    pub fn installed(&self) -> Option<Arc<state::Installed>> {
        self.shared.routing.current()
    }

    /// Stops accepting, lets open connections finish their current response, stops tasks.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

//! `ilb data-plane`: run the proxy for one front-end cluster.
//!
//! Snapshots come from exactly one source: a control plane (`--control-plane URL --cluster C`),
//! a file (`--snapshot FILE`, reloaded when it changes), or quick mode (`--engine URL ...`,
//! equal weights, models discovered from each engine's `/v1/models`).

use crate::config::{self, DataPlaneTls};
use anyhow::{bail, Context};
use ilb_dataplane::config::{DataPlaneSection, UrlList, Validated};
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct DataPlaneArgs {
    /// Address to serve on: the OpenAI-compatible API (`ilb epp`: the ext_proc gRPC server).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Serve /metrics, /debug/route and /health on this address instead of the client
    /// listener (which then no longer serves the first two); `ilb epp`: where it serves them
    /// (it has no HTTP listener otherwise).
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// What the x-ilb-route response header tells clients: full, id (default) or off.
    #[arg(long, value_name = "DETAIL")]
    route_header: Option<String>,
    /// Quick mode: an engine base URL (repeatable); equal weights, models from its /v1/models.
    #[arg(long = "engine", value_name = "URL")]
    engines: Vec<String>,
    /// Install routing snapshots from this JSON file, reloading it when it changes.
    #[arg(long, value_name = "FILE")]
    snapshot: Option<PathBuf>,
    /// Pull snapshots from this control plane (needs --cluster); repeat for replicas: pull from
    /// one, fail over to the next, report to all.
    #[arg(long, value_name = "URL")]
    control_plane: Vec<String>,
    /// The front-end cluster this data plane serves.
    #[arg(long)]
    cluster: Option<String>,
    /// Another data plane of this cluster (its admin URL, else its client URL; repeatable; an
    /// http:// host name counts as every address it resolves to): they share conversation
    /// placements, stored-response engines and load.
    #[arg(long = "peer", value_name = "URL")]
    peers: Vec<String>,
    /// The longest time between two messages to the peers, ms (default 200); they also go out
    /// whenever a request starts or ends, at most every 5 ms.
    #[arg(long, value_name = "MS")]
    peer_interval_ms: Option<u64>,
    /// TOML config file; its `[data_plane]` table sets everything the flags set, and more.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Terminate TLS on the client listener (ilb epp: its gRPC listener) with this PEM
    /// certificate chain (with --tls-key); the files are watched and reloaded when they change.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA bundle trusted for https engines, added to the platform's roots.
    #[arg(long, value_name = "FILE")]
    engine_ca: Option<PathBuf>,
    /// Trust only --engine-ca for engines, not the platform's roots.
    #[arg(long, requires = "engine_ca")]
    engine_ca_only: bool,
    /// PEM client certificate presented to https engines that ask for one (with --engine-key).
    #[arg(long, value_name = "FILE", requires = "engine_key")]
    engine_cert: Option<PathBuf>,
    /// PEM private key of --engine-cert.
    #[arg(long, value_name = "FILE", requires = "engine_cert")]
    engine_key: Option<PathBuf>,
    /// PEM CA bundle trusted for an https control plane, added to the platform's roots.
    #[arg(long, value_name = "FILE")]
    control_plane_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS with the control plane (with --client-key).
    #[arg(long, value_name = "FILE", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    client_key: Option<PathBuf>,
    /// Refuse snapshots and engines with plain http:// URLs.
    #[arg(long)]
    https_only: bool,
    /// Worker threads (default: one per available core). 1 runs a single-threaded runtime,
    /// the cheapest way to use one pinned core, and the default when only one is available.
    #[arg(long)]
    threads: Option<usize>,
}

/// What the data plane's flags and config file make, validated and with its files read, before
/// any port is bound: `ilb data-plane` serves it, `ilb epp` routes with it.
pub struct Prepared {
    pub config: DataPlaneConfig,
    pub source: SnapshotSource,
    /// A snapshot file to install and follow (`--snapshot`).
    pub snapshot_file: Option<PathBuf>,
    pub reports: Option<ReportConfig>,
    /// TLS for the client listener (`--tls-cert`), watched for rotation.
    pub listener: Option<crate::tls::Listener>,
    pub runtime: tokio::runtime::Runtime,
}

impl DataPlaneArgs {
    /// Whether the flags set a client-listener option that only the proxy has (`ilb epp`
    /// refuses them): its name.
    pub fn proxy_only_flag(&self) -> Option<&'static str> {
        if self.route_header.is_some() {
            Some("--route-header")
        } else if !self.peers.is_empty() {
            // Peers post their deltas to the HTTP listener, which `ilb epp` does not have.
            Some("--peer")
        } else {
            None
        }
    }
}

pub fn run(args: DataPlaneArgs) -> anyhow::Result<()> {
    let Prepared { config, source, snapshot_file, reports, listener, runtime } = prepare(&args)?;
    runtime.block_on(serve(config, source, snapshot_file, reports, listener))
}

/// Reads the config file, applies the flags over it, reads the TLS files and validates; builds
/// the runtime (`--threads`).
pub fn prepare(args: &DataPlaneArgs) -> anyhow::Result<Prepared> {
    let (mut section, mut tls) = match &args.config {
        Some(path) => {
            let file = config::load(path)?;
            (file.data_plane.unwrap_or_default(), file.data_plane_tls)
        }
        None => (DataPlaneSection::default(), DataPlaneTls::default()),
    };
    // Flags override the file.
    if let Some(listen) = args.listen {
        section.listen = Some(listen.to_string());
    }
    if let Some(admin) = args.admin_listen {
        section.admin_listen = Some(admin.to_string());
    }
    if let Some(detail) = &args.route_header {
        section.route_header = Some(detail.clone());
    }
    if !args.engines.is_empty() {
        section.engines = args.engines.clone();
    }
    if let Some(path) = &args.snapshot {
        section.snapshot_file = Some(path.clone());
    }
    if !args.control_plane.is_empty() {
        section.control_plane = Some(UrlList::Many(args.control_plane.clone()));
    }
    if let Some(cluster) = &args.cluster {
        section.cluster = Some(cluster.clone());
    }
    if !args.peers.is_empty() {
        section.peers = args.peers.clone();
    }
    if args.peer_interval_ms.is_some() {
        section.peer_interval_ms = args.peer_interval_ms;
    }
    if args.tls_cert.is_some() {
        tls.tls.cert = args.tls_cert.clone();
        tls.tls.key = args.tls_key.clone();
    }
    if args.engine_ca.is_some() {
        tls.engine_tls.ca = args.engine_ca.clone();
    }
    if args.engine_ca_only {
        tls.engine_tls.ca_only = Some(true);
    }
    if args.engine_cert.is_some() {
        tls.engine_tls.cert = args.engine_cert.clone();
        tls.engine_tls.key = args.engine_key.clone();
    }
    if args.control_plane_ca.is_some() {
        tls.control_plane_tls.ca = args.control_plane_ca.clone();
    }
    if args.client_cert.is_some() {
        tls.control_plane_tls.cert = args.client_cert.clone();
        tls.control_plane_tls.key = args.client_key.clone();
    }
    if args.https_only {
        section.https_only = Some(true);
    }
    // TLS files are read here, before any port is bound; a bad file stops the start.
    let listener = tls.tls.build("data_plane.tls", false)?;
    let engine_tls = tls.engine_tls.build("data_plane.engine_tls")?;
    let control_plane_tls = tls.control_plane_tls.build("data_plane.control_plane_tls")?;
    let Validated { mut config, source, snapshot_file: file, reports } = section.validate()?;
    config.engine_tls = Some(engine_tls);
    config.control_plane_tls = Some(control_plane_tls);
    config.listener_tls = listener.as_ref().map(|l| l.tls.clone());
    // One available core (a pinned data plane): the single-threaded runtime, as `--threads 1`.
    let one_core = std::thread::available_parallelism().is_ok_and(|n| n.get() == 1);
    let runtime = match args.threads.or(one_core.then_some(1)) {
        Some(0) => bail!("--threads must be at least 1"),
        Some(1) => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        Some(n) => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build()?,
        None => tokio::runtime::Builder::new_multi_thread().enable_all().build()?,
    };
    Ok(Prepared { config, source, snapshot_file: file, reports, listener, runtime })
}

async fn serve(
    config: DataPlaneConfig,
    source: SnapshotSource,
    file: Option<PathBuf>,
    reports: Option<ReportConfig>,
    listener: Option<crate::tls::Listener>,
) -> anyhow::Result<()> {
    let listen = config.listen;
    let data_plane = DataPlane::start_with_reports(config, source, reports)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let stop = crate::cmd::stop_signal();
    println!("data-plane: {}", data_plane.url());
    if let Some(admin) = data_plane.admin_url() {
        println!("data-plane admin (metrics, debug/route, health): {admin}");
    }
    let _watcher = listener.map(|l| AbortOnDrop(tokio::spawn(l.watch(Duration::from_secs(1)))));
    follow_snapshot_file(file.as_deref(), |bytes| data_plane.install_json(bytes), stop).await;
    data_plane.shutdown().await;
    Ok(())
}

/// Until `stop` ([`crate::cmd::stop_signal`]): installs the snapshot `file` (if any) with `install`, again whenever its
/// mtime changes (polled once a second); a snapshot refused keeps the last good one.
pub async fn follow_snapshot_file(
    file: Option<&Path>,
    install: impl Fn(&[u8]) -> Result<(), ilb_dataplane::state::InstallError>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut last_modified = None;
    tokio::pin!(stop);
    loop {
        if let Some(path) = file {
            let modified = modified(path);
            if modified != last_modified || last_modified.is_none() {
                last_modified = modified;
                let installed = std::fs::read(path)
                    .with_context(|| format!("cannot read {}", path.display()))
                    .and_then(|bytes| Ok(install(&bytes)?));
                if let Err(e) = installed {
                    tracing::warn!(file = %path.display(), error = %format!("{e:#}"), "snapshot not installed, keeping the last good one");
                }
            }
        }
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Stops a background task when dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

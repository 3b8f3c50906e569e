//! `ilb control-plane --config FILE`: collect signals and reports, optimize, publish snapshots.
//! The file is watched (its modification time, every `--watch-ms`) and re-read on SIGHUP; a
//! valid new file is applied as a diff, an invalid one is refused with the reason and the
//! running configuration stays. `--check-config FILE` only validates.

use crate::config;
use anyhow::Context;
use ilb_controlplane::{ControlPlane, Reloader};
use ilb_planning::FleetConfig;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

#[derive(clap::Args, Debug)]
pub struct ControlPlaneArgs {
    /// TOML file describing the fleet and the control plane's settings; watched for changes.
    #[arg(long, value_name = "FILE", required_unless_present = "check_config")]
    config: Option<PathBuf>,
    /// Overrides `control_plane.listen`.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Terminate TLS on the API and dashboard with this PEM certificate chain (with
    /// --tls-key); the files are watched and reloaded when they change.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA bundle of data planes' client certificates: verify them (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// `required` (default) or `optional` client certificates with --tls-client-ca.
    #[arg(long, value_name = "MODE", requires = "tls_client_ca")]
    tls_client_auth: Option<String>,
    /// PEM CA bundle trusted for https engines' /metrics, added to the platform's roots.
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
    /// Validate FILE as a control-plane config and exit: status 0 and "ok", or 1 and the
    /// field-named reason.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    /// How often the config file's modification time is checked, ms; 0 reloads on SIGHUP only.
    #[arg(long, default_value_t = 1000)]
    watch_ms: u64,
    /// An etcd endpoint (repeatable; `[control_plane.etcd] endpoints`): the replicas sharing
    /// the prefix elect one planner on an etcd lease and all publish its plans.
    #[arg(long = "etcd", value_name = "URL")]
    etcd: Vec<String>,
}

/// Reads and validates a control-plane config file.
pub fn load_fleet(path: &Path) -> anyhow::Result<FleetConfig> {
    config::load(path)?
        .fleet
        .with_context(|| format!("{} describes no fleet (no [[clusters]] or [[engines]])", path.display()))
}

pub fn run(args: ControlPlaneArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.check_config {
        load_fleet(path)?;
        println!("{}: ok", path.display());
        return Ok(());
    }
    let path = args.config.clone().context("--config is required")?;
    // What the watcher compares the file with: taken before the file is loaded, so an edit
    // made once the control plane is up is never mistaken for the file it started from.
    let baseline = (modified(&path), std::fs::read_to_string(&path).ok());
    let file = config::load(&path)?;
    let (mut listener_tls, mut engine_tls) = (file.control_plane_tls, file.control_plane_engine_tls);
    let fleet = file
        .fleet
        .with_context(|| format!("{} describes no fleet (no [[clusters]] or [[engines]])", path.display()))?;
    if args.tls_cert.is_some() {
        listener_tls.cert = args.tls_cert.clone();
        listener_tls.key = args.tls_key.clone();
    }
    if args.tls_client_ca.is_some() {
        listener_tls.client_ca = args.tls_client_ca.clone();
    }
    if args.tls_client_auth.is_some() {
        listener_tls.client_auth = args.tls_client_auth.clone();
    }
    if args.engine_ca.is_some() {
        engine_tls.ca = args.engine_ca.clone();
    }
    if args.engine_ca_only {
        engine_tls.ca_only = Some(true);
    }
    if args.engine_cert.is_some() {
        engine_tls.cert = args.engine_cert.clone();
        engine_tls.key = args.engine_key.clone();
    }
    let mut etcd = file.control_plane_etcd;
    if !args.etcd.is_empty() {
        etcd.endpoints = args.etcd.clone();
    }
    let listener = listener_tls.build("control_plane.tls", true)?;
    let tls = ilb_controlplane::ApiTls {
        listener: listener.as_ref().map(|l| l.tls.clone()),
        scrape: Some(engine_tls.build("control_plane.engine_tls")?),
    };
    let listen = match args.listen {
        Some(l) => l,
        None => fleet.control_plane.listen.parse().context("control_plane.listen")?,
    };
    let etcd = etcd.validate(listen)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let cp = ControlPlane::start_elected(fleet, listen, tls, etcd)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        // Listen for SIGHUP before saying we are up, so an early signal cannot kill the process.
        let hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; reloads follow the file only");
                None
            }
        };
        let stop = crate::cmd::stop_signal();
        println!("control-plane: {}", cp.url());
        let cert_watcher = listener.map(|l| tokio::spawn(l.watch(std::time::Duration::from_secs(1))));
        let watcher =
            tokio::spawn(watch(path, baseline, cp.reloader(), Duration::from_millis(args.watch_ms), hangup));
        stop.await;
        watcher.abort();
        if let Some(cert_watcher) = cert_watcher {
            cert_watcher.abort();
        }
        cp.shutdown().await;
        Ok(())
    })
}

fn modified(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Re-reads `path` when its modification time or size changes from `baseline`'s (checked
/// every `every`; never if zero) or on SIGHUP, and hands the result to the control plane. A
/// file whose text did not change is not applied again.
async fn watch(
    path: PathBuf,
    baseline: (Option<(SystemTime, u64)>, Option<String>),
    reloader: Reloader,
    every: Duration,
    mut hangup: Option<tokio::signal::unix::Signal>,
) {
    let (mut stamp, mut last_text) = baseline;
    let mut poll = tokio::time::interval(if every.is_zero() { Duration::from_secs(3600) } else { every });
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = poll.tick() => false,
            Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
        };
        if !forced {
            let now = modified(&path);
            if every.is_zero() || now == stamp {
                continue;
            }
            stamp = now;
        }
        let text = std::fs::read_to_string(&path);
        if let Ok(text) = &text {
            if !forced && last_text.as_deref() == Some(text.as_str()) {
                continue;
            }
        }
        let result = match text {
            Ok(text) => {
                last_text = Some(text.clone());
                config::parse(&text)
                    .with_context(|| format!("invalid config {}", path.display()))
                    .and_then(|f| f.fleet.with_context(|| format!("{} describes no fleet", path.display())))
            }
            Err(e) => Err(anyhow::anyhow!("cannot read config {}: {e}", path.display())),
        };
        let result = result.map_err(|e| format!("{e:#}"));
        match &result {
            Ok(_) => tracing::info!(file = %path.display(), "config file changed; applying"),
            Err(reason) => tracing::warn!(%reason, "config file refused; the running configuration stays"),
        }
        if !reloader.reload(result).await {
            return;
        }
    }
}

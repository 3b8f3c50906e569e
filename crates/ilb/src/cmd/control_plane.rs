//! `ilb control-plane --config FILE`: collect signals and reports, optimize, publish snapshots.

use crate::config;
use anyhow::Context;
use ilb_controlplane::ControlPlane;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ControlPlaneArgs {
    /// TOML file describing the fleet and the control plane's settings.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
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
}

pub fn run(args: ControlPlaneArgs) -> anyhow::Result<()> {
    let file = config::load(&args.config)?;
    let (mut listener_tls, mut engine_tls) = (file.control_plane_tls, file.control_plane_engine_tls);
    let fleet = file.fleet.with_context(|| {
        format!("{} describes no fleet (no [[clusters]] or [[engines]])", args.config.display())
    })?;
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
    let listener = listener_tls.build("control_plane.tls", true)?;
    let tls = ilb_controlplane::api::ApiTls {
        listener: listener.as_ref().map(|l| l.tls.clone()),
        scrape: Some(engine_tls.build("control_plane.engine_tls")?),
    };
    let listen = match args.listen {
        Some(l) => l,
        None => fleet.control_plane.listen.parse().context("control_plane.listen")?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let cp = ControlPlane::start_with_tls(fleet, listen, tls)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        println!("control-plane: {}", cp.url());
        let watcher = listener.map(|l| tokio::spawn(l.watch(std::time::Duration::from_secs(1))));
        tokio::signal::ctrl_c().await?;
        if let Some(watcher) = watcher {
            watcher.abort();
        }
        cp.shutdown().await;
        Ok(())
    })
}

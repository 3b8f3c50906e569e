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
}

pub fn run(args: ControlPlaneArgs) -> anyhow::Result<()> {
    let fleet = config::load(&args.config)?.fleet.with_context(|| {
        format!("{} describes no fleet (no [[clusters]] or [[engines]])", args.config.display())
    })?;
    let listen = match args.listen {
        Some(l) => l,
        None => fleet.control_plane.listen.parse().context("control_plane.listen")?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let cp =
            ControlPlane::start(fleet, listen).await.with_context(|| format!("cannot listen on {listen}"))?;
        println!("control-plane: {}", cp.url());
        tokio::signal::ctrl_c().await?;
        cp.shutdown().await;
        Ok(())
    })
}

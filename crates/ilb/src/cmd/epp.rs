//! `ilb epp`: ilb as the Endpoint Picker of an Envoy gateway (docs/epp.md). It takes the data
//! plane's routing flags and config (`--engine`, `--control-plane`/`--cluster`, `--snapshot`,
//! `--config`, the engine and control-plane TLS flags, `--admin-listen` for `/metrics`), routes
//! with the data plane's own code (`ilb_dataplane::Router`) and answers Envoy's ext_proc stream
//! on `--listen` (gRPC; over TLS with `--tls-cert`/`--tls-key`, reloaded when the files change).

use crate::cmd::data_plane::{self, AbortOnDrop, DataPlaneArgs, Prepared};
use anyhow::{bail, Context};
use ilb_dataplane::Router;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct EppArgs {
    #[command(flatten)]
    routing: DataPlaneArgs,
}

pub fn run(args: EppArgs) -> anyhow::Result<()> {
    if let Some(flag) = args.routing.proxy_only_flag() {
        bail!(
            "{flag} is a data-plane listener option; ilb epp serves gRPC to the gateway and does not take it"
        );
    }
    let Prepared { config, source, snapshot_file, reports, listener, runtime } =
        data_plane::prepare(&args.routing)?;
    if !config.peers.is_empty() {
        // Peers post their deltas to a data plane's HTTP listener, which ilb epp does not have.
        bail!("data_plane.peers is a data-plane option; ilb epp does not take it");
    }
    runtime.block_on(async move {
        let listen = config.listen;
        let router = Router::start(config, source, reports);
        let epp = ilb_epp::Epp::start(listen, router)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let stop = crate::cmd::stop_signal();
        let scheme = if listener.is_some() { "gRPC over TLS" } else { "gRPC" };
        println!("epp (ext_proc {scheme}): {}", epp.local_addr());
        if let Some(admin) = epp.admin_addr() {
            println!("epp admin (metrics, debug/route, health): http://{admin}");
        }
        let _watcher = listener.map(|l| AbortOnDrop(tokio::spawn(l.watch(Duration::from_secs(1)))));
        data_plane::follow_snapshot_file(
            snapshot_file.as_deref(),
            |bytes| epp.router().install_json(bytes),
            stop,
        )
        .await;
        epp.shutdown().await;
        Ok(())
    })
}

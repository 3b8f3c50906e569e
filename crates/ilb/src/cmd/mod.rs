//! One module per subcommand: its clap arguments, config loading and validation, and `run`.

pub mod control_plane;
pub mod data_plane;
pub mod demo;
pub mod engine_sim;
pub mod epp;
pub mod explain;
pub mod optimize;
pub mod profile;
pub mod simulate;

/// A future that resolves when the process is asked to stop: Ctrl-C (SIGINT) or SIGTERM, which
/// Kubernetes, systemd and `kill` send. SIGTERM is listened for from this call on (inside the
/// runtime), so create it before announcing that the process serves, and once, before a loop.
pub fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => Some(term),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; stop with Ctrl-C");
            None
        }
    };
    async move {
        #[cfg(unix)]
        if let Some(mut term) = term {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

//! The fast guard's data-plane side: follows the control plane's `GET /v1/engine-holds`
//! (long-poll) and marks the engines it holds (asleep, no ready replica, unreachable) so the
//! request path skips them at once, without waiting for the next snapshot.
//!
//! A hold only removes an engine this data plane already routes to; it never adds an address,
//! and the request path still reads only its installed snapshot plus one flag per engine.
//! Holds fail open: when the control plane has not answered for [`STALE_AFTER`], they are
//! cleared, since a hold nobody refreshes may be about an engine that has long recovered (the
//! local guard still ejects engines that fail requests).

use crate::clock;
use crate::shared::Shared;
use ilb_core::holds::{EngineHolds, MAX_HOLDS_BYTES};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long the control plane may wait before answering an unchanged set (and so how often
/// holds are re-applied to engines that arrived with a new snapshot).
pub const LONG_POLL: Duration = Duration::from_secs(5);
/// Holds not refreshed for this long are dropped.
pub const STALE_AFTER: Duration = Duration::from_secs(10);
/// Pause after a failed poll.
const RETRY: Duration = Duration::from_secs(1);

/// The holds URL of a control plane given its snapshot URL (`…/v1/snapshots/{cluster}`).
pub fn url_for_snapshot_url(snapshot_url: &str) -> Option<String> {
    snapshot_url.find("/v1/snapshots/").map(|at| format!("{}/v1/engine-holds", &snapshot_url[..at]))
}

/// Follows the holds of the control-plane replicas at `urls` until shutdown: one at a time,
/// moving to the next after a failed poll (replicas number their holds independently, so the
/// first poll of a new one asks without a version).
pub async fn follow(shared: Arc<Shared>, urls: Vec<String>, mut shutdown: watch::Receiver<bool>) {
    if urls.is_empty() {
        return;
    }
    let mut at = 0;
    let mut latest: Option<EngineHolds> = None;
    let mut known_version: Option<u64> = None;
    let mut last_contact = clock::now();
    loop {
        let url = &urls[at];
        let target = match known_version {
            Some(version) => format!("{url}?version={version}&wait={}s", LONG_POLL.as_secs()),
            None => url.clone(),
        };
        let fetched = tokio::select! {
            r = tokio::time::timeout(LONG_POLL + Duration::from_secs(5), crate::sources::fetch(&shared.control_plane_client, &target, None)) => r,
            _ = shutdown.changed() => return,
        };
        let mut failed = false;
        match fetched {
            Ok(Ok(Some((body, _)))) if body.len() <= MAX_HOLDS_BYTES => {
                match serde_json::from_slice::<EngineHolds>(&body) {
                    Ok(holds) => {
                        last_contact = clock::now();
                        known_version = Some(holds.version);
                        latest = Some(holds);
                    }
                    Err(e) => {
                        tracing::warn!(%url, error = %e, "engine holds rejected");
                        failed = true;
                    }
                }
            }
            Ok(Ok(Some(_))) => {
                tracing::warn!(%url, "engine holds document too large");
                failed = true;
            }
            Ok(Ok(None)) => last_contact = clock::now(),
            Ok(Err(e)) => {
                tracing::debug!(%url, error = %e, "engine holds poll failed");
                failed = true;
            }
            Err(_) => failed = true,
        }
        if latest.is_some() && clock::since(last_contact) > STALE_AFTER {
            tracing::warn!(%url, "engine holds not refreshed for {STALE_AFTER:?}: released");
            latest = None;
        }
        apply(&shared, latest.as_ref());
        if failed {
            at = (at + 1) % urls.len();
            known_version = None;
            tokio::select! {
                _ = tokio::time::sleep(RETRY) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Marks the installed engines `holds` names, and clears the others.
pub fn apply(shared: &Shared, holds: Option<&EngineHolds>) {
    let Some(installed) = shared.routing.current() else { return };
    for engine in installed.engines.iter() {
        let reason =
            holds.and_then(|h| h.held.iter().find(|hold| hold.engine == engine.id)).map(|h| h.reason);
        if engine.set_hold(reason) {
            match reason {
                Some(reason) => {
                    tracing::info!(engine = %engine.id, reason = reason.as_str(), "engine held by the control plane")
                }
                None => tracing::info!(engine = %engine.id, "engine hold released"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_url_from_snapshot_url() {
        assert_eq!(
            url_for_snapshot_url("http://127.0.0.1:7000/v1/snapshots/eu-fe").as_deref(),
            Some("http://127.0.0.1:7000/v1/engine-holds")
        );
        assert_eq!(
            url_for_snapshot_url("https://cp.example/prefix/v1/snapshots/a?x=1").as_deref(),
            Some("https://cp.example/prefix/v1/engine-holds")
        );
        assert_eq!(url_for_snapshot_url("http://cp/other"), None);
    }
}

//! The published snapshots, one per front-end cluster, and the version counter.
//!
//! Versions come from the wall clock (Unix milliseconds) and always increase by at least one,
//! so a restarted control plane never publishes a version lower than one a data plane holds
//! (as long as the clock does not step back by more than the restart took).

use bytes::Bytes;
use ilb_core::snapshot::Snapshot;
use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::sync::watch;

#[derive(Clone, Debug)]
pub struct Published {
    /// Strong ETag, `"<version>"`.
    pub etag: String,
    pub body: Bytes,
}

pub struct Publisher {
    snapshots: Mutex<BTreeMap<String, Published>>,
    last_version: Mutex<u64>,
    /// The newest published version; long-polls wait on it.
    round: watch::Sender<u64>,
}

impl Default for Publisher {
    fn default() -> Self {
        Publisher { snapshots: Mutex::default(), last_version: Mutex::new(0), round: watch::channel(0).0 }
    }
}

impl Publisher {
    /// The version for the next round: `max(last + 1, now_unix_ms)`.
    pub fn next_version(&self, now_unix_ms: u64) -> u64 {
        let mut last = self.last_version.lock().unwrap_or_else(|p| p.into_inner());
        *last = (*last + 1).max(now_unix_ms);
        *last
    }

    /// Publishes one round of snapshots (all carry the same version) and returns how many it
    /// refused. A snapshot that fails the validation data planes apply (`Snapshot::validate`:
    /// a non-finite weight, say) is not published: its cluster keeps the snapshot it has, so
    /// data planes are never offered one they must reject.
    pub fn publish(&self, snapshots: &BTreeMap<String, Snapshot>) -> usize {
        let (mut version, mut refused) = (0, 0);
        {
            let mut map = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
            for (cluster, snapshot) in snapshots {
                version = version.max(snapshot.version.0);
                if let Err(e) = snapshot.validate() {
                    tracing::error!(%cluster, error = %e, "planned snapshot is invalid; the cluster keeps its previous one");
                    refused += 1;
                    continue;
                }
                let body = match serde_json::to_vec(snapshot) {
                    Ok(b) => Bytes::from(b),
                    Err(e) => {
                        tracing::error!(%cluster, error = %e, "snapshot does not serialize");
                        refused += 1;
                        continue;
                    }
                };
                map.insert(cluster.clone(), Published { etag: format!("\"{}\"", snapshot.version.0), body });
            }
        }
        self.round.send_replace(version);
        refused
    }

    /// Publishes a round another replica planned (the etcd leader's, `election.rs`) if its
    /// version is newer than the newest published here; whether it did.
    pub fn publish_if_newer(&self, version: u64, snapshots: &BTreeMap<String, Snapshot>) -> bool {
        if version <= *self.round.borrow() || snapshots.values().any(|s| s.version.0 != version) {
            return false;
        }
        {
            let mut last = self.last_version.lock().unwrap_or_else(|p| p.into_inner());
            *last = (*last).max(version);
        }
        self.publish(snapshots);
        true
    }

    pub fn get(&self, cluster: &str) -> Option<Published> {
        self.snapshots.lock().unwrap_or_else(|p| p.into_inner()).get(cluster).cloned()
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.round.subscribe()
    }
}

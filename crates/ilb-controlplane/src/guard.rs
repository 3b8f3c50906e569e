//! The fast guard's control-plane side: the current [`EngineHolds`] (engines the data planes
//! must send no new requests to), republished under a new version whenever the set changes,
//! and long-polled by data planes at `GET /v1/engine-holds?version=V&wait=5s`.
//!
//! Why a stream from the control plane rather than the data planes' own probes: the reasons an
//! engine must be held (vLLM asleep, zero ready replicas) are in its metrics, and the data
//! plane never scrapes engine metrics; a data plane probing `/health` would also see a
//! sleeping vLLM as healthy (it answers 200). The control plane scrapes every engine once a
//! second anyway, so one scrape period plus one long-poll round trip bounds the reaction.

use bytes::Bytes;
use ilb_core::holds::{EngineHolds, Hold, HoldReason};
use ilb_core::EngineId;
use std::sync::Arc;
use tokio::sync::watch;

/// One published set of holds with its JSON body.
#[derive(Debug)]
pub struct PublishedHolds {
    pub holds: EngineHolds,
    pub body: Bytes,
}

pub struct HoldsPublisher {
    current: watch::Sender<Arc<PublishedHolds>>,
}

impl HoldsPublisher {
    /// Starts at version `first_version` (the wall clock in ms, so a restarted control plane
    /// does not repeat its predecessor's versions) with nothing held.
    pub fn new(first_version: u64) -> HoldsPublisher {
        let holds = EngineHolds { version: first_version, held: Vec::new() };
        HoldsPublisher { current: watch::channel(Arc::new(publish(holds))).0 }
    }

    /// Publishes `held` under a new version if it differs from the current set. Returns
    /// whether it did.
    pub fn update(&self, held: Vec<(String, HoldReason)>) -> bool {
        let held: Vec<Hold> =
            held.into_iter().map(|(engine, reason)| Hold { engine: EngineId::new(engine), reason }).collect();
        let current = self.current.borrow().holds.clone();
        if current.held == held {
            return false;
        }
        for hold in held.iter().filter(|h| !current.held.contains(h)) {
            tracing::info!(engine = %hold.engine, reason = hold.reason.as_str(), "engine held: data planes stop sending it requests");
        }
        for hold in current.held.iter().filter(|h| !held.iter().any(|n| n.engine == h.engine)) {
            tracing::info!(engine = %hold.engine, "engine hold released");
        }
        let next = EngineHolds { version: current.version + 1, held };
        self.current.send_replace(Arc::new(publish(next)));
        true
    }

    pub fn current(&self) -> Arc<PublishedHolds> {
        Arc::clone(&self.current.borrow())
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<PublishedHolds>> {
        self.current.subscribe()
    }
}

fn publish(holds: EngineHolds) -> PublishedHolds {
    let body = Bytes::from(serde_json::to_vec(&holds).unwrap_or_default());
    PublishedHolds { holds, body }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_version_only_when_the_set_changes() {
        let publisher = HoldsPublisher::new(100);
        assert_eq!(publisher.current().holds.version, 100);
        assert!(!publisher.update(vec![]));
        assert!(publisher.update(vec![("e1".into(), HoldReason::Asleep)]));
        assert_eq!(publisher.current().holds.version, 101);
        assert!(!publisher.update(vec![("e1".into(), HoldReason::Asleep)]));
        assert!(publisher.update(vec![("e1".into(), HoldReason::Unreachable)]), "a new reason is a change");
        assert!(publisher.update(vec![]));
        let current = publisher.current();
        assert_eq!(current.holds.version, 103);
        assert_eq!(&current.body[..], br#"{"version":103,"held":[]}"#);
    }
}

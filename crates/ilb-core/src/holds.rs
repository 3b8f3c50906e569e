//! The engine holds: engines the control plane tells data planes to send no new requests to
//! right now (asleep, no ready replica, unreachable), served beside the snapshots by
//! `GET /v1/engine-holds` on the control plane. JSON on the wire.
//!
//! This is the data planes' fast guard: scrapes run every second, plans far less often, so a
//! hold takes an engine out of rotation within about a scrape period instead of waiting for the
//! next plan. A hold only ever removes an engine the data plane already has in its snapshot; it
//! never adds an address.

use crate::ids::EngineId;
use serde::{Deserialize, Serialize};

/// Why an engine is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldReason {
    /// The engine reports it is asleep (vLLM sleep mode).
    Asleep,
    /// The engine reports zero ready replicas, or is configured with none.
    NoReadyReplicas,
    /// The control plane cannot reach the engine's metrics endpoint (its health check).
    Unreachable,
}

impl HoldReason {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldReason::Asleep => "asleep",
            HoldReason::NoReadyReplicas => "no_ready_replicas",
            HoldReason::Unreachable => "unreachable",
        }
    }
}

/// One held engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hold {
    pub engine: EngineId,
    pub reason: HoldReason,
}

/// The whole set of holds, versioned: a new version whenever the set changes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineHolds {
    /// Changes with every change of `held`; compare for equality only (a restarted control
    /// plane starts from the wall clock, so its versions differ from its predecessor's).
    pub version: u64,
    pub held: Vec<Hold>,
}

/// Largest holds document a data plane accepts.
pub const MAX_HOLDS_BYTES: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format() {
        let holds = EngineHolds {
            version: 7,
            held: vec![Hold { engine: EngineId::new("e1"), reason: HoldReason::NoReadyReplicas }],
        };
        let json = serde_json::to_string(&holds).unwrap();
        assert_eq!(json, r#"{"version":7,"held":[{"engine":"e1","reason":"no_ready_replicas"}]}"#);
        assert_eq!(serde_json::from_str::<EngineHolds>(&json).unwrap(), holds);
        assert!(serde_json::from_str::<EngineHolds>(
            r#"{"version":1,"held":[{"engine":"e","reason":"bored"}]}"#
        )
        .is_err());
    }
}

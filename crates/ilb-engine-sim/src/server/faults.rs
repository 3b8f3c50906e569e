//! Injected faults: the JSON document of `GET/PUT /admin/faults` and `EngineHandle::set_faults`.

use serde::{Deserialize, Serialize};

/// Faults applied to one engine. `PUT /admin/faults` replaces the whole document (missing
/// fields take these defaults); `DELETE /admin/faults` resets it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Multiplies the duration of every iteration planned from now on (> 0; 1.0 = none).
    /// No effect with latency modelling off.
    pub slowdown: f64,
    /// Fraction (0..=1) of inference requests answered with a 500 at once (seeded RNG).
    pub error_rate: f64,
    /// Inference requests are accepted and never answered (until the client gives up).
    pub hang: bool,
    /// Fraction (0..=1) of streamed responses whose connection is closed after the first chunk.
    pub drop_mid_stream: f64,
    /// Replicas that take new requests (`null` = all). `0` makes `/health` answer 503 and
    /// inference requests get a 503.
    pub ready_replicas: Option<u32>,
    /// The engine stops accepting: the listener and every live connection are closed.
    /// `false` re-binds the same port.
    pub down: bool,
    /// With `down: true`, come back up by itself after this many milliseconds (`null` = stay
    /// down until told otherwise through the library handle).
    pub down_for_ms: Option<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            slowdown: 1.0,
            error_rate: 0.0,
            hang: false,
            drop_mid_stream: 0.0,
            ready_replicas: None,
            down: false,
            down_for_ms: None,
        }
    }
}

/// A fault document that cannot be applied.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("fault field {field}: {problem}")]
pub struct FaultsError {
    pub field: &'static str,
    pub problem: &'static str,
}

impl Faults {
    pub fn validate(&self) -> Result<(), FaultsError> {
        if !(self.slowdown.is_finite() && self.slowdown > 0.0) {
            return Err(FaultsError { field: "slowdown", problem: "must be a finite number > 0" });
        }
        for (field, value) in [("error_rate", self.error_rate), ("drop_mid_stream", self.drop_mid_stream)] {
            if !(0.0..=1.0).contains(&value) {
                return Err(FaultsError { field, problem: "must be between 0 and 1" });
            }
        }
        Ok(())
    }

    /// Whether the engine reports itself unhealthy.
    pub fn unhealthy(&self) -> bool {
        self.ready_replicas == Some(0) || self.down
    }
}

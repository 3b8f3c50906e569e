//! The only place this crate reads the clock: the HTTP simulator's model time (nanoseconds
//! since the engine started, on tokio's clock so paused-time tests work) and the Unix time
//! OpenAI responses carry in `created`.

use crate::model::Nanos;
use tokio::time::Instant;

/// Current tokio instant.
#[allow(clippy::disallowed_methods)]
pub fn now() -> Instant {
    Instant::now()
}

/// Time from `earlier` to [`now`] (zero if `earlier` is later), as `Instant::elapsed` is.
pub fn since(earlier: Instant) -> std::time::Duration {
    now().saturating_duration_since(earlier)
}

/// Model time of `now()` relative to `epoch`.
pub fn model_now(epoch: Instant) -> Nanos {
    now().saturating_duration_since(epoch).as_nanos() as Nanos
}

/// Seconds since the Unix epoch (0 if the system clock is before it).
#[allow(clippy::disallowed_methods)]
pub fn unix_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

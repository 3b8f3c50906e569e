//! The data plane's only access to the clock. Monotonic time is tokio's (so paused-time tests
//! control it), read through [`now`] and [`since`]; Unix time through [`unix_ms`]. Nothing else
//! in the crate calls `Instant::now`, `Instant::elapsed` or `SystemTime::now`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Now, on tokio's monotonic clock.
#[inline]
#[allow(clippy::disallowed_methods)]
pub fn now() -> Instant {
    Instant::now()
}

/// Time from `earlier` to [`now`] (zero if `earlier` is later), as `Instant::elapsed` is.
#[inline]
pub fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}

/// Milliseconds since the Unix epoch.
#[allow(clippy::disallowed_methods)]
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64
}

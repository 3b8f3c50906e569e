//! The data plane's only access to the wall clock. Monotonic time is tokio's (so paused-time
//! tests control it); Unix time is read here alone.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
#[allow(clippy::disallowed_methods)]
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64
}

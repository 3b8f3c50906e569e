//! The binary's only access to the clock (tokio's, so paused-time tests control it).

/// The current instant on tokio's clock.
#[allow(clippy::disallowed_methods)]
pub fn now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// Time from `earlier` to [`now`] (zero if `earlier` is later), as `Instant::elapsed` is.
pub fn since(earlier: tokio::time::Instant) -> std::time::Duration {
    now().saturating_duration_since(earlier)
}

/// A wall-clock instant for measuring CPU-bound work outside a runtime (`ilb optimize --bench`).
#[allow(clippy::disallowed_methods)]
pub fn wall() -> std::time::Instant {
    std::time::Instant::now()
}

/// Time from `earlier` to [`wall`] (zero if `earlier` is later).
pub fn wall_since(earlier: std::time::Instant) -> std::time::Duration {
    wall().saturating_duration_since(earlier)
}

/// Nanoseconds since the Unix epoch (0 if the system clock is before it): a value that
/// differs from run to run (`ilb profile`'s prompt nonce), not a time to compute with.
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

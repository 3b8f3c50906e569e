//! The only place in this crate that reads the clock. Everything else takes `now` as an
//! argument so it can run on virtual time (fleet simulator, paused-time tests).

/// The current instant on tokio's clock (which honours `start_paused` tests).
#[allow(clippy::disallowed_methods)]
pub fn now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// Time from `earlier` to [`now`] (zero if `earlier` is later), as `Instant::elapsed` is.
pub fn since(earlier: tokio::time::Instant) -> std::time::Duration {
    now().saturating_duration_since(earlier)
}

/// Milliseconds since the Unix epoch (snapshot versions and creation times).
#[allow(clippy::disallowed_methods)]
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

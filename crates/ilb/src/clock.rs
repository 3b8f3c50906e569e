//! The binary's only access to the clock (tokio's, so paused-time tests control it).

/// The current instant on tokio's clock.
#[allow(clippy::disallowed_methods)]
pub fn now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// A wall-clock instant for measuring CPU-bound work outside a runtime (`ilb optimize --bench`).
#[allow(clippy::disallowed_methods)]
pub fn wall() -> std::time::Instant {
    std::time::Instant::now()
}

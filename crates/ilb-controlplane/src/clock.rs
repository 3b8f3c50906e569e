//! The only place in this crate that reads the clock. Everything else takes `now` as an
//! argument so it can run on virtual time (fleet simulator, paused-time tests).

/// The current instant on tokio's clock (which honours `start_paused` tests).
pub fn now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

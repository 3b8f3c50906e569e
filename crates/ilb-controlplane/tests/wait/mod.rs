//! Waiting in tests: a hang guard counted in polls, never a bound on wall-clock time, so a
//! loaded machine only makes the wait longer.

use std::time::Duration;

/// Polls `check` every `every`, at most `polls` times; panics naming `what` if it never held.
pub async fn until(what: &str, polls: u32, every: Duration, mut check: impl FnMut() -> bool) {
    for _ in 0..polls {
        if check() {
            return;
        }
        tokio::time::sleep(every).await;
    }
    assert!(check(), "gave up after {polls} polls waiting until {what}");
}

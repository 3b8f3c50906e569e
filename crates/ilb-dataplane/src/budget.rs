//! The retry budget: retries may not exceed a share of recent requests (plus a small floor per
//! second so that light traffic can still retry), and that share shrinks as the fleet's planned
//! utilisation rises, so that retries cannot snowball into a retry storm when capacity is tight.
//!
//! The window is a ring of one-second buckets updated with relaxed atomics: lock-free on the
//! request path, and approximate in the way a budget may be (a bucket that rolls over while
//! being counted loses at most a few counts).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

const BUCKETS: usize = 10;

/// The first retry's back-off is uniform below this many microseconds (10 ms)...
const BACKOFF_BASE_US: u64 = 10_000;
/// ...and the bound doubles with each further retry, at most this many times (to 160 ms).
const BACKOFF_DOUBLINGS: usize = 4;

/// The jittered back-off before retrying a request already sent `tried` times (at least 1):
/// deterministic per request (`request_id`), no global RNG.
pub fn backoff(request_id: u64, tried: usize) -> Duration {
    let cap_us = BACKOFF_BASE_US << (tried.max(1) - 1).min(BACKOFF_DOUBLINGS);
    Duration::from_micros(ilb_core::slots::mix(request_id ^ tried as u64) % cap_us)
}

#[derive(Clone, Debug)]
pub struct RetryBudgetConfig {
    /// Retries allowed per request while utilisation is at or below `knee` (default 0.2).
    pub ratio: f64,
    /// Retries allowed per request at or above `saturation` utilisation (default 0.02).
    pub floor_ratio: f64,
    /// Utilisation up to which the full ratio applies (default 0.5).
    pub knee: f64,
    /// Utilisation from which only the floor applies (default 0.95).
    pub saturation: f64,
    /// Retries per second always allowed, whatever the traffic (default 1).
    pub min_per_sec: f64,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig { ratio: 0.2, floor_ratio: 0.02, knee: 0.5, saturation: 0.95, min_per_sec: 1.0 }
    }
}

impl RetryBudgetConfig {
    /// The retry ratio at fleet utilisation `u`: full below the knee, the floor above
    /// saturation, linear in between.
    pub fn ratio_at(&self, u: f64) -> f64 {
        // NaN (no utilisation known) gets the full ratio.
        if u.is_nan() || u <= self.knee {
            return self.ratio;
        }
        if u >= self.saturation {
            return self.floor_ratio;
        }
        let t = (u - self.knee) / (self.saturation - self.knee);
        self.ratio + t * (self.floor_ratio - self.ratio)
    }
}

#[derive(Default)]
struct Bucket {
    second: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

/// A sliding ten-second window of requests and retries.
pub struct RetryBudget {
    config: RetryBudgetConfig,
    buckets: [Bucket; BUCKETS],
    /// Retries refused since start.
    pub exhausted_total: AtomicU64,
    /// Retries granted since start.
    pub retries_total: AtomicU64,
}

impl RetryBudget {
    pub fn new(config: RetryBudgetConfig) -> RetryBudget {
        RetryBudget {
            config,
            buckets: Default::default(),
            exhausted_total: AtomicU64::new(0),
            retries_total: AtomicU64::new(0),
        }
    }

    fn bucket(&self, now: Duration) -> &Bucket {
        let second = now.as_secs();
        let bucket = &self.buckets[(second % BUCKETS as u64) as usize];
        let seen = bucket.second.load(Relaxed);
        if seen != second && bucket.second.compare_exchange(seen, second, Relaxed, Relaxed).is_ok() {
            bucket.requests.store(0, Relaxed);
            bucket.retries.store(0, Relaxed);
        }
        bucket
    }

    /// Counts a client request (not its retries). Hot path.
    pub fn record_request(&self, now: Duration) {
        self.bucket(now).requests.fetch_add(1, Relaxed);
    }

    /// Takes one retry from the budget if there is one. Hot path (failures only).
    pub fn try_retry(&self, now: Duration, utilisation: f64) -> bool {
        let current = self.bucket(now);
        let oldest = now.as_secs().saturating_sub(BUCKETS as u64 - 1);
        let (mut requests, mut retries) = (0u64, 0u64);
        for b in &self.buckets {
            if b.second.load(Relaxed) >= oldest {
                requests += b.requests.load(Relaxed);
                retries += b.retries.load(Relaxed);
            }
        }
        let allowed =
            self.config.min_per_sec * BUCKETS as f64 + self.config.ratio_at(utilisation) * requests as f64;
        if (retries + 1) as f64 <= allowed {
            current.retries.fetch_add(1, Relaxed);
            self.retries_total.fetch_add(1, Relaxed);
            true
        } else {
            self.exhausted_total.fetch_add(1, Relaxed);
            false
        }
    }

    /// Asks to retry request `request_id`, sent `tried` times so far: the [`backoff`] to sleep
    /// before sending it again, or `None` when the budget is spent and it is not retried.
    pub fn retry(&self, now: Duration, utilisation: f64, request_id: u64, tried: usize) -> Option<Duration> {
        self.try_retry(now, utilisation).then(|| backoff(request_id, tried))
    }

    /// (requests, retries) in the current window, for metrics and explanations.
    pub fn window(&self, now: Duration) -> (u64, u64) {
        let oldest = now.as_secs().saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .filter(|b| b.second.load(Relaxed) >= oldest)
            .fold((0, 0), |(q, r), b| (q + b.requests.load(Relaxed), r + b.retries.load(Relaxed)))
    }

    pub fn config(&self) -> &RetryBudgetConfig {
        &self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_shrinks_with_utilisation() {
        let c = RetryBudgetConfig::default();
        assert_eq!(c.ratio_at(0.0), 0.2);
        assert_eq!(c.ratio_at(0.5), 0.2);
        assert!((c.ratio_at(0.725) - 0.11).abs() < 1e-9);
        assert_eq!(c.ratio_at(0.95), 0.02);
        assert_eq!(c.ratio_at(1.0), 0.02);
        assert_eq!(c.ratio_at(f64::NAN), 0.2);
    }

    #[test]
    fn retries_are_capped_by_the_window() {
        let budget = RetryBudget::new(RetryBudgetConfig { min_per_sec: 0.0, ..Default::default() });
        let now = Duration::from_secs(100);
        for _ in 0..1000 {
            budget.record_request(now);
        }
        let granted = (0..1000).filter(|_| budget.try_retry(now, 0.0)).count();
        assert_eq!(granted, 200, "20 % of 1,000 requests");
        let at_saturation = RetryBudget::new(RetryBudgetConfig { min_per_sec: 0.0, ..Default::default() });
        for _ in 0..1000 {
            at_saturation.record_request(now);
        }
        assert_eq!((0..1000).filter(|_| at_saturation.try_retry(now, 0.97)).count(), 20);
        // Eleven seconds later the window has forgotten everything.
        let later = now + Duration::from_secs(11);
        assert_eq!(budget.window(later), (0, 0));
    }

    #[test]
    fn backoff_is_jittered_below_a_doubling_bound() {
        for id in 0..200u64 {
            assert!(backoff(id, 1) < Duration::from_millis(10));
            assert!(backoff(id, 3) < Duration::from_millis(40));
            assert!(backoff(id, 9) < Duration::from_millis(160));
            assert_eq!(backoff(id, 2), backoff(id, 2), "deterministic per request");
        }
        assert!((0..200u64).any(|id| backoff(id, 5) >= Duration::from_millis(80)), "the bound grows");
    }

    #[test]
    fn light_traffic_can_still_retry() {
        let budget = RetryBudget::new(RetryBudgetConfig::default());
        let now = Duration::from_secs(5);
        budget.record_request(now);
        assert!(budget.try_retry(now, 0.99), "the per-second floor allows a retry");
    }
}

//! Time-aware smoothing of noisy signals: an EWMA with an explicit time constant, staleness
//! detection, and an EWMA rate estimator for cumulative counters.
//!
//! With irregular sampling a fixed per-sample weight would make the smoothing depend on the
//! scrape interval; instead each update uses `alpha = 1 − exp(−Δt/τ)`, the exact discrete
//! form of a first-order low-pass filter with time constant τ: after τ of steady input the
//! estimate has moved 63 % of the way to it, after 3τ 95 %. Choosing τ: a few scrape
//! intervals (e.g. τ = 10 s with 2 s scrapes) damps scrape-to-scrape noise while still
//! following a load step within ~30 s, faster than the optimizer should react anyway.
//!
//! Time is injected: every method takes `now` ([`TimePoint`]), so the same code runs on the
//! control loop's clock, a paused test clock or a simulator's virtual clock.

use std::time::Duration;

/// Time constants an EWMA takes to follow a step (95 % of it). After a change of demand or of
/// the fleet, the measurements are taken as settled once this many have passed.
pub const SETTLING_TAUS: u32 = 3;

/// A point in time. Implemented for `Duration` read as the time since an arbitrary epoch: the
/// control loop's time since it started, a simulator's virtual time. (The model reads no
/// clock, so it has no use for instants.)
pub trait TimePoint: Copy {
    /// Seconds from `earlier` to `self`; negative if `self` is earlier.
    fn seconds_since(self, earlier: Self) -> f64;
}

impl TimePoint for Duration {
    fn seconds_since(self, earlier: Self) -> f64 {
        signed_seconds(self.checked_sub(earlier), earlier.checked_sub(self))
    }
}

fn signed_seconds(forward: Option<Duration>, backward: Option<Duration>) -> f64 {
    match (forward, backward) {
        (Some(forward), _) => forward.as_secs_f64(),
        (None, Some(backward)) => -backward.as_secs_f64(),
        (None, None) => 0.0,
    }
}

/// Exponentially weighted moving average with time constant `tau`.
#[derive(Clone, Debug)]
pub struct Ewma<T> {
    tau_s: f64,
    value: Option<f64>,
    last_update: Option<T>,
}

impl<T: TimePoint> Ewma<T> {
    /// A new, empty average. A zero `tau` means no smoothing (the last value wins).
    pub fn new(tau: Duration) -> Self {
        Self { tau_s: tau.as_secs_f64(), value: None, last_update: None }
    }

    /// Changes the time constant from the next update on (the value is kept).
    pub fn set_tau(&mut self, tau: Duration) {
        self.tau_s = tau.as_secs_f64();
    }

    /// Folds in observation `x` taken at `now` and returns the new estimate. The first
    /// observation is taken as is. Non-finite observations and observations older than the
    /// last one are ignored (the current estimate is returned).
    pub fn update(&mut self, now: T, x: f64) -> Option<f64> {
        if !x.is_finite() {
            return self.value;
        }
        match (self.value, self.last_update) {
            (Some(value), Some(last)) => {
                let dt = now.seconds_since(last);
                if dt < 0.0 {
                    return self.value;
                }
                let alpha = if self.tau_s > 0.0 { 1.0 - (-dt / self.tau_s).exp() } else { 1.0 };
                self.value = Some(value + alpha * (x - value));
            }
            _ => self.value = Some(x),
        }
        self.last_update = Some(now);
        self.value
    }

    /// The current estimate, `None` before the first observation.
    pub fn value(&self) -> Option<f64> {
        self.value
    }

    /// When the last observation was folded in.
    pub fn last_update(&self) -> Option<T> {
        self.last_update
    }

    /// True if there is no observation, or the last one is more than `bound` older than `now`.
    pub fn is_stale(&self, now: T, bound: Duration) -> bool {
        match self.last_update {
            None => true,
            Some(last) => now.seconds_since(last) > bound.as_secs_f64(),
        }
    }
}

/// Two sums whose past counts less and less (weight `exp(−age/τ)`), for a ratio of totals over
/// a sliding window, such as generated tokens per finished request: unlike an average of
/// per-window ratios, windows with more requests count for more.
#[derive(Clone, Debug)]
pub struct DecayedSums<T> {
    tau_s: f64,
    sums: (f64, f64),
    last_update: Option<T>,
}

impl<T: TimePoint> DecayedSums<T> {
    pub fn new(tau: Duration) -> Self {
        Self { tau_s: tau.as_secs_f64(), sums: (0.0, 0.0), last_update: None }
    }

    /// Decays the sums to `now` and adds (`a`, `b`). Non-finite or negative amounts and
    /// updates older than the last one are ignored.
    pub fn add(&mut self, now: T, a: f64, b: f64) {
        if !(a.is_finite() && b.is_finite() && a >= 0.0 && b >= 0.0) {
            return;
        }
        if let Some(last) = self.last_update {
            let dt = now.seconds_since(last);
            if dt < 0.0 {
                return;
            }
            let keep = if self.tau_s > 0.0 { (-dt / self.tau_s).exp() } else { 0.0 };
            self.sums = (self.sums.0 * keep, self.sums.1 * keep);
        }
        self.sums = (self.sums.0 + a, self.sums.1 + b);
        self.last_update = Some(now);
    }

    /// The decayed sums as of the last update.
    pub fn sums(&self) -> (f64, f64) {
        self.sums
    }
}

/// Smoothed rate (units per second) of a cumulative counter, such as tokens generated.
#[derive(Clone, Debug)]
pub struct RateEstimator<T> {
    ewma: Ewma<T>,
    last_counter: Option<(T, f64)>,
}

impl<T: TimePoint> RateEstimator<T> {
    /// A new estimator whose rates are smoothed with time constant `tau`.
    pub fn new(tau: Duration) -> Self {
        Self { ewma: Ewma::new(tau), last_counter: None }
    }

    /// Records counter value `counter` read at `now`; returns the smoothed rate, `None`
    /// until two readings are in. A counter that went down means the source restarted:
    /// the new value is then the increase since the restart.
    pub fn update(&mut self, now: T, counter: f64) -> Option<f64> {
        if !counter.is_finite() {
            return self.ewma.value();
        }
        let Some((last_at, last_value)) = self.last_counter else {
            self.last_counter = Some((now, counter));
            return None;
        };
        let dt = now.seconds_since(last_at);
        if dt <= 0.0 {
            return self.ewma.value();
        }
        let increase = if counter >= last_value { counter - last_value } else { counter.max(0.0) };
        self.last_counter = Some((now, counter));
        self.ewma.update(now, increase / dt)
    }

    /// The current smoothed rate.
    pub fn rate(&self) -> Option<f64> {
        self.ewma.value()
    }

    /// True if there is no rate yet or the last reading is older than `bound`.
    pub fn is_stale(&self, now: T, bound: Duration) -> bool {
        self.ewma.is_stale(now, bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds)
    }

    #[test]
    fn first_observation_is_taken_as_is() {
        let mut ewma = Ewma::new(at(10.0));
        assert_eq!(ewma.value(), None);
        assert_eq!(ewma.update(at(0.0), 5.0), Some(5.0));
    }

    #[test]
    fn step_reaches_63_percent_after_one_time_constant() {
        let mut ewma = Ewma::new(at(10.0));
        ewma.update(at(0.0), 0.0);
        let value = ewma.update(at(10.0), 1.0).unwrap();
        assert!((value - (1.0 - (-1.0f64).exp())).abs() < 1e-12);
    }

    #[test]
    fn smoothing_does_not_depend_on_sampling_interval() {
        // One update after 10 s equals ten 1-s updates of the same constant input.
        let mut coarse = Ewma::new(at(5.0));
        let mut fine = Ewma::new(at(5.0));
        coarse.update(at(0.0), 0.0);
        fine.update(at(0.0), 0.0);
        coarse.update(at(10.0), 4.0);
        for second in 1..=10 {
            fine.update(at(f64::from(second)), 4.0);
        }
        assert!((coarse.value().unwrap() - fine.value().unwrap()).abs() < 1e-9);
    }

    #[test]
    fn out_of_order_and_non_finite_observations_are_ignored() {
        let mut ewma = Ewma::new(at(1.0));
        ewma.update(at(5.0), 2.0);
        assert_eq!(ewma.update(at(4.0), 100.0), Some(2.0));
        assert_eq!(ewma.update(at(6.0), f64::NAN), Some(2.0));
        assert_eq!(ewma.last_update(), Some(at(5.0)));
    }

    #[test]
    fn zero_tau_follows_last_value() {
        let mut ewma = Ewma::new(Duration::ZERO);
        ewma.update(at(0.0), 1.0);
        assert_eq!(ewma.update(at(1.0), 7.0), Some(7.0));
    }

    #[test]
    fn staleness() {
        let mut ewma = Ewma::new(at(1.0));
        assert!(ewma.is_stale(at(0.0), at(5.0)));
        ewma.update(at(10.0), 1.0);
        assert!(!ewma.is_stale(at(15.0), at(5.0)));
        assert!(ewma.is_stale(at(15.1), at(5.0)));
    }

    #[test]
    fn rate_of_steady_counter() {
        let mut rate = RateEstimator::new(at(10.0));
        assert_eq!(rate.update(at(0.0), 100.0), None);
        for step in 1..=20 {
            rate.update(at(f64::from(step) * 2.0), 100.0 + 30.0 * f64::from(step) * 2.0);
        }
        assert!((rate.rate().unwrap() - 30.0).abs() < 1e-9);
    }

    #[test]
    fn rate_survives_counter_reset() {
        let mut rate = RateEstimator::new(Duration::ZERO);
        rate.update(at(0.0), 1000.0);
        rate.update(at(1.0), 1010.0);
        // Restart: the counter starts again from zero and reads 4 one second later.
        assert_eq!(rate.update(at(2.0), 4.0), Some(4.0));
        assert!(!rate.is_stale(at(2.0), at(1.0)));
    }
}

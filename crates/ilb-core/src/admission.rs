//! Admission rules, as pure functions of counts, rates and durations: which requests are shed
//! when the plan says a class is over capacity, and how long a request may wait for a free
//! engine slot. The data plane runs them on its atomics and tokio's clock; the fleet simulator
//! can run the very same code on virtual time.
//!
//! **Shedding.** When the control plane plans to shed a fraction `s` of a class (its demand is
//! above usable capacity), the class sheds that fraction early, lowest priority first: every
//! [`SHED_PLAN_PERIOD`] its per-priority arrival rates become per-priority shed probabilities
//! ([`ClassShedding::plan`]: all of `low` before any `normal`, and so on), and each request
//! compares one number with a uniform draw ([`shed`]).
//!
//! **Waiting.** A request whose candidate engines are all at their concurrency limit waits for
//! a slot, at most [`max_wait`] and only while fewer than the configured number wait
//! ([`may_queue`]); critical requests wait longer and are never turned away for the count.

use crate::priority::{PerPriority, Priority};
use std::time::Duration;

/// How often a class's shed probabilities are recomputed from its arrivals.
pub const SHED_PLAN_PERIOD: Duration = Duration::from_millis(500);

/// Time constant of the exponential smoothing of a class's per-priority arrival rates.
pub const ARRIVAL_RATE_TAU: Duration = Duration::from_secs(2);

/// How many times the configured queue wait a critical request may wait for a slot.
pub const CRITICAL_WAIT_FACTOR: u32 = 2;

/// Per-priority shed probabilities that shed `shed_fraction` of the total rate, lowest
/// priority first: a level is shed only once every lower level is shed entirely. A level
/// below one being shed is shed entirely even when none of its requests was seen yet (its
/// first ones must not get in while higher priorities are turned away), and a fraction of 1
/// sheds every level.
pub fn shed_probabilities(shed_fraction: f64, rates: &PerPriority<f64>) -> PerPriority<f64> {
    if shed_fraction >= 1.0 {
        return PerPriority([1.0; 4]);
    }
    let total: f64 = rates.0.iter().sum();
    let mut remaining = (shed_fraction.max(0.0) * total).max(0.0);
    // What is left after a level is shed entirely is rounding, not traffic to shed.
    let negligible = total * 1e-12;
    let mut out = PerPriority::<f64>::default();
    for (p, &rate) in rates.iter() {
        if remaining <= negligible {
            break;
        }
        if rate <= 0.0 {
            out[p] = 1.0;
            continue;
        }
        out[p] = (remaining / rate).min(1.0);
        remaining -= out[p] * rate;
    }
    out
}

/// Whether to shed one request whose priority's shed probability is `probability`, given
/// `draw`, uniform in [0, 1) (the data plane derives it from the request id, a simulator from
/// its seeded generator).
#[inline]
pub fn shed(probability: f64, draw: f64) -> bool {
    probability > 0.0 && draw < probability
}

/// The shedding state of one traffic class: its smoothed per-priority arrival rates, and the
/// cumulative arrival counts they were last updated from.
#[derive(Clone, Debug)]
pub struct ClassShedding {
    counts: PerPriority<u64>,
    rates: PerPriority<f64>,
}

impl ClassShedding {
    /// A class first seen with cumulative arrivals `counts`; no rate is known yet.
    pub fn new(counts: PerPriority<u64>) -> ClassShedding {
        ClassShedding { counts, rates: PerPriority::default() }
    }

    /// One [`SHED_PLAN_PERIOD`] after the last call (or [`ClassShedding::new`]), with the
    /// class's cumulative arrivals now `counts` and its planned `shed_fraction`: updates the
    /// rates and returns the per-priority shed probabilities.
    pub fn plan(&mut self, counts: PerPriority<u64>, shed_fraction: f64) -> PerPriority<f64> {
        let period_s = SHED_PLAN_PERIOD.as_secs_f64();
        let alpha = 1.0 - (-period_s / ARRIVAL_RATE_TAU.as_secs_f64()).exp();
        for p in Priority::ALL {
            let rate = counts[p].saturating_sub(self.counts[p]) as f64 / period_s;
            self.rates[p] += alpha * (rate - self.rates[p]);
        }
        self.counts = counts;
        shed_probabilities(shed_fraction, &self.rates)
    }

    /// The smoothed arrival rates, requests per second.
    pub fn rates(&self) -> &PerPriority<f64> {
        &self.rates
    }
}

/// The longest a request of `priority` may wait for a free engine slot when the configured
/// wait is `queue_wait`: critical requests [`CRITICAL_WAIT_FACTOR`] times as long.
pub fn max_wait(queue_wait: Duration, priority: Priority) -> Duration {
    match priority {
        Priority::Critical => queue_wait * CRITICAL_WAIT_FACTOR,
        Priority::Low | Priority::Normal | Priority::High => queue_wait,
    }
}

/// Whether a request of `priority` may wait for a slot while `waiting` requests already do and
/// the configured most is `max_waiting`: critical requests always may.
pub fn may_queue(priority: Priority, waiting: usize, max_waiting: usize) -> bool {
    waiting < max_waiting || priority == Priority::Critical
}

/// How much longer a request of `priority` that has waited `waited` for a slot may wait, or
/// `None` when it is refused now ([`max_wait`] is up, or [`may_queue`] says no).
pub fn remaining_wait(
    priority: Priority,
    waited: Duration,
    queue_wait: Duration,
    waiting: usize,
    max_waiting: usize,
) -> Option<Duration> {
    let limit = max_wait(queue_wait, priority);
    (may_queue(priority, waiting, max_waiting) && waited < limit).then(|| limit - waited)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sheds_lowest_priority_first() {
        // 10 low, 50 normal, 30 high, 10 critical req/s; shed 30 % = 30 req/s.
        let p = shed_probabilities(0.3, &PerPriority([10.0, 50.0, 30.0, 10.0]));
        assert_eq!(p[Priority::Low], 1.0);
        assert!((p[Priority::Normal] - 0.4).abs() < 1e-12);
        assert_eq!((p[Priority::High], p[Priority::Critical]), (0.0, 0.0));
        assert_eq!(shed_probabilities(0.0, &PerPriority([1.0; 4])).0, [0.0; 4]);
        assert_eq!(shed_probabilities(1.0, &PerPriority([1.0; 4])).0, [1.0; 4]);
        // Only critical traffic: critical is shed when the plan says so, and the levels below
        // it, not seen yet, entirely.
        assert_eq!(shed_probabilities(0.5, &PerPriority([0.0, 0.0, 0.0, 8.0])).0, [1.0, 1.0, 1.0, 0.5]);
        // Everything shed: every level, seen or not.
        assert_eq!(shed_probabilities(1.0, &PerPriority([0.0, 5.0, 0.0, 0.0])).0, [1.0; 4]);
        // Nothing seen at all: nothing to shed from yet.
        assert_eq!(shed_probabilities(0.5, &PerPriority([0.0; 4])).0, [0.0; 4]);
        // Low fully shed exactly: nothing of normal, whatever the rounding.
        assert_eq!(shed_probabilities(0.1, &PerPriority([0.1, 0.9, 0.0, 0.0])).0, [1.0, 0.0, 0.0, 0.0]);
        assert!(shed(0.4, 0.39) && !shed(0.4, 0.4) && !shed(0.0, 0.0));
    }

    #[test]
    fn plans_from_smoothed_arrival_rates() {
        let mut class = ClassShedding::new(PerPriority([100, 100, 0, 0]));
        // The first period sees no arrivals: nothing to shed from.
        assert_eq!(class.plan(PerPriority([100, 100, 0, 0]), 0.5).0, [0.0; 4]);
        // Steady 20 low and 20 normal req/s (10 and 10 per half second).
        let mut counts = PerPriority([100u64, 100, 0, 0]);
        let mut p = PerPriority::default();
        for _ in 0..200 {
            counts[Priority::Low] += 10;
            counts[Priority::Normal] += 10;
            p = class.plan(counts, 0.25);
        }
        assert!((class.rates()[Priority::Low] - 20.0).abs() < 1e-6);
        // A quarter of 40 req/s is 10 req/s: half of the low traffic, no normal.
        assert!((p[Priority::Low] - 0.5).abs() < 1e-6, "{p:?}");
        assert_eq!(p[Priority::Normal], 0.0);
    }

    #[test]
    fn critical_waits_longer_and_past_the_count() {
        let wait = Duration::from_secs(2);
        assert_eq!(max_wait(wait, Priority::Critical), Duration::from_secs(4));
        assert_eq!(max_wait(wait, Priority::High), wait);
        let ms = Duration::from_millis;
        assert_eq!(remaining_wait(Priority::Normal, ms(500), wait, 0, 1), Some(ms(1500)));
        assert_eq!(remaining_wait(Priority::Normal, ms(2000), wait, 0, 1), None);
        assert_eq!(remaining_wait(Priority::High, ms(0), wait, 1, 1), None, "the queue is full");
        assert_eq!(remaining_wait(Priority::Critical, ms(2500), wait, 5, 1), Some(ms(1500)));
        assert_eq!(remaining_wait(Priority::Critical, ms(4000), wait, 0, 1), None);
    }
}

//! Capacity learned from saturation: what an engine completes while it keeps a queue is what
//! it can serve.
//!
//! A configured (or `ilb profile`d) capacity is measured on one workload; in production the
//! prompts are longer, the prefix cache hits less, or the engine has turned slow, and the
//! engine saturates below it. The planner would then keep loading it to ρ of a capacity it
//! does not have, and its queue would grow without bound while the curve, whose pole sits at
//! the configured capacity, still promised a modest latency.
//!
//! Continuous-batching engines queue requests (vLLM's `num_requests_waiting`, SGLang's
//! `num_queue_reqs`, llama.cpp's `requests_deferred`) only once their batch or their KV cache
//! is full. A queue that grows through a whole scrape window means requests arrived faster than
//! the engine served them, and a server with work waiting never idles, so the requests it
//! completed in that window measure its service rate. A queue that merely stands (an engine
//! near its capacity under bursty arrivals keeps one or two waiting) proves nothing: its
//! completions are its arrivals, and taking them for its capacity moved traffic back and forth
//! on the fleet simulator's bundled scenarios. From the `GROWING_WINDOWS`-th growing window in
//! a row, each moves the engine's capacity share halfway down to the completed rate over its
//! nominal capacity (never below `MIN_SHARE`), so the share follows a runaway queue within a
//! few scrape periods while one noisy window moves it only half as far. Otherwise the share
//! recovers towards 1 with time constant `RECOVERY_TAU`, so a spell of long prompts or a grey
//! engine that healed does not keep the capacity down; if the engine saturates again on the
//! way, it comes down again.
//! The learned share scales the capacity the optimizer may load (`ρ` of it) and the pole of
//! the engine's queueing curves, so that latency turns up where the engine's does.

use super::Now;
use std::time::Duration;

/// Waiting requests at a window's start for its growth to count.
const QUEUE_MIN: f64 = 1.0;
/// Growing windows in a row before the capacity share comes down (a burst lasts one or two).
const GROWING_WINDOWS: u32 = 3;
/// The capacity share never falls below this: an engine that completes almost nothing is
/// the outlier detector's (and the health check's) to take out, not this estimate's.
pub(crate) const MIN_SHARE: f64 = 0.2;
/// How far each growing window moves the share towards what it measured.
const STEP: f64 = 0.5;
/// Time constant of the share's recovery towards 1 while the engine keeps no queue.
const RECOVERY_TAU: Duration = Duration::from_secs(120);

/// One engine's learned capacity share.
#[derive(Clone, Debug)]
pub struct Saturation {
    /// Learned capacity over nominal capacity, in [`MIN_SHARE`, 1].
    share: f64,
    /// Consecutive windows in which the queue grew.
    growing_windows: u32,
    last_window: Option<Now>,
}

impl Default for Saturation {
    fn default() -> Self {
        Saturation { share: 1.0, growing_windows: 0, last_window: None }
    }
}

impl Saturation {
    /// Learned capacity over nominal capacity.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// A scrape window ended at `now`: the waiting gauge at its start and end, the requests
    /// it completed per second (if the engine counts them) and the engine's nominal capacity.
    pub fn on_window(&mut self, now: Now, waiting: (f64, f64), completed_rps: Option<f64>, nominal_rps: f64) {
        let elapsed = self.last_window.map_or(Duration::ZERO, |last| now.saturating_sub(last));
        self.last_window = Some(now);
        let growing = waiting.0 >= QUEUE_MIN && waiting.1 > waiting.0;
        if !growing {
            self.growing_windows = 0;
            let keep = (-elapsed.as_secs_f64() / RECOVERY_TAU.as_secs_f64()).exp();
            self.share = 1.0 - (1.0 - self.share) * keep;
            return;
        }
        self.growing_windows = self.growing_windows.saturating_add(1);
        let Some(completed) = completed_rps.filter(|r| r.is_finite() && *r >= 0.0) else { return };
        if self.growing_windows >= GROWING_WINDOWS && nominal_rps > 0.0 {
            // Halfway at each window: one window's count is a noisy reading of the rate.
            let measured = (completed / nominal_rps).max(MIN_SHARE);
            if measured < self.share {
                self.share -= STEP * (self.share - measured);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Now {
        Duration::from_secs(s)
    }

    #[test]
    fn a_growing_queue_brings_the_share_down_to_the_completed_rate() {
        let mut s = Saturation::default();
        s.on_window(at(1), (0.0, 3.0), Some(6.0), 10.0);
        assert_eq!(s.share(), 1.0, "a queue that formed during the window is no evidence");
        s.on_window(at(2), (3.0, 5.0), Some(6.0), 10.0);
        s.on_window(at(3), (5.0, 7.0), Some(6.0), 10.0);
        assert_eq!(s.share(), 1.0, "two growing windows may be a burst");
        s.on_window(at(4), (7.0, 9.0), Some(6.0), 10.0);
        assert!((s.share() - 0.8).abs() < 1e-12, "halfway to 0.6: {}", s.share());
        s.on_window(at(5), (9.0, 11.0), Some(6.0), 10.0);
        assert!((s.share() - 0.7).abs() < 1e-12, "{}", s.share());
        s.on_window(at(6), (11.0, 12.0), Some(9.0), 10.0);
        assert!((s.share() - 0.7).abs() < 1e-12, "a higher reading does not raise it: {}", s.share());
        for t in 7..20 {
            s.on_window(at(t), (8.0 + t as f64, 9.0 + t as f64), Some(0.1), 10.0);
        }
        assert!((s.share() - MIN_SHARE).abs() < 1e-3, "{}", s.share());
    }

    #[test]
    fn a_standing_queue_is_no_evidence() {
        let mut s = Saturation::default();
        for t in 1..=20 {
            // Bursty arrivals at an engine near its capacity: a queue of one or two that
            // grows as often as it shrinks.
            let waiting = if t % 2 == 0 { (1.0, 2.0) } else { (2.0, 1.0) };
            s.on_window(at(t), waiting, Some(6.0), 10.0);
        }
        assert_eq!(s.share(), 1.0);
    }

    #[test]
    fn without_growth_the_share_recovers_with_its_time_constant() {
        let mut s = Saturation::default();
        for t in 1..=4 {
            s.on_window(at(t), (t as f64, t as f64 + 1.0), Some(5.0), 10.0);
        }
        assert!((s.share() - 0.625).abs() < 1e-12, "{}", s.share());
        s.on_window(at(4 + RECOVERY_TAU.as_secs()), (5.0, 5.0), Some(5.0), 10.0);
        let expected = 1.0 - 0.375 * (-1.0_f64).exp();
        assert!((s.share() - expected).abs() < 1e-9, "{} vs {expected}", s.share());
    }

    #[test]
    fn a_queue_without_a_completion_count_keeps_the_share() {
        let mut s = Saturation::default();
        for t in 1..=5 {
            s.on_window(at(t), (t as f64, t as f64 + 1.0), None, 10.0);
        }
        assert_eq!(s.share(), 1.0);
    }
}

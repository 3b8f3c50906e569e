//! An engine's recent operating points, for the latency-profile fits: (load, mean TTFT, mean
//! time between tokens) per scrape window, pooled into 10 s buckets and kept for 10 minutes.
//!
//! Why so long: near capacity an engine's mean latency is dominated by occasional queue
//! build-ups lasting tens of seconds, so a profile fitted to the last two minutes describes a
//! typical two minutes, not the long-run mean the plan is judged by (the fleet simulator's
//! prediction error with two minutes and with ten is in `docs/results.md`). Pooling keeps that
//! history at 60 entries per engine.
//!
//! Only windows and buckets in which the engine was *settled* are points of its curve
//! ([`settled`]): one that was filling up or draining (a flood at start-up or after a plan
//! change, a surge, a queue creeping up past the engine's knee) has a latency set by how it got
//! there, paired with a load reading (the smoothed rate) that lags.

use crate::profile::Observation;
use std::collections::VecDeque;
use std::time::Duration;

/// Time since the control plane started.
type Now = Duration;

/// Scrape windows are pooled into buckets this long.
const BUCKET: Duration = Duration::from_secs(10);
/// Closed buckets kept: ten minutes.
const MAX_BUCKETS: usize = 60;

/// Standard deviations of its own fluctuation by which an engine's population may move within
/// a window that still counts as [`settled`].
const SETTLED_SIGMAS: f64 = 3.0;
/// Requests by which the population may move regardless (a nearly idle engine's count is small).
const SETTLED_SLACK: f64 = 2.0;

/// Whether a scrape window over which an engine's population (requests running plus waiting)
/// went from `before` to `after` shows its latency at a steady load.
///
/// At a steady load the requests an engine holds fluctuate like a Poisson count (the occupancy
/// of a server with many slots is Poisson, with mean load × time in the system), so two readings
/// a window apart differ by about √(before + after). A larger move means the load itself was
/// moving. Such a window is rare but lands where the engine seldom runs: on the fleet
/// simulator's `random-1-47` the start-up plan flooded one H100 with 600 requests for three
/// seconds (time between tokens 45–91 ms against 9 ms settled), and that one bucket, at a load
/// above the fleet's operating point, bent the twins' fitted curve up right there, so the plan
/// kept a third of the traffic on slower A100s for the whole run (`docs/results.md`). A queue
/// can also creep up by less than that per window and still run away over a bucket (an A100 on
/// `random-1-75`, whose first bucket then priced it out for the rest of the run), so the test
/// also applies to each bucket's first and last population. Unknown counts (NaN) count as
/// settled.
pub(crate) fn settled(before: f64, after: f64) -> bool {
    let moved = (after - before).abs();
    let allowed = SETTLED_SLACK + SETTLED_SIGMAS * (before + after).max(0.0).sqrt();
    moved.is_nan() || moved <= allowed
}

/// One bucket: the weighted means of its windows (both latencies weighted by requests).
#[derive(Clone, Copy, Debug)]
struct Bucket {
    start: Now,
    ttft: Observation,
    tbot: Option<Observation>,
    /// The engine's population at its first window's start and at its last window's end: a
    /// queue that creeps up by less than [`settled`] allows per window can still run away
    /// over a bucket.
    population: (f64, f64),
}

impl Bucket {
    fn settled(&self) -> bool {
        settled(self.population.0, self.population.1)
    }
}

#[derive(Debug, Default)]
pub struct LoadHistory {
    closed: VecDeque<Bucket>,
    open: Option<Bucket>,
}

impl LoadHistory {
    /// Records one scrape window at `now`: TTFT (and TBOT if the engine exposes it), both at
    /// load `ttft.load_rps` and weighted by `ttft.weight` requests, over which the engine's
    /// population (requests running plus waiting) went from `population.0` to `population.1`.
    /// A window, or a whole bucket, in which the engine was not [`settled`] is left out.
    pub fn record(&mut self, now: Now, ttft: Observation, tbot: Option<Observation>, population: (f64, f64)) {
        if !settled(population.0, population.1) {
            return;
        }
        if let Some(open) = &mut self.open {
            if now.saturating_sub(open.start) < BUCKET {
                open.population.1 = population.1;
                open.ttft = pooled(open.ttft, ttft);
                open.tbot = match (open.tbot, tbot) {
                    (Some(a), Some(b)) => Some(pooled(a, b)),
                    (a, b) => a.or(b),
                };
                return;
            }
        }
        if let Some(full) = self.open.take().filter(Bucket::settled) {
            self.closed.push_back(full);
            if self.closed.len() > MAX_BUCKETS {
                self.closed.pop_front();
            }
        }
        self.open = Some(Bucket { start: now, ttft, tbot, population });
    }

    /// Forgets everything that may include windows from `started` on (the windows that got an
    /// engine penalised are not its normal behaviour).
    pub fn forget_since(&mut self, started: Now) {
        self.open = None;
        self.closed.retain(|b| b.start + BUCKET <= started);
    }

    fn buckets(&self) -> impl Iterator<Item = &Bucket> {
        self.closed.iter().chain(self.open.iter().filter(|b| b.settled()))
    }

    pub fn ttft(&self) -> Vec<Observation> {
        self.buckets().map(|b| b.ttft).collect()
    }

    pub fn tbot(&self) -> Vec<Observation> {
        self.buckets().filter_map(|b| b.tbot).collect()
    }
}

/// Two observations as one: weights add, load and latency are weight-averaged.
fn pooled(a: Observation, b: Observation) -> Observation {
    let weight = a.weight + b.weight;
    if weight.is_nan() || weight <= 0.0 {
        return b;
    }
    Observation {
        load_rps: (a.load_rps * a.weight + b.load_rps * b.weight) / weight,
        latency_ms: (a.latency_ms * a.weight + b.latency_ms * b.weight) / weight,
        weight,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEADY: (f64, f64) = (4.0, 4.0);

    fn at(load: f64, ms: f64, weight: f64) -> Observation {
        Observation { load_rps: load, latency_ms: ms, weight }
    }

    #[test]
    fn windows_pool_into_buckets_and_age_out() {
        let mut h = LoadHistory::default();
        h.record(Duration::from_secs(0), at(10.0, 100.0, 1.0), None, STEADY);
        h.record(Duration::from_secs(5), at(20.0, 200.0, 3.0), Some(at(20.0, 30.0, 3.0)), STEADY);
        let ttft = h.ttft();
        assert_eq!(ttft.len(), 1);
        assert_eq!((ttft[0].load_rps, ttft[0].latency_ms, ttft[0].weight), (17.5, 175.0, 4.0));
        assert_eq!(h.tbot().len(), 1);
        for s in 1..=100 {
            h.record(Duration::from_secs(10 * s), at(1.0, 1.0, 1.0), None, STEADY);
        }
        assert_eq!(h.ttft().len(), MAX_BUCKETS + 1);
        assert!(h.tbot().is_empty(), "the first bucket aged out");
    }

    #[test]
    fn a_filling_or_draining_engine_is_not_settled() {
        assert!(settled(30.0, 41.0), "within three standard deviations of a Poisson count");
        assert!(settled(0.0, 2.0) && settled(3.0, 0.0), "a nearly idle engine's count is small");
        assert!(!settled(0.0, 226.0) && !settled(226.0, 400.0), "a flood");
        assert!(!settled(625.0, 45.0), "draining");
        assert!(settled(f64::NAN, 3.0), "unknown counts");
    }

    #[test]
    fn a_bucket_whose_queue_crept_up_is_left_out() {
        let mut h = LoadHistory::default();
        // Each window adds 8 to a population of about 40 (within its fluctuation), the bucket 80.
        for s in 0..10 {
            let before = 40.0 + 8.0 * s as f64;
            h.record(Duration::from_secs(s), at(10.0, 300.0, 10.0), None, (before, before + 8.0));
        }
        assert!(h.ttft().is_empty(), "the open bucket ran away");
        h.record(Duration::from_secs(10), at(10.0, 50.0, 10.0), None, STEADY);
        assert_eq!(h.ttft().len(), 1, "and it is not kept when it closes");
        assert_eq!(h.ttft()[0].latency_ms, 50.0);
    }

    #[test]
    fn forgetting_drops_buckets_that_may_hold_later_windows() {
        let mut h = LoadHistory::default();
        for s in 0..5 {
            h.record(Duration::from_secs(10 * s), at(1.0, 1.0, 1.0), None, STEADY);
        }
        // Buckets start at 0, 10, 20, 30 (closed) and 40 (open); 25 s on is suspect.
        h.forget_since(Duration::from_secs(25));
        assert_eq!(h.ttft().len(), 2);
    }
}

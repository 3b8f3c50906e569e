//! The load search behind `ilb profile`, without I/O: which rate to measure next, whether a
//! measured step was past the engine's knee, and the profile the steps give. `ilb profile` runs
//! it against a live engine; the fleet simulator runs it against its engine model, so the
//! profiles the simulator's control plane starts from come from the product's own search.
//!
//! The search doubles the rate until a step is past the knee, bisects until the knee is
//! bracketed within [`KNEE_BRACKET`] (a good step at or above a bad one counts as noise near the
//! knee), then measures the [`FILL_SHARES`] of the knee so that the curve spans the loads a fleet
//! runs at. The profile's capacity is where a queueing curve fitted to the TTFT points below the
//! knee has its pole; the points themselves are the measured curves.

use super::{fit_queueing, LatencyProfile, Observation, QueueingPrior};

/// One load step's outcome.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Step {
    /// The rate the search asked for, req/s.
    pub offered_rps: f64,
    /// Arrivals sent per second.
    pub load_rps: f64,
    pub ttft_ms: f64,
    pub tbot_ms: f64,
    pub overloaded: bool,
}

/// A step is past the knee when TTFT's mean exceeds idle's by this factor (and by a second).
pub const KNEE_TTFT_FACTOR: f64 = 8.0;
/// … or when fewer than this share of its arrivals completed.
pub const KNEE_COMPLETED_SHARE: f64 = 0.9;
/// … or when its latency at the end was this many times that at its start.
pub const KNEE_GROWTH: f64 = 3.0;
/// The knee is bracketed once the lowest bad rate is within this factor of the highest good one.
pub const KNEE_BRACKET: f64 = 1.1;
/// Once the knee is bracketed, the loads measured below it, as shares of the knee.
pub const FILL_SHARES: [f64; 3] = [0.5, 0.75, 0.25];

/// What a step measured, for [`Measured::past_knee`].
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// Requests sent and requests completed.
    pub sent: u64,
    pub completed: u64,
    /// Mean TTFT of the step, ms.
    pub ttft_ms: f64,
    /// TTFT of an idle engine, ms.
    pub idle_ttft_ms: f64,
    /// Whether latency rose through the step as a queue that outgrows the engine makes it (see
    /// [`grew`]).
    pub queue_grew: bool,
}

impl Measured {
    /// Whether the step was past the engine's knee: requests did not complete, TTFT was far
    /// above idle's, or a queue grew through the step.
    pub fn past_knee(&self) -> bool {
        (self.completed as f64) < KNEE_COMPLETED_SHARE * self.sent as f64
            || self.ttft_ms > (KNEE_TTFT_FACTOR * self.idle_ttft_ms).max(self.idle_ttft_ms + 1000.0)
            || self.queue_grew
    }
}

/// Whether a latency went from `first_ms` early in a step to `last_ms` late in it as a queue
/// that outgrows the engine makes it: by more than [`KNEE_GROWTH`] times and by more than an
/// idle latency. A stable queue starting empty also rises, but by a fraction, not a multiple.
pub fn grew(first_ms: f64, last_ms: f64, idle_ms: f64) -> bool {
    last_ms > KNEE_GROWTH * first_ms && last_ms > first_ms + idle_ms
}

/// The knee as the steps so far show it: the lowest rate past it, and the highest rate below
/// that which was not (a good step at or above a bad one was noise near the knee, not a load
/// the engine sustains).
pub fn knee(steps: &[Step]) -> (Option<f64>, Option<f64>) {
    let bad = steps.iter().filter(|s| s.overloaded).map(|s| s.offered_rps).reduce(f64::min);
    let good = steps
        .iter()
        .filter(|s| !s.overloaded && bad.is_none_or(|b| s.offered_rps < b))
        .map(|s| s.offered_rps)
        .reduce(f64::max);
    (good, bad)
}

/// The next rate of the search, or `None` when it is done: doubling to the knee, bisecting until
/// it is bracketed within [`KNEE_BRACKET`], then the [`FILL_SHARES`] below it not measured yet.
pub fn next_rate(steps: &[Step]) -> Option<f64> {
    match knee(steps) {
        (Some(good), None) => Some(2.0 * good),
        (None, Some(bad)) => Some(0.5 * bad),
        (Some(good), Some(bad)) if bad > KNEE_BRACKET * good => Some(0.5 * (good + bad)),
        (Some(good), Some(_)) => FILL_SHARES.iter().map(|share| share * good).find(|&target| {
            !steps.iter().any(|s| (s.offered_rps / target - 1.0).abs() < 0.5 * (KNEE_BRACKET - 1.0))
        }),
        (None, None) => None,
    }
}

/// The profile a search's steps give, per replica.
#[derive(Clone, Debug)]
pub struct Fitted {
    /// Where TTFT's fitted queueing curve has its pole, req/s.
    pub capacity_rps: f64,
    pub ttft_t0_ms: f64,
    pub ttft_b_ms: f64,
    pub tbot_t0_ms: f64,
    pub tbot_b_ms: f64,
    /// The steps below the knee, as (load, latency) points with increasing loads.
    pub ttft_curve: Vec<Observation>,
    pub tbot_curve: Vec<Observation>,
    /// Steps below the knee.
    pub below_knee: usize,
}

/// Fits the profile of `steps` for an engine of `replicas` replicas; an error when fewer than two
/// steps measured it below its knee.
pub fn fit(steps: &[Step], replicas: u32) -> Result<Fitted, String> {
    let replicas = f64::from(replicas.max(1));
    let first_bad = knee(steps).1.unwrap_or(f64::INFINITY);
    // The pole lies below the load the first step past the knee sent.
    let bad_load = steps.iter().find(|s| s.offered_rps == first_bad).map_or(f64::INFINITY, |s| s.load_rps);
    let mut good: Vec<Step> = steps
        .iter()
        .copied()
        .filter(|s| !s.overloaded && s.ttft_ms.is_finite() && s.offered_rps < first_bad)
        .collect();
    good.sort_by(|a, b| a.load_rps.total_cmp(&b.load_rps));
    if good.len() < 2 {
        return Err(format!(
            "only {} of {} steps measured the engine below its knee (two are needed)",
            good.len(),
            steps.len()
        ));
    }
    let points = |latency: fn(&Step) -> f64| -> Vec<Observation> {
        let mut out: Vec<Observation> = Vec::new();
        for s in good.iter().filter(|s| latency(s).is_finite() && s.load_rps > 0.0) {
            // Measured curves need strictly increasing loads.
            if out.last().is_none_or(|o| s.load_rps / replicas > o.load_rps) {
                out.push(Observation {
                    load_rps: s.load_rps / replicas,
                    latency_ms: latency(s),
                    weight: 1.0,
                });
            }
        }
        out
    };
    let (ttft, tbot) = (points(|s| s.ttft_ms), points(|s| s.tbot_ms));
    let top = ttft.last().map_or(0.0, |o| o.load_rps);
    let capacity = pole(&ttft, top, (bad_load / replicas).min(4.0 * top));
    let queueing = |observations: &[Observation]| match unweighted(capacity, observations) {
        LatencyProfile::Queueing { t0_ms, b_ms } => (t0_ms, b_ms),
        LatencyProfile::Piecewise(_) => (0.0, 0.0),
    };
    let ((ttft_t0_ms, ttft_b_ms), (tbot_t0_ms, tbot_b_ms)) = (queueing(&ttft), queueing(&tbot));
    Ok(Fitted {
        capacity_rps: capacity,
        ttft_t0_ms,
        ttft_b_ms,
        tbot_t0_ms,
        tbot_b_ms,
        ttft_curve: ttft,
        tbot_curve: tbot,
        below_knee: good.len(),
    })
}

fn unweighted(capacity_rps: f64, observations: &[Observation]) -> LatencyProfile {
    fit_queueing(QueueingPrior { t0_ms: 0.0, b_ms: 0.0, weight: 0.0 }, capacity_rps, observations)
}

/// The capacity where a queueing curve t0 + b·y/(c − y) fits the TTFT points best: a search
/// over c between just above the highest good load and `upper` (the first overloaded load).
fn pole(points: &[Observation], top: f64, upper: f64) -> f64 {
    if points.len() < 2 || top.is_nan() || top <= 0.0 {
        return top.max(1e-3) * 1.25;
    }
    let upper = if upper.is_finite() && upper > top { upper } else { 2.0 * top };
    let error = |c: f64| -> f64 {
        let fit = unweighted(c, points);
        points.iter().map(|o| (fit.latency_ms(o.load_rps, c) - o.latency_ms).powi(2)).sum()
    };
    let candidates = (1..=40).map(|i| top * 1.01 + (upper - top * 1.01) * f64::from(i) / 40.0);
    candidates.min_by(|a, b| error(*a).total_cmp(&error(*b))).unwrap_or(upper)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The steps the search takes against an engine past its knee above `knee` (and at the rates
    /// in `noise`, which a noisy step called wrongly), until it stops.
    fn search(first: f64, knee: f64, noise: &[(f64, bool)]) -> Vec<Step> {
        let mut steps: Vec<Step> = Vec::new();
        let mut rate = Some(first);
        while let Some(r) = rate {
            assert!(steps.len() < 30, "the search does not end: {steps:?}");
            let overloaded = noise.iter().find(|(at, _)| (at - r).abs() < 1e-9).map_or(r > knee, |n| n.1);
            steps.push(Step { offered_rps: r, load_rps: r, ttft_ms: 1.0, tbot_ms: 1.0, overloaded });
            rate = next_rate(&steps);
        }
        steps
    }

    fn rates(steps: &[Step]) -> Vec<f64> {
        steps.iter().map(|s| s.offered_rps).collect()
    }

    #[test]
    fn the_search_brackets_the_knee_then_measures_below_it() {
        let steps = search(0.25, 0.6, &[]);
        let (Some(good), Some(bad)) = knee(&steps) else { panic!("no knee: {steps:?}") };
        assert!(good <= 0.6 && bad > 0.6 && bad <= KNEE_BRACKET * good, "{:?}", rates(&steps));
        for share in FILL_SHARES {
            let target = share * good;
            assert!(
                steps.iter().any(|s| (s.offered_rps / target - 1.0).abs() < 0.05),
                "{share}: {:?}",
                rates(&steps)
            );
        }
    }

    #[test]
    fn a_bad_step_below_a_good_one_voids_it() {
        // The step at 0.75 looked good by chance; the knee is at 0.5. The search brackets a
        // false knee above 0.75, and its measurement at ¾ of that (0.5625) is past the knee.
        let steps = search(0.25, 0.5, &[(0.75, false)]);
        let (Some(good), Some(bad)) = knee(&steps) else { panic!("no knee: {:?}", rates(&steps)) };
        assert!(good <= 0.5 && bad > 0.5 && bad <= KNEE_BRACKET * good, "{:?}", rates(&steps));
    }

    #[test]
    fn a_first_step_past_the_knee_halves_the_rate() {
        assert_eq!(&rates(&search(2.0, 0.6, &[]))[..3], &[2.0, 1.0, 0.5]);
    }

    /// Steps measured on an M/M/1-like engine of capacity 10 find its pole and curve.
    #[test]
    fn the_fit_finds_the_pole_of_a_queueing_engine() {
        let latency = |y: f64| 50.0 + 20.0 * y / (10.0 - y);
        let steps: Vec<Step> = [2.0, 4.0, 6.0, 8.0, 9.0, 9.8]
            .iter()
            .map(|&y| Step {
                offered_rps: y,
                load_rps: y,
                ttft_ms: latency(y),
                tbot_ms: 5.0,
                overloaded: y > 9.5,
            })
            .collect();
        let fitted = fit(&steps, 1).expect("five good steps");
        assert_eq!(fitted.below_knee, 5);
        assert!((fitted.capacity_rps / 10.0 - 1.0).abs() < 0.05, "{fitted:?}");
        assert!(
            (fitted.ttft_t0_ms - 50.0).abs() < 5.0 && (fitted.ttft_b_ms - 20.0).abs() < 5.0,
            "{fitted:?}"
        );
        let halved = fit(&steps, 2).expect("per replica");
        assert!((halved.capacity_rps / 5.0 - 1.0).abs() < 0.05, "{halved:?}");
        assert!(fit(&steps[4..], 1).is_err(), "one good step is not a profile");
    }
}

//! Refining latency profiles from observed (load, latency) pairs.
//!
//! Queueing shape: L(y) = t0 + b·x with x = y/(c − y) is linear in (t0, b), so the fit is a
//! weighted least squares on the transformed variable x, solved in closed form (2 × 2 normal
//! equations). The offline profile acts as a prior: it enters as pseudo-observations of the
//! prior curve at idle (x = 0) and at half load (x = 1), each with half the prior weight. With
//! few or clustered observations the prior dominates (a cluster of points at one load pins the
//! curve's level there but not its shape); with many spread observations the data do. Both
//! coefficients are kept non-negative.
//!
//! Measured curve (a shape profiled offline, e.g. by a calibration run): its shape is kept and
//! its level follows the observations, scaled by their latency relative to the curve.
//!
//! Shape: where observations are dense, a curve (queueing or measured) is replaced by the
//! observations' binned means, blended with the curve by weight, and kept elsewhere, scaled to
//! the nearest data; the result is projected onto convex non-decreasing curves. This is what
//! the control plane plans with.
//!
//! Piecewise shape: observations are binned to the nearest knot, averaged, and projected onto
//! convex non-decreasing curves, weighted by the bins' observation weights.

use super::{project_convex_increasing_weighted, LatencyProfile, GRID_MAX_UTILISATION};

/// One observed operating point of an engine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// Load over the observation window, requests per second.
    pub load_rps: f64,
    /// Latency observed over the window (e.g. mean TTFT), milliseconds.
    pub latency_ms: f64,
    /// How much to trust it, typically the number of requests in the window.
    pub weight: f64,
}

impl Observation {
    /// Finite, positively weighted, and below `MAX_FIT_UTILISATION` of `capacity_rps`.
    fn usable(&self, capacity_rps: f64) -> bool {
        self.load_rps.is_finite()
            && self.latency_ms.is_finite()
            && self.weight.is_finite()
            && self.weight > 0.0
            && self.load_rps >= 0.0
            && self.load_rps < MAX_FIT_UTILISATION * capacity_rps
    }
}

/// The offline queueing profile used as a prior, and how much it counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueueingPrior {
    pub t0_ms: f64,
    pub b_ms: f64,
    /// Weight of the prior in the same units as [`Observation::weight`]: the prior counts as
    /// this much observation weight, split between idle and half load. 0 = data only.
    pub weight: f64,
}

/// Loads at or above this fraction of capacity are ignored: x = y/(c − y) explodes there and
/// a single overloaded window would dominate the fit.
const MAX_FIT_UTILISATION: f64 = 0.99;

/// Fits `L(y) = t0 + b·y/(c − y)` for capacity `capacity_rps` to `observations`, regularised
/// towards `prior`. Returns a `Queueing` profile; returns the prior unchanged when the
/// capacity is not positive or nothing usable was observed. Never panics; non-finite or
/// non-positive-weight observations are skipped.
pub fn fit_queueing(prior: QueueingPrior, capacity_rps: f64, observations: &[Observation]) -> LatencyProfile {
    let prior_profile = LatencyProfile::Queueing { t0_ms: prior.t0_ms, b_ms: prior.b_ms };
    if !(capacity_rps.is_finite() && capacity_rps > 0.0) {
        return prior_profile;
    }
    let mut sums = Sums::default();
    for observation in observations {
        let Observation { load_rps, latency_ms, weight } = *observation;
        if observation.usable(capacity_rps) {
            sums.add(load_rps / (capacity_rps - load_rps), latency_ms, weight);
        }
    }
    if sums.weight <= 0.0 {
        return prior_profile;
    }
    let prior_usable =
        prior.weight.is_finite() && prior.weight > 0.0 && prior.t0_ms.is_finite() && prior.b_ms.is_finite();
    if prior_usable {
        sums.add(0.0, prior.t0_ms, prior.weight / 2.0);
        sums.add(1.0, prior.t0_ms + prior.b_ms, prior.weight / 2.0);
    }
    let (t0_ms, b_ms) = sums.solve(prior.b_ms.max(0.0));
    LatencyProfile::Queueing { t0_ms, b_ms }
}

/// Width of the load bins of [`fit_level`], as a fraction of capacity.
const LEVEL_BIN: f64 = 0.05;

/// The usable observations binned by load, `LEVEL_BIN` of `capacity_rps` (finite, > 0) wide,
/// from idle to `MAX_FIT_UTILISATION`: per bin Σw, Σw·load, Σw·latency.
fn load_bins(capacity_rps: f64, observations: &[Observation]) -> Vec<(f64, f64, f64)> {
    let width = LEVEL_BIN * capacity_rps;
    let mut bins = vec![(0.0, 0.0, 0.0); (MAX_FIT_UTILISATION / LEVEL_BIN).ceil() as usize];
    let last = bins.len() - 1;
    for observation in observations {
        let Observation { load_rps, latency_ms, weight } = *observation;
        if observation.usable(capacity_rps) {
            let bin = &mut bins[((load_rps / width) as usize).min(last)];
            bin.0 += weight;
            bin.1 += weight * load_rps;
            bin.2 += weight * latency_ms;
        }
    }
    bins
}

/// [`load_bins`] with `prior` evaluated at each bin's mean load: per bin, (weight, mean load,
/// weighted latency sum, prior latency there), `None` for a bin without data or where the
/// prior is not a positive number.
fn bins_against(
    prior: &LatencyProfile,
    capacity_rps: f64,
    observations: &[Observation],
) -> Vec<Option<(f64, f64, f64, f64)>> {
    load_bins(capacity_rps, observations)
        .into_iter()
        .map(|(w, load, latency)| {
            let load = load / w;
            let curve = if w > 0.0 { prior.latency_ms(load, capacity_rps) } else { 0.0 };
            (curve.is_finite() && curve > 0.0).then_some((w, load, latency, curve))
        })
        .collect()
}

/// Scales `prior` by how the observed latencies compare with it, for a curve whose shape is
/// trusted (measured offline) but whose level drifts in production (cache hit rates,
/// burstiness). Observations are binned by load (5 % of capacity wide); the factor is the ratio
/// Σ_b W_b·Ō_b / Σ_b W_b·L(Ȳ_b) of each bin's mean observed latency to the curve at the bin's
/// mean load, weighted by the bin's weight. Comparing each observation with the curve at its
/// own load instead would fold the load's fluctuation into the level: the curve is convex, so
/// the mean of L over a fluctuating load exceeds L at the mean load, and the fitted curve would
/// then predict too little at a steady operating point. The prior counts as `prior_weight`
/// observations right on the curve. Observations at or above 99 % of `capacity_rps`, non-finite
/// or weightless ones are skipped, and so are bins where the curve is not positive.
pub fn fit_level(
    prior: &LatencyProfile,
    prior_weight: f64,
    capacity_rps: f64,
    observations: &[Observation],
) -> LatencyProfile {
    if !(capacity_rps.is_finite() && capacity_rps > 0.0) {
        return prior.clone();
    }
    let (mut weight, mut observed, mut predicted) = (0.0, 0.0, 0.0);
    for (w, _, latency, curve) in bins_against(prior, capacity_rps, observations).into_iter().flatten() {
        weight += w;
        observed += latency;
        predicted += w * curve;
    }
    if weight <= 0.0 {
        return prior.clone();
    }
    // The prior: `prior_weight` observations at the bins' mean predicted latency.
    let anchor = if prior_weight.is_finite() { prior_weight.max(0.0) * predicted / weight } else { 0.0 };
    prior.scaled((observed + anchor) / (predicted + anchor))
}

/// Reshapes `prior` to the observations where they are dense, for curves whose offline shape
/// is right in general but not at the loads the fleet actually runs (the fleet's engines see
/// other cache hit rates, bursts and load changes than a profiling run does). Observations are
/// binned by load (5 % of capacity wide, as in [`fit_level`]); in each bin with data the curve
/// goes through the weighted mean of the bin's mean observed latency, at its mean load, and of
/// the prior there, the prior counting as `prior_weight` observations. Bins without data keep
/// the prior's shape scaled by the nearest bin with data, and a last knot at 98 % of capacity
/// keeps the prior's steepness beyond the data. The knots are projected onto convex
/// non-decreasing curves weighted by their observation weights. Returns the prior unchanged
/// when no observation is usable (finite, weighted, below 99 % of `capacity_rps`) or the
/// capacity is not positive.
pub fn fit_shape(
    prior: &LatencyProfile,
    prior_weight: f64,
    capacity_rps: f64,
    observations: &[Observation],
) -> LatencyProfile {
    if !(capacity_rps.is_finite() && capacity_rps > 0.0) {
        return prior.clone();
    }
    let prior_weight = if prior_weight.is_finite() { prior_weight.max(0.0) } else { 0.0 };
    let width = LEVEL_BIN * capacity_rps;
    // Per bin with data: (mean load, posterior latency, weight, posterior / prior).
    let fitted: Vec<Option<(f64, f64, f64, f64)>> = bins_against(prior, capacity_rps, observations)
        .into_iter()
        .map(|bin| {
            bin.map(|(w, load, latency, curve)| {
                let posterior = (latency + prior_weight * curve) / (w + prior_weight);
                (load, posterior, w + prior_weight, posterior / curve)
            })
        })
        .collect();
    let count = fitted.len();
    if fitted.iter().all(Option::is_none) {
        return prior.clone();
    }
    // The ratio of the nearest bin with data (the lower one on a tie).
    let nearest_ratio = |index: usize| -> f64 {
        (0..count)
            .flat_map(|distance| [index.checked_sub(distance), Some(index + distance)])
            .flatten()
            .find_map(|j| fitted.get(j).copied().flatten())
            .map_or(1.0, |(_, _, _, ratio)| ratio)
    };
    let anchor_weight = prior_weight.max(f64::MIN_POSITIVE);
    let anchor = |load: f64, ratio: f64| {
        let curve = prior.latency_ms(load, capacity_rps);
        curve.is_finite().then_some((load, curve * ratio, anchor_weight))
    };
    let mut knots: Vec<(f64, f64, f64)> = Vec::with_capacity(count + 2);
    knots.extend(anchor(0.0, nearest_ratio(0)));
    knots.extend(anchor(GRID_MAX_UTILISATION * capacity_rps, nearest_ratio(count - 1)));
    for (index, bin) in fitted.iter().enumerate() {
        knots.extend(match *bin {
            Some((load, latency, weight, _)) => Some((load, latency, weight)),
            None => anchor((index as f64 + 0.5) * width, nearest_ratio(index)),
        });
    }
    LatencyProfile::convex_latencies(project_convex_increasing_weighted(&knots))
}

/// Weighted sums of the 2 × 2 normal equations for latency = t0 + b·x.
#[derive(Default)]
struct Sums {
    weight: f64,
    x: f64,
    xx: f64,
    y: f64,
    xy: f64,
}

impl Sums {
    fn add(&mut self, x: f64, y: f64, weight: f64) {
        self.weight += weight;
        self.x += weight * x;
        self.xx += weight * x * x;
        self.y += weight * y;
        self.xy += weight * x * y;
    }

    /// (t0, b) minimising the weighted squared error with t0, b ≥ 0. When all x are equal the
    /// slope is not identified: keep `fallback_b` and fit the level only.
    fn solve(&self, fallback_b: f64) -> (f64, f64) {
        let determinant = self.weight * self.xx - self.x * self.x;
        let (t0, b) = if determinant > 1e-12 * self.weight * self.xx.max(f64::MIN_POSITIVE) {
            let b = (self.weight * self.xy - self.x * self.y) / determinant;
            ((self.y - b * self.x) / self.weight, b)
        } else {
            ((self.y - fallback_b * self.x) / self.weight, fallback_b)
        };
        if b < 0.0 {
            // Latency falling with load is noise; the best flat curve is the weighted mean.
            return ((self.y / self.weight).max(0.0), 0.0);
        }
        if t0 < 0.0 {
            let b = if self.xx > 0.0 { (self.xy / self.xx).max(0.0) } else { fallback_b };
            return (0.0, b);
        }
        (t0, b)
    }
}

/// Fits a convex non-decreasing piecewise-linear profile from observations binned around
/// `knot_loads` (req/s): each observation counts towards its nearest knot, and each non-empty
/// bin becomes one point at the weighted mean load and latency of its observations (placing it
/// at the knot itself would bias steep parts of the curve). Returns `None` when fewer than two
/// bins have data.
pub fn fit_piecewise(observations: &[Observation], knot_loads: &[f64]) -> Option<LatencyProfile> {
    let mut knots: Vec<f64> = knot_loads.iter().copied().filter(|x| x.is_finite()).collect();
    knots.sort_by(f64::total_cmp);
    knots.dedup();
    // Per bin: weighted sums of load and latency, and the total weight.
    let mut bins = vec![(0.0_f64, 0.0_f64, 0.0_f64); knots.len()];
    for observation in observations {
        let Observation { load_rps, latency_ms, weight } = *observation;
        if !(load_rps.is_finite() && latency_ms.is_finite() && weight.is_finite() && weight > 0.0) {
            continue;
        }
        let upper = knots.partition_point(|&knot| knot < load_rps);
        let nearest = match (upper.checked_sub(1), knots.get(upper)) {
            (Some(lower), Some(&upper_load)) if load_rps - knots[lower] <= upper_load - load_rps => lower,
            (_, Some(_)) => upper,
            (Some(lower), None) => lower,
            (None, None) => continue,
        };
        bins[nearest].0 += load_rps * weight;
        bins[nearest].1 += latency_ms * weight;
        bins[nearest].2 += weight;
    }
    let points: Vec<(f64, f64, f64)> = bins
        .iter()
        .filter(|(_, _, weight)| *weight > 0.0)
        .map(|&(load, latency, weight)| (load / weight, latency / weight, weight))
        .collect();
    if points.len() < 2 {
        return None;
    }
    Some(LatencyProfile::convex_latencies(project_convex_increasing_weighted(&points)))
}

//! Latency profiles: an engine's expected latency L(y), in milliseconds, as a function of its
//! load y in requests per second, in the two shapes the optimizer accepts.
//!
//! - `Queueing { t0_ms, b_ms }`: L(y) = t0 + b·y/(c − y) for capacity c (given separately,
//!   since it changes with ready replicas and health while the shape does not). The default,
//!   from offline profiling in the config.
//! - `Piecewise([(load_rps, latency_ms), …])`: a fitted curve, linear between knots, flat
//!   below the first knot and extended with the last slope beyond the last one.
//!
//! The optimizer needs L convex and non-decreasing (its marginal cost must increase), so a
//! fitted curve goes through [`project_convex_increasing`] before it is published. JSON is
//! externally tagged and snake_case, exactly what the optimizer reads:
//! `{"queueing": {"t0_ms": 60.0, "b_ms": 15.0}}` or `{"piecewise": [[0.0, 60.0], [50.0, 75.0]]}`.
//!
//! Which latency counts is a config choice ([`Objective`]); [`combine`] turns a TTFT and a
//! TBOT profile into the one curve the optimizer minimises.

mod convex;
mod fit;
pub mod search;
mod tail;

pub use convex::{project_convex_increasing, project_convex_increasing_weighted};
pub use fit::{fit_level, fit_piecewise, fit_queueing, fit_shape, Observation, QueueingPrior};
pub use tail::{expected_excess_ms, mixture_quantile, DecodeLengths};

use serde::{Deserialize, Serialize};

/// An engine's latency as a function of load. See the module documentation for the shapes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LatencyProfile {
    /// L(y) = t0 + b·y/(c − y), milliseconds.
    Queueing { t0_ms: f64, b_ms: f64 },
    /// Knots (load_rps, latency_ms), loads strictly increasing.
    Piecewise(Vec<(f64, f64)>),
}

/// Which latency the optimizer minimises.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Objective {
    /// Time to first token only (interactive chat: what the user waits for).
    Ttft,
    /// TTFT plus the decode time of a typical response: TTFT(y) + tokens × TBOT(y).
    TtftPlusDecode {
        /// Expected output tokens per request, e.g. 250.
        expected_output_tokens: f64,
    },
}

/// A profile that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("queueing profile needs finite t0_ms and b_ms >= 0")]
    InvalidQueueing,
    #[error("piecewise profile has no knots")]
    EmptyPiecewise,
    #[error("piecewise knot {index} is not finite and non-negative")]
    InvalidKnot { index: usize },
    #[error("piecewise loads must be strictly increasing (knot {index})")]
    UnsortedKnots { index: usize },
}

/// Sampling points used when a curve has to be tabulated ([`combine`] of non-queueing shapes).
const GRID_POINTS: usize = 32;
/// A queueing curve is tabulated up to this fraction of capacity, where it is finite.
pub(crate) const GRID_MAX_UTILISATION: f64 = 0.98;

impl LatencyProfile {
    /// Checks the invariants the optimizer relies on (it still wants [`Self::convexified`]).
    pub fn validate(&self) -> Result<(), ProfileError> {
        match self {
            Self::Queueing { t0_ms, b_ms } => {
                let ok = t0_ms.is_finite() && b_ms.is_finite() && *t0_ms >= 0.0 && *b_ms >= 0.0;
                ok.then_some(()).ok_or(ProfileError::InvalidQueueing)
            }
            Self::Piecewise(knots) => {
                if knots.is_empty() {
                    return Err(ProfileError::EmptyPiecewise);
                }
                for (index, &(load, latency)) in knots.iter().enumerate() {
                    if !(load.is_finite() && latency.is_finite() && load >= 0.0 && latency >= 0.0) {
                        return Err(ProfileError::InvalidKnot { index });
                    }
                    if index > 0 && load <= knots[index - 1].0 {
                        return Err(ProfileError::UnsortedKnots { index });
                    }
                }
                Ok(())
            }
        }
    }

    /// Expected latency (ms) at `load_rps` on an engine of capacity `capacity_rps`.
    /// A queueing profile is infinite at or beyond capacity. Negative loads read as zero.
    pub fn latency_ms(&self, load_rps: f64, capacity_rps: f64) -> f64 {
        let load = load_rps.max(0.0);
        match self {
            Self::Queueing { t0_ms, b_ms } => {
                if load >= capacity_rps {
                    f64::INFINITY
                } else {
                    t0_ms + b_ms * load / (capacity_rps - load)
                }
            }
            Self::Piecewise(knots) => piecewise_at(knots, load),
        }
    }

    /// The same curve with every latency multiplied by `factor` (≥ 0).
    pub fn scaled(&self, factor: f64) -> Self {
        match self {
            Self::Queueing { t0_ms, b_ms } => Self::Queueing { t0_ms: t0_ms * factor, b_ms: b_ms * factor },
            Self::Piecewise(knots) => {
                Self::Piecewise(knots.iter().map(|&(y, ms)| (y, ms * factor)).collect())
            }
        }
    }

    /// A projected convex non-decreasing curve as a profile, its latencies clamped at 0: the
    /// least-squares projection of non-negative latencies can dip below zero at its start
    /// (rounding on a flat start at 0 gave −4.5e-13 in the shape fit's property test; data
    /// rising concavely from 0 can do it by more), and a profile takes no negative latency.
    /// max(L, 0) of a convex non-decreasing L is still convex and non-decreasing.
    pub(crate) fn convex_latencies(knots: Vec<(f64, f64)>) -> Self {
        Self::Piecewise(knots.into_iter().map(|(load, ms)| (load, ms.max(0.0))).collect())
    }

    /// The same profile, made safe for the optimizer: a piecewise curve is sorted, cleaned of
    /// non-finite knots and projected onto convex non-decreasing shapes. Queueing profiles
    /// are convex already and come back unchanged.
    pub fn convexified(&self) -> Self {
        match self {
            Self::Queueing { .. } => self.clone(),
            Self::Piecewise(knots) => Self::convex_latencies(project_convex_increasing(knots)),
        }
    }
}

/// Knots [`LatencyProfile::through_measured`] puts on each span between measured points.
const MEASURED_SUBDIVISIONS: usize = 8;

impl LatencyProfile {
    /// A convex non-decreasing piecewise curve through measured (load, latency) points, smooth
    /// where the points are sparse. Joined by chords, a few points measured below an engine's
    /// knee (what `ilb profile` prints) make a curve whose slope jumps at each point: the
    /// optimizer's marginal cost then sits at a point while demand moves, and jumps past it
    /// (on the fleet simulator's `surge` the chords delayed the re-plan and doubled churn),
    /// and each chord overstates the convex curve beneath it.
    ///
    /// The points are projected onto convex non-decreasing shapes, each gets a slope between
    /// those of its two chords (their harmonic mean, as Fritsch and Butland's monotone
    /// interpolation takes it: near a queueing curve's slope where it bends, the arithmetic mean
    /// is far above it; at the ends, the chord's mirrored), and each span is the quadratic
    /// Bézier curve through its ends with those slopes, tabulated at eight knots: convex, below
    /// the chord, above both tangents and with no kink at a measured point.
    pub fn through_measured(points: &[(f64, f64)]) -> Self {
        let knots = project_convex_increasing(points);
        if knots.len() < 3 {
            return Self::convex_latencies(knots);
        }
        let chords: Vec<f64> = knots.windows(2).map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0)).collect();
        let last = chords.len() - 1;
        let mut slopes: Vec<f64> = Vec::with_capacity(knots.len());
        slopes.push(0.0);
        slopes.extend(chords.windows(2).map(|c| {
            if c[0] + c[1] > 0.0 {
                2.0 * c[0] * c[1] / (c[0] + c[1])
            } else {
                0.0
            }
        }));
        slopes[0] = (2.0 * chords[0] - slopes[1]).max(0.0);
        slopes.push(2.0 * chords[last] - slopes[last]);
        let mut curve = Vec::with_capacity(chords.len() * MEASURED_SUBDIVISIONS + 1);
        for (i, span) in knots.windows(2).enumerate() {
            let ((x0, y0), (x1, y1)) = (span[0], span[1]);
            let (d0, d1) = (slopes[i], slopes[i + 1]);
            // Where the two tangents cross: the Bézier curve's control point. Equal slopes
            // (a straight span) put it anywhere on the chord.
            let x = if d1 > d0 { ((y1 - y0) + d0 * x0 - d1 * x1) / (d0 - d1) } else { 0.5 * (x0 + x1) };
            let x = x.clamp(x0, x1);
            let control = (x, y0 + d0 * (x - x0));
            curve.push((x0, y0));
            curve.extend((1..MEASURED_SUBDIVISIONS).map(|k| {
                let t = k as f64 / MEASURED_SUBDIVISIONS as f64;
                let (a, b, c) = ((1.0 - t) * (1.0 - t), 2.0 * t * (1.0 - t), t * t);
                (a * x0 + b * control.0 + c * x1, a * y0 + b * control.1 + c * y1)
            }));
        }
        curve.extend(knots.last().copied());
        // Convex as built: each span's slopes run from its start slope to its end slope, which
        // is the next span's start slope. No second projection (40-odd knots cost 0.5 ms where
        // the points' own took 3 µs).
        Self::convex_latencies(curve)
    }
}

/// Linear interpolation between knots; flat before the first, last slope after the last.
fn piecewise_at(knots: &[(f64, f64)], load: f64) -> f64 {
    let Some(&(first_load, first_latency)) = knots.first() else {
        return f64::NAN;
    };
    if load <= first_load || knots.len() == 1 {
        return first_latency;
    }
    let upper = knots.partition_point(|&(x, _)| x < load).min(knots.len() - 1);
    let (x0, y0) = knots[upper - 1];
    let (x1, y1) = knots[upper];
    let slope = if x1 > x0 { (y1 - y0) / (x1 - x0) } else { 0.0 };
    y0 + slope * (load - x0)
}

/// Combines a TTFT and a TBOT (ms per token) profile into the curve the optimizer minimises,
/// for an engine of capacity `capacity_rps`.
///
/// Two queueing profiles combine exactly (the sum of queueing shapes with one capacity is a
/// queueing shape). Otherwise both are tabulated on a grid over [0, 0.98·c] that is denser
/// near capacity, plus every piecewise knot, and the sum is projected onto convex
/// non-decreasing shapes. If `capacity_rps` is not positive and finite, only the knots are used.
pub fn combine(
    ttft: &LatencyProfile,
    tbot: &LatencyProfile,
    objective: Objective,
    capacity_rps: f64,
) -> LatencyProfile {
    combine_with_tail(ttft, tbot, objective, None, capacity_rps)
}

/// The tail term added to a combined curve: `weight` × E[(latency − `threshold_ms`)⁺], each
/// request's decode tokens of law `lengths` (see `tail.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tail<'a> {
    pub threshold_ms: f64,
    pub weight: f64,
    pub lengths: &'a DecodeLengths,
}

/// [`combine`], plus `tail` when the objective counts decode.
pub fn combine_with_tail(
    ttft: &LatencyProfile,
    tbot: &LatencyProfile,
    objective: Objective,
    tail: Option<Tail<'_>>,
    capacity_rps: f64,
) -> LatencyProfile {
    let tokens = match objective {
        Objective::Ttft => return ttft.clone(),
        Objective::TtftPlusDecode { expected_output_tokens } => expected_output_tokens.max(0.0),
    };
    if let (
        None,
        LatencyProfile::Queueing { t0_ms: t0_first, b_ms: b_first },
        LatencyProfile::Queueing { t0_ms: t0_token, b_ms: b_token },
    ) = (tail, ttft, tbot)
    {
        return LatencyProfile::Queueing {
            t0_ms: t0_first + tokens * t0_token,
            b_ms: b_first + tokens * b_token,
        };
    }
    let mut loads = Vec::with_capacity(GRID_POINTS + 1);
    if capacity_rps.is_finite() && capacity_rps > 0.0 {
        let top = GRID_MAX_UTILISATION * capacity_rps;
        loads.extend((0..=GRID_POINTS).map(|i| {
            let remaining = 1.0 - i as f64 / GRID_POINTS as f64;
            top * (1.0 - remaining * remaining)
        }));
    }
    for profile in [ttft, tbot] {
        if let LatencyProfile::Piecewise(knots) = profile {
            loads.extend(knots.iter().map(|&(load, _)| load));
        }
    }
    let knots: Vec<(f64, f64)> = loads
        .into_iter()
        .map(|load| {
            let (first, per_token) =
                (ttft.latency_ms(load, capacity_rps), tbot.latency_ms(load, capacity_rps));
            let excess = tail
                .map_or(0.0, |t| t.weight * expected_excess_ms(first, per_token, t.lengths, t.threshold_ms));
            (load, first + tokens * per_token + excess)
        })
        .filter(|(load, latency)| load.is_finite() && *load >= 0.0 && latency.is_finite())
        .collect();
    LatencyProfile::convex_latencies(project_convex_increasing(&knots))
}

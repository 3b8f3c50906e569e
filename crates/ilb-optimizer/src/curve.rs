//! One engine's latency curve as the solver sees it: L(y), the cost f(y) = y·L(y), the marginal
//! cost f'(y), and its inverse (the engine's best response to a price), clamped to the usable
//! capacity. Fitted piecewise-linear points are replaced by their convex increasing envelope
//! here, so that f is convex and the dual method applies.

use crate::problem::Latency;

/// Smallest slope (ms per req/s) of a piecewise curve: a flat segment would make the engine's
/// best response jump, which the per-engine solve handles but Newton does not like. The change
/// to the curve is at most 1e-6 ms per req/s of load, far below any measurement.
const MIN_SLOPE: f64 = 1e-6;

/// Smallest `b` of the queueing shape, for the same reason (b = 0 would be a constant latency).
const MIN_B_MS: f64 = 1e-9;

/// Keeps the queueing shape's load strictly below its pole y = c even when ρ = 1.
const POLE_MARGIN: f64 = 1e-9;

/// Newton steps `Curve::queueing_root` takes before leaving the root to the caller's bracketed
/// method: from a previous pass's price it needs two or three.
const MAX_QUEUEING_STEPS: usize = 30;

/// A processed latency curve with its usable capacity `cap` = ρ·c.
#[derive(Clone, Debug, PartialEq)]
pub struct Curve {
    shape: Shape,
    cap: f64,
    /// f'(0), kept: every pass asks for it twice per engine, and for the queueing shape it costs
    /// a division.
    base: f64,
    /// f'(cap): from this price on the engine is full (for `queueing_root`).
    full: f64,
}

#[derive(Clone, Debug, PartialEq)]
enum Shape {
    Queueing {
        t0: f64,
        b: f64,
        c: f64,
    },
    /// L(y) = max_i (a_i + s_i·y): lines sorted by slope, line i is the maximum on
    /// `[breaks[i], breaks[i+1]]` with `breaks[0]` = 0 and an open last interval.
    Lines {
        a: Vec<f64>,
        s: Vec<f64>,
        breaks: Vec<f64>,
        /// f' at the start and at the end of each segment, `a_i + 2·s_i·breaks[i]` and
        /// `a_i + 2·s_i·breaks[i+1]` (no end for the last one), and 0.5/s_i: what `response`
        /// computed on every call (a fifth of the engines' curves are fitted, and their responses
        /// were half of the time spent in curves), the same values.
        starts: Vec<f64>,
        ends: Vec<f64>,
        half_inverse: Vec<f64>,
    },
    /// The marginal cost f' tabulated: `f'(load[i]) = price[i]`, linear in between, both strictly
    /// increasing; `integral[i] = f(load[i])`. The solver's aggregate of several engines (see
    /// `coarse`), never built from user input.
    Table {
        price: Vec<f64>,
        load: Vec<f64>,
        integral: Vec<f64>,
    },
}

impl Curve {
    /// Builds the curve of an engine with capacity `capacity` and headroom `rho` (validated input).
    pub fn new(latency: &Latency, capacity: f64, rho: f64) -> Self {
        match latency {
            Latency::Queueing { t0_ms, b_ms } => Curve {
                shape: Shape::Queueing { t0: *t0_ms, b: b_ms.max(MIN_B_MS), c: capacity },
                cap: capacity * rho.min(1.0 - POLE_MARGIN),
                base: 0.0,
                full: 0.0,
            }
            .with_base(),
            Latency::Piecewise(points) => {
                let (a, s) = convex_increasing_lines(points);
                let mut breaks = vec![0.0];
                for i in 1..a.len() {
                    breaks.push((a[i - 1] - a[i]) / (s[i] - s[i - 1]));
                }
                let starts = (0..a.len()).map(|i| a[i] + 2.0 * s[i] * breaks[i]).collect();
                let ends =
                    (0..a.len().saturating_sub(1)).map(|i| a[i] + 2.0 * s[i] * breaks[i + 1]).collect();
                let half_inverse = s.iter().map(|&si| 0.5 / si).collect();
                let shape = Shape::Lines { a, s, breaks, starts, ends, half_inverse };
                Curve { shape, cap: capacity * rho, base: 0.0, full: 0.0 }.with_base()
            }
        }
    }

    /// The curve whose marginal cost runs through `(price, load)` points, linear in between:
    /// prices strictly increasing, loads non-decreasing from 0; points that add no load are
    /// dropped. The usable capacity is the last load. None with fewer than two useful points.
    pub(crate) fn from_marginal_table(points: &[(f64, f64)]) -> Option<Self> {
        let (&(p0, y0), rest) = points.split_first()?;
        if y0 != 0.0 {
            return None;
        }
        let (mut price, mut load, mut integral) = (vec![p0], vec![0.0], vec![0.0]);
        for &(p, y) in rest {
            let (last_p, last_y) = (price[price.len() - 1], load[load.len() - 1]);
            if !(p > last_p && y > last_y && p.is_finite() && y.is_finite()) {
                continue;
            }
            integral.push(integral[integral.len() - 1] + 0.5 * (y - last_y) * (p + last_p));
            price.push(p);
            load.push(y);
        }
        let cap = *load.last()?;
        (load.len() >= 2).then(|| {
            Curve { shape: Shape::Table { price, load, integral }, cap, base: 0.0, full: 0.0 }.with_base()
        })
    }

    fn with_base(mut self) -> Self {
        self.base = self.marginal(0.0);
        self.full = self.marginal(self.cap);
        self
    }

    /// 1e-12·max(cap, 1e-9) (req/s): where the engine's water-filling may stop.
    pub(crate) fn load_tolerance(&self) -> f64 {
        1e-12 * self.cap.max(1e-9)
    }

    /// Usable capacity ρ·c (req/s).
    pub fn cap(&self) -> f64 {
        self.cap
    }

    /// For a piecewise curve, the lines `(intercept_ms, slope)` whose maximum is L(y) for y ≥ 0.
    pub fn envelope_lines(&self) -> Option<Vec<(f64, f64)>> {
        match &self.shape {
            Shape::Queueing { .. } | Shape::Table { .. } => None,
            Shape::Lines { a, s, .. } => Some(a.iter().copied().zip(s.iter().copied()).collect()),
        }
    }

    /// For the queueing shape, `(t0, b, c)` as used (b floored at a tiny positive value).
    pub fn queueing_params(&self) -> Option<(f64, f64, f64)> {
        match self.shape {
            Shape::Queueing { t0, b, c } => Some((t0, b, c)),
            Shape::Lines { .. } | Shape::Table { .. } => None,
        }
    }

    fn segment(breaks: &[f64], y: f64) -> usize {
        breaks.partition_point(|&b| b <= y).saturating_sub(1)
    }

    /// Expected latency L(y) in ms.
    pub fn latency(&self, y: f64) -> f64 {
        match &self.shape {
            &Shape::Queueing { t0, b, c } => queueing_latency(t0, b, c, y),
            Shape::Lines { a, s, breaks, .. } => {
                let i = Self::segment(breaks, y);
                a[i] + s[i] * y
            }
            Shape::Table { price, .. } => {
                if y <= 0.0 {
                    price[0]
                } else {
                    self.cost(y) / y
                }
            }
        }
    }

    /// Cost f(y) = y·L(y) (ms·req/s). Inlined for the queueing shape (once per engine per pass).
    #[inline]
    pub fn cost(&self, y: f64) -> f64 {
        if y <= 0.0 {
            return 0.0;
        }
        if let Shape::Queueing { t0, b, c } = self.shape {
            return y * queueing_latency(t0, b, c, y);
        }
        self.cost_tabulated(y)
    }

    /// `cost` for the piecewise shapes (y > 0).
    #[inline(never)]
    fn cost_tabulated(&self, y: f64) -> f64 {
        match &self.shape {
            Shape::Table { price, load, integral } => {
                let i = Self::segment(load, y).min(load.len() - 2);
                integral[i] + 0.5 * (y - load[i]) * (price[i] + self.marginal(y))
            }
            _ => y * self.latency(y),
        }
    }

    /// Marginal cost f'(y) (right derivative where f' jumps).
    pub fn marginal(&self, y: f64) -> f64 {
        match &self.shape {
            Shape::Queueing { t0, b, c } => {
                let ratio = c / (c - y);
                t0 + b * (ratio * ratio - 1.0)
            }
            Shape::Lines { a, s, breaks, .. } => {
                let i = Self::segment(breaks, y);
                a[i] + 2.0 * s[i] * y
            }
            Shape::Table { price, load, .. } => {
                let i = Self::segment(load, y).min(load.len() - 2);
                let t = ((y - load[i]) / (load[i + 1] - load[i])).max(0.0);
                price[i] + t * (price[i + 1] - price[i])
            }
        }
    }

    /// f'(0) = L(0): below this price the engine takes no load.
    pub fn base_price(&self) -> f64 {
        self.base
    }

    /// The engine's best response to price `q`: `(y, dy/dq)` with y = (f')⁻¹(q) clamped to
    /// [0, cap]; dy/dq = 0 where clamped or where f' jumps.
    ///
    /// Inlined for the queueing shape (every pass asks each engine for two or three responses;
    /// the call was a fifth of their cost), the other shapes out of line.
    #[inline]
    pub fn response(&self, q: f64) -> (f64, f64) {
        if let Shape::Queueing { t0, b, c } = self.shape {
            let (y, dy) = queueing_response(t0, b, c, q);
            return clamp(self.cap, y, dy);
        }
        self.response_tabulated(q)
    }

    /// Adds the load at each of `prices` (ascending) less `offset` to `loads`: `response(p −
    /// offset).0` each, the same sums. The queueing shape's load never falls as the price rises,
    /// so once one is the capacity so are the rest, added without evaluating them.
    pub fn add_responses(&self, prices: &[f64], offset: f64, loads: &mut [f64]) {
        if let Shape::Queueing { t0, b, c } = self.shape {
            let mut i = 0;
            while i < prices.len() {
                let y = clamp(self.cap, queueing_response(t0, b, c, prices[i] - offset).0, 0.0).0;
                loads[i] += y;
                i += 1;
                if y == self.cap {
                    break;
                }
            }
            for load in &mut loads[i..prices.len()] {
                *load += self.cap;
            }
            return;
        }
        for (load, &price) in loads.iter_mut().zip(prices) {
            *load += self.response(price - offset).0;
        }
    }

    /// `response` for the piecewise shapes.
    #[inline(never)]
    fn response_tabulated(&self, q: f64) -> (f64, f64) {
        let (y, dy) = match &self.shape {
            &Shape::Queueing { t0, b, c } => queueing_response(t0, b, c, q),
            Shape::Lines { a, s, breaks, starts, ends, half_inverse } => {
                if q <= a[0] {
                    (0.0, 0.0)
                } else {
                    // The first segment whose marginal range ends at or above q: as many as end
                    // below it (ascending), counted without a branch (which one is data).
                    let i = ends.iter().map(|&end| usize::from(end < q)).sum::<usize>();
                    if i > 0 && q < starts[i] {
                        // q falls in the jump of f' at breaks[i].
                        return clamp(self.cap, breaks[i], 0.0);
                    }
                    ((q - a[i]) / (2.0 * s[i]), half_inverse[i])
                }
            }
            Shape::Table { price, load, .. } => {
                if q <= price[0] {
                    (0.0, 0.0)
                } else {
                    let i = Self::segment(price, q);
                    if i + 1 >= price.len() {
                        (self.cap, 0.0)
                    } else {
                        let slope = (load[i + 1] - load[i]) / (price[i + 1] - price[i]);
                        (load[i] + slope * (q - price[i]), slope)
                    }
                }
            }
        };
        clamp(self.cap, y, dy)
    }

    /// For the queueing shape, the price q where the best response meets the line s − a·q (an
    /// engine's water level: a = k_j·m, s = k_j·Σ r'), by Newton's method from `start`, to
    /// |Y(q) − (s − a·q)| ≤ `tolerance`; with the response there, `(q, (y, dy/dq))`. Where the
    /// line is still at or above the capacity at f'(cap), the engine is full at the root, which
    /// is where the line falls to the capacity (no step needed). `None` for the other shapes, and
    /// where an iterate leaves the shape's smooth part (the caller's bracketed method solves those).
    ///
    /// In w = √(q − t0 + b) the equation is the cubic g(w) = a·w³ + (c − s + a·(t0 − b))·w − c·√b
    /// = w·(Y(q) − s + a·q), whose steps take a division each, where a step in q takes the
    /// response's division, square root and division and then its own division: the engines'
    /// roots were half of a warm re-solve. g is convex for w > 0 and negative at 0, so Newton's
    /// method converges from any start where g rises, from the right without passing the root.
    pub(crate) fn queueing_root(
        &self,
        a: f64,
        s: f64,
        start: f64,
        tolerance: f64,
    ) -> Option<(f64, (f64, f64))> {
        let Shape::Queueing { t0, b, c } = self.shape else {
            return None;
        };
        if s - a * self.full >= self.cap {
            return Some(((s - self.cap) / a, (self.cap, 0.0)));
        }
        let linear = c - s + a * (t0 - b);
        let constant = c * b.sqrt();
        let mut w = (start - t0 + b).sqrt();
        for _ in 0..MAX_QUEUEING_STEPS {
            let w2 = w * w;
            let g = (a * w2 + linear) * w - constant;
            if g.abs() <= tolerance * w {
                let inverse = 1.0 / w;
                let y = c - constant * inverse;
                if !(y > 0.0 && y < self.cap) {
                    return None;
                }
                return Some((w2 + t0 - b, (y, 0.5 * constant * inverse * inverse * inverse)));
            }
            let rise = 3.0 * a * w2 + linear;
            let next = w - g / rise;
            // Where g falls (left of its minimum) Newton's step leads away; NaN fails here too.
            if !(rise > 0.0 && next > 0.0) {
                return None;
            }
            w = next;
        }
        None
    }

    /// min over y ∈ [0, cap] of f(y) − q·y, i.e. −f*(q): the engine's term in the dual bound.
    pub fn neg_conjugate(&self, q: f64) -> f64 {
        let (y, _) = self.response(q);
        self.cost(y) - q * y
    }
}

/// L(y) = t0 + b·y/(c − y), +∞ from the pole on.
#[inline]
fn queueing_latency(t0: f64, b: f64, c: f64, y: f64) -> f64 {
    if y >= c {
        f64::INFINITY
    } else {
        t0 + b * y / (c - y)
    }
}

/// (f')⁻¹(q) and its derivative for L(y) = t0 + b·y/(c − y), before clamping to the capacity.
#[inline]
fn queueing_response(t0: f64, b: f64, c: f64, q: f64) -> (f64, f64) {
    let z = q - t0 + b;
    if q <= t0 {
        (0.0, 0.0)
    } else {
        let root = (b / z).sqrt();
        (c * (1.0 - root), 0.5 * c * root / z)
    }
}

fn clamp(cap: f64, y: f64, dy: f64) -> (f64, f64) {
    if y >= cap {
        (cap, 0.0)
    } else if y <= 0.0 {
        (0.0, 0.0)
    } else {
        (y, dy)
    }
}

/// Lines `(a, s)`, sorted by increasing slope, whose maximum is the convex increasing envelope of
/// the fitted points: the lower convex hull, flat (slope `MIN_SLOPE`) left of its lowest point,
/// every slope at least `MIN_SLOPE`, extended by its last line to the right.
fn convex_increasing_lines(points: &[[f64; 2]]) -> (Vec<f64>, Vec<f64>) {
    let mut pts: Vec<[f64; 2]> = points.to_vec();
    pts.sort_by(|p, q| p[0].total_cmp(&q[0]).then(p[1].total_cmp(&q[1])));
    pts.dedup_by(|later, earlier| later[0] == earlier[0]); // keeps the lowest latency per load
                                                           // Lower convex hull (Andrew's monotone chain).
    let mut hull: Vec<[f64; 2]> = Vec::with_capacity(pts.len());
    for p in pts {
        while hull.len() >= 2 {
            let (o, m) = (hull[hull.len() - 2], hull[hull.len() - 1]);
            let cross = (m[0] - o[0]) * (p[1] - o[1]) - (m[1] - o[1]) * (p[0] - o[0]);
            if cross <= 0.0 {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(p);
    }
    // Drop the decreasing part: start at the lowest point.
    let lowest = hull.iter().enumerate().min_by(|x, y| x.1[1].total_cmp(&y.1[1])).map_or(0, |(i, _)| i);
    let hull = &hull[lowest..];
    let mut a = Vec::with_capacity(hull.len());
    let mut s = Vec::with_capacity(hull.len());
    let mut push = |slope: f64, through: [f64; 2]| {
        let slope = slope.max(MIN_SLOPE);
        let intercept = through[1] - slope * through[0];
        if let Some(&last) = s.last() {
            if slope <= last {
                // Equal slopes: keep the higher line (it is the maximum everywhere).
                let idx = s.len() - 1;
                if intercept > a[idx] {
                    a[idx] = intercept;
                }
                return;
            }
        }
        a.push(intercept);
        s.push(slope);
    };
    push(MIN_SLOPE, hull[0]);
    for w in hull.windows(2) {
        push((w[1][1] - w[0][1]) / (w[1][0] - w[0][0]), w[0]);
    }
    upper_envelope(a, s)
}

/// Removes lines that are nowhere the maximum on y ≥ 0 (slopes strictly increasing on input).
fn upper_envelope(a: Vec<f64>, s: Vec<f64>) -> (Vec<f64>, Vec<f64>) {
    let mut out_a: Vec<f64> = Vec::with_capacity(a.len());
    let mut out_s: Vec<f64> = Vec::with_capacity(s.len());
    for (ai, si) in a.into_iter().zip(s) {
        while let (Some(&la), Some(&ls)) = (out_a.last(), out_s.last()) {
            // Crossing of the new line with the last kept one.
            let cross = (la - ai) / (si - ls);
            let n = out_a.len();
            let previous_cross =
                if n >= 2 { (out_a[n - 2] - la) / (ls - out_s[n - 2]) } else { f64::NEG_INFINITY };
            if cross <= previous_cross.max(0.0) {
                out_a.pop();
                out_s.pop();
            } else {
                break;
            }
        }
        out_a.push(ai);
        out_s.push(si);
    }
    (out_a, out_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queueing_response_inverts_marginal() {
        let c = Curve::new(&Latency::Queueing { t0_ms: 60.0, b_ms: 15.0 }, 100.0, 0.95);
        for y in [1.0, 30.0, 80.0, 94.0] {
            let (back, _) = c.response(c.marginal(y));
            assert!((back - y).abs() < 1e-9, "{y} -> {back}");
        }
        assert_eq!(c.response(1e9).0, c.cap());
        assert_eq!(c.response(10.0).0, 0.0);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, rng_seed: proptest::test_runner::RngSeed::Fixed(7), ..Default::default() })]

        /// `queueing_root` finds the water level Y(q) = s − a·q that a bisection on `response`
        /// finds, and returns the response there; from a start on either side of it.
        #[test]
        fn queueing_root_is_the_water_level(
            t0 in 1.0f64..200.0,
            b in 1e-3f64..60.0,
            capacity in 1.0f64..300.0,
            rho in 0.5f64..0.99,
            fill in 0.01f64..0.99,
            k in 1.0f64..1e4,
            m in 1usize..6,
            start in -0.5f64..2.0,
        ) {
            let curve = Curve::new(&Latency::Queueing { t0_ms: t0, b_ms: b }, capacity, rho);
            // The root: load `fill` of the usable capacity, on a line of slope a = k·m through it.
            let a = k * m as f64;
            let load = fill * curve.cap();
            let root = curve.marginal(load);
            let s = a * root + load;
            let tolerance = 1e-15 * (s.abs() + a * root.abs()) + 1e-12 * curve.cap();
            let from = t0 + (root - t0) * (1.0 + start);
            proptest::prop_assume!(from > t0);
            let (q, (y, dy)) = curve.queueing_root(a, s, from, tolerance).expect("a smooth root");
            let (exact_y, exact_dy) = curve.response(q);
            proptest::prop_assert!((exact_y - (s - a * q)).abs() <= 10.0 * tolerance, "{q} vs {root}");
            proptest::prop_assert!((q - root).abs() <= 1e-9 * root.abs(), "{q} vs {root}");
            proptest::prop_assert!((y - exact_y).abs() <= 1e-9 * curve.cap(), "{y} vs {exact_y}");
            proptest::prop_assert!((dy - exact_dy).abs() <= 1e-9 * exact_dy, "{dy} vs {exact_dy}");
        }
    }

    #[test]
    fn queueing_root_of_a_full_engine_and_of_other_shapes() {
        let curve = Curve::new(&Latency::Queueing { t0_ms: 60.0, b_ms: 15.0 }, 100.0, 0.9);
        // A line that meets the response where it is clamped at the capacity (90 req/s, from
        // f'(90) = 1,545 ms on).
        let (a, q_full) = (50.0, 2000.0);
        let s = a * q_full + curve.cap();
        assert!(curve.marginal(curve.cap()) < q_full);
        for start in [1900.0, 2100.0] {
            let (q, response) = curve.queueing_root(a, s, start, 1e-9).expect("full");
            assert!((q - q_full).abs() < 1e-9, "{q}");
            assert_eq!(response, curve.response(q));
        }
        // Other shapes are left to the caller.
        let lines = Curve::new(&Latency::Piecewise(vec![[0.0, 50.0], [50.0, 80.0]]), 100.0, 0.9);
        assert_eq!(lines.queueing_root(a, s, 300.0, 1e-9), None);
    }

    #[test]
    fn table_is_consistent() {
        let c = Curve::from_marginal_table(&[(10.0, 0.0), (20.0, 5.0), (20.0, 6.0), (40.0, 8.0)])
            .expect("two useful points");
        assert_eq!(c.cap(), 8.0);
        assert_eq!(c.base_price(), 10.0);
        assert_eq!(c.response(5.0), (0.0, 0.0));
        assert_eq!(c.response(15.0), (2.5, 0.5));
        assert_eq!(c.response(50.0), (8.0, 0.0));
        assert!((c.marginal(2.5) - 15.0).abs() < 1e-12);
        // f(5) = ∫ f' = 5·(10 + 20)/2, and f(8) adds 3·(20 + 40)/2.
        assert!((c.cost(5.0) - 75.0).abs() < 1e-12);
        assert!((c.cost(8.0) - 165.0).abs() < 1e-12);
        assert!((c.latency(5.0) - 15.0).abs() < 1e-12);
        for q in [12.0, 19.0, 25.0, 39.0] {
            let (y, _) = c.response(q);
            assert!((c.marginal(y) - q).abs() < 1e-9);
        }
        assert!(Curve::from_marginal_table(&[(10.0, 0.0)]).is_none());
        assert!(Curve::from_marginal_table(&[(10.0, 1.0), (20.0, 2.0)]).is_none());
    }

    #[test]
    fn piecewise_is_made_convex_and_increasing() {
        // A dip at the start and a concave bump in the middle.
        let pts = vec![[0.0, 50.0], [10.0, 40.0], [20.0, 60.0], [30.0, 62.0], [40.0, 100.0]];
        let c = Curve::new(&Latency::Piecewise(pts), 50.0, 1.0);
        let mut prev = f64::NEG_INFINITY;
        let mut prev_slope = f64::NEG_INFINITY;
        for i in 0..200 {
            let y = i as f64 * 0.25;
            let l = c.latency(y);
            assert!(l >= prev);
            if i > 0 {
                let slope = (l - prev) / 0.25;
                assert!(slope >= prev_slope - 1e-9, "not convex at {y}");
                prev_slope = slope;
            }
            prev = l;
            let (back, _) = c.response(c.marginal(y));
            assert!((back - y).abs() < 1e-6 || c.marginal(y) > c.marginal(y - 1e-9) + 1e-9);
        }
        assert!((c.latency(10.0) - 40.0).abs() < 1e-3);
        assert!((c.latency(40.0) - 100.0).abs() < 1e-3);
    }
}

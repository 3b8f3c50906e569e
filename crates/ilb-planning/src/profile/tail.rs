//! The tail term of the objective: how far a request's latency runs past a threshold, on
//! average, so that the plan weighs an engine's slow answers and not only its mean.
//!
//! A request on an engine at load y spends a(y) = TTFT(y) and then L × b(y), b the time between
//! tokens and L its decode tokens (output tokens less the first). L's law is [`DecodeLengths`]:
//! learned from the engines' histograms of generated tokens per request where they expose one
//! (vLLM, SGLang, TGI), and otherwise exponential around the learned mean, the widest spread a
//! mean alone allows (the maximum-entropy law on [0, ∞)). With S(x) = P(L > x),
//!
//! E[(a + L·b − t)⁺] = b·E[(L − s)⁺] = b·∫ₛ^∞ S(x) dx,   s = (t − a)/b,
//!
//! the perspective of a convex non-increasing function of s: jointly convex in (a, b) and
//! non-decreasing in both, whatever L's law. a and b are convex and non-decreasing in y, so the
//! term is too, and y × (mean + weight × term) stays convex for the optimizer.
//!
//! With t the fleet's p99 (engine side, [`mixture_quantile`]), weight × term / (1 − 0.99) is the
//! conditional value at risk's share of a request (Rockafellar–Uryasev): the objective becomes
//! mean + μ × CVaR₉₉ with a fixed threshold, re-chosen every round.

use crate::signals::Histogram;

/// The law of a request's decode tokens L ≥ 0: its survival S(x) = P(L > x) is linear between
/// `points` and, past the last one, decays exponentially with mean `tail_mean` (an atom at 0
/// is 1 − S(0): answers of one token).
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeLengths {
    /// (x, S(x)), x strictly ascending from 0, S non-increasing in [0, 1].
    points: Vec<(f64, f64)>,
    /// E[L − x_last | L > x_last]: the exponential tail's mean.
    tail_mean: f64,
}

impl DecodeLengths {
    /// Exponential with mean `mean` (none below 0).
    pub fn exponential(mean: f64) -> DecodeLengths {
        let mean = if mean.is_finite() { mean.max(0.0) } else { 0.0 };
        DecodeLengths { points: vec![(0.0, if mean > 0.0 { 1.0 } else { 0.0 })], tail_mean: mean }
    }

    /// The law of output tokens less one from a histogram of output tokens per request
    /// (`vllm:request_generation_tokens`, `sglang:generation_tokens_histogram`,
    /// `tgi_request_generated_tokens`): uniform within each bucket, and past the last finite
    /// bound exponential with the mean the histogram's sum leaves for its `+Inf` bucket. `None`
    /// for an empty or unusable histogram.
    pub fn from_output_histogram(histogram: &Histogram) -> Option<DecodeLengths> {
        let total = histogram.buckets.last().map(|b| b.1).filter(|n| *n > 0.0 && n.is_finite())?;
        let mut points: Vec<(f64, f64)> = vec![(0.0, 1.0)];
        // The buckets' share of the sum at their midpoints, to leave the rest to the +Inf bucket.
        let (mut lower, mut below, mut finite_sum) = (0.0_f64, 0.0_f64, 0.0_f64);
        for &(le, cumulative) in histogram.buckets.iter().filter(|(le, _)| le.is_finite()) {
            if le <= lower || cumulative < below {
                continue;
            }
            finite_sum += (cumulative - below) * 0.5 * (lower + le);
            let survival = (1.0 - cumulative / total).clamp(0.0, 1.0);
            let x = (le - 1.0).max(0.0);
            match points.last_mut() {
                Some(last) if last.0 >= x => last.1 = last.1.min(survival),
                _ => points.push((x, survival)),
            }
            (lower, below) = (le, cumulative);
        }
        let beyond = total - below;
        let tail_mean = if beyond > 0.0 {
            let mean_beyond = (histogram.sum - finite_sum) / beyond;
            (mean_beyond - lower).max(1.0)
        } else {
            0.0
        };
        Some(DecodeLengths { points, tail_mean }.checked())
    }

    /// The mixture of `parts` (weight, law); `None` without positive weight.
    pub fn mixture(parts: &[(f64, &DecodeLengths)]) -> Option<DecodeLengths> {
        let parts: Vec<(f64, &DecodeLengths)> =
            parts.iter().copied().filter(|(w, _)| *w > 0.0 && w.is_finite()).collect();
        let total: f64 = parts.iter().map(|p| p.0).sum();
        if parts.is_empty() || total <= 0.0 {
            return None;
        }
        // Every part's points, and where an exponential tail would be poorly followed by a
        // chord, points along it.
        let mut xs: Vec<f64> = parts
            .iter()
            .flat_map(|(_, law)| {
                let (x_last, tail) = (law.points[law.points.len() - 1].0, law.tail_mean);
                let along = TAIL_POINTS.iter().filter(move |_| tail > 0.0).map(move |k| x_last + k * tail);
                law.points.iter().map(|q| q.0).chain(along)
            })
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let survival = |x: f64| parts.iter().map(|(w, law)| w * law.survival(x)).sum::<f64>() / total;
        let points: Vec<(f64, f64)> = xs.iter().map(|&x| (x, survival(x))).collect();
        // Past the last point every part's tail is exponential (memoryless): their means,
        // weighted by the mass each has left there.
        let last = *xs.last().expect("every law has a point");
        let (mass, residual) = parts.iter().fold((0.0, 0.0), |(m, r), (w, law)| {
            let left = w * law.survival(last);
            (m + left, r + left * law.tail_mean)
        });
        let tail_mean = if mass > 0.0 { residual / mass } else { 0.0 };
        Some(DecodeLengths { points, tail_mean }.checked())
    }

    /// The same shape stretched to mean `mean` (an exponential of that mean if this law's mean
    /// is 0).
    pub fn scaled_to_mean(&self, mean: f64) -> DecodeLengths {
        let own = self.mean();
        if !(own > 0.0 && mean.is_finite() && mean > 0.0) {
            return DecodeLengths::exponential(mean);
        }
        let k = mean / own;
        DecodeLengths {
            points: self.points.iter().map(|&(x, s)| (x * k, s)).collect(),
            tail_mean: self.tail_mean * k,
        }
    }

    /// E\[L\].
    pub fn mean(&self) -> f64 {
        self.excess_ms(0.0, 1.0)
    }

    /// P(L > x).
    pub fn survival(&self, x: f64) -> f64 {
        self.survival_ms(x, 1.0)
    }

    /// The `q`-quantile (0 < q < 1): [`mixture_quantile`] of one engine that answers at once and
    /// takes a millisecond per token. `None` past 10⁹ tokens.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        mixture_quantile(&[(1.0, 0.0, 1.0)], self, q)
    }

    /// E[(L − s)⁺] = ∫ₛ^∞ S(x) dx (E\[L\] − s below 0).
    pub fn excess(&self, s: f64) -> f64 {
        self.excess_ms(s, 1.0)
    }

    /// P(b·L > t) for b = `per_token` > 0: the chance that decoding takes longer than `t`.
    fn survival_ms(&self, t: f64, per_token: f64) -> f64 {
        // A NaN time (a curve's NaN) is taken as the worst case.
        if t.is_nan() || t < 0.0 {
            return 1.0;
        }
        let n = self.points.len();
        let (x_last, s_last) = self.points[n - 1];
        let (start, spread) = (per_token * x_last, per_token * self.tail_mean);
        if t >= start || n == 1 {
            return if spread > 0.0 { s_last * (-(t - start).max(0.0) / spread).exp() } else { 0.0 };
        }
        // The segment holding x (clamped: t/b may round past the last point when t < b·x_last).
        let x = t / per_token;
        let i = self.points.partition_point(|p| p.0 <= x).clamp(1, n - 1);
        let ((x0, s0), (x1, s1)) = (self.points[i - 1], self.points[i]);
        (s0 + (s1 - s0) * (x - x0) / (x1 - x0)).clamp(s1, s0)
    }

    /// E\[(b·L − t)⁺\] for b = `per_token` > 0 (b·E\[L\] − t below 0). In ms for b and t in ms; an
    /// exponential law's is b·m·exp(−t/(b·m)).
    fn excess_ms(&self, t: f64, per_token: f64) -> f64 {
        let (x_last, s_last) = self.points[self.points.len() - 1];
        let (start, spread) = (per_token * x_last, per_token * self.tail_mean);
        if t < 0.0 {
            return -t + self.excess_ms(0.0, per_token);
        }
        if t >= start {
            return if spread > 0.0 { s_last * spread * (-(t - start) / spread).exp() } else { 0.0 };
        }
        let s = t / per_token;
        let mut area = 0.0;
        for pair in self.points.windows(2) {
            let ((x0, s0), (x1, s1)) = (pair[0], pair[1]);
            if x1 <= s {
                continue;
            }
            let from = x0.max(s);
            let at_from = s0 + (s1 - s0) * (from - x0) / (x1 - x0);
            area += 0.5 * (at_from + s1) * (x1 - from);
        }
        per_token * area + s_last * spread
    }

    /// Survivals made non-increasing and within [0, 1], a non-negative tail mean (a histogram's
    /// rounding cannot make a law that is not one).
    fn checked(mut self) -> DecodeLengths {
        let mut floor = 1.0_f64;
        for point in &mut self.points {
            point.1 = if point.1.is_finite() { point.1.clamp(0.0, floor) } else { floor };
            floor = point.1;
        }
        if !(self.tail_mean.is_finite() && self.tail_mean > 0.0) {
            self.tail_mean = 0.0;
        }
        self
    }
}

/// Where a mixture follows an exponential tail with points, in tail means past its start: the
/// chords then overstate the tail's area by under 2 %.
const TAIL_POINTS: [f64; 8] = [0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.5, 7.0];

/// E[(a + L·b − t)⁺] for decode tokens L of law `lengths`, ms.
pub fn expected_excess_ms(
    first_ms: f64,
    per_token_ms: f64,
    lengths: &DecodeLengths,
    threshold_ms: f64,
) -> f64 {
    let below = threshold_ms - first_ms;
    if per_token_ms.is_nan() || per_token_ms <= 0.0 {
        return (-below).max(0.0);
    }
    lengths.excess_ms(below, per_token_ms)
}

/// P(a + L·b > t) for decode tokens L of law `lengths`.
fn exceeds(first_ms: f64, per_token_ms: f64, lengths: &DecodeLengths, threshold_ms: f64) -> f64 {
    let below = threshold_ms - first_ms;
    if below <= 0.0 {
        1.0
    } else if per_token_ms > 0.0 {
        lengths.survival_ms(below, per_token_ms)
    } else {
        0.0
    }
}

/// The `q` quantile (0 < q < 1) of a request's latency over engines `(share, a, b)`, each
/// request's decode tokens of law `lengths`; `None` without shares.
pub fn mixture_quantile(engines: &[(f64, f64, f64)], lengths: &DecodeLengths, q: f64) -> Option<f64> {
    let total: f64 = engines.iter().map(|e| e.0).filter(|w| *w > 0.0).sum();
    if !(total > 0.0 && total.is_finite()) {
        return None;
    }
    let tail = |t: f64| -> f64 {
        engines.iter().filter(|e| e.0 > 0.0).map(|&(w, a, b)| w * exceeds(a, b, lengths, t)).sum::<f64>()
            / total
    };
    let target = 1.0 - q;
    let (mut lo, mut hi) = (0.0_f64, 1.0_f64);
    while tail(hi) > target {
        hi *= 2.0;
        if hi > 1e9 {
            return None;
        }
    }
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if tail(mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exponential(tokens: f64) -> DecodeLengths {
        DecodeLengths::exponential(tokens)
    }

    /// E[(a + L·b − t)⁺] by the midpoint rule over L's quantiles, L exponential.
    fn numerical_excess(a: f64, b: f64, tokens: f64, t: f64) -> f64 {
        let n = 200_000;
        (0..n)
            .map(|i| {
                let u = (i as f64 + 0.5) / n as f64;
                let l = -tokens * (1.0 - u).ln();
                (a + l * b - t).max(0.0)
            })
            .sum::<f64>()
            / n as f64
    }

    /// A histogram of output tokens as vLLM exposes it (1-2-5 bounds) from per-request counts.
    fn output_histogram(outputs: &[u32]) -> Histogram {
        let bounds = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, f64::INFINITY];
        let buckets = bounds
            .iter()
            .map(|&le| (le, outputs.iter().filter(|&&o| f64::from(o) <= le).count() as f64))
            .collect();
        let sum = outputs.iter().map(|&o| f64::from(o)).sum();
        Histogram::from_parts(buckets, sum, outputs.len() as f64).unwrap()
    }

    #[test]
    fn the_excess_is_the_exponential_laws() {
        for &(a, b, tokens, t) in &[
            (40.0, 15.0, 30.0, 1500.0),
            (40.0, 15.0, 30.0, 20.0),
            (100.0, 30.0, 250.0, 20_000.0),
            (5.0, 8.0, 12.0, 200.0),
        ] {
            let exact = expected_excess_ms(a, b, &exponential(tokens), t);
            let numerical = numerical_excess(a, b, tokens, t);
            assert!(
                (exact - numerical).abs() <= 1e-3 * numerical.max(1.0),
                "{a} {b} {tokens} {t}: {exact} vs {numerical}"
            );
        }
        assert_eq!(expected_excess_ms(50.0, 0.0, &exponential(30.0), 100.0), 0.0);
        assert_eq!(expected_excess_ms(150.0, 0.0, &exponential(30.0), 100.0), 50.0);
        assert_eq!(exponential(0.0).mean(), 0.0);
        assert_eq!(expected_excess_ms(50.0, 10.0, &exponential(0.0), 40.0), 10.0);
    }

    #[test]
    fn one_engines_quantile_is_its_laws() {
        // a + L·b > t with probability exp(−(t − a)/(m·b)): the p99 is a + m·b·ln 100.
        let p99 = mixture_quantile(&[(10.0, 40.0, 15.0)], &exponential(30.0), 0.99).unwrap();
        assert!((p99 - (40.0 + 450.0 * 100f64.ln())).abs() < 1e-6, "{p99}");
        assert_eq!(mixture_quantile(&[], &exponential(30.0), 0.99), None);
        assert_eq!(mixture_quantile(&[(0.0, 40.0, 15.0)], &exponential(30.0), 0.99), None);
    }

    #[test]
    fn a_slow_decoder_carries_the_mixtures_tail() {
        // A tenth of the traffic on an engine twice as slow per token moves the p99 up by
        // more than a tenth of the gap between the two engines' own p99s.
        let law = exponential(30.0);
        let fast = mixture_quantile(&[(1.0, 40.0, 10.0)], &law, 0.99).unwrap();
        let slow = mixture_quantile(&[(1.0, 40.0, 20.0)], &law, 0.99).unwrap();
        let mixed = mixture_quantile(&[(0.9, 40.0, 10.0), (0.1, 40.0, 20.0)], &law, 0.99).unwrap();
        assert!(mixed > fast + 0.1 * (slow - fast), "{fast} {mixed} {slow}");
        assert!(mixed < slow);
        // At the mixture's p99 the slow engine's excess per request is the larger by far.
        let (fast_excess, slow_excess) =
            (expected_excess_ms(40.0, 10.0, &law, mixed), expected_excess_ms(40.0, 20.0, &law, mixed));
        assert!(slow_excess > 10.0 * fast_excess, "{fast_excess} {slow_excess}");
    }

    /// The law read from a histogram: its survival at each bucket bound is the histogram's, its
    /// excess is the integral of that survival, and its mean is the histogram's to within the
    /// buckets' spread (exactly, once scaled to it).
    #[test]
    fn a_histograms_law_has_its_survival_and_mean() {
        // Answers of 1, 3, 8, 15, 40 and 90 tokens, ten of each, and two of 3,000 (past the last bound).
        let mut outputs: Vec<u32> = [1, 3, 8, 15, 40, 90].iter().flat_map(|&o| [o; 10]).collect();
        outputs.extend([3000, 3000]);
        let law = DecodeLengths::from_output_histogram(&output_histogram(&outputs)).unwrap();
        let n = outputs.len() as f64;
        for le in [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 2000.0] {
            let empirical = outputs.iter().filter(|&&o| f64::from(o) > le).count() as f64 / n;
            assert!((law.survival(le - 1.0) - empirical).abs() < 1e-12, "S({}) {}", le - 1.0, empirical);
        }
        // The two long answers are in the exponential tail, with the mean their sum leaves.
        assert!(law.survival(1999.0) > 0.0 && law.survival(1_000_000.0) < 1e-12);
        let mean = outputs.iter().map(|&o| f64::from(o) - 1.0).sum::<f64>() / n;
        assert!((law.mean() - mean).abs() < 0.1 * mean, "{} vs {mean}", law.mean());
        let scaled = law.scaled_to_mean(mean);
        assert!((scaled.mean() - mean).abs() < 1e-9 * mean);
        // Excess = ∫ S, by the midpoint rule; convex and non-increasing.
        for s in [0.0, 0.5, 3.0, 12.0, 49.0, 150.0, 2500.0] {
            let (h, steps) = (0.01, 400_000);
            let integral: f64 = (0..steps).map(|i| law.survival(s + (i as f64 + 0.5) * h) * h).sum();
            let beyond = law.excess(s + h * steps as f64);
            assert!((law.excess(s) - integral - beyond).abs() < 1e-4 * law.excess(s).max(1e-3), "s {s}");
        }
        let values: Vec<f64> = (0..400).map(|i| law.excess(f64::from(i) * 0.37 - 5.0)).collect();
        for w in values.windows(3) {
            assert!(w[1] <= w[0] + 1e-12 && w[1] - w[0] <= w[2] - w[1] + 1e-9, "{w:?}");
        }
        assert_eq!(law.excess(-2.0), law.mean() + 2.0);
        assert!(DecodeLengths::from_output_histogram(&output_histogram(&[])).is_none());
    }

    /// Answers that all run about as long as each other have a short tail: the p99 planned with
    /// their histogram is far below the one an exponential of the same mean gives.
    #[test]
    fn answers_of_one_length_have_a_short_tail() {
        let outputs = [150u32; 100];
        let law =
            DecodeLengths::from_output_histogram(&output_histogram(&outputs)).unwrap().scaled_to_mean(149.0);
        let (engines, exp) = ([(1.0, 100.0, 10.0)], exponential(149.0));
        let learned = mixture_quantile(&engines, &law, 0.99).unwrap();
        let assumed = mixture_quantile(&engines, &exp, 0.99).unwrap();
        assert!(learned <= 100.0 + 10.0 * 200.0, "{learned}");
        assert!(assumed > 100.0 + 10.0 * 149.0 * 4.0, "{assumed}");
    }

    #[test]
    fn quantiles_invert_the_survival() {
        let law = exponential(40.0);
        for q in [0.5_f64, 0.9, 0.99] {
            let expected = -40.0 * (1.0 - q).ln();
            let got = law.quantile(q).unwrap();
            assert!((got - expected).abs() <= 1e-3 * expected, "{q}: {got}");
        }
        let one_length = DecodeLengths::from_output_histogram(&output_histogram(&[150; 50])).unwrap();
        let (p50, p99) = (one_length.quantile(0.5).unwrap(), one_length.quantile(0.99).unwrap());
        assert!(p50 <= p99 && p99 <= 200.0, "{p50} {p99}");
    }

    /// A mixture's survival is the weighted sum of its parts'; its tail mean is the parts'
    /// weighted by the mass each has left; its mean is the weighted mean.
    #[test]
    fn a_mixture_weighs_its_parts() {
        let short = DecodeLengths::from_output_histogram(&output_histogram(&[3, 8, 15, 15])).unwrap();
        let long = exponential(300.0);
        let mixed = DecodeLengths::mixture(&[(3.0, &short), (1.0, &long)]).unwrap();
        for x in [0.0, 1.0, 4.0, 9.0, 19.0, 75.0, 150.0, 300.0] {
            let expected = 0.75 * short.survival(x) + 0.25 * long.survival(x);
            assert!((mixed.survival(x) - expected).abs() < 1e-12, "S({x})");
        }
        // Between its points, chords.
        let expected = 0.75 * short.survival(14.0) + 0.25 * long.survival(14.0);
        assert!((mixed.survival(14.0) - expected).abs() < 0.01 * expected);
        let mean = 0.75 * short.mean() + 0.25 * long.mean();
        assert!((mixed.mean() - mean).abs() < 0.02 * mean, "{} vs {mean}", mixed.mean());
        assert!(DecodeLengths::mixture(&[(0.0, &short)]).is_none());
    }

    /// Non-finite latencies (a curve at its pole) and tiny times between tokens give numbers or
    /// NaN, which the callers drop, never a panic.
    #[test]
    fn odd_inputs_do_not_panic() {
        let law = DecodeLengths::from_output_histogram(&output_histogram(&[3, 8, 15, 40, 90])).unwrap();
        for law in [&law, &exponential(30.0), &exponential(0.0)] {
            for (a, b, t) in [
                (f64::INFINITY, 10.0, f64::INFINITY),
                (f64::NAN, 10.0, 100.0),
                (40.0, f64::NAN, 100.0),
                (40.0, 1e-300, 40.0 + 1e-299),
                (40.0, f64::INFINITY, 100.0),
                (40.0, 10.0, f64::NEG_INFINITY),
            ] {
                let _ = expected_excess_ms(a, b, law, t);
                let p = exceeds(a, b, law, t);
                assert!((0.0..=1.0).contains(&p) || p.is_nan(), "{a} {b} {t}: {p}");
            }
            let _ = mixture_quantile(&[(1.0, f64::NAN, 10.0), (1.0, 40.0, f64::INFINITY)], law, 0.99);
        }
    }
}

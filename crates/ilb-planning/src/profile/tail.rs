//! The tail term of the objective: how far a request's latency runs past a threshold, on
//! average, so that the plan weighs an engine's slow answers and not only its mean.
//!
//! A request on an engine at load y spends a(y) = TTFT(y) and then L × b(y), b the time between
//! tokens and L its decode tokens. Only the mean of L is learned (the engines' token counters),
//! so L is taken as exponential with that mean: the widest spread a mean alone allows (the
//! maximum-entropy law on [0, ∞)). Then
//!
//! E[(a + L·b − t)⁺] = m·b·exp(−(t − a)/(m·b))   for t ≥ a,   a − t + m·b   below,
//!
//! convex and non-decreasing in (a, b); a and b are convex and non-decreasing in y, so the term
//! is too, and y × (mean + weight × term) stays convex for the optimizer.
//!
//! With t the fleet's p99 (engine side, [`mixture_quantile`]), weight × term / (1 − 0.99) is the
//! conditional value at risk's share of a request (Rockafellar–Uryasev): the objective becomes
//! mean + μ × CVaR₉₉ with a fixed threshold, re-chosen every round.

/// E[(a + L·b − t)⁺] for L exponential with mean `tokens`, ms.
pub fn expected_excess_ms(first_ms: f64, per_token_ms: f64, tokens: f64, threshold_ms: f64) -> f64 {
    let spread = tokens.max(0.0) * per_token_ms.max(0.0);
    let below = threshold_ms - first_ms;
    if below <= 0.0 {
        return -below + spread;
    }
    if spread <= 0.0 {
        return 0.0;
    }
    spread * (-below / spread).exp()
}

/// P(a + L·b > t) for L exponential with mean `tokens`.
fn exceeds(first_ms: f64, per_token_ms: f64, tokens: f64, threshold_ms: f64) -> f64 {
    let spread = tokens.max(0.0) * per_token_ms.max(0.0);
    let below = threshold_ms - first_ms;
    if below <= 0.0 {
        1.0
    } else if spread <= 0.0 {
        0.0
    } else {
        (-below / spread).exp()
    }
}

/// The `q` quantile (0 < q < 1) of a request's latency over engines `(share, a, b)`, each
/// request's decode tokens exponential with mean `tokens`; `None` without shares.
pub fn mixture_quantile(engines: &[(f64, f64, f64)], tokens: f64, q: f64) -> Option<f64> {
    let total: f64 = engines.iter().map(|e| e.0).filter(|w| *w > 0.0).sum();
    if !(total > 0.0 && total.is_finite()) {
        return None;
    }
    let tail = |t: f64| -> f64 {
        engines.iter().filter(|e| e.0 > 0.0).map(|&(w, a, b)| w * exceeds(a, b, tokens, t)).sum::<f64>()
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

    /// E[(a + L·b − t)⁺] by the midpoint rule over L's quantiles.
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

    #[test]
    fn the_excess_is_the_exponential_laws() {
        for &(a, b, tokens, t) in &[
            (40.0, 15.0, 30.0, 1500.0),
            (40.0, 15.0, 30.0, 20.0),
            (100.0, 30.0, 250.0, 20_000.0),
            (5.0, 8.0, 12.0, 200.0),
        ] {
            let exact = expected_excess_ms(a, b, tokens, t);
            let numerical = numerical_excess(a, b, tokens, t);
            assert!(
                (exact - numerical).abs() <= 1e-3 * numerical.max(1.0),
                "{a} {b} {tokens} {t}: {exact} vs {numerical}"
            );
        }
        assert_eq!(expected_excess_ms(50.0, 0.0, 30.0, 100.0), 0.0);
        assert_eq!(expected_excess_ms(150.0, 0.0, 30.0, 100.0), 50.0);
    }

    #[test]
    fn one_engines_quantile_is_its_laws() {
        // a + L·b > t with probability exp(−(t − a)/(m·b)): the p99 is a + m·b·ln 100.
        let p99 = mixture_quantile(&[(10.0, 40.0, 15.0)], 30.0, 0.99).unwrap();
        assert!((p99 - (40.0 + 450.0 * 100f64.ln())).abs() < 1e-6, "{p99}");
        assert_eq!(mixture_quantile(&[], 30.0, 0.99), None);
        assert_eq!(mixture_quantile(&[(0.0, 40.0, 15.0)], 30.0, 0.99), None);
    }

    #[test]
    fn a_slow_decoder_carries_the_mixtures_tail() {
        // A tenth of the traffic on an engine twice as slow per token moves the p99 up by
        // more than a tenth of the gap between the two engines' own p99s.
        let fast = mixture_quantile(&[(1.0, 40.0, 10.0)], 30.0, 0.99).unwrap();
        let slow = mixture_quantile(&[(1.0, 40.0, 20.0)], 30.0, 0.99).unwrap();
        let mixed = mixture_quantile(&[(0.9, 40.0, 10.0), (0.1, 40.0, 20.0)], 30.0, 0.99).unwrap();
        assert!(mixed > fast + 0.1 * (slow - fast), "{fast} {mixed} {slow}");
        assert!(mixed < slow);
        // At the mixture's p99 the slow engine's excess per request is the larger by far.
        let (fast_excess, slow_excess) =
            (expected_excess_ms(40.0, 10.0, 30.0, mixed), expected_excess_ms(40.0, 20.0, 30.0, mixed));
        assert!(slow_excess > 10.0 * fast_excess, "{fast_excess} {slow_excess}");
    }
}

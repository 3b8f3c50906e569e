//! A cumulative Prometheus histogram (buckets, sum, count), its delta between two scrapes
//! with counter-reset detection, and quantile estimation by linear interpolation inside the
//! bucket, as PromQL's `histogram_quantile` does.

/// A cumulative histogram as exposed by an engine. Bucket counts are cumulative (each bucket
/// counts observations ≤ its upper bound) and bounds are strictly increasing; the last
/// bucket is normally `+Inf`.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// (upper bound `le`, cumulative count), sorted by bound.
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl Histogram {
    /// Builds a histogram from unordered `(le, cumulative count)` pairs. Returns `None` when
    /// the buckets are unusable (non-finite counts, NaN bounds, duplicate bounds), so the
    /// caller treats the histogram as absent rather than computing nonsense from it.
    pub fn from_parts(mut buckets: Vec<(f64, f64)>, sum: f64, count: f64) -> Option<Self> {
        if buckets.iter().any(|(le, n)| le.is_nan() || !n.is_finite() || *n < 0.0) {
            return None;
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        if buckets.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            return None;
        }
        // Some exporters omit `_count`; the +Inf bucket carries the same number.
        let count = if count.is_finite() {
            count
        } else {
            buckets.last().filter(|(le, _)| *le == f64::INFINITY).map(|(_, n)| *n)?
        };
        Some(Self { buckets, sum, count })
    }

    /// Adds another histogram with the same bounds (e.g. a second data-parallel engine of the
    /// same model). Returns `false` and leaves `self` unchanged when the bounds differ.
    pub fn add(&mut self, other: &Histogram) -> bool {
        let same_bounds = self.buckets.len() == other.buckets.len()
            && self.buckets.iter().zip(&other.buckets).all(|(a, b)| a.0 == b.0);
        if !same_bounds {
            return false;
        }
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            mine.1 += theirs.1;
        }
        self.sum += other.sum;
        self.count += other.count;
        true
    }

    /// Every count and the sum multiplied by `factor` (a decayed histogram's older windows).
    pub fn scale(&mut self, factor: f64) {
        for bucket in &mut self.buckets {
            bucket.1 *= factor;
        }
        self.sum *= factor;
        self.count *= factor;
    }

    /// The observations made between `previous` and `self`. If any count went down, the
    /// engine restarted: as PromQL's `rate` does, the whole of `self` is taken as the delta
    /// and the second value is `true`. Returns `None` if the bucket bounds changed.
    pub fn delta_since(&self, previous: &Histogram) -> Option<(Histogram, bool)> {
        let same_bounds = self.buckets.len() == previous.buckets.len()
            && self.buckets.iter().zip(&previous.buckets).all(|(a, b)| a.0 == b.0);
        if !same_bounds {
            return None;
        }
        let reset = self.count < previous.count
            || self.buckets.iter().zip(&previous.buckets).any(|(now, before)| now.1 < before.1);
        if reset {
            return Some((self.clone(), true));
        }
        let buckets = self
            .buckets
            .iter()
            .zip(&previous.buckets)
            .map(|(now, before)| (now.0, now.1 - before.1))
            .collect();
        let delta = Histogram { buckets, sum: self.sum - previous.sum, count: self.count - previous.count };
        Some((delta, false))
    }

    /// Mean observation (`sum / count`), `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count).filter(|mean| mean.is_finite())
    }

    /// Estimated `q`-quantile (0 ≤ q ≤ 1), `None` when empty. Interpolates linearly inside the
    /// bucket holding the rank, taking 0 as the lower edge of the first bucket; a rank in the
    /// `+Inf` bucket returns the largest finite bound (an underestimate, as in PromQL).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total.is_nan() || total <= 0.0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let rank = q * total;
        let mut lower_bound = 0.0_f64;
        let mut lower_count = 0.0_f64;
        for &(le, cumulative) in &self.buckets {
            if cumulative >= rank && cumulative > lower_count {
                if le == f64::INFINITY {
                    return Some(lower_bound);
                }
                let lower = lower_bound.min(le);
                let fraction = (rank - lower_count) / (cumulative - lower_count);
                return Some(lower + (le - lower) * fraction.clamp(0.0, 1.0));
            }
            if le.is_finite() {
                lower_bound = le;
            }
            lower_count = lower_count.max(cumulative);
        }
        Some(lower_bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(buckets: &[(f64, f64)], sum: f64) -> Histogram {
        let count = buckets.last().map(|b| b.1).unwrap_or(0.0);
        Histogram::from_parts(buckets.to_vec(), sum, count).unwrap()
    }

    #[test]
    fn quantile_interpolates_inside_bucket() {
        // 10 observations in (0, 0.1], 10 in (0.1, 0.2].
        let h = hist(&[(0.1, 10.0), (0.2, 20.0), (f64::INFINITY, 20.0)], 3.0);
        assert!((h.quantile(0.5).unwrap() - 0.1).abs() < 1e-12);
        assert!((h.quantile(0.25).unwrap() - 0.05).abs() < 1e-12);
        assert!((h.quantile(0.9).unwrap() - 0.18).abs() < 1e-12);
        assert!((h.mean().unwrap() - 0.15).abs() < 1e-12);
    }

    #[test]
    fn quantile_in_inf_bucket_returns_largest_finite_bound() {
        let h = hist(&[(0.1, 1.0), (0.2, 2.0), (f64::INFINITY, 10.0)], 30.0);
        assert_eq!(h.quantile(0.9), Some(0.2));
    }

    #[test]
    fn empty_histogram_has_no_quantile_or_mean() {
        let h = hist(&[(0.1, 0.0), (f64::INFINITY, 0.0)], 0.0);
        assert_eq!(h.quantile(0.5), None);
        assert_eq!(h.mean(), None);
    }

    #[test]
    fn delta_detects_counter_reset() {
        let before = hist(&[(0.1, 10.0), (f64::INFINITY, 20.0)], 5.0);
        let after = hist(&[(0.1, 12.0), (f64::INFINITY, 25.0)], 6.0);
        let (delta, reset) = after.delta_since(&before).unwrap();
        assert!(!reset);
        assert_eq!(delta.buckets, vec![(0.1, 2.0), (f64::INFINITY, 5.0)]);
        assert_eq!(delta.count, 5.0);

        let restarted = hist(&[(0.1, 1.0), (f64::INFINITY, 3.0)], 0.5);
        let (delta, reset) = restarted.delta_since(&before).unwrap();
        assert!(reset);
        assert_eq!(delta, restarted);
    }

    #[test]
    fn delta_with_changed_bounds_is_none() {
        let a = hist(&[(0.1, 1.0), (f64::INFINITY, 2.0)], 0.1);
        let b = hist(&[(0.2, 1.0), (f64::INFINITY, 2.0)], 0.1);
        assert!(a.delta_since(&b).is_none());
    }

    #[test]
    fn from_parts_rejects_duplicate_bounds_and_fills_missing_count() {
        assert!(Histogram::from_parts(vec![(0.1, 1.0), (0.1, 2.0)], 0.0, 2.0).is_none());
        let h = Histogram::from_parts(vec![(f64::INFINITY, 4.0), (0.5, 1.0)], 1.0, f64::NAN).unwrap();
        assert_eq!(h.count, 4.0);
        assert_eq!(h.buckets[0].0, 0.5);
    }
}

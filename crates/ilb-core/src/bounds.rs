//! The ranges every number that enters ilb from outside must fall in: config files,
//! engine registrations, DNS-discovered engines and data-plane reports all check their numbers
//! against these bounds, so nothing downstream computes with a NaN, an infinity or a product
//! that overflows (a fleet's capacity is at most [`REPLICAS`] × [`CAPACITY_RPS`] per engine, far
//! inside `f64`).
//!
//! The bounds are generous (no real fleet is near them) and exist to refuse nonsense, not to
//! second-guess operators. An error names the field and the range, never anything but the
//! number itself.

use std::fmt;

/// A closed range of `f64`, with an optionally open lower end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bound {
    pub min: f64,
    pub max: f64,
    /// Whether `min` itself is refused (a range like `(0, max]`).
    pub min_exclusive: bool,
}

/// A request rate capacity per engine replica, req/s.
pub const CAPACITY_RPS: Bound = Bound::new(1e-3, 1e6);
/// A rate of requests (demand, arrivals), req/s.
pub const RATE_RPS: Bound = Bound::new(0.0, 1e7);
/// A latency or a duration measured in milliseconds (an hour at most).
pub const LATENCY_MS: Bound = Bound::new(0.0, 3_600_000.0);
/// A latency that must be positive, ms.
pub const POSITIVE_LATENCY_MS: Bound = Bound { min: 0.0, max: 3_600_000.0, min_exclusive: true };
/// A number of output tokens per request.
pub const TOKENS: Bound = Bound::new(0.0, 1e7);
/// Replicas behind one engine URL.
pub const REPLICAS: std::ops::RangeInclusive<u64> = 1..=100_000;
/// Concurrent requests one engine takes.
pub const MAX_IN_FLIGHT: std::ops::RangeInclusive<u64> = 1..=1_000_000;
/// A period or interval in milliseconds (a day at most).
pub const PERIOD_MS: std::ops::RangeInclusive<u64> = 1..=86_400_000;

impl Bound {
    pub const fn new(min: f64, max: f64) -> Bound {
        Bound { min, max, min_exclusive: false }
    }

    pub fn contains(&self, v: f64) -> bool {
        let above = if self.min_exclusive { v > self.min } else { v >= self.min };
        v.is_finite() && above && v <= self.max
    }

    /// `v` if it is in range, else an error naming `field`.
    pub fn check(&self, field: &str, v: f64) -> Result<f64, OutOfBounds> {
        if self.contains(v) {
            Ok(v)
        } else {
            Err(OutOfBounds { field: field.to_owned(), value: number(v), range: self.to_string() })
        }
    }

    /// Like [`Bound::check`] for an optional number.
    pub fn check_opt(&self, field: &str, v: Option<f64>) -> Result<(), OutOfBounds> {
        v.map_or(Ok(()), |v| self.check(field, v).map(drop))
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let open = if self.min_exclusive { '(' } else { '[' };
        write!(f, "{open}{}, {}]", number(self.min), number(self.max))
    }
}

/// `v` as written in an error: plainly for everyday magnitudes, in exponent form otherwise.
fn number(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e9).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// `v` if it is in `range`, else an error naming `field`.
pub fn check_count(field: &str, v: u64, range: &std::ops::RangeInclusive<u64>) -> Result<u64, OutOfBounds> {
    if range.contains(&v) {
        Ok(v)
    } else {
        Err(OutOfBounds {
            field: field.to_owned(),
            value: v.to_string(),
            range: format!("[{}, {}]", range.start(), range.end()),
        })
    }
}

/// A number outside its bound.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{field}: {value} is not in {range}")]
pub struct OutOfBounds {
    pub field: String,
    pub value: String,
    pub range: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_refuse_non_finite_and_out_of_range_numbers() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e308, -1.0, 0.0, 1e-300] {
            assert!(CAPACITY_RPS.check("c", bad).is_err(), "{bad}");
        }
        assert_eq!(CAPACITY_RPS.check("c", 12.5), Ok(12.5));
        assert!(POSITIVE_LATENCY_MS.check("l", 0.0).is_err());
        assert_eq!(LATENCY_MS.check("l", 0.0), Ok(0.0));
        assert_eq!(
            CAPACITY_RPS.check("engines.a.capacity_rps", 1e308).unwrap_err().to_string(),
            "engines.a.capacity_rps: 1e308 is not in [0.001, 1000000]"
        );
        assert!(check_count("r", 0, &REPLICAS).is_err());
        assert!(check_count("r", u64::from(u32::MAX), &REPLICAS).is_err());
        assert_eq!(check_count("r", 4, &REPLICAS), Ok(4));
    }

    #[test]
    fn the_largest_fleet_capacity_is_finite() {
        let engine = *REPLICAS.end() as f64 * CAPACITY_RPS.max;
        assert!((engine * 1e6).is_finite(), "a million such engines still sum finitely");
    }
}

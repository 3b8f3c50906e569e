//! Request priority: the levels of the `x-ilb-priority` header, ordered lowest first, and
//! [`PerPriority`], one value per level indexed by the level itself (no integer indices).
//!
//! A request's priority is parsed once, when it is classified; shedding takes the levels
//! lowest first and a freed engine slot goes to the highest level waiting (see
//! [`crate::admission`]).

use std::fmt;
use std::ops::{Index, IndexMut};

/// The request header that sets a request's priority.
pub const HEADER: &str = "x-ilb-priority";

/// Scheduling priority, from the [`HEADER`] header. Lower priorities are shed first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// `low`, or its alias `batch`.
    Low,
    /// `normal`: a request without the header, or with an empty one.
    #[default]
    Normal,
    High,
    /// Waits longer for a slot and may wait even when the wait queue is full
    /// ([`crate::admission::max_wait`], [`crate::admission::may_queue`]).
    Critical,
}

/// A header value that names no priority.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("x-ilb-priority must be one of low, normal, high, critical (got {0:?})")]
pub struct UnknownPriority(pub String);

impl Priority {
    /// How many levels there are.
    pub const COUNT: usize = 4;
    /// Every level, lowest first: the order in which shedding takes them.
    pub const ALL: [Priority; Priority::COUNT] =
        [Priority::Low, Priority::Normal, Priority::High, Priority::Critical];

    /// Parses a header value (case-insensitive, surrounding white space ignored).
    pub fn parse(s: &str) -> Result<Priority, UnknownPriority> {
        match s.trim().to_ascii_lowercase().as_str() {
            "low" | "batch" => Ok(Priority::Low),
            "normal" | "" => Ok(Priority::Normal),
            "high" => Ok(Priority::High),
            "critical" => Ok(Priority::Critical),
            _ => Err(UnknownPriority(s.to_owned())),
        }
    }

    /// The priority of a request whose [`HEADER`] header is `value` (`None`: no header, normal).
    pub fn from_header(value: Option<&str>) -> Result<Priority, UnknownPriority> {
        value.map_or(Ok(Priority::Normal), Priority::parse)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }

    /// Position in [`Priority::ALL`] (0 for `low`).
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `T` per priority, indexed by [`Priority`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerPriority<T>(pub [T; Priority::COUNT]);

impl<T> PerPriority<T> {
    /// The value `f(p)` for every level `p`.
    pub fn from_fn(mut f: impl FnMut(Priority) -> T) -> PerPriority<T> {
        PerPriority(std::array::from_fn(|i| f(Priority::ALL[i])))
    }

    /// Each level with its value, lowest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (Priority, &T)> {
        Priority::ALL.into_iter().zip(self.0.iter())
    }

    /// `f` applied to each value.
    pub fn map<U>(&self, mut f: impl FnMut(&T) -> U) -> PerPriority<U> {
        PerPriority::from_fn(|p| f(&self[p]))
    }
}

impl<T> Index<Priority> for PerPriority<T> {
    type Output = T;

    #[inline]
    fn index(&self, p: Priority) -> &T {
        &self.0[p.index()]
    }
}

impl<T> IndexMut<Priority> for PerPriority<T> {
    #[inline]
    fn index_mut(&mut self, p: Priority) -> &mut T {
        &mut self.0[p.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_levels_and_orders_them_lowest_first() {
        assert_eq!(Priority::parse(" Critical ").unwrap(), Priority::Critical);
        assert_eq!(Priority::parse("batch").unwrap(), Priority::Low);
        assert_eq!(Priority::parse("").unwrap(), Priority::Normal);
        assert_eq!(Priority::from_header(None).unwrap(), Priority::Normal);
        assert_eq!(Priority::from_header(Some("high")).unwrap(), Priority::High);
        let err = Priority::parse("urgent").unwrap_err();
        assert_eq!(
            err.to_string(),
            "x-ilb-priority must be one of low, normal, high, critical (got \"urgent\")"
        );
        assert!(Priority::ALL.windows(2).all(|w| w[0] < w[1]));
        for (i, p) in Priority::ALL.into_iter().enumerate() {
            assert_eq!(p.index(), i);
            assert_eq!(Priority::parse(p.as_str()).unwrap(), p);
        }
    }

    #[test]
    fn per_priority_is_indexed_by_level() {
        let mut v = PerPriority::from_fn(|p| p.index() * 10);
        v[Priority::High] += 1;
        assert_eq!(v.0, [0, 10, 21, 30]);
        assert_eq!(v.iter().next_back(), Some((Priority::Critical, &30)));
        assert_eq!(v.map(|x| x + 1)[Priority::Low], 1);
    }
}

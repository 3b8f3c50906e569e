//! The routing problem as data: traffic classes, engines with latency curves, the class × engine
//! network latency matrix and the headroom factor ρ; its JSON format and its validation.
//!
//! The network matrix is stored engine-major (one contiguous column of class latencies per
//! engine) because the solver's inner loops scan one engine against all classes; the JSON form
//! is class-major rows, as people write it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One routing problem (one model). See the crate README for the math.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Problem {
    /// Usable fraction of each engine's capacity, in (0, 1], e.g. 0.95.
    pub rho: f64,
    /// Traffic classes, in a fixed order: results are indexed by position.
    pub classes: Vec<Class>,
    /// Engines, in a fixed order: results are indexed by position.
    pub engines: Vec<Engine>,
    /// Network latency (ms) from each class's front end to each engine; forbidden pairs absent.
    pub network_ms: NetworkMatrix,
}

/// A traffic class: a front-end cluster together with the constraints on where it may go.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Class {
    pub id: String,
    /// Measured demand in requests/s (≥ 0).
    pub demand_rps: f64,
    /// Cost of shedding one request of this class, in ms (≥ 0; larger for higher priority).
    pub shed_penalty_ms: f64,
    /// Of `demand_rps`, the part that is a margin above the demand expected (≥ 0, read as at
    /// most `demand_rps`; 0 by default). A class holding its previous weights need only fit its
    /// engines without half of it: what of that half does not fit is planned on engines with
    /// room, and the weights stay.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub headroom_rps: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// An inference engine (all replicas behind one endpoint).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Engine {
    pub id: String,
    /// Effective capacity in requests/s (≥ 0; 0 means the engine takes no traffic).
    pub capacity_rps: f64,
    pub latency: Latency,
}

/// An engine's expected latency L(y) at load y requests/s.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Latency {
    /// L(y) = t0 + b·y/(c − y), with c the engine's capacity.
    Queueing { t0_ms: f64, b_ms: f64 },
    /// Fitted points `[load_rps, latency_ms]`; the solver uses their convex increasing envelope
    /// (see [`crate::Curve`]).
    Piecewise(Vec<[f64; 2]>),
}

/// Network latency in ms for every (class, engine) pair; `None` (JSON `null`) = forbidden.
///
/// Invariant: every stored value is finite and ≥ 0 or `+∞` (forbidden); the constructors check it.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkMatrix {
    n_classes: usize,
    n_engines: usize,
    /// `values[engine_idx * n_classes + class_idx]`; `f64::INFINITY` where forbidden. Shared by
    /// clones (never mutated), so that a warm start can recognise the matrix it was solved with
    /// (see `same_values`) without keeping a copy.
    values: Arc<Vec<f64>>,
}

/// Why a problem was rejected.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum ProblemError {
    #[error("rho must be in (0, 1], got {0}")]
    Rho(f64),
    #[error("class {id:?}: {field} must be finite and non-negative, got {value}")]
    ClassField { id: String, field: &'static str, value: f64 },
    #[error("engine {id:?}: {field} must be finite and non-negative, got {value}")]
    EngineField { id: String, field: &'static str, value: f64 },
    #[error("engine {id:?}: piecewise latency {reason}")]
    Piecewise { id: String, reason: &'static str },
    #[error("duplicate {kind} id {id:?}")]
    DuplicateId { kind: &'static str, id: String },
    #[error("network_ms has {rows} rows but there are {classes} classes")]
    NetworkRows { rows: usize, classes: usize },
    #[error("network_ms has {columns} columns but there are {engines} engines")]
    NetworkColumns { columns: usize, engines: usize },
    #[error("network_ms row {row} has {len} entries, expected {expected}")]
    RaggedRow { row: usize, len: usize, expected: usize },
    #[error("network_ms[{class}][{engine}] must be finite and non-negative or null, got {value}")]
    NetworkValue { class: usize, engine: usize, value: f64 },
    #[error("network_ms entry ({class}, {engine}) is outside a {n_classes} x {n_engines} matrix")]
    NetworkIndex { class: usize, engine: usize, n_classes: usize, n_engines: usize },
}

fn non_negative(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}

/// How many engines ahead a scan of the network matrix asks for the next columns
/// (`NetworkMatrix::prefetch_column`).
pub(crate) const PREFETCH_AHEAD: usize = 3;

impl NetworkMatrix {
    /// Builds the matrix from `f(class_idx, engine_idx)`; `None` = forbidden.
    pub fn from_fn(
        n_classes: usize,
        n_engines: usize,
        mut f: impl FnMut(usize, usize) -> Option<f64>,
    ) -> Result<Self, ProblemError> {
        let mut values = Vec::with_capacity(n_classes * n_engines);
        for engine in 0..n_engines {
            for class in 0..n_classes {
                values.push(match f(class, engine) {
                    None => f64::INFINITY,
                    Some(v) if non_negative(v) => v,
                    Some(value) => return Err(ProblemError::NetworkValue { class, engine, value }),
                });
            }
        }
        Ok(Self { n_classes, n_engines, values: Arc::new(values) })
    }

    /// As [`Self::from_fn`] for callers whose values are finite and ≥ 0 by construction.
    pub(crate) fn from_fn_unchecked(
        n_classes: usize,
        n_engines: usize,
        mut f: impl FnMut(usize, usize) -> Option<f64>,
    ) -> Self {
        let mut values = Vec::with_capacity(n_classes * n_engines);
        for engine in 0..n_engines {
            for class in 0..n_classes {
                let v = f(class, engine).unwrap_or(f64::INFINITY);
                debug_assert!(v >= 0.0);
                values.push(v);
            }
        }
        Self { n_classes, n_engines, values: Arc::new(values) }
    }

    /// Wraps engine-major values that already satisfy the invariant (the solver's group matrix).
    pub(crate) fn from_engine_major(n_classes: usize, n_engines: usize, values: Vec<f64>) -> Self {
        debug_assert_eq!(values.len(), n_classes * n_engines);
        Self { n_classes, n_engines, values: Arc::new(values) }
    }

    /// Builds the matrix from class-major rows, as in the JSON format.
    pub fn from_rows(rows: &[Vec<Option<f64>>]) -> Result<Self, ProblemError> {
        let n_engines = rows.first().map_or(0, Vec::len);
        for (row, r) in rows.iter().enumerate() {
            if r.len() != n_engines {
                return Err(ProblemError::RaggedRow { row, len: r.len(), expected: n_engines });
            }
        }
        Self::from_fn(rows.len(), n_engines, |k, j| rows[k][j])
    }

    /// Builds a sparse-input matrix: listed `(class_idx, engine_idx, ms)` pairs are allowed, every
    /// other pair is forbidden. A pair listed twice keeps its last value.
    pub fn from_entries(
        n_classes: usize,
        n_engines: usize,
        entries: impl IntoIterator<Item = (usize, usize, f64)>,
    ) -> Result<Self, ProblemError> {
        let mut values = vec![f64::INFINITY; n_classes * n_engines];
        for (class, engine, value) in entries {
            if class >= n_classes || engine >= n_engines {
                return Err(ProblemError::NetworkIndex { class, engine, n_classes, n_engines });
            }
            if !non_negative(value) {
                return Err(ProblemError::NetworkValue { class, engine, value });
            }
            values[engine * n_classes + class] = value;
        }
        Ok(Self { n_classes, n_engines, values: Arc::new(values) })
    }

    pub fn n_classes(&self) -> usize {
        self.n_classes
    }

    pub fn n_engines(&self) -> usize {
        self.n_engines
    }

    /// Latency in ms, `None` if the pair is forbidden. Panics if an index is out of range.
    pub fn get(&self, class_idx: usize, engine_idx: usize) -> Option<f64> {
        let v = self.values[engine_idx * self.n_classes + class_idx];
        v.is_finite().then_some(v)
    }

    /// All classes' latencies to one engine, `+∞` where forbidden (the solver's hot access).
    pub(crate) fn engine_column(&self, engine_idx: usize) -> &[f64] {
        &self.values[engine_idx * self.n_classes..(engine_idx + 1) * self.n_classes]
    }

    /// Asks the CPU to start loading engine `engine_idx`'s column into its cache, if there is
    /// such an engine: a hint with no effect on any result. The matrix is larger than the caches
    /// (32 MB for 200 × 20,000), and the passes that read a few columns' entries each, or jump
    /// from one cluster member's column to the next, otherwise wait on memory for each column.
    #[inline]
    #[allow(unsafe_code)]
    pub(crate) fn prefetch_column(&self, engine_idx: usize) {
        let range = engine_idx * self.n_classes..(engine_idx + 1) * self.n_classes;
        let Some(column) = self.values.get(range) else {
            return;
        };
        #[cfg(target_arch = "x86_64")]
        for line in column.chunks(8) {
            // SAFETY: a prefetch only hints the cache: it reads nothing into the program and
            // cannot fault, whatever the address; SSE, which provides it, is part of x86_64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast());
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = column;
    }

    /// The stored values, shared (for a warm start's `same_values` check).
    pub(crate) fn shared_values(&self) -> Arc<Vec<f64>> {
        Arc::clone(&self.values)
    }

    /// Whether this matrix holds `values` bit for bit: at once when it shares them (a clone of
    /// the matrix they came from), else by one comparison of the bits that stops at the first
    /// difference (a matrix rebuilt from the same inputs).
    pub(crate) fn same_values(&self, values: &Arc<Vec<f64>>) -> bool {
        if Arc::ptr_eq(&self.values, values) {
            return true;
        }
        let (a, b) = (&self.values[..], &values[..]);
        if a.len() != b.len() {
            return false;
        }
        // Blocks of 64 compared without branches (so that they vectorise), one test per block.
        let (ca, cb) = (a.chunks_exact(64), b.chunks_exact(64));
        let tail = ca.remainder().iter().zip(cb.remainder()).all(|(x, y)| x.to_bits() == y.to_bits());
        tail && ca
            .zip(cb)
            .all(|(x, y)| x.iter().zip(y).fold(0u64, |acc, (p, q)| acc | (p.to_bits() ^ q.to_bits())) == 0)
    }

    /// Class-major rows with `None` where forbidden (the JSON form).
    pub fn to_rows(&self) -> Vec<Vec<Option<f64>>> {
        (0..self.n_classes).map(|k| (0..self.n_engines).map(|j| self.get(k, j)).collect()).collect()
    }
}

impl Serialize for NetworkMatrix {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_rows().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for NetworkMatrix {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let rows = Vec::<Vec<Option<f64>>>::deserialize(deserializer)?;
        Self::from_rows(&rows).map_err(serde::de::Error::custom)
    }
}

impl Problem {
    /// Parses and validates the JSON format described in the crate README.
    pub fn from_json(text: &str) -> Result<Self, ParseError> {
        let problem: Problem = serde_json::from_str(text)?;
        problem.validate()?;
        Ok(problem)
    }

    /// Checks every number and shape; the solver calls this first.
    pub fn validate(&self) -> Result<(), ProblemError> {
        self.validate_with(true)
    }

    /// [`Self::validate`], optionally without checking that ids are unique (the solver skips
    /// that sort when the ids are exactly those of its previous, validated, problem).
    pub(crate) fn validate_with(&self, check_ids: bool) -> Result<(), ProblemError> {
        if !(self.rho > 0.0 && self.rho <= 1.0) {
            return Err(ProblemError::Rho(self.rho));
        }
        for class in &self.classes {
            for (field, value) in [
                ("demand_rps", class.demand_rps),
                ("shed_penalty_ms", class.shed_penalty_ms),
                ("headroom_rps", class.headroom_rps),
            ] {
                if !non_negative(value) {
                    return Err(ProblemError::ClassField { id: class.id.clone(), field, value });
                }
            }
        }
        for engine in &self.engines {
            let id = || engine.id.clone();
            if !non_negative(engine.capacity_rps) {
                return Err(ProblemError::EngineField {
                    id: id(),
                    field: "capacity_rps",
                    value: engine.capacity_rps,
                });
            }
            match &engine.latency {
                Latency::Queueing { t0_ms, b_ms } => {
                    for (field, value) in [("t0_ms", *t0_ms), ("b_ms", *b_ms)] {
                        if !non_negative(value) {
                            return Err(ProblemError::EngineField { id: id(), field, value });
                        }
                    }
                }
                Latency::Piecewise(points) => {
                    if points.is_empty() {
                        return Err(ProblemError::Piecewise { id: id(), reason: "needs at least one point" });
                    }
                    if points.iter().any(|p| !non_negative(p[0]) || !non_negative(p[1])) {
                        return Err(ProblemError::Piecewise {
                            id: id(),
                            reason: "points must be finite and non-negative",
                        });
                    }
                }
            }
        }
        if check_ids {
            check_unique("class", self.classes.iter().map(|c| c.id.as_str()))?;
            check_unique("engine", self.engines.iter().map(|e| e.id.as_str()))?;
        }
        if self.network_ms.n_classes != self.classes.len() {
            return Err(ProblemError::NetworkRows {
                rows: self.network_ms.n_classes,
                classes: self.classes.len(),
            });
        }
        // An empty row list carries no column count: zero classes fit any number of engines.
        if self.network_ms.n_engines != self.engines.len() && !self.classes.is_empty() {
            return Err(ProblemError::NetworkColumns {
                columns: self.network_ms.n_engines,
                engines: self.engines.len(),
            });
        }
        Ok(())
    }

    pub fn total_demand_rps(&self) -> f64 {
        self.classes.iter().map(|c| c.demand_rps).sum()
    }
}

fn check_unique<'a>(
    kind: &'static str,
    ids: impl Iterator<Item = &'a str> + Clone,
) -> Result<(), ProblemError> {
    // Distinct hashes prove distinct ids, and sorting 8-byte hashes costs a fraction of sorting
    // the strings (12 M of a 200 × 20,000 cold solve's instructions for the engine ids). Only when
    // two hashes agree are the ids themselves sorted, so the id reported is the same.
    let mut hashes: Vec<u64> = ids.clone().map(fnv1a).collect();
    hashes.sort_unstable();
    if hashes.windows(2).all(|w| w[0] != w[1]) {
        return Ok(());
    }
    let mut sorted: Vec<&str> = ids.collect();
    sorted.sort_unstable();
    match sorted.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(ProblemError::DuplicateId { kind, id: w[0].to_owned() }),
        None => Ok(()),
    }
}

/// 64-bit FNV-1a hash of `text`'s bytes.
fn fnv1a(text: &str) -> u64 {
    text.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3))
}

/// Why a JSON problem could not be read. The message carries the cause (no separate source, so
/// that error chains print it once).
#[derive(Debug, Error)]
pub enum ParseError {
    #[error("malformed problem JSON: {0}")]
    Json(serde_json::Error),
    #[error("invalid problem: {0}")]
    Invalid(ProblemError),
}

impl From<serde_json::Error> for ParseError {
    fn from(e: serde_json::Error) -> Self {
        ParseError::Json(e)
    }
}

impl From<ProblemError> for ParseError {
    fn from(e: ProblemError) -> Self {
        ParseError::Invalid(e)
    }
}

//! `ilb-optimizer`: the routing optimizer. Given traffic classes with demand, engines with
//! capacity and convex load-dependent latency, and the class × engine network latency, it finds
//! the routing (and shedding) that minimises mean end-to-end latency, certifies how close to
//! optimal it is, and keeps the split stable from one solve to the next. Pure: no IO, no clock,
//! no threads. The math, the method and the measured figures are in this crate's README.

// No product function over `too-many-lines-threshold` (clippy.toml) lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// Index loops over parallel arrays (classes, engines, candidate entries) read as the math does.
#![allow(clippy::needless_range_loop)]
// The one exception, allowed where it is: a cache prefetch hint (`NetworkMatrix::prefetch_column`).
// Every other ilb crate forbids unsafe code outright.
#![deny(unsafe_code)]

mod aggregate;
mod certify;
mod coarse;
mod curve;
mod disaggregate;
pub mod gen;
mod linalg;
mod newton;
mod options;
mod pass;
mod problem;
mod solution;
mod solver;
mod stability;
mod warm;

pub use curve::Curve;
pub use options::SolverOptions;
pub use problem::{Class, Engine, Latency, NetworkMatrix, ParseError, Problem, ProblemError};
pub use solution::{EnginePlan, Route, Solution, WarmStart};
pub use solver::{solve, Solver};

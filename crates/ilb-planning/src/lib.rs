//! The ilb planning model: what the control plane knows about the fleet and how it plans from
//! it, with no I/O and no clock, so that the control plane's shell (`ilb-controlplane`) and the
//! fleet simulator run the same code, one on the wall clock and sockets, the other in virtual
//! time.
//!
//! Signals in:
//! - [`prom`]: a bounded, zero-copy Prometheus text-format (0.0.4 / OpenMetrics) parser.
//! - [`signals`]: vLLM, SGLang, llama.cpp and TGI metric names → one [`signals::EngineSample`]
//!   per model, and windowed figures (rates, latency means and quantiles) between two samples.
//! - [`smoothing`]: EWMA with an explicit time constant, staleness, counter rates.
//!
//! The fleet's state:
//! - [`config`]: the fleet configuration and its validation.
//! - [`profile`]: latency profiles L(y), their fit from observations, and the projection onto
//!   convex non-decreasing curves the optimizer requires.
//! - [`fleet`]: the [`Fleet`] (per-engine signals, per-cluster demand and round trips, health,
//!   penalties, holds, fitted curves) and [`fleet::members`], where engines come from.
//!
//! Planning and what it shows:
//! - [`plan`], [`planner`]: the fleet's [`PlanningInputs`] → optimizer problems (one per model)
//!   → warm-started solves → one routing snapshot per front-end cluster; the control loop and
//!   the fleet simulator both plan through [`Planner`].
//! - [`view`]: the latest plan with the numbers behind every weight.
//!
//! **Invariant:** no I/O, no clock, no tokio, no hyper: time comes in as an argument
//! ([`Now`], a `Duration` since an epoch the caller picks), and so do solve timings.

// No product function over `too-many-lines-threshold` (clippy.toml) lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unsafe code (the workspace's one `unsafe` is the optimizer's cache prefetch hint).
#![forbid(unsafe_code)]

pub mod config;
pub mod fleet;
pub mod plan;
pub mod planner;
pub mod profile;
pub mod prom;
pub mod signals;
pub mod smoothing;
pub mod view;

pub use config::FleetConfig;
pub use fleet::{EngineCurves, Fleet, Now, PlanningInputs};
pub use planner::{Planner, Round};

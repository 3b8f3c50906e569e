//! The ilb control plane: collect engine signals, smooth them, and model each engine's
//! latency as a function of load, for the optimizer.
//!
//! - [`prom`]: a bounded, zero-copy Prometheus text-format (0.0.4 / OpenMetrics) parser.
//! - [`signals`]: vLLM, SGLang, llama.cpp and TGI metric names → one [`signals::EngineSample`] per model,
//!   and windowed figures (rates, latency means and quantiles) between two samples.
//! - [`scrape`]: fetch and parse one engine's `/metrics` with a timeout and a body limit.
//! - [`smoothing`]: EWMA with an explicit time constant, staleness, counter rates.
//! - [`profile`]: latency profiles L(y), their fit from observations, and the projection
//!   onto convex non-decreasing curves the optimizer requires.
//! - [`plan`], [`planner`]: fleet state → optimizer problems (one per model) → warm-started
//!   solves → one routing snapshot per front-end cluster; the control loop and the fleet
//!   simulator both plan through [`planner::Planner`].
//! - [`clock`]: the only place that reads the clock.
//! - [`fleet::members`], [`discovery`], [`registrar`]: where engines come from (config file,
//!   registrations with leases, DNS discovery) and how the set changes while running;
//!   [`run::Reloader`] applies a new config file.
//!
//! **Invariant:** the control plane never depends on the data plane crate.

pub mod clock;
pub mod profile;
pub mod prom;
pub mod scrape;
pub mod signals;
pub mod smoothing;

pub mod api;
mod api_engines;
pub mod config;
pub mod dashboard;
pub mod discovery;
pub mod fleet;
pub mod guard;
pub mod plan;
pub mod planner;
pub mod publish;
pub mod registrar;
pub mod run;
pub mod telemetry;
pub mod view;

pub use config::FleetConfig;
pub use run::{ControlPlane, Reloader};

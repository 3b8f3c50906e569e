//! The ilb control plane's shell: the tasks, sockets and clock around the planning model
//! (`ilb-planning`). It scrapes engines, takes the data planes' reports and the engines'
//! registrations, discovers engines, runs the control loop that owns the model's `Fleet` and
//! `Planner`, and publishes snapshots and engine holds over its HTTP API.
//!
//! Modules, leaves first; each imports only modules above it:
//! - `clock`: the only place that reads the clock.
//! - [`scrape`]: fetch and parse one engine's `/metrics` with a timeout and a body limit.
//! - `publish`, `guard`: the published snapshots and engine holds. `telemetry`: `/metrics`
//!   from the model's `View`. `dashboard`: the web page.
//! - `events`: the control loop's closed `Event` enum and the handles of the tasks it starts.
//! - [`discovery`]: engines from DNS; `registrar`: the client side of registration
//!   ([`Registrar`]).
//! - `api`: the HTTP API (`engines.rs`: registration).
//! - `etcd`: etcd's v3 gRPC client, generated ahead of time from its protos.
//! - `election`: with etcd, one replica plans and publishes, the others publish its rounds.
//! - `run`: the control loop ([`ControlPlane`], [`Reloader`]).
//!
//! **Invariant:** the control plane never depends on the data plane crate.
//! **Invariant:** planning happens in `ilb-planning`; this crate only feeds it and publishes
//! what it plans.

// No product function over `too-many-lines-threshold` (clippy.toml) lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unsafe code (the workspace's one `unsafe` is the optimizer's cache prefetch hint).
#![forbid(unsafe_code)]

mod api;
mod clock;
mod dashboard;
pub mod discovery;
mod election;
mod etcd;
mod events;
mod guard;
mod publish;
mod registrar;
mod run;
pub mod scrape;
mod telemetry;

pub use api::ApiTls;
pub use dashboard::PAGE as DASHBOARD_PAGE;
pub use election::{EtcdOptions, VERSION_BASE};
pub use ilb_planning::FleetConfig;
pub use registrar::{Registrar, RegistrarError};
pub use run::{ControlPlane, Reloader};

//! One module per subcommand: its clap arguments, config loading and validation, and `run`.

pub mod control_plane;
pub mod data_plane;
pub mod demo;
mod demo_engines;
mod demo_fleet;
mod demo_scenario;
pub mod engine_sim;
pub mod epp;
pub mod explain;
pub mod optimize;
pub mod profile;
pub mod simulate;

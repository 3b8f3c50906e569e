//! `ilb`: the inference load balancer's one binary. Parses argv, reads files and env, validates
//! configuration, and hands typed configs to the library crates. See ARCHITECTURE.md.

// No product function over `too-many-lines-threshold` (clippy.toml) lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unsafe code (the workspace's one `unsafe` is the optimizer's cache prefetch hint).
#![forbid(unsafe_code)]

mod clock;
mod cmd;
mod config;
mod tls;
mod traffic;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ilb", version, about = "ilb, the inference load balancer for LLM fleets")]
struct Cli {
    /// Log level filter (tracing `EnvFilter` syntax, e.g. `info`, `ilb_dataplane=debug`).
    #[arg(long, global = true, default_value = "info", env = "ILB_LOG")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run engines, the control plane, data planes and conversation traffic in one process on loopback.
    Demo(cmd::demo::DemoArgs),
    /// Run the global control plane: signals, optimizer, published snapshots.
    ControlPlane(cmd::control_plane::ControlPlaneArgs),
    /// Run the data plane: an OpenAI-compatible proxy for one front-end cluster.
    DataPlane(cmd::data_plane::DataPlaneArgs),
    /// Run ilb as the Endpoint Picker (ext_proc gRPC) of an Envoy gateway, with the data plane's routing.
    Epp(cmd::epp::EppArgs),
    /// Explain the weights of one cluster and model, from a running control plane.
    Explain(cmd::explain::ExplainArgs),
    /// Run one or more simulated OpenAI-compatible inference engines.
    EngineSim(cmd::engine_sim::EngineSimArgs),
    /// Run a fleet scenario in virtual time and compare routing policies.
    Simulate(cmd::simulate::SimulateArgs),
    /// Solve one routing problem offline and print the solution as JSON.
    Optimize(cmd::optimize::OptimizeArgs),
    /// Measure an engine's latency against load and print its profile as fleet TOML.
    Profile(cmd::profile::ProfileArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(&cli.log) {
        eprintln!("error: {e:#}");
        return std::process::ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Demo(args) => cmd::demo::run(args),
        Command::ControlPlane(args) => cmd::control_plane::run(args),
        Command::DataPlane(args) => cmd::data_plane::run(args),
        Command::Epp(args) => cmd::epp::run(args),
        Command::EngineSim(args) => cmd::engine_sim::run(args),
        Command::Explain(args) => cmd::explain::run(args),
        Command::Optimize(args) => cmd::optimize::run(args),
        Command::Profile(args) => cmd::profile::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(filter: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|e| anyhow::anyhow!("invalid --log filter {filter:?}: {e}"))?;
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    Ok(())
}

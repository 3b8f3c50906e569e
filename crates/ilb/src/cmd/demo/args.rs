//! The flags of `ilb demo`, which every mode reads.

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Do not generate traffic (engines, control plane and data planes only).
    #[arg(long)]
    pub(crate) no_traffic: bool,
    /// Multiplies the generated demand (1.0 = the worked example: 90 % / 120 % / 40 % of engine A's capacity).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) load: f64,
    /// Control plane on this port, data planes on +1000.., engines on +2000...
    #[arg(long, default_value_t = 7000)]
    pub(crate) port_base: u16,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub(crate) seconds: Option<u64>,
    /// Seconds between console summaries.
    #[arg(long, default_value_t = 5)]
    pub(crate) report_every: u64,
    /// Run a fleet-simulator scenario live instead: its engines (at most 32) as simulated
    /// engines, its clusters as data planes, its demand as traffic. Demand and engine speed are
    /// scaled together (`--scale`) so the scenario fits this machine.
    #[arg(long, value_name = "FILE")]
    pub(crate) scenario: Option<std::path::PathBuf>,
    /// With --scenario: demand and engine throughput multiplier (default: whatever brings the
    /// scenario's initial demand to about 40 req/s). Latencies stretch by 1/scale.
    #[arg(long)]
    pub(crate) scale: Option<f64>,
    /// Run in front of an engine you already have (repeatable), instead of simulated ones: a
    /// control plane on `--port-base` and one data plane on `--port-base` + 1080, models
    /// discovered from each engine's `/v1/models`, no generated traffic.
    #[arg(long = "engine", value_name = "URL", conflicts_with = "scenario")]
    pub(crate) engines: Vec<String>,
    /// With `--engine`: the capacity planned for each engine, req/s (demand beyond the planned
    /// capacity of all engines is shed).
    #[arg(long, default_value_t = 50.0, value_name = "RPS")]
    pub(crate) engine_capacity_rps: f64,
}

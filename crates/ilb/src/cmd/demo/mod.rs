//! `ilb demo`: the whole system in one process on loopback — simulated engines in three regions
//! reproducing the brief's worked example (cluster B's demand exceeds its local engine, so part
//! of it should spill to engine C), the control plane, three data planes, and a traffic
//! generator of multi-turn conversations. Prints every URL, a `curl` and an `openai` snippet,
//! then a console summary every few seconds until Ctrl-C.
//!
//! `ilb demo --engine URL ...` runs the control plane and a data plane in front of engines the
//! user already has (vLLM, SGLang, llama.cpp, anything OpenAI-compatible): no simulated engines
//! and no generated traffic, models discovered from each engine's `/v1/models`.
//!
//! `ilb demo --scenario FILE` runs a fleet-simulator scenario live instead.
//!
//! Each mode is a module (`worked_example`, `engines`, `scenario`; the worked example's changing
//! fleet is `fleet`), on the flags (`args`) and the pieces they share (`stack`); this module
//! only checks the flags and picks the mode, so imports point one way (ARCHITECTURE.md lists the
//! order, `crates/ilb/tests/module_layers.rs` checks it).

mod args;
mod engines;
mod fleet;
mod scenario;
mod stack;
mod worked_example;

pub use args::DemoArgs;

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.load.is_finite() && args.load >= 0.0, "--load must be a non-negative number");
    anyhow::ensure!(args.port_base <= 60_000, "--port-base must leave room for +2002");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if !args.engines.is_empty() {
        return runtime.block_on(engines::run(args));
    }
    match args.scenario.clone() {
        Some(path) => runtime.block_on(scenario::run(args, &path)),
        None => runtime.block_on(worked_example::run(args)),
    }
}

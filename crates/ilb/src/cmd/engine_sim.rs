//! `ilb engine-sim` (placeholder until its issue lands).

#[derive(clap::Args)]
pub struct EngineSimArgs {}

pub fn run(_args: EngineSimArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}

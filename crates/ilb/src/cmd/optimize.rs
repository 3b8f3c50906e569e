//! `ilb optimize` (placeholder until its issue lands).

#[derive(clap::Args)]
pub struct OptimizeArgs {}

pub fn run(_args: OptimizeArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}

//! `ilb simulate` (placeholder until the fleet simulator lands).

#[derive(clap::Args)]
pub struct SimulateArgs {}

pub fn run(_args: SimulateArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}

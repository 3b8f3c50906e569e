//! `ilb data-plane` (placeholder until its issue lands).

#[derive(clap::Args)]
pub struct DataPlaneArgs {}

pub fn run(_args: DataPlaneArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}

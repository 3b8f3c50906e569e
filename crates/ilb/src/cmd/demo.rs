//! `ilb demo` (placeholder until its issue lands).

#[derive(clap::Args)]
pub struct DemoArgs {}

pub fn run(_args: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}

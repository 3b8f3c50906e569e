//! `ilb engine-sim`: serve one or more simulated OpenAI-compatible engines on consecutive
//! ports until Ctrl-C. Each answers `GET /health` (the probe vLLM's and SGLang's routers send),
//! the OpenAI endpoints, `/metrics` in vLLM's names, and `/admin/faults`.
//!
//! With `--register CONTROL_PLANE_URL` each engine registers itself (`POST /v1/engines`) and
//! renews its lease while it runs; on Ctrl-C it deregisters first, then finishes the requests
//! it has (as a drained engine should) before it stops.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use ilb_controlplane::Registrar;
use ilb_engine_sim::{EngineConfig, EngineHandle, HardwareProfile};
use ilb_planning::fleet::members::Registration;
use std::time::Duration;

#[derive(clap::Args)]
pub struct EngineSimArgs {
    /// Address of the first engine; engine `i` listens on the next ports (port + i).
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Number of engines.
    #[arg(long, default_value_t = 1)]
    count: usize,
    /// Served model name (requests naming another model get a 404).
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// Hardware profile: l4, a100 or h100.
    #[arg(long, default_value = "a100")]
    profile: String,
    /// TOML file whose fields override the chosen profile's (e.g. `replicas = 4`).
    #[arg(long)]
    profile_file: Option<PathBuf>,
    /// Answer at once without the latency model (for load tests of what sits in front).
    #[arg(long)]
    no_latency: bool,
    /// Seed for fault draws and output text; engine `i` uses seed + i.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Engine id prefix; engine `i` is `<id>-<i>`.
    #[arg(long, default_value = "sim")]
    id: String,
    /// Serve https with this PEM certificate chain (with --tls-key); every engine uses it, and
    /// the files are watched and reloaded when they change.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Tokio worker threads; 1 runs a single-threaded runtime.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Register every engine with this control plane (base URL) and renew the lease while it
    /// runs; deregister on Ctrl-C. Repeat for control-plane replicas: each gets every
    /// registration and heartbeat, so a failover forgets no engine.
    #[arg(long, value_name = "CONTROL_PLANE_URL")]
    register: Vec<String>,
    /// Bearer token for registration (the control plane's `control_plane.token`).
    #[arg(long, env = "ILB_TOKEN", default_value = "", hide_env_values = true)]
    token: String,
    /// Region the engines register in (a `[[regions]]` id of the control plane, if it has any).
    #[arg(long, default_value = "local")]
    region: String,
    /// Control-plane profile the engines register with (a `[profiles.NAME]`); default: --profile.
    #[arg(long, value_name = "NAME")]
    register_profile: Option<String>,
    /// Lease length, s: without a renewal for this long the control plane drops the engine.
    #[arg(long, default_value_t = 10.0)]
    ttl_s: f64,
}

pub fn run(args: EngineSimArgs) -> anyhow::Result<()> {
    if args.count == 0 {
        bail!("--count must be at least 1");
    }
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let mut profile = HardwareProfile::by_name(&args.profile).context("--profile")?;
    if let Some(path) = &args.profile_file {
        profile = override_profile(profile, path)?;
    }
    profile.validate().context("hardware profile")?;
    let section = crate::tls::ListenerTlsSection {
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        ..Default::default()
    };
    let listener = section.build("engine-sim --tls-cert", false)?;
    let config = EngineConfig {
        tls: listener.as_ref().map(|l| l.tls.clone()),
        id: args.id.as_str().into(),
        model: args.model.as_str().into(),
        profile,
        latency: !args.no_latency,
        seed: args.seed,
        ..EngineConfig::default()
    };
    let runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads).enable_all().build()
    }
    .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let engines = ilb_engine_sim::spawn_many(config, args.listen, args.count).await?;
        let watcher = listener.map(|l| tokio::spawn(l.watch(std::time::Duration::from_secs(1))));
        let stop = crate::cmd::stop_signal();
        let mut stdout = std::io::stdout().lock();
        for engine in &engines {
            writeln!(stdout, "engine {}: {}", engine.id(), engine.url())?;
        }
        stdout.flush()?;
        drop(stdout);
        let mut registrars = Vec::new();
        let profile = args.register_profile.clone().unwrap_or_else(|| args.profile.clone());
        for cp in &args.register {
            for engine in &engines {
                let registration = registration(engine, &args.model, &args.region, &profile, args.ttl_s);
                let mut registrar = Registrar::spawn(cp, &args.token, registration);
                if !registrar.registered(Duration::from_secs(10)).await {
                    tracing::warn!(engine = %engine.id(), "not registered yet; retrying in the background");
                }
                registrars.push(registrar);
            }
        }
        stop.await;
        leave(registrars, &engines).await;
        tracing::info!("shutting down engines");
        if let Some(watcher) = watcher {
            watcher.abort();
        }
        for engine in engines {
            engine.shutdown().await;
        }
        Ok(())
    })
}

/// What an engine of this simulator registers as.
pub fn registration(
    engine: &EngineHandle,
    model: &str,
    region: &str,
    profile: &str,
    ttl_s: f64,
) -> Registration {
    Registration {
        id: engine.id().to_string(),
        url: engine.url(),
        model: model.to_owned(),
        region: region.to_owned(),
        profile: profile.to_owned(),
        replicas: engine.config().profile.replicas,
        capabilities: Vec::new(),
        residency: Vec::new(),
        capacity_rps: None,
        max_in_flight: None,
        ttl_s,
    }
}

/// Deregisters, then waits (at most a minute) until the engines have finished what they were
/// given: data planes stop sending new requests from their next snapshot on.
pub async fn leave(registrars: Vec<Registrar>, engines: &[EngineHandle]) {
    for registrar in registrars {
        if let Err(e) = registrar.deregister().await {
            tracing::warn!(error = %e, "deregistration failed; the lease will run out");
        }
    }
    let deadline = crate::clock::now() + Duration::from_secs(60);
    // The data planes need a snapshot round to stop sending; then the engines run dry.
    tokio::time::sleep(Duration::from_secs(1)).await;
    while crate::clock::now() < deadline
        && engines.iter().any(|e| {
            let stats = e.stats();
            stats.running + stats.waiting > 0
        })
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Applies the fields of a TOML file on top of `base`; unknown fields are an error.
fn override_profile(base: HardwareProfile, path: &Path) -> anyhow::Result<HardwareProfile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let overrides: toml::Table = text.parse().with_context(|| format!("parsing {}", path.display()))?;
    let mut merged = toml::Table::try_from(&base).context("encoding the base profile")?;
    merged.extend(overrides);
    merged.try_into().with_context(|| format!("profile fields in {}", path.display()))
}

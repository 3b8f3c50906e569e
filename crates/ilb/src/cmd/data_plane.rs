//! `ilb data-plane`: run the proxy for one front-end cluster.
//!
//! Snapshots come from exactly one source: a control plane (`--control-plane URL --cluster C`),
//! a file (`--snapshot FILE`, reloaded when it changes), or quick mode (`--engine URL ...`,
//! equal weights, models discovered from each engine's `/v1/models`).

use crate::config::{self, DataPlaneSection};
use anyhow::{bail, Context};
use ilb_core::snapshot::Snapshot;
use ilb_dataplane::report::ReportConfig;
use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct DataPlaneArgs {
    /// Address to serve the OpenAI-compatible API on.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Quick mode: an engine base URL (repeatable); equal weights, models from its /v1/models.
    #[arg(long = "engine", value_name = "URL")]
    engines: Vec<String>,
    /// Install routing snapshots from this JSON file, reloading it when it changes.
    #[arg(long, value_name = "FILE")]
    snapshot: Option<PathBuf>,
    /// Pull snapshots from this control plane (needs --cluster); repeat for replicas: pull from
    /// one, fail over to the next, report to all.
    #[arg(long, value_name = "URL")]
    control_plane: Vec<String>,
    /// The front-end cluster this data plane serves.
    #[arg(long)]
    cluster: Option<String>,
    /// TOML config file; its `[data_plane]` table sets everything the flags set, and more.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Terminate TLS on the client listener with this PEM certificate chain (with --tls-key);
    /// the files are watched and reloaded when they change.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA bundle trusted for https engines, added to the platform's roots.
    #[arg(long, value_name = "FILE")]
    engine_ca: Option<PathBuf>,
    /// Trust only --engine-ca for engines, not the platform's roots.
    #[arg(long, requires = "engine_ca")]
    engine_ca_only: bool,
    /// PEM client certificate presented to https engines that ask for one (with --engine-key).
    #[arg(long, value_name = "FILE", requires = "engine_key")]
    engine_cert: Option<PathBuf>,
    /// PEM private key of --engine-cert.
    #[arg(long, value_name = "FILE", requires = "engine_cert")]
    engine_key: Option<PathBuf>,
    /// PEM CA bundle trusted for an https control plane, added to the platform's roots.
    #[arg(long, value_name = "FILE")]
    control_plane_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS with the control plane (with --client-key).
    #[arg(long, value_name = "FILE", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    client_key: Option<PathBuf>,
    /// Refuse snapshots and engines with plain http:// URLs.
    #[arg(long)]
    https_only: bool,
    /// Worker threads (default: one per available core). 1 runs a single-threaded runtime,
    /// the cheapest way to use one pinned core.
    #[arg(long)]
    threads: Option<usize>,
}

pub fn run(args: DataPlaneArgs) -> anyhow::Result<()> {
    let mut section = match &args.config {
        Some(path) => config::load(path)?.data_plane.unwrap_or_default(),
        None => DataPlaneSection::default(),
    };
    // Flags override the file.
    if let Some(listen) = args.listen {
        section.listen = Some(listen.to_string());
    }
    if !args.engines.is_empty() {
        section.engines = args.engines.clone();
    }
    if let Some(path) = &args.snapshot {
        section.snapshot_file = Some(path.clone());
    }
    if !args.control_plane.is_empty() {
        section.control_plane = Some(config::UrlList::Many(args.control_plane.clone()));
    }
    if let Some(cluster) = &args.cluster {
        section.cluster = Some(cluster.clone());
    }
    if args.tls_cert.is_some() {
        section.tls.cert = args.tls_cert.clone();
        section.tls.key = args.tls_key.clone();
    }
    if args.engine_ca.is_some() {
        section.engine_tls.ca = args.engine_ca.clone();
    }
    if args.engine_ca_only {
        section.engine_tls.ca_only = Some(true);
    }
    if args.engine_cert.is_some() {
        section.engine_tls.cert = args.engine_cert.clone();
        section.engine_tls.key = args.engine_key.clone();
    }
    if args.control_plane_ca.is_some() {
        section.control_plane_tls.ca = args.control_plane_ca.clone();
    }
    if args.client_cert.is_some() {
        section.control_plane_tls.cert = args.client_cert.clone();
        section.control_plane_tls.key = args.client_key.clone();
    }
    if args.https_only {
        section.https_only = Some(true);
    }
    // TLS files are read here, before any port is bound; a bad file stops the start.
    let listener = section.tls.build("data_plane.tls", false)?;
    let engine_tls = section.engine_tls.build("data_plane.engine_tls")?;
    let control_plane_tls = section.control_plane_tls.build("data_plane.control_plane_tls")?;
    let control_planes = section.control_plane.as_ref().map(|c| c.urls()).unwrap_or_default();
    let reports = control_planes.first().map(|cp| {
        let instance = format!("{}-{}", section.cluster.as_deref().unwrap_or("local"), std::process::id());
        let mut reports = ReportConfig::new(format!("{}/v1/reports", cp.trim_end_matches('/')), instance);
        reports.also =
            control_planes[1..].iter().map(|cp| format!("{}/v1/reports", cp.trim_end_matches('/'))).collect();
        reports.token = section.token.clone();
        if let Some(ms) = section.report_interval_ms {
            reports.interval = Duration::from_millis(ms.max(100));
        }
        reports
    });
    let (mut config, source, file) = section.validate()?;
    config.engine_tls = Some(engine_tls);
    config.control_plane_tls = Some(control_plane_tls);
    config.listener_tls = listener.as_ref().map(|l| l.tls.clone());
    let runtime = match args.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(1) => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        Some(n) => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build()?,
        None => tokio::runtime::Builder::new_multi_thread().enable_all().build()?,
    };
    runtime.block_on(serve(config, source, file, reports, listener))
}

async fn serve(
    config: DataPlaneConfig,
    source: SnapshotSource,
    file: Option<PathBuf>,
    reports: Option<ReportConfig>,
    listener: Option<crate::tls::Listener>,
) -> anyhow::Result<()> {
    let listen = config.listen;
    let data_plane = DataPlane::start_with_reports(config, source, reports)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    println!("data-plane: {}", data_plane.url());
    let _watcher = listener.map(|l| AbortOnDrop(tokio::spawn(l.watch(Duration::from_secs(1)))));
    // The snapshot file is polled once a second and reinstalled when its mtime changes.
    let mut last_modified = None;
    loop {
        if let Some(path) = &file {
            let modified = modified(path);
            if modified != last_modified || last_modified.is_none() {
                last_modified = modified;
                let installed = load_snapshot(path).and_then(|s| Ok(data_plane.install(&s)?));
                if let Err(e) = installed {
                    tracing::warn!(file = %path.display(), error = %format!("{e:#}"), "snapshot not installed, keeping the last good one");
                }
            }
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    data_plane.shutdown().await;
    Ok(())
}

/// Stops a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

pub fn load_snapshot(path: &Path) -> anyhow::Result<Snapshot> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Snapshot::from_json(&bytes).with_context(|| format!("invalid snapshot in {}", path.display()))
}

impl DataPlaneSection {
    /// Checks the section and turns it into the library's typed config.
    pub fn validate(self) -> anyhow::Result<(DataPlaneConfig, SnapshotSource, Option<PathBuf>)> {
        let listen: SocketAddr = self
            .listen
            .as_deref()
            .unwrap_or("127.0.0.1:8080")
            .parse()
            .context("data_plane.listen: expected host:port, e.g. 127.0.0.1:8080")?;
        let mut config = DataPlaneConfig::new(listen);
        config.cluster = self.cluster.clone().map(ilb_core::ClusterId::new);
        if let Some(b) = self.max_body_bytes {
            if b == 0 {
                bail!("data_plane.max_body_bytes: must be positive");
            }
            config.max_body_bytes = b;
        }
        if let Some(a) = self.max_attempts {
            if a == 0 {
                bail!("data_plane.max_attempts: must be at least 1");
            }
            config.max_attempts = a;
        }
        if let Some(c) = self.max_connections {
            config.max_connections = c.max(1);
        }
        if let Some(ms) = self.queue_wait_ms {
            config.queue_wait = Duration::from_millis(ms);
        }
        if let Some(n) = self.max_waiting {
            config.max_waiting = n;
        }
        if let Some(n) = self.affinity_entries {
            if n > 1 << 26 {
                bail!("data_plane.affinity_entries: at most 67108864 (512 MiB of table)");
            }
            config.affinity_entries = n;
        }
        if let Some(ms) = self.affinity_ttl_ms {
            if !(1000..=65_535_000).contains(&ms) {
                bail!("data_plane.affinity_ttl_ms: must be between 1000 and 65535000 (the table counts seconds in 16 bits)");
            }
            config.affinity_ttl = Duration::from_millis(ms);
        }
        if let Some(on) = self.place_new_keys_by_load {
            config.place_new_keys_by_load = on;
        }
        if let Some(ms) = self.response_ttl_ms {
            if !(1000..=65_535_000).contains(&ms) {
                bail!("data_plane.response_ttl_ms: must be between 1000 and 65535000 (the table counts seconds in 16 bits)");
            }
            config.response_ttl = Duration::from_millis(ms);
        }
        if let Some(t) = self.create_traceparent {
            config.create_traceparent = t;
        }
        config.https_only = self.https_only.unwrap_or(false);
        let budget = &mut config.retry_budget;
        for (name, value, slot) in [
            ("retry_ratio", self.retry_ratio, &mut budget.ratio),
            ("retry_floor_ratio", self.retry_floor_ratio, &mut budget.floor_ratio),
            ("retry_min_per_sec", self.retry_min_per_sec, &mut budget.min_per_sec),
        ] {
            if let Some(v) = value {
                if !(v.is_finite() && v >= 0.0) {
                    bail!("data_plane.{name}: must be a non-negative number");
                }
                *slot = v;
            }
        }
        if budget.floor_ratio > budget.ratio {
            bail!("data_plane.retry_floor_ratio: must not exceed retry_ratio");
        }
        let t = &mut config.timeouts;
        for (name, value, slot) in [
            ("connect_ms", self.timeouts.connect_ms, &mut t.connect),
            ("first_byte_ms", self.timeouts.first_byte_ms, &mut t.first_byte),
            ("idle_ms", self.timeouts.idle_ms, &mut t.idle),
            ("client_body_ms", self.timeouts.client_body_ms, &mut t.client_body),
            ("header_read_ms", self.timeouts.header_read_ms, &mut t.header_read),
        ] {
            if let Some(ms) = value {
                if ms == 0 {
                    bail!("data_plane.timeouts.{name}: must be positive");
                }
                *slot = Duration::from_millis(ms);
            }
        }
        let sources = [!self.engines.is_empty(), self.snapshot_file.is_some(), self.control_plane.is_some()];
        let source = match sources {
            [true, false, false] => {
                for url in &self.engines {
                    ilb_core::snapshot::check_engine_url(url)
                        .map_err(|why| anyhow::anyhow!("engine url '{url}' {why}"))?;
                    if config.https_only && !url.starts_with("https://") {
                        bail!("engine url '{url}' is plain http and data_plane.https_only is set");
                    }
                }
                SnapshotSource::Discover { engines: self.engines, interval: Duration::from_secs(30) }
            }
            [false, true, false] => SnapshotSource::Manual,
            [false, false, true] => {
                let cluster = self
                    .cluster
                    .as_deref()
                    .context("--control-plane needs --cluster (data_plane.cluster)")?;
                let urls: Vec<String> = self
                    .control_plane
                    .map(|c| c.urls())
                    .unwrap_or_default()
                    .iter()
                    .map(|base| format!("{}/v1/snapshots/{cluster}", base.trim_end_matches('/')))
                    .collect();
                if urls.is_empty() {
                    bail!("data_plane.control_plane: needs at least one URL");
                }
                SnapshotSource::Replicas { urls, interval: Duration::from_secs(1), long_poll: true }
            }
            [false, false, false] => {
                bail!("no snapshot source: give --engine URL, --snapshot FILE or --control-plane URL")
            }
            _ => bail!("give only one snapshot source: --engine, --snapshot or --control-plane"),
        };
        Ok((config, source, self.snapshot_file))
    }
}

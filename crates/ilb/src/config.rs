//! The one TOML config file: raw, serde-parsed sections with `deny_unknown_fields`. Each
//! subcommand validates its section into the typed config of its library crate before any port
//! is bound, with errors that name the field. Doc comments here are the user documentation.

use anyhow::Context;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The whole file: a `[data_plane]` table for `ilb data-plane`, and the fleet description
/// (`[control_plane]`, `[[regions]]`, `[network]`, `[[clusters]]`, `[[classes]]`,
/// `[profiles.NAME]`, `[[engines]]`) for `ilb control-plane`; see
/// `ilb_controlplane::config::FleetConfig` for those tables' fields.
#[derive(Debug, Default)]
pub struct ConfigFile {
    pub data_plane: Option<DataPlaneSection>,
    pub fleet: Option<ilb_controlplane::FleetConfig>,
    /// `[control_plane.tls]`: TLS on the control plane's API and dashboard listener (`cert`,
    /// `key`, both watched; `client_ca` and `client_auth` to verify data planes' certificates).
    pub control_plane_tls: crate::tls::ListenerTlsSection,
    /// `[control_plane.engine_tls]`: trust for https engines' `/metrics` (`ca`, `ca_only`) and a
    /// client certificate if they ask for one (`cert`, `key`).
    pub control_plane_engine_tls: crate::tls::ClientTlsSection,
}

/// `[data_plane]`: one front-end cluster's proxy.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataPlaneSection {
    /// Address for the OpenAI-compatible API, e.g. `"0.0.0.0:8080"`. Default `127.0.0.1:8080`.
    pub listen: Option<String>,
    /// The front-end cluster served, e.g. `"eu-west"`; snapshots for other clusters are refused.
    pub cluster: Option<String>,
    /// Control plane base URL, e.g. `"http://cp:7000"`, or a list of replicas'
    /// (`["http://cp-0:7000", "http://cp-1:7000"]`): snapshots come from
    /// `GET {control_plane}/v1/snapshots/{cluster}` (long-polled) of one replica, the next one
    /// when it stops answering; reports go to every replica.
    pub control_plane: Option<UrlList>,
    /// A snapshot JSON file to route on, reloaded when it changes.
    pub snapshot_file: Option<PathBuf>,
    /// Quick mode: engine base URLs routed with equal weights.
    #[serde(default)]
    pub engines: Vec<String>,
    /// Largest request body in bytes; default 16777216 (16 MiB).
    pub max_body_bytes: Option<usize>,
    /// Most engines tried per request (first attempt plus retries); default 3.
    pub max_attempts: Option<u32>,
    /// Most open client connections; default 10000.
    pub max_connections: Option<usize>,
    /// Longest wait for a free engine slot when every engine is at its `max_in_flight`, ms
    /// (critical requests wait twice as long); default 2000.
    pub queue_wait_ms: Option<u64>,
    /// Most requests waiting for a slot at once; default 1024.
    pub max_waiting: Option<usize>,
    /// Retries allowed per request while fleet utilisation is at most 0.5; default 0.2.
    pub retry_ratio: Option<f64>,
    /// Retries allowed per request at 95 % utilisation and above; default 0.02.
    pub retry_floor_ratio: Option<f64>,
    /// Retries per second always allowed; default 1.
    pub retry_min_per_sec: Option<f64>,
    /// Entries of the session-affinity table, which keeps a conversation on the engine that
    /// served its last turn while that engine keeps a weight and room (0 turns it off);
    /// default 262144 (2 MiB).
    pub affinity_entries: Option<usize>,
    /// How long the session-affinity table remembers a key, ms; default 600000 (10 minutes).
    pub affinity_ttl_ms: Option<u64>,
    /// How long the data plane remembers which engine stored a Responses API response, so a
    /// request naming it as `previous_response_id` reaches that engine, ms; default 14400000
    /// (4 hours), at most 65535000.
    pub response_ttl_ms: Option<u64>,
    /// Place new conversations (keys the affinity table has never seen) on the less loaded of
    /// the hash's two first candidates, per unit of weight, and let a follow-up leave an engine
    /// more than twice as loaded per unit of weight as its hash pick; default false (new
    /// conversations go where the hash says).
    pub place_new_keys_by_load: Option<bool>,
    /// Create a W3C `traceparent` for requests without one; default true.
    pub create_traceparent: Option<bool>,
    /// How often to report to the control plane, ms; default 1000.
    pub report_interval_ms: Option<u64>,
    /// Bearer token for the control plane's report endpoint, if it requires one.
    pub token: Option<String>,
    /// Timeouts; see `[data_plane.timeouts]`.
    #[serde(default)]
    pub timeouts: TimeoutsSection,
    /// Refuse snapshots (and quick-mode engines) with plain `http://` engine URLs; default false.
    pub https_only: Option<bool>,
    /// `[data_plane.tls]`: terminate TLS on the client listener (`cert`, `key`; both watched
    /// and reloaded when they change).
    #[serde(default)]
    pub tls: crate::tls::ListenerTlsSection,
    /// `[data_plane.engine_tls]`: trust for https engines (`ca`, `ca_only`) and a client
    /// certificate if engines ask for one (`cert`, `key`).
    #[serde(default)]
    pub engine_tls: crate::tls::ClientTlsSection,
    /// `[data_plane.control_plane_tls]`: trust for an https control plane (`ca`, `ca_only`) and
    /// the client certificate it verifies (`cert`, `key`: mutual TLS).
    #[serde(default)]
    pub control_plane_tls: crate::tls::ClientTlsSection,
}

/// One URL or a list of them.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum UrlList {
    One(String),
    Many(Vec<String>),
}

impl UrlList {
    pub fn urls(&self) -> Vec<String> {
        match self {
            UrlList::One(url) => vec![url.clone()],
            UrlList::Many(urls) => urls.clone(),
        }
    }
}

/// `[data_plane.timeouts]`, all in milliseconds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsSection {
    /// TCP connect to an engine; default 2000.
    pub connect_ms: Option<u64>,
    /// Request sent → engine's response headers; default 60000.
    pub first_byte_ms: Option<u64>,
    /// Longest gap between two chunks of an engine's response; default 60000.
    pub idle_ms: Option<u64>,
    /// Time for a client to send its body; default 30000.
    pub client_body_ms: Option<u64>,
    /// Time for a client to send its request head; default 10000.
    pub header_read_ms: Option<u64>,
}

pub fn load(path: &Path) -> anyhow::Result<ConfigFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?;
    parse(&text).with_context(|| format!("invalid config {}", path.display()))
}

/// Parses the file into its sections; each is checked with its field names in errors.
pub fn parse(text: &str) -> anyhow::Result<ConfigFile> {
    let mut table: toml::Table = toml::from_str(text)?;
    let data_plane = match table.remove("data_plane") {
        Some(v) => Some(v.try_into::<DataPlaneSection>().context("in [data_plane]")?),
        None => None,
    };
    // The TLS tables name files, which only the binary reads: taken out here, before the
    // fleet tables go to the control plane crate.
    let mut control_plane_tls = crate::tls::ListenerTlsSection::default();
    let mut control_plane_engine_tls = crate::tls::ClientTlsSection::default();
    if let Some(toml::Value::Table(cp)) = table.get_mut("control_plane") {
        if let Some(v) = cp.remove("tls") {
            control_plane_tls = v.try_into().context("in [control_plane.tls]")?;
        }
        if let Some(v) = cp.remove("engine_tls") {
            control_plane_engine_tls = v.try_into().context("in [control_plane.engine_tls]")?;
        }
    }
    let fleet = if table.is_empty() {
        None
    } else {
        let fleet: ilb_controlplane::FleetConfig = toml::Value::Table(table).try_into()?;
        fleet.validate()?;
        Some(fleet)
    };
    Ok(ConfigFile { data_plane, fleet, control_plane_tls, control_plane_engine_tls })
}

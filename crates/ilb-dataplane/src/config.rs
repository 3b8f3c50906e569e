//! The data plane's configuration: the typed [`DataPlaneConfig`], where snapshots come from
//! ([`SnapshotSource`]) and where reports go ([`ReportConfig`]); and the `[data_plane]` table of
//! the TOML file ([`DataPlaneSection`], unknown fields are errors), which
//! [`DataPlaneSection::validate`] checks and turns into them, naming the offending field. The
//! binary reads the file and the certificate files its TLS tables name, and lets flags
//! override the table; this crate never reads files or the environment. Doc comments of the
//! section types are the user documentation (`docs/config.md` is generated from them).

use crate::budget::RetryBudgetConfig;
use crate::engines::GuardConfig;
use ilb_core::ClusterId;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct DataPlaneConfig {
    pub listen: SocketAddr,
    /// A second listener for the operator: `/metrics`, `/debug/route` and `/health`. When set,
    /// the client listener no longer serves `/metrics` and `/debug/route`; when not, they stay
    /// on the client listener.
    pub admin_listen: Option<SocketAddr>,
    /// How much the `x-ilb-route` response header tells clients (default [`RouteHeader::Id`]).
    pub route_header: RouteHeader,
    /// When set, snapshots for any other cluster are rejected.
    pub cluster: Option<ClusterId>,
    /// Largest request body accepted, in bytes (default 16 MiB); larger ones get 413.
    pub max_body_bytes: usize,
    /// Most client connections open at once; further connections wait in the accept backlog.
    pub max_connections: usize,
    /// Most engines one request is sent to (first try plus retries).
    pub max_attempts: u32,
    pub timeouts: Timeouts,
    pub guard: GuardConfig,
    /// How often ejected engines are checked for a due health probe.
    pub probe_interval: Duration,
    pub retry_budget: RetryBudgetConfig,
    /// Longest a request waits for a slot when every candidate engine is at its
    /// `max_in_flight`; critical requests wait twice as long. Then it is shed (503).
    pub queue_wait: Duration,
    /// Most requests waiting for a slot at once; beyond it, non-critical requests are shed at once.
    pub max_waiting: usize,
    /// Add a W3C `traceparent` header to requests that arrive without one (existing ones pass
    /// through unchanged). Default true.
    pub create_traceparent: bool,
    /// Idle engine connections: how long they are kept and how many per engine.
    pub upstream_pool: crate::upstream::PoolConfig,
    /// Session affinity: entries of the table that remembers each affinity key's last engine
    /// (0 turns it off; see `ilb_core::affinity`), and how long an entry lasts.
    pub affinity_entries: usize,
    pub affinity_ttl: Duration,
    /// How long the data plane remembers which engine stored a response (Responses API
    /// `previous_response_id` routing; a table of `affinity_entries` entries). At most about
    /// 18 hours (65,535 s); default 4 hours.
    pub response_ttl: Duration,
    /// Place a key the affinity table has never seen (a new conversation) on the less loaded,
    /// per unit of weight, of the hash's first two candidates, and let a follow-up leave an
    /// engine far more loaded per unit of weight than its hash pick
    /// (`ilb_core::table::ClassTable::select`). Default true: on the fleet simulator's nine
    /// planning scenarios it lowered ilb's mean latency on every scenario and seed (three
    /// seeds; −13 to −14 % on `far-regions`, −3 to −23 % on `grey-engine`, −0.4 % on
    /// `residency`) for about one point of prefix-cache hit rate; false hashes new
    /// conversations blindly.
    pub place_new_keys_by_load: bool,
    /// TLS to https engines (requests, probes, discovery, round trips): trust roots and an
    /// optional client certificate. `None`: no trusted roots, so every https engine fails its
    /// handshake with `unknown_issuer`.
    pub engine_tls: Option<ilb_tls::ClientTls>,
    /// TLS to an https control plane (snapshots, reports), with the client certificate it
    /// may ask for. `None`: no trusted roots.
    pub control_plane_tls: Option<ilb_tls::ClientTls>,
    /// Terminate TLS on the client listener with this (rotatable) certificate.
    pub listener_tls: Option<ilb_tls::ServerTls>,
    /// Refuse snapshots that name a plain `http://` engine.
    pub https_only: bool,
    /// The other data planes of this cluster (`replicas`): base URLs of their admin listener
    /// (else client listener). An `http://` host name stands for every address it resolves to.
    /// Empty: this data plane decides alone.
    pub peers: Vec<String>,
    /// The longest time between two messages to the peers (they also go out, at most every
    /// `replicas::MIN_GAP`, whenever a request starts or ends).
    pub peer_interval: Duration,
    /// Longest a delivery to one peer may take; a peer still busy with the previous one is
    /// skipped.
    pub peer_timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct Timeouts {
    /// TCP connect to an engine.
    pub connect: Duration,
    /// From sending a request to an engine until its response headers arrive.
    pub first_byte: Duration,
    /// Longest silence between two chunks of an engine's response body.
    pub idle: Duration,
    /// Time a client has to send its whole request body.
    pub client_body: Duration,
    /// Time a client has to send its request head (slowloris guard).
    pub header_read: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            first_byte: Duration::from_secs(60),
            idle: Duration::from_secs(60),
            client_body: Duration::from_secs(30),
            header_read: Duration::from_secs(10),
        }
    }
}

/// How much the `x-ilb-route` response header tells clients about the route a request took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RouteHeader {
    /// `engine=ID; class=C; weight=W; snapshot=V; model=M; attempts=N`: the engine, its class,
    /// its planned weight and the snapshot (for operators and demos; it shows clients the plan).
    Full,
    /// `engine=ID; attempts=N`: which engine answered, by its snapshot id (in quick mode the id
    /// is the engine's `host:port`).
    #[default]
    Id,
    /// No header.
    Off,
}

impl RouteHeader {
    /// `"full"`, `"id"` or `"off"`.
    pub fn parse(value: &str) -> Option<RouteHeader> {
        match value {
            "full" => Some(RouteHeader::Full),
            "id" => Some(RouteHeader::Id),
            "off" => Some(RouteHeader::Off),
            _ => None,
        }
    }
}

impl DataPlaneConfig {
    pub fn new(listen: SocketAddr) -> DataPlaneConfig {
        DataPlaneConfig {
            listen,
            admin_listen: None,
            route_header: RouteHeader::default(),
            cluster: None,
            max_body_bytes: 16 << 20,
            max_connections: 10_000,
            max_attempts: 3,
            timeouts: Timeouts::default(),
            guard: GuardConfig::default(),
            probe_interval: Duration::from_millis(250),
            retry_budget: Default::default(),
            queue_wait: Duration::from_secs(2),
            max_waiting: 1024,
            create_traceparent: true,
            upstream_pool: Default::default(),
            affinity_entries: ilb_core::affinity::DEFAULT_ENTRIES,
            affinity_ttl: Duration::from_secs(u64::from(ilb_core::affinity::DEFAULT_TTL_S)),
            response_ttl: Duration::from_secs(4 * 3600),
            place_new_keys_by_load: true,
            engine_tls: None,
            control_plane_tls: None,
            listener_tls: None,
            https_only: false,
            peers: Vec::new(),
            peer_interval: Duration::from_millis(200),
            peer_timeout: Duration::from_secs(1),
        }
    }
}

/// Where snapshots come from.
#[derive(Clone, Debug)]
pub enum SnapshotSource {
    /// Only what the embedding program installs through the handle (files are the binary's job).
    Manual,
    /// Poll a control plane's `GET /v1/snapshots/{cluster}`; `long_poll` waits server-side for a
    /// newer version instead of polling on a fixed period.
    Poll { url: String, interval: Duration, long_poll: bool },
    /// As `Poll`, over several control-plane replicas: pull from one, move to the next when it
    /// stops answering (see [`crate::sources::poll`]).
    Replicas { urls: Vec<String>, interval: Duration, long_poll: bool },
    /// Quick mode: route to these engines with equal weights, models from their `/v1/models`.
    Discover { engines: Vec<String>, interval: Duration },
}

/// Where and how often to report.
#[derive(Clone, Debug)]
pub struct ReportConfig {
    /// `POST` target, e.g. `http://cp:7000/v1/reports`.
    pub url: String,
    /// More targets, one per further control-plane replica: every report goes to each, so
    /// every replica plans from the same demand.
    pub also: Vec<String>,
    pub interval: Duration,
    /// Names this data-plane instance among the cluster's replicas.
    pub instance: String,
    /// Bearer token, if the control plane requires one.
    pub token: Option<String>,
    /// Time constant of the demand EWMA.
    pub smoothing: Duration,
    /// Engines whose round trip is measured per period (round robin over all).
    pub rtt_probes_per_period: usize,
}

impl ReportConfig {
    pub fn new(url: String, instance: String) -> ReportConfig {
        ReportConfig {
            url,
            also: Vec::new(),
            interval: Duration::from_secs(1),
            instance,
            token: None,
            smoothing: Duration::from_secs(5),
            rtt_probes_per_period: 16,
        }
    }
}

/// `[data_plane]`: one front-end cluster's proxy. Its TLS tables (`[data_plane.tls]`,
/// `[data_plane.engine_tls]`, `[data_plane.control_plane_tls]`) name certificate files, which
/// only the binary reads: see their sections below.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataPlaneSection {
    /// Address for the OpenAI-compatible API, e.g. `"0.0.0.0:8080"`. Default `127.0.0.1:8080`.
    pub listen: Option<String>,
    /// Address for the operator's endpoints, `/metrics`, `/debug/route` and `/health`, e.g.
    /// `"127.0.0.1:9090"` (flag `--admin-listen`). When set, the client listener no longer
    /// serves `/metrics` and `/debug/route`; by default (unset) both stay on the client
    /// listener, which then shows clients the fleet's engines and weights. `ilb epp` serves
    /// them only here (its `listen` is gRPC).
    pub admin_listen: Option<String>,
    /// What the `x-ilb-route` response header tells clients: `"full"` (engine id, class,
    /// weight, snapshot version, model and attempts), `"id"` (engine id and attempts; in quick
    /// mode the id is the engine's `host:port`) or `"off"` (no header); default `"id"` (flag
    /// `--route-header`).
    pub route_header: Option<String>,
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
    /// more than twice as loaded per unit of weight as its hash pick; default true (false: new
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
    /// The other data planes of this front-end cluster, e.g. `["http://ilb-dp:9090"]` (flag
    /// `--peer`, repeatable): base URLs of their admin listener (their client listener when
    /// they have none). Each data plane sends them, whenever one of its requests starts or ends
    /// (at most every 5 ms) and at least every `peer_interval_ms`, the conversations it placed
    /// or moved, the engines that stored its Responses API responses and its
    /// requests in flight per engine, so that a follow-up reaching any replica finds its
    /// engine and all replicas place by the load all of them cause. An `http://` host name
    /// counts as every address it resolves to (a headless Service names all replicas); this
    /// data plane's own messages are recognised and ignored. Default: none.
    #[serde(default)]
    pub peers: Vec<String>,
    /// The longest time between two messages to the peers, ms; default 200 (at least 20; flag
    /// `--peer-interval-ms`).
    pub peer_interval_ms: Option<u64>,
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
#[derive(Clone, Debug, Default, Deserialize)]
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

/// A `[data_plane]` value that is out of range or inconsistent; the message names the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// A checked `[data_plane]`: the typed config, where snapshots come from, the snapshot file to
/// watch (with [`SnapshotSource::Manual`]) and the reports to send (with a control plane).
#[derive(Debug)]
pub struct Validated {
    pub config: DataPlaneConfig,
    pub source: SnapshotSource,
    pub snapshot_file: Option<PathBuf>,
    pub reports: Option<ReportConfig>,
}

impl DataPlaneSection {
    /// Checks the section and turns it into the crate's typed config. The TLS fields of
    /// [`DataPlaneConfig`] stay unset: the binary builds them from the files it reads.
    pub fn validate(self) -> Result<Validated, ConfigError> {
        let listen: SocketAddr = self.listen.as_deref().unwrap_or("127.0.0.1:8080").parse().map_err(|e| {
            ConfigError(format!("data_plane.listen: expected host:port, e.g. 127.0.0.1:8080: {e}"))
        })?;
        let mut config = DataPlaneConfig::new(listen);
        if let Some(admin) = self.admin_listen.as_deref() {
            let admin: SocketAddr = admin.parse().map_err(|e| {
                ConfigError(format!("data_plane.admin_listen: expected host:port, e.g. 127.0.0.1:9090: {e}"))
            })?;
            if admin == listen && admin.port() != 0 {
                return err("data_plane.admin_listen: must differ from data_plane.listen");
            }
            config.admin_listen = Some(admin);
        }
        if let Some(detail) = self.route_header.as_deref() {
            config.route_header = RouteHeader::parse(detail).ok_or_else(|| {
                ConfigError(format!(
                    "data_plane.route_header: expected \"full\", \"id\" or \"off\", not {detail:?}"
                ))
            })?;
        }
        config.cluster = self.cluster.clone().map(ClusterId::new);
        if let Some(b) = self.max_body_bytes {
            if b == 0 {
                return err("data_plane.max_body_bytes: must be positive");
            }
            config.max_body_bytes = b;
        }
        if let Some(a) = self.max_attempts {
            if a == 0 {
                return err("data_plane.max_attempts: must be at least 1");
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
                return err("data_plane.affinity_entries: at most 67108864 (512 MiB of table)");
            }
            config.affinity_entries = n;
        }
        config.affinity_ttl = ttl("affinity_ttl_ms", self.affinity_ttl_ms, config.affinity_ttl)?;
        config.response_ttl = ttl("response_ttl_ms", self.response_ttl_ms, config.response_ttl)?;
        if let Some(on) = self.place_new_keys_by_load {
            config.place_new_keys_by_load = on;
        }
        if let Some(t) = self.create_traceparent {
            config.create_traceparent = t;
        }
        config.https_only = self.https_only.unwrap_or(false);
        self.peers(&mut config)?;
        self.retry_budget(&mut config.retry_budget)?;
        self.timeouts.apply(&mut config.timeouts)?;
        let source = self.source(config.https_only)?;
        let reports = self.reports();
        Ok(Validated { config, source, snapshot_file: self.snapshot_file, reports })
    }

    fn peers(&self, config: &mut DataPlaneConfig) -> Result<(), ConfigError> {
        for url in &self.peers {
            let host = url.parse::<http::Uri>().ok().filter(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some_and(|h| !h.is_empty())
            });
            if host.is_none() {
                return err(format!("data_plane.peers: '{url}' is not an http:// or https:// base URL"));
            }
        }
        config.peers = self.peers.iter().map(|u| u.trim_end_matches('/').to_owned()).collect();
        if let Some(ms) = self.peer_interval_ms {
            if ms < 20 {
                return err("data_plane.peer_interval_ms: must be at least 20");
            }
            config.peer_interval = Duration::from_millis(ms);
        }
        Ok(())
    }

    fn retry_budget(&self, budget: &mut RetryBudgetConfig) -> Result<(), ConfigError> {
        for (name, value, slot) in [
            ("retry_ratio", self.retry_ratio, &mut budget.ratio),
            ("retry_floor_ratio", self.retry_floor_ratio, &mut budget.floor_ratio),
            ("retry_min_per_sec", self.retry_min_per_sec, &mut budget.min_per_sec),
        ] {
            if let Some(v) = value {
                if !(v.is_finite() && v >= 0.0) {
                    return err(format!("data_plane.{name}: must be a non-negative number"));
                }
                *slot = v;
            }
        }
        if budget.floor_ratio > budget.ratio {
            return err("data_plane.retry_floor_ratio: must not exceed retry_ratio");
        }
        Ok(())
    }

    /// Exactly one of quick mode (`engines`), `snapshot_file` and `control_plane`.
    fn source(&self, https_only: bool) -> Result<SnapshotSource, ConfigError> {
        let sources = [!self.engines.is_empty(), self.snapshot_file.is_some(), self.control_plane.is_some()];
        match sources {
            [true, false, false] => {
                for url in &self.engines {
                    ilb_core::snapshot::check_engine_url(url)
                        .map_err(|why| ConfigError(format!("engine url '{url}' {why}")))?;
                    if https_only && !url.starts_with("https://") {
                        return err(format!(
                            "engine url '{url}' is plain http and data_plane.https_only is set"
                        ));
                    }
                }
                Ok(SnapshotSource::Discover {
                    engines: self.engines.clone(),
                    interval: Duration::from_secs(30),
                })
            }
            [false, true, false] => Ok(SnapshotSource::Manual),
            [false, false, true] => {
                let Some(cluster) = self.cluster.as_deref() else {
                    return err("--control-plane needs --cluster (data_plane.cluster)");
                };
                let urls: Vec<String> = self
                    .control_planes()
                    .iter()
                    .map(|base| format!("{}/v1/snapshots/{cluster}", base.trim_end_matches('/')))
                    .collect();
                if urls.is_empty() {
                    return err("data_plane.control_plane: needs at least one URL");
                }
                Ok(SnapshotSource::Replicas { urls, interval: Duration::from_secs(1), long_poll: true })
            }
            [false, false, false] => {
                err("no snapshot source: give --engine URL, --snapshot FILE or --control-plane URL")
            }
            _ => err("give only one snapshot source: --engine, --snapshot or --control-plane"),
        }
    }

    fn control_planes(&self) -> Vec<String> {
        self.control_plane.as_ref().map(UrlList::urls).unwrap_or_default()
    }

    /// Reports go to every control-plane replica, under an instance name of the cluster, this
    /// process's id and a random part: containers of one Deployment all run as process 1, and
    /// the control plane keeps one report per instance name (a second replica's reports under
    /// the same name were refused as not newer, its demand lost).
    fn reports(&self) -> Option<ReportConfig> {
        use std::hash::BuildHasher;
        let control_planes = self.control_planes();
        let reports_url = |cp: &String| format!("{}/v1/reports", cp.trim_end_matches('/'));
        let first = control_planes.first()?;
        let pid = std::process::id();
        // `RandomState` is seeded at random per process.
        let random = std::collections::hash_map::RandomState::new().hash_one(pid) as u32;
        let instance = format!("{}-{pid}-{random:08x}", self.cluster.as_deref().unwrap_or("local"));
        let mut reports = ReportConfig::new(reports_url(first), instance);
        reports.also = control_planes[1..].iter().map(reports_url).collect();
        reports.token = self.token.clone();
        if let Some(ms) = self.report_interval_ms {
            reports.interval = Duration::from_millis(ms.max(100));
        }
        Some(reports)
    }
}

/// A table TTL in ms: the tables count seconds in 16 bits.
fn ttl(name: &str, ms: Option<u64>, default: Duration) -> Result<Duration, ConfigError> {
    match ms {
        None => Ok(default),
        Some(ms) if (1000..=65_535_000).contains(&ms) => Ok(Duration::from_millis(ms)),
        Some(_) => err(format!(
            "data_plane.{name}: must be between 1000 and 65535000 (the table counts seconds in 16 bits)"
        )),
    }
}

impl TimeoutsSection {
    fn apply(&self, t: &mut Timeouts) -> Result<(), ConfigError> {
        for (name, value, slot) in [
            ("connect_ms", self.connect_ms, &mut t.connect),
            ("first_byte_ms", self.first_byte_ms, &mut t.first_byte),
            ("idle_ms", self.idle_ms, &mut t.idle),
            ("client_body_ms", self.client_body_ms, &mut t.client_body),
            ("header_read_ms", self.header_read_ms, &mut t.header_read),
        ] {
            if let Some(ms) = value {
                if ms == 0 {
                    return err(format!("data_plane.timeouts.{name}: must be positive"));
                }
                *slot = Duration::from_millis(ms);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(json: &str) -> DataPlaneSection {
        serde_json::from_str(json).unwrap()
    }

    fn error(json: &str) -> String {
        section(json).validate().unwrap_err().0
    }

    #[test]
    fn fills_the_typed_config_and_the_source() {
        let v = section(
            r#"{"listen": "0.0.0.0:9000", "cluster": "eu", "control_plane": ["http://a:7000/", "http://b:7000"],
                "queue_wait_ms": 500, "retry_ratio": 0.3, "affinity_ttl_ms": 2000, "report_interval_ms": 10,
                "timeouts": {"first_byte_ms": 1500}, "token": "t"}"#,
        )
        .validate()
        .unwrap();
        assert_eq!(v.config.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(v.config.queue_wait, Duration::from_millis(500));
        assert_eq!(v.config.retry_budget.ratio, 0.3);
        assert_eq!(v.config.affinity_ttl, Duration::from_secs(2));
        assert_eq!(v.config.timeouts.first_byte, Duration::from_millis(1500));
        assert_eq!(v.config.timeouts.connect, Timeouts::default().connect);
        match v.source {
            SnapshotSource::Replicas { urls, .. } => {
                assert_eq!(urls, ["http://a:7000/v1/snapshots/eu", "http://b:7000/v1/snapshots/eu"])
            }
            other => panic!("{other:?}"),
        }
        let reports = v.reports.unwrap();
        assert_eq!(reports.url, "http://a:7000/v1/reports");
        assert_eq!(reports.also, ["http://b:7000/v1/reports"]);
        assert_eq!(reports.interval, Duration::from_millis(100), "at least 100 ms");
        assert_eq!(reports.token.as_deref(), Some("t"));
        let quick = section(r#"{"engines": ["http://127.0.0.1:8000"]}"#).validate().unwrap();
        assert!(matches!(quick.source, SnapshotSource::Discover { .. }) && quick.reports.is_none());
        assert_eq!((quick.config.admin_listen, quick.config.route_header), (None, RouteHeader::Id));
        let admin = section(
            r#"{"engines": ["http://127.0.0.1:8000"], "admin_listen": "127.0.0.1:9090", "route_header": "off"}"#,
        )
        .validate()
        .unwrap();
        assert_eq!(admin.config.admin_listen, Some("127.0.0.1:9090".parse().unwrap()));
        assert_eq!(admin.config.route_header, RouteHeader::Off);
    }

    #[test]
    fn errors_name_the_field() {
        let engines = r#""engines": ["http://127.0.0.1:8000"]"#;
        assert!(
            error(r#"{"listen": "nowhere", "snapshot_file": "s.json"}"#).starts_with("data_plane.listen: ")
        );
        assert_eq!(
            error(&format!("{{{engines}, \"max_attempts\": 0}}")),
            "data_plane.max_attempts: must be at least 1"
        );
        assert!(error(&format!("{{{engines}, \"response_ttl_ms\": 999}}"))
            .starts_with("data_plane.response_ttl_ms: "));
        assert_eq!(
            error(&format!("{{{engines}, \"retry_ratio\": 0.01}}")),
            "data_plane.retry_floor_ratio: must not exceed retry_ratio"
        );
        assert_eq!(
            error(&format!("{{{engines}, \"timeouts\": {{\"idle_ms\": 0}}}}")),
            "data_plane.timeouts.idle_ms: must be positive"
        );
        assert_eq!(
            error(r#"{"engines": ["http://127.0.0.1:8000"], "https_only": true}"#),
            "engine url 'http://127.0.0.1:8000' is plain http and data_plane.https_only is set"
        );
        assert_eq!(
            error(r#"{"control_plane": "http://cp:7000"}"#),
            "--control-plane needs --cluster (data_plane.cluster)"
        );
        assert!(error("{}").starts_with("no snapshot source"));
        assert!(error(r#"{"snapshot_file": "s.json", "engines": ["http://127.0.0.1:8000"]}"#)
            .starts_with("give only one"));
        assert!(error(&format!("{{{engines}, \"admin_listen\": \"nowhere\"}}"))
            .starts_with("data_plane.admin_listen: "));
        assert_eq!(
            error(&format!(
                "{{{engines}, \"listen\": \"127.0.0.1:8080\", \"admin_listen\": \"127.0.0.1:8080\"}}"
            )),
            "data_plane.admin_listen: must differ from data_plane.listen"
        );
        assert_eq!(
            error(&format!("{{{engines}, \"route_header\": \"engine\"}}")),
            "data_plane.route_header: expected \"full\", \"id\" or \"off\", not \"engine\""
        );
        assert!(
            serde_json::from_str::<DataPlaneSection>(r#"{"listen_addr": "x"}"#).is_err(),
            "unknown fields are errors"
        );
    }
}

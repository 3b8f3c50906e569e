//! The state shared by every connection and background task of one data plane: its config,
//! the installed routing state, the HTTP clients of the background tasks, the retry budget,
//! the slot waiters, the affinity tables and the data plane's own counters.

use crate::clock;
use crate::config::DataPlaneConfig;
use crate::engines::EngineState;
use crate::state::{InstallError, RoutingState};
use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use ilb_core::snapshot::Snapshot;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use tokio::time::Instant;

/// The background tasks' HTTP client (probes, discovery, snapshots, reports): http, or https
/// with one of the data plane's client TLS configs.
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// State shared by every connection and background task of one data plane.
pub struct Shared {
    pub config: DataPlaneConfig,
    pub routing: RoutingState,
    /// For engines: probes, quick-mode discovery, round trips.
    pub client: HttpClient,
    /// For the control plane: snapshots and reports.
    pub control_plane_client: HttpClient,
    /// TLS to https engines on the request path.
    pub engine_tls: ilb_tls::ClientTls,
    pub budget: crate::budget::RetryBudget,
    pub waiters: crate::admission::Waiters,
    epoch: Instant,
    requests: AtomicU64,
    pub snapshot_installs: AtomicU64,
    /// Snapshots refused, by [`InstallError::REASONS`].
    pub snapshot_rejections: [AtomicU64; InstallError::REASONS.len()],
    /// The last snapshot refused for something other than its age, while no newer one has
    /// been installed: `/health` says the data plane is degraded.
    pub snapshot_rejected: Mutex<Option<Rejected>>,
    /// Distinguishes this process's generated trace ids from other data planes'.
    pub trace_seed: u64,
    /// Coarse time for the idle connection pools, advanced by the prober (see `now_ms`).
    pub pool_clock: crate::upstream::CoarseClock,
    /// Which engine served each affinity key last; kept across snapshot installs.
    pub affinity: ilb_core::affinity::AffinityTable,
    /// Which engine stored each response id this data plane proxied (Responses API), so that
    /// a request naming it as `previous_response_id` goes there.
    pub responses: ilb_core::affinity::AffinityTable,
    /// The model objects engines list in their `/v1/models`, by model id, where the data
    /// plane asked them (quick mode): `/v1/models` serves their fields (vLLM's
    /// `max_model_len`, llama.cpp's `meta`, ...). Empty with a snapshot source.
    pub model_objects: arc_swap::ArcSwap<ModelObjects>,
    /// What the other data planes of the cluster said (`replicas`); never touched by requests.
    pub peers: Peers,
}

/// Engines' own model objects (JSON objects) by model id.
pub type ModelObjects = std::collections::BTreeMap<String, serde_json::Map<String, serde_json::Value>>;

impl Shared {
    pub fn new(config: DataPlaneConfig) -> Shared {
        // No roots: an https peer without configured trust fails its handshake (unknown issuer).
        let untrusting = || {
            ilb_tls::ClientTls::new(&ilb_tls::ClientOptions::default())
                .expect("an empty client config builds")
        };
        let engine_tls = config.engine_tls.clone().unwrap_or_else(untrusting);
        let control_plane_tls = config.control_plane_tls.clone().unwrap_or_else(untrusting);
        let client = http_client(&config, &engine_tls);
        let control_plane_client = http_client(&config, &control_plane_tls);
        // The tables note their changes for the other data planes of the cluster (`replicas`),
        // whether they go to peers or ride on the reports.
        let affinity = ilb_core::affinity::AffinityTable::with_journal(
            config.affinity_entries,
            config.affinity_ttl.as_secs().min(u64::from(u32::MAX)) as u32,
            JOURNAL_LEN,
        );
        let responses = ilb_core::affinity::AffinityTable::with_journal(
            config.affinity_entries,
            config.response_ttl.as_secs().min(u64::from(u32::MAX)) as u32,
            JOURNAL_LEN,
        );
        Shared {
            responses,
            budget: crate::budget::RetryBudget::new(config.retry_budget.clone()),
            waiters: crate::admission::Waiters::default(),
            config,
            routing: RoutingState::default(),
            client,
            control_plane_client,
            engine_tls,
            epoch: clock::now(),
            requests: AtomicU64::new(0),
            snapshot_installs: AtomicU64::new(0),
            snapshot_rejections: Default::default(),
            snapshot_rejected: Mutex::new(None),
            trace_seed: ilb_core::slots::mix(crate::clock::unix_ms() ^ u64::from(std::process::id()) << 32),
            pool_clock: Default::default(),
            affinity,
            model_objects: Default::default(),
            peers: Default::default(),
        }
    }

    /// Parses, validates and installs a snapshot as it came from the control plane or a file;
    /// every refusal is counted and remembered as [`Shared::install`]'s are.
    pub fn install_json(&self, bytes: &[u8]) -> Result<(), InstallError> {
        match Snapshot::from_json(bytes) {
            Ok(snapshot) => self.install(&snapshot),
            Err(e) => Err(self.rejected(InstallError::Invalid(e))),
        }
    }

    /// Installs a snapshot, logging the outcome (not on the request path).
    pub fn install(&self, snapshot: &Snapshot) -> Result<(), InstallError> {
        if self.config.https_only {
            if let Some(plain) = snapshot.engines.iter().find(|e| !e.url.starts_with("https://")) {
                return Err(self.rejected(InstallError::PlainEngine {
                    engine: plain.id.to_string(),
                    url: plain.url.clone(),
                }));
            }
        }
        let expected = self.config.cluster.as_ref().map(|c| c.as_str());
        let installed = match self.routing.install(snapshot, expected, crate::clock::unix_ms()) {
            Ok(installed) => installed,
            Err(e) => return Err(self.rejected(e)),
        };
        *self.snapshot_rejected.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.snapshot_installs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(
            version = %installed.table.version,
            engines = installed.table.engines.len(),
            models = installed.table.model_names().len(),
            "snapshot installed"
        );
        Ok(())
    }

    /// Counts a refused snapshot and, unless it was merely older than the installed one,
    /// remembers why for `/health`.
    fn rejected(&self, e: InstallError) -> InstallError {
        self.snapshot_rejections[e.reason_index()].fetch_add(1, Relaxed);
        if !matches!(e, InstallError::Stale { .. }) {
            let rejected = Rejected { reason: e.to_string(), unix_ms: crate::clock::unix_ms() };
            *self.snapshot_rejected.lock().unwrap_or_else(|p| p.into_inner()) = Some(rejected);
        }
        e
    }

    /// Milliseconds since this data plane started (monotonic).
    pub fn now_ms(&self) -> u64 {
        clock::since(self.epoch).as_millis() as u64
    }

    /// Time since this data plane started (monotonic).
    pub fn uptime(&self) -> std::time::Duration {
        clock::since(self.epoch)
    }

    pub fn next_request_id(&self) -> u64 {
        self.requests.fetch_add(1, Relaxed)
    }

    pub fn requests_total(&self) -> u64 {
        self.requests.load(Relaxed)
    }

    /// This data plane's requests in flight changed (one started or ended, with whatever it
    /// noted in the affinity and response tables): with peers, their sender sends it now (at
    /// most once per `replicas::MIN_GAP`). One atomic operation while the sender is busy or
    /// resting.
    pub fn load_changed(&self) {
        if !self.config.peers.is_empty() {
            self.peers.changed.notify_one();
        }
    }

    /// A failed attempt: the local guard may eject the engine.
    pub fn engine_failed(&self, engine: &EngineState) {
        let max_fraction = self.config.guard.max_ejected_fraction;
        let under_cap = || {
            self.routing
                .load()
                .is_none_or(|installed| crate::engines::may_eject(&installed.engines, max_fraction))
        };
        if engine.record_failure(self.now_ms(), &self.config.guard, under_cap) {
            tracing::warn!(engine = %engine.id, "engine ejected after consecutive failures");
        }
    }
}

/// Changes each table's journal keeps between two sends: far more than a replica decides in
/// one `peer_interval` or report period (16,384 new conversations).
pub const JOURNAL_LEN: usize = 1 << 14;

/// What the other data planes of the cluster said, and the exchange's counters (for
/// `/metrics`): the state of `replicas`, held here so that every module can reach it.
#[derive(Default)]
pub struct Peers {
    /// Each peer's last in-flight figures by instance name. Taken by the receiving handler
    /// and the folding task, never by a request.
    pub(crate) loads: Mutex<HashMap<String, PeerLoad>>,
    /// Wakes the sender ([`Shared::load_changed`]).
    pub(crate) changed: tokio::sync::Notify,
    pub messages_received: AtomicU64,
    pub messages_refused: AtomicU64,
    pub messages_sent: AtomicU64,
    pub send_failures: AtomicU64,
    /// Deliveries skipped because the peer was still busy with the previous one.
    pub sends_skipped: AtomicU64,
    pub entries_learned: AtomicU64,
}

pub(crate) struct PeerLoad {
    /// [`Shared::now_ms`] when it arrived.
    pub at_ms: u64,
    pub in_flight: Vec<(u32, u32)>,
}

/// A snapshot the data plane refused, and when.
#[derive(Clone, Debug)]
pub struct Rejected {
    pub reason: String,
    pub unix_ms: u64,
}

/// A keep-alive client for http and https URLs, trusting what `tls` trusts.
fn http_client(config: &DataPlaneConfig, tls: &ilb_tls::ClientTls) -> HttpClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(config.timeouts.connect));
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.config_without_alpn())
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(std::time::Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector)
}

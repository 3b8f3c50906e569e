//! The data plane's typed configuration. The binary builds it from flags and the TOML file and
//! validates it; this crate never reads files or the environment.

use crate::engines::GuardConfig;
use ilb_core::ClusterId;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct DataPlaneConfig {
    pub listen: SocketAddr,
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
    pub retry_budget: crate::budget::RetryBudgetConfig,
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
    /// (`ilb_core::table::ClassTable::select`). Default false: with it, the overload test
    /// (`tests/protection.rs`, one affinity key for every request) served 67–71 of 123 req/s
    /// (132 of 131 without the follow-up rule, `ilb_core::table::AFFINITY_KEEP_RATIO`), not yet
    /// understood; the grey-engine test passes with it (12 of 12 runs).
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

impl DataPlaneConfig {
    pub fn new(listen: SocketAddr) -> DataPlaneConfig {
        DataPlaneConfig {
            listen,
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
            place_new_keys_by_load: false,
            engine_tls: None,
            control_plane_tls: None,
            listener_tls: None,
            https_only: false,
        }
    }
}

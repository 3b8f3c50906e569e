//! The installed routing state and how a snapshot becomes it.
//!
//! A snapshot is validated and compiled into an [`Installed`] off the request path, then
//! published with one `ArcSwap` store; a request does one `load()` and finds the table, the
//! engines' runtime state and the per-class counters in that one `Arc`. The first install takes
//! the same path as every later one. An invalid snapshot, or one older than the installed
//! version, is rejected and the last good one stays.

use crate::engines::EngineState;
use arc_swap::ArcSwapOption;
use ilb_core::priority::PerPriority;
use ilb_core::snapshot::{Snapshot, SnapshotError};
use ilb_core::table::RoutingTable;
use ilb_core::{ClassId, EngineId, ModelName, SnapshotVersion};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};

/// Everything a request needs, swapped atomically as one unit.
#[derive(Debug)]
pub struct Installed {
    pub table: RoutingTable,
    /// Runtime state per engine, indexed like `table.engines`.
    pub engines: Vec<Arc<EngineState>>,
    /// Per-class counters, indexed by `ClassTable::seq`.
    pub classes: Vec<Arc<ClassState>>,
    /// Requests of each class in flight on each of its candidates, by `ClassTable::seq` and
    /// candidate: what the load bound compares with the class's in-flight count (an engine's
    /// own count also holds other classes' requests).
    pub class_engine_in_flight: Vec<Vec<Arc<AtomicU32>>>,
    /// The `x-ilb-route` value of a first-try answer, by `ClassTable::seq` and candidate: built
    /// here once so that the request path formats nothing.
    pub routes: Vec<Vec<RoutePrefix>>,
    /// Each engine's `ip:port` as a gateway addresses it ([`endpoint_of`]),
    /// indexed like `engines`: built here once so that a pick formats nothing.
    pub endpoints: Vec<String>,
    /// Unix milliseconds when this data plane installed it.
    pub installed_unix_ms: u64,
}

/// Why an install did not happen.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Invalid(#[from] SnapshotError),
    #[error("snapshot version {offered} is older than the installed version {installed}")]
    Stale { offered: SnapshotVersion, installed: SnapshotVersion },
    #[error("snapshot is for cluster '{offered}', this data plane serves '{expected}'")]
    WrongCluster { offered: String, expected: String },
    #[error("engine '{engine}' has a plain-http url ({url}) and this data plane is https-only")]
    PlainEngine { engine: String, url: String },
}

impl InstallError {
    /// Every reason, in the order of [`InstallError::reason_index`]; the `reason` label of
    /// `ilb_dataplane_snapshot_rejections_total`.
    pub const REASONS: [&'static str; 5] = ["malformed", "invalid", "stale", "wrong_cluster", "plain_engine"];

    /// This rejection's position in [`InstallError::REASONS`].
    pub fn reason_index(&self) -> usize {
        match self {
            InstallError::Invalid(SnapshotError::Json(_)) => 0,
            InstallError::Invalid(_) => 1,
            InstallError::Stale { .. } => 2,
            InstallError::WrongCluster { .. } => 3,
            InstallError::PlainEngine { .. } => 4,
        }
    }
}

/// Holds the current [`Installed`] and the registries that persist across installs.
#[derive(Default)]
pub struct RoutingState {
    current: ArcSwapOption<Installed>,
    /// Serialises installs and keeps runtime state alive across them. Never touched by requests.
    registry: Mutex<Registry>,
    /// Calls of [`RoutingState::load`], for the test of the one-load rule.
    #[cfg(test)]
    pub(crate) request_loads: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Registry {
    engines: HashMap<EngineId, Arc<EngineState>>,
    classes: HashMap<(ModelName, ClassId), Arc<ClassState>>,
    class_engines: HashMap<(ModelName, ClassId, EngineId), Arc<AtomicU32>>,
}

/// Counters of one traffic class that persist across snapshot installs.
#[derive(Debug, Default)]
pub struct ClassState {
    /// Requests of this class in flight (until their response body ends).
    pub in_flight: AtomicU32,
    /// Requests the other data planes of the cluster have in flight on this class's
    /// candidates, as they last said (`replicas`); 0 without peers.
    pub peer_in_flight: AtomicU32,
    /// Requests that arrived (admitted or shed), cumulative.
    pub arrivals: AtomicU64,
    /// Requests shed by plan (the class is over capacity), cumulative.
    pub shed: AtomicU64,
    /// Requests refused because every engine stayed at its concurrency limit, cumulative.
    pub overloaded: AtomicU64,
    /// Requests answered by an engine with a success status, cumulative.
    pub ok: AtomicU64,
    /// Requests that failed after every attempt (engine errors, timeouts, nothing healthy).
    pub failed: AtomicU64,
    /// Arrivals and shed probabilities per priority.
    pub priority: PriorityCounters,
}

/// Cumulative arrivals per priority and the current shed probability per priority of a class
/// (set by `admission::plan_shedding`).
#[derive(Debug, Default)]
pub struct PriorityCounters {
    pub arrivals: PerPriority<AtomicU64>,
    /// f64 bits.
    pub shed_probability: PerPriority<AtomicU64>,
}

/// The `x-ilb-route` header of one candidate, without and with its attempt count, in the
/// detail of `RouteHeader::Full` and of `RouteHeader::Id`.
#[derive(Clone, Debug)]
pub struct RoutePrefix {
    /// `engine=..; class=..; weight=..; snapshot=..; model=..; attempts=` (for other counts).
    pub prefix: String,
    /// The whole value for `attempts=1`.
    pub first_try: http::HeaderValue,
    /// `engine=..; attempts=` (for other counts).
    pub id_prefix: String,
    /// The whole `engine=..; attempts=1`.
    pub id_first_try: http::HeaderValue,
}

impl RoutePrefix {
    fn new(
        table: &RoutingTable,
        model: &ModelName,
        class: &ilb_core::table::ClassTable,
        c: &ilb_core::table::Candidate,
    ) -> RoutePrefix {
        let engine = &table.engines[c.engine_idx].id;
        let prefix = format!(
            "engine={engine}; class={}; weight={:.4}; snapshot={}; model={model}; attempts=",
            class.id, c.weight, table.version
        );
        let id_prefix = format!("engine={engine}; attempts=");
        let first = |prefix: &str| {
            http::HeaderValue::from_maybe_shared(bytes::Bytes::from(format!("{prefix}1")))
                .unwrap_or_else(|_| http::HeaderValue::from_static("engine=?"))
        };
        RoutePrefix { first_try: first(&prefix), id_first_try: first(&id_prefix), prefix, id_prefix }
    }
}

impl RoutingState {
    /// The installed state for a request: its one load, and a reload after a failure that may
    /// eject its engine (ARCHITECTURE.md's one-load rule; the proxy's tests count the calls). Hot path:
    /// lock-free (`load_full`: an `Arc` clone of the installed state).
    #[inline]
    pub fn load(&self) -> Option<Arc<Installed>> {
        #[cfg(test)]
        self.request_loads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.current.load_full()
    }

    /// The installed state for everything off the request path (background loops, `/metrics`,
    /// `/health`, `/v1/models`, `/debug/route`): the same load, not counted as a request's.
    pub fn current(&self) -> Option<Arc<Installed>> {
        self.current.load_full()
    }

    /// Validates, compiles and installs `snapshot`. `expected_cluster` (if any) must match.
    pub fn install(
        &self,
        snapshot: &Snapshot,
        expected_cluster: Option<&str>,
        now_unix_ms: u64,
    ) -> Result<Arc<Installed>, InstallError> {
        let mut registry = self.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(expected) = expected_cluster {
            if snapshot.cluster.as_str() != expected {
                return Err(InstallError::WrongCluster {
                    offered: snapshot.cluster.to_string(),
                    expected: expected.to_owned(),
                });
            }
        }
        let previous = self.current.load_full();
        if let Some(prev) = &previous {
            if snapshot.version < prev.table.version {
                return Err(InstallError::Stale { offered: snapshot.version, installed: prev.table.version });
            }
        }
        let table = RoutingTable::compile(snapshot, previous.as_deref().map(|p| &p.table))?;

        let mut engines = Vec::with_capacity(table.engines.len());
        for entry in &table.engines {
            let state = registry
                .engines
                .entry(entry.id.clone())
                .and_modify(|s| {
                    if s.origin.base_url != entry.url.trim_end_matches('/') {
                        // Same id, new address: fresh state; the old one drains.
                        s.pool.set_draining(true);
                        *s = Arc::new(EngineState::new(entry.id.clone(), &entry.url));
                    }
                })
                .or_insert_with(|| Arc::new(EngineState::new(entry.id.clone(), &entry.url)));
            engines.push(Arc::clone(state));
        }
        // Per class (indexed by seq): its counters, its per-candidate in-flight counters (kept
        // across installs by (model, class, engine)), and its prebuilt route headers.
        let n = table.n_classes();
        let mut classes: Vec<Option<Arc<ClassState>>> = vec![None; n];
        let mut class_engine_in_flight = vec![Vec::new(); n];
        let mut routes = vec![Vec::new(); n];
        for model in table.models() {
            for class in &model.classes {
                let counter = registry
                    .classes
                    .entry((model.name.clone(), class.id.clone()))
                    .or_insert_with(|| Arc::new(ClassState::default()));
                classes[class.seq] = Some(Arc::clone(counter));
                class_engine_in_flight[class.seq] = class
                    .candidates
                    .iter()
                    .map(|c| {
                        let key =
                            (model.name.clone(), class.id.clone(), table.engines[c.engine_idx].id.clone());
                        Arc::clone(registry.class_engines.entry(key).or_default())
                    })
                    .collect();
                routes[class.seq] = class
                    .candidates
                    .iter()
                    .map(|c| RoutePrefix::new(&table, &model.name, class, c))
                    .collect();
            }
        }
        // Every seq below n_classes belongs to exactly one class, so none is left empty.
        let classes: Vec<Arc<ClassState>> = classes.into_iter().flatten().collect();
        debug_assert_eq!(classes.len(), n);
        // Engines that left drain: no new requests pick them from this table on, their idle
        // connections close now and the others as their responses end. Forget engines,
        // classes and counters that left and have nothing in flight.
        let live: std::collections::HashSet<&EngineId> = table.engines.iter().map(|e| &e.id).collect();
        for (id, state) in &registry.engines {
            let leaving = !live.contains(id);
            if leaving != state.pool.is_draining() {
                if leaving {
                    tracing::info!(engine = %id, in_flight = state.in_flight.load(std::sync::atomic::Ordering::Relaxed), "engine left the snapshot; draining");
                }
                state.pool.set_draining(leaving);
            }
        }
        registry.engines.retain(|id, s| live.contains(id) || Arc::strong_count(s) > 1);
        registry.classes.retain(|_, c| Arc::strong_count(c) > 1);
        registry.class_engines.retain(|_, c| Arc::strong_count(c) > 1);
        let endpoints = engines.iter().map(|engine| endpoint_of(engine)).collect();
        let installed = Arc::new(Installed {
            table,
            engines,
            classes,
            class_engine_in_flight,
            routes,
            endpoints,
            installed_unix_ms: now_unix_ms,
        });
        self.current.store(Some(Arc::clone(&installed)));
        Ok(installed)
    }
}

/// An engine's `ip:port` as a gateway addresses it (IPv6 in brackets). Engines named by host
/// name give `name:port`, which a gateway's override-host policy will not find among its
/// endpoints: the EPP wants engines addressed by IP (docs/epp.md).
pub fn endpoint_of(engine: &EngineState) -> String {
    let (host, port) = engine.origin.connect_addr();
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

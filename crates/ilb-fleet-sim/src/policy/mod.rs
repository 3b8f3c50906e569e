//! Routing policies. Every policy decides, for one request of one stream, which engine serves
//! it (or that it is shed, or that no engine can take it). The baselines (`round-robin`,
//! `random`, `nearest`, `least-loaded`) route directly; `feedback` and `ilb` publish snapshots
//! that a simulated data plane compiles and picks from with the real `ilb-core` code.
//!
//! Every policy respects residency and capability constraints (a data plane filters candidates
//! before anything else); `nearest` additionally never leaves the cluster's own region.

mod baseline;
mod dataplane;
mod feedback;
mod ilb;
mod replicas;

pub use baseline::Baseline;
pub use feedback::Feedback;
pub use ilb::Ilb;
pub use replicas::PEER_GAP_NS;

use ilb_core::report::Report;
use ilb_core::ModelName;
use ilb_engine_sim::Nanos;
use ilb_planning::signals::EngineSample;
use rand_pcg::Pcg64Mcg;

/// What never changes during a run: which engines each stream may use, and engine capacities.
#[derive(Clone, Debug)]
pub struct Topology {
    pub n_engines: usize,
    pub n_clusters: usize,
    /// Per stream: engines serving its model and satisfying its class (sorted).
    pub allowed: Vec<Vec<usize>>,
    /// Per stream: `allowed` as a mask over engines.
    pub allowed_mask: Vec<Vec<bool>>,
    /// Per stream: the allowed engines in the stream's own region.
    pub local: Vec<Vec<usize>>,
    /// Per stream: its cluster.
    pub stream_cluster: Vec<usize>,
    /// Per engine: nominal capacity, requests/s (calibrated).
    pub capacity_rps: Vec<f64>,
    /// Per stream: model name, class id, required capabilities (sorted) and residency zone.
    pub stream_model: Vec<String>,
    pub stream_class: Vec<String>,
    pub stream_require: Vec<Vec<String>>,
    pub stream_residency: Vec<Option<String>>,
    /// Per stream: its priority (`x-ilb-priority`).
    pub stream_priority: Vec<ilb_core::priority::Priority>,
    pub cluster_ids: Vec<String>,
    /// Per engine: the model it serves.
    pub engine_model: Vec<String>,
    /// What a snapshot says about each engine.
    pub engine_entries: Vec<ilb_core::snapshot::EngineEntry>,
    /// Whether data planes place new conversations by load (`[control]`).
    pub place_new_keys_by_load: bool,
    /// Data planes per cluster, and how they share what they decide (`[control]`).
    pub data_planes: usize,
    pub sharing: crate::scenario::Sharing,
}

/// The fleet's load as data planes see it.
#[derive(Clone, Debug)]
pub struct Load {
    pub up: Vec<bool>,
    /// Requests in flight per engine, all clusters.
    pub in_flight: Vec<u32>,
    /// Requests of each stream in flight on each engine, `[stream * n_engines + engine]`: what
    /// the data plane's load bound compares with the stream's (class's) in-flight count.
    pub stream_engine_in_flight: Vec<u32>,
    /// Requests in flight per stream (= per class of a data plane).
    pub stream_in_flight: Vec<u32>,
    /// What each data plane counts itself: the requests it sent of each stream to each
    /// engine, `[(data_plane * n_streams + stream) * n_engines + engine]` (with one data plane
    /// per cluster, `stream_engine_in_flight`).
    pub data_plane_stream_engine_in_flight: Vec<u32>,
    /// The requests each data plane sent of each stream, `[data_plane * n_streams + stream]`.
    pub data_plane_stream_in_flight: Vec<u32>,
}

impl Load {
    pub fn new(topology: &Topology, n_streams: usize) -> Load {
        let data_planes = topology.data_planes.max(1);
        Load {
            up: vec![true; topology.n_engines],
            in_flight: vec![0; topology.n_engines],
            stream_engine_in_flight: vec![0; topology.n_engines * n_streams],
            stream_in_flight: vec![0; n_streams],
            data_plane_stream_engine_in_flight: vec![0; data_planes * n_streams * topology.n_engines],
            data_plane_stream_in_flight: vec![0; data_planes * n_streams],
        }
    }

    /// Counts one request of `stream` sent by `data_plane` to `engine` (`add`), or finished.
    pub fn count(&mut self, data_plane: usize, stream: usize, engine: usize, add: bool) {
        let n_streams = self.stream_in_flight.len();
        let n = self.in_flight.len();
        let counts = [
            &mut self.in_flight[engine],
            &mut self.stream_engine_in_flight[stream * n + engine],
            &mut self.stream_in_flight[stream],
            &mut self.data_plane_stream_engine_in_flight[(data_plane * n_streams + stream) * n + engine],
            &mut self.data_plane_stream_in_flight[data_plane * n_streams + stream],
        ];
        for count in counts {
            *count = if add { *count + 1 } else { *count - 1 };
        }
    }
}

/// One request as a policy sees it: its stream, its affinity key, and the data plane of its
/// cluster it reached (0 with one data plane per cluster).
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    pub stream: usize,
    pub key_hash: u64,
    pub data_plane: usize,
}

/// Where a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Engine(usize),
    /// Refused early on purpose (429).
    Shed,
    /// No allowed engine is up (503).
    NoEngine,
}

/// A routing policy under simulation.
pub trait Policy {
    /// Routes one request at virtual time `now`.
    fn route(
        &mut self,
        now: Nanos,
        topology: &Topology,
        load: &Load,
        arrival: Arrival,
        rng: &mut Pcg64Mcg,
    ) -> Decision;

    /// Control period in seconds, for policies with a control loop.
    fn period_s(&self) -> Option<f64> {
        None
    }

    /// The control loop ran at `now`; returns when its output should be installed.
    fn on_tick(&mut self, _now: Nanos, _topology: &Topology) -> Option<Nanos> {
        None
    }

    /// Install whatever is due at `now`.
    fn on_wake(&mut self, _now: Nanos, _topology: &Topology) {}

    /// Whether the policy routes through simulated data planes (that can be several per
    /// cluster and share what they decide).
    fn has_data_planes(&self) -> bool {
        false
    }

    /// Data plane `data_plane` of every cluster shares what it decided since its last turn
    /// with the others of its cluster (`None`: all of them at once, as peers do).
    fn on_share(&mut self, _now: Nanos, _topology: &Topology, _load: &Load, _data_plane: Option<usize>) {}

    /// Whether scrapes and reports should be delivered.
    fn wants_signals(&self) -> bool {
        false
    }

    fn on_scrape(
        &mut self,
        _now: Nanos,
        _engine: usize,
        _result: Result<Vec<(ModelName, EngineSample)>, String>,
    ) {
    }

    fn on_report(&mut self, _now: Nanos, _report: Report) {}

    /// The intended split: `out[stream * n_engines + engine]`, each stream's row summing to one
    /// (or zero when it has nowhere to go).
    fn weights(&self, topology: &Topology, load: &Load, out: &mut [f64]);

    /// Whether the latest plan gives none of `engines` any traffic (`None`: no plan).
    fn plan_excludes(&self, _engines: &[usize]) -> Option<bool> {
        None
    }

    /// The optimizer's predicted mean latency of the latest plan, ms.
    fn predicted_latency_ms(&self) -> Option<f64> {
        None
    }

    /// The optimizer's predicted mean latency for the mean measured demand per stream
    /// (`mean_rps`, requests/s), at the end of the run, ms.
    fn steady_state_latency_ms(
        &mut self,
        _now: Nanos,
        _topology: &Topology,
        _mean_rps: &[f64],
    ) -> Option<f64> {
        None
    }
}

/// Uniform weights over `engines` that are up.
pub(crate) fn uniform_row(engines: &[usize], up: &[bool], row: &mut [f64]) {
    row.iter_mut().for_each(|w| *w = 0.0);
    let n = engines.iter().filter(|&&j| up[j]).count();
    if n > 0 {
        for &j in engines.iter().filter(|&&j| up[j]) {
            row[j] = 1.0 / n as f64;
        }
    }
}

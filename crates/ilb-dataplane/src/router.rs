//! The data plane's routing decision without its proxy, for a program that forwards requests
//! itself: `ilb epp`, where Envoy forwards and ilb picks (docs/epp.md).
//!
//! A [`Router`] runs the data plane's background tasks (snapshot polling or quick-mode
//! discovery, the holds follower, the prober, shedding plans, reports) on the same `Shared`
//! state, and [`Router::route`] answers one request with the data plane's own functions:
//! `proxy::classify_request`, `proxy::admit` (planned shedding), `proxy::pick` (the pinned
//! engine, else `ClassTable::select` with the guard, holds and load bound) and
//! `admission::wait_for_slot`. What a proxy learns from sending, the caller reports on the
//! returned [`Routing`]: which endpoint served, its status, the chunks of a streamed body and
//! its end; that feeds the in-flight counts, the affinity table, the local guard and the
//! reports exactly as the proxy's own attempts do (`in_flight::InFlight`).

use crate::admission;
use crate::body::{ResponseIdReader, ResponseStore};
use crate::config::DataPlaneConfig;
use crate::config::SnapshotSource;
use crate::engines::Outcome;
use crate::error::ProxyError;
use crate::in_flight::InFlight;
use crate::pick::{choose, NoCandidate, Pick};
use crate::proxy::{self, ClassTarget, Classified};
use crate::shared::Shared;
use crate::state::Installed;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode};
use ilb_core::classify::{self, Endpoint};
use ilb_core::table::{ClassTable, Constraints};
use ilb_core::ModelName;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Starts the background tasks every data plane runs besides its listeners: the prober of
/// ejected engines, the shedding planner, the reporter (if configured) and the tasks of the
/// snapshot `source`. `DataPlane::start` and [`Router::start`] both start them here.
pub(crate) fn spawn_background(
    shared: &Arc<Shared>,
    source: SnapshotSource,
    reports: Option<crate::report::ReportConfig>,
    shutdown_rx: &watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) {
    tasks.spawn(crate::sources::probe_ejected(Arc::clone(shared), shutdown_rx.clone()));
    let planner = Arc::clone(shared);
    let planner_shutdown = shutdown_rx.clone();
    tasks.spawn(async move { admission::plan_shedding(&planner.routing, planner_shutdown).await });
    if let Some(reports) = reports {
        tasks.spawn(crate::report::run(Arc::clone(shared), reports, shutdown_rx.clone()));
    }
    if !shared.config.peers.is_empty() {
        tasks.spawn(crate::replicas::run(Arc::clone(shared), shutdown_rx.clone()));
    }
    let shutdown_rx = shutdown_rx.clone();
    match source {
        SnapshotSource::Manual => {}
        SnapshotSource::Poll { url, interval, long_poll } => {
            let holds = crate::holds::url_for_snapshot_url(&url).into_iter().collect();
            tasks.spawn(crate::holds::follow(Arc::clone(shared), holds, shutdown_rx.clone()));
            tasks.spawn(crate::sources::poll(
                Arc::clone(shared),
                vec![url],
                interval,
                long_poll,
                shutdown_rx,
            ));
        }
        SnapshotSource::Replicas { urls, interval, long_poll } => {
            // The fast guard rides beside the snapshots, from the same replicas.
            let holds = urls.iter().filter_map(|u| crate::holds::url_for_snapshot_url(u)).collect();
            tasks.spawn(crate::holds::follow(Arc::clone(shared), holds, shutdown_rx.clone()));
            tasks.spawn(crate::sources::poll(Arc::clone(shared), urls, interval, long_poll, shutdown_rx));
        }
        SnapshotSource::Discover { engines, interval } => {
            tasks.spawn(crate::sources::discover(Arc::clone(shared), engines, interval, shutdown_rx));
        }
    }
}

/// The data plane's routing state and background tasks, without a listener.
pub struct Router {
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

/// The request headers [`Router::route`] reads: a gateway may give it these alone
/// (`RouteRequest::headers`), the others change nothing. The body's encoding and type, the
/// session and affinity keys ([`proxy::SESSION_HEADERS`]), constraints, residency, priority.
pub const ROUTE_HEADERS: [HeaderName; 7] = [
    http::header::CONTENT_ENCODING,
    http::header::CONTENT_TYPE,
    HeaderName::from_static("x-session-id"),
    HeaderName::from_static("x-ilb-affinity-key"),
    proxy::REQUIRE_HEADER,
    proxy::RESIDENCY_HEADER,
    proxy::PRIORITY_HEADER,
];

/// One request as a gateway saw it, to route.
pub struct RouteRequest<'a> {
    /// The request's path (a query string is ignored).
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    /// The whole request body as the client sent it (compressed bodies are decoded to be read).
    pub body: Bytes,
    /// Only engines at these `ip:port` endpoints may be picked (the gateway's subset hint);
    /// `None`: any engine of the request's class.
    pub subset: Option<&'a [String]>,
}

impl Router {
    /// Starts the background tasks of `source` (and reports, if configured). `config.listen`
    /// is not bound: the embedding program serves its own protocol.
    pub fn start(
        config: DataPlaneConfig,
        source: SnapshotSource,
        reports: Option<crate::report::ReportConfig>,
    ) -> Router {
        let shared = Arc::new(Shared::new(config));
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        spawn_background(&shared, source, reports, &shutdown_rx, &mut tasks);
        Router { shared, shutdown, tasks }
    }

    pub fn config(&self) -> &DataPlaneConfig {
        &self.shared.config
    }

    /// The installed state, if a snapshot has been installed.
    pub fn installed(&self) -> Option<Arc<Installed>> {
        self.shared.routing.current()
    }

    /// Installs a snapshot now (a manual source, tests).
    pub fn install(&self, snapshot: &ilb_core::snapshot::Snapshot) -> Result<(), crate::state::InstallError> {
        self.shared.install(snapshot)
    }

    /// Parses, validates and installs a snapshot's JSON now (a `snapshot_file`), as
    /// `DataPlane::install_json` does.
    pub fn install_json(&self, bytes: &[u8]) -> Result<(), crate::state::InstallError> {
        self.shared.install_json(bytes)
    }

    /// Runs the task `make` builds from the shared state and the shutdown signal until
    /// [`Router::shutdown`] (a module listed after this one adds its own, as `serve_admin`).
    pub(crate) fn spawn<F>(&mut self, make: impl FnOnce(Arc<Shared>, watch::Receiver<bool>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(make(Arc::clone(&self.shared), self.shutdown.subscribe()));
    }

    /// Stops the background tasks.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
    }

    /// Classifies the request, admits it and picks its engine and then up to
    /// `max_attempts - 1` fallbacks, each among the engines not picked before, as the proxy's
    /// attempts would; waits (bounded, by priority) when every usable engine is full. The
    /// primary counts in flight from now. Errors are the proxy's: a malformed body or unknown
    /// model (4xx), shed (429), no engine (503).
    pub async fn route(&self, request: RouteRequest<'_>) -> Result<Routing, ProxyError> {
        let shared = &self.shared;
        let path = request.path.split('?').next().unwrap_or_default();
        classify::check_path(path).map_err(|e| ProxyError::InvalidPath(e.to_string()))?;
        let endpoint = Endpoint::from_path(path)
            .ok_or_else(|| ProxyError::NotFound { method: "POST".into(), path: path.to_owned() })?;
        let limit = shared.config.max_body_bytes;
        if request.body.len() > limit {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        let mut decoded_headers;
        let mut headers = request.headers;
        let mut body = request.body;
        if headers.contains_key(http::header::CONTENT_ENCODING) {
            decoded_headers = headers.clone();
            body = proxy::decode(&mut decoded_headers, body, limit)?;
            headers = &decoded_headers;
        }
        let request_id = shared.next_request_id();
        let form_model;
        let classified = match proxy::multipart_boundary(headers) {
            Some(boundary) => {
                form_model = proxy::form_field(&body, boundary, "model").await?.ok_or_else(|| {
                    ProxyError::BadRequest("a multipart request must have a 'model' form field".into())
                })?;
                let info = classify::BodyInfo { model: form_model.as_str().into(), ..Default::default() };
                proxy::classify_info(endpoint, info, headers, request_id)?
            }
            None => proxy::classify_request(endpoint, headers, &body, request_id)?,
        };
        self.route_classified(&classified, request_id, request.subset).await
    }

    /// `route` once the request is classified: admits it, picks its primary (waiting while
    /// every usable engine is full) and its fallbacks.
    async fn route_classified(
        &self,
        classified: &Classified<'_>,
        request_id: u64,
        subset: Option<&[String]>,
    ) -> Result<Routing, ProxyError> {
        let shared = &self.shared;
        let installed = shared.routing.load().ok_or(ProxyError::NoSnapshot)?;
        let model = installed
            .table
            .model(&classified.model)
            .ok_or_else(|| ProxyError::UnknownModel(classified.model.to_string()))?;
        let constraints = Constraints { require: &classified.require, residency: classified.residency };
        let class = model.class_for(&constraints);
        let class_state = &installed.classes[class.seq];
        proxy::admit(class_state, class, &model.name, classified.priority, request_id)?;
        // Candidates outside the gateway's subset count as tried: `pick` skips them.
        let mut tried: Vec<usize> = match subset {
            None => Vec::new(),
            Some(subset) => outside_subset(&installed, class, subset),
        };
        let excluded = tried.len();
        let target = ClassTarget { installed: &installed, class, constraints: &constraints };
        let primary = pick_primary(shared, target, &model.name, classified, &tried, subset.is_some()).await?;
        let now_s = (shared.pool_clock.ms() / 1000) as u32;
        let in_flight = InFlight::start(shared, &installed, class, primary);
        tried.push(primary);
        // Fallbacks: what the proxy's retries would pick next (no waiting, not remembered).
        let max_attempts = shared.config.max_attempts.max(1) as usize;
        while tried.len() - excluded < max_attempts {
            let pick = Pick {
                tried: &tried,
                pinned: None,
                affinity: &shared.affinity,
                now_s,
                place_new_by_load: shared.config.place_new_keys_by_load,
            };
            match choose(&installed, class, &constraints, classified.key_hash, pick) {
                Ok(candidate) => tried.push(candidate),
                Err(_) => break,
            }
        }
        let picks: Vec<usize> = tried.split_off(excluded);
        let engines = picks.iter().map(|&c| class.candidates[c].engine_idx).collect();
        let class_pos = model.classes.iter().position(|c| c.seq == class.seq).unwrap_or_default();
        Ok(Routing {
            shared: Arc::clone(shared),
            model: model.name.clone(),
            class_pos,
            key_hash: classified.key_hash,
            now_s,
            picks,
            engines,
            in_flight: Some(in_flight),
            served: None,
            status: None,
            streamed: false,
            last_chunk: None,
            stores_response: classified.endpoint == Endpoint::Responses,
            response_id: None,
            installed,
        })
    }
}

/// The class's candidates whose engines are outside the gateway's endpoint subset.
fn outside_subset(installed: &Installed, class: &ClassTable, subset: &[String]) -> Vec<usize> {
    (0..class.candidates.len())
        .filter(|&c| {
            let endpoint = &installed.endpoints[class.candidates[c].engine_idx];
            !subset.iter().any(|allowed| same_endpoint(allowed, endpoint))
        })
        .collect()
}

/// Picks the primary among the candidates not `tried`, waiting (bounded, by priority) while
/// every usable engine is full; `subset`: the gateway named an endpoint subset.
async fn pick_primary(
    shared: &Shared,
    target: ClassTarget<'_>,
    model: &ModelName,
    classified: &Classified<'_>,
    tried: &[usize],
    subset: bool,
) -> Result<usize, ProxyError> {
    let class_state = &target.installed.classes[target.class.seq];
    let mut wait_started: Option<Instant> = None;
    loop {
        let now_s = (shared.pool_clock.ms() / 1000) as u32;
        match proxy::pick(shared, target, classified, tried, now_s) {
            Ok(candidate) => return Ok(candidate),
            Err(NoCandidate::Saturated) => {
                let wait = admission::wait_for_slot(
                    &shared.waiters,
                    &shared.config,
                    classified.priority,
                    &mut wait_started,
                );
                if let Err(waited) = wait.await {
                    class_state.overloaded.fetch_add(1, Relaxed);
                    let waited_ms = waited.as_millis() as u64;
                    return Err(ProxyError::Overloaded { model: model.to_string(), waited_ms });
                }
            }
            Err(NoCandidate::Unavailable) => {
                class_state.failed.fetch_add(1, Relaxed);
                return Err(ProxyError::NoHealthyEngine {
                    model: model.to_string(),
                    detail: match (target.constraints.is_empty(), subset) {
                        (true, false) => String::new(),
                        (false, false) => " satisfying the request's constraints".into(),
                        (_, true) => " among the gateway's endpoint subset".into(),
                    },
                });
            }
        }
    }
}

/// A routed request: its picks (primary first) and, once the gateway says which served, that
/// engine's in-flight count until the response ends.
pub struct Routing {
    shared: Arc<Shared>,
    installed: Arc<Installed>,
    model: ilb_core::ModelName,
    /// The class's position among its model's classes.
    class_pos: usize,
    key_hash: u64,
    now_s: u32,
    /// Candidates of the class, primary first, then the fallbacks in order.
    picks: Vec<usize>,
    /// The engine of each pick (an index into `installed.engines` and `installed.endpoints`).
    engines: Vec<usize>,
    in_flight: Option<InFlight>,
    /// Which pick served (an index into `picks`).
    served: Option<usize>,
    status: Option<StatusCode>,
    streamed: bool,
    last_chunk: Option<Instant>,
    /// A Responses API request: the engine that answers it stores the response.
    stores_response: bool,
    /// The search for that response's id in the body passing through.
    response_id: Option<Box<ResponseIdReader>>,
}

impl Routing {
    /// The picked endpoints (`ip:port`), primary first.
    pub fn endpoints(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.engines.iter().map(|&engine| self.installed.endpoints[engine].as_str())
    }

    /// The ids of the picked engines, primary first.
    pub fn engine_ids(&self) -> Vec<&str> {
        match self.class() {
            Some(class) => self
                .picks
                .iter()
                .map(|&c| self.installed.table.engines[class.candidates[c].engine_idx].id.as_str())
                .collect(),
            None => Vec::new(),
        }
    }

    fn class(&self) -> Option<&ClassTable> {
        self.installed.table.model(self.model.as_str())?.classes.get(self.class_pos)
    }

    /// The response head arrived from `served` (`ip:port`, as the gateway reports it; `None`
    /// when it does not say: the primary is assumed) with `status`. The picks before the one
    /// that served failed (the gateway retried past them) and count against their engines; the
    /// request counts in flight on the engine that served, which the affinity table remembers.
    /// `streamed`: an SSE body follows (its chunks feed the streaming latency figures).
    pub fn served(&mut self, served: Option<&str>, status: StatusCode, streamed: bool) {
        if self.served.is_some() {
            return;
        }
        let index = match served {
            None => Some(0),
            Some(endpoint) => self.endpoints().position(|e| same_endpoint(e, endpoint)),
        };
        let Some(index) = index else {
            // Not one of ours (the gateway's fallback policy chose): say nothing about anyone.
            tracing::debug!(served = ?served, picks = ?self.endpoints().collect::<Vec<_>>(), "served by an endpoint the router did not pick");
            self.in_flight = None;
            return;
        };
        self.served = Some(index);
        self.status = Some(status);
        self.streamed = streamed;
        if index > 0 {
            let Some(class) =
                self.installed.table.model(self.model.as_str()).and_then(|m| m.classes.get(self.class_pos))
            else {
                return;
            };
            if let Some(mut primary) = self.in_flight.take() {
                primary.finish(Outcome::NoAnswer);
            }
            for &failed in &self.picks[1..index] {
                InFlight::start(&self.shared, &self.installed, class, failed).finish(Outcome::NoAnswer);
            }
            let candidate = self.picks[index];
            self.in_flight = Some(InFlight::start(&self.shared, &self.installed, class, candidate));
            class.remember(&self.shared.affinity, self.key_hash, candidate, self.now_s);
        }
        if let Some(in_flight) = &self.in_flight {
            in_flight.first_byte();
        }
        // A stored response: a follow-up naming its id (`previous_response_id`) must reach
        // this engine, so its id is read from the body as it passes.
        if self.stores_response && status.is_success() && self.in_flight.is_some() {
            if let Some(class) = self.class() {
                let store = ResponseStore { tag: class.affinity_tag(self.picks[index]), now_s: self.now_s };
                self.response_id = Some(ResponseIdReader::new(store, streamed));
            }
        }
    }

    /// `data`, a piece of the response body, passed through.
    pub fn body(&mut self, data: &[u8]) {
        let Some(in_flight) = &self.in_flight else { return };
        ResponseIdReader::read(&mut self.response_id, data, false, in_flight);
        if self.streamed && !data.is_empty() {
            let now = crate::clock::now();
            in_flight.stream_chunk(self.last_chunk, now);
            self.last_chunk = Some(now);
        }
    }

    /// The response ended: the engine's in-flight count drops and the attempt is judged.
    pub fn finish(&mut self) {
        let Some(mut in_flight) = self.in_flight.take() else { return };
        ResponseIdReader::read(&mut self.response_id, &[], true, &in_flight);
        let status = self.status.unwrap_or(StatusCode::OK);
        if let Some(class) = self.class() {
            let class_state = &self.installed.classes[class.seq];
            if status.is_success() {
                class_state.ok.fetch_add(1, Relaxed);
            } else if status.is_server_error() {
                class_state.failed.fetch_add(1, Relaxed);
            }
        }
        in_flight.finish(Outcome::Answered(status));
    }
}

/// Whether two `ip:port` strings name the same endpoint (`::1` written two ways, say).
fn same_endpoint(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim(), b.trim());
    if a == b {
        return true;
    }
    match (a.parse::<std::net::SocketAddr>(), b.parse::<std::net::SocketAddr>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a.eq_ignore_ascii_case(b),
    }
}

#[cfg(test)]
mod tests {
    use super::same_endpoint;

    /// The session headers the classification reads are among the route headers.
    #[test]
    fn route_headers_hold_the_session_headers() {
        for name in &crate::proxy::SESSION_HEADERS {
            assert!(super::ROUTE_HEADERS.contains(name), "{name}");
        }
    }

    #[test]
    fn endpoints_compare_as_socket_addresses() {
        assert!(same_endpoint("10.0.0.1:80", " 10.0.0.1:80"));
        assert!(same_endpoint("[::1]:80", "[0:0:0:0:0:0:0:1]:80"));
        assert!(!same_endpoint("10.0.0.1:80", "10.0.0.1:81"));
        assert!(same_endpoint("Engine:80", "engine:80"));
    }
}

//! The control loop. One task owns the [`Fleet`] and reacts to a closed set of events: a scrape
//! finished, a data-plane report arrived, the solve timer ticked, a solve finished, the config
//! file was reloaded, an engine registered or left, a discovery group resolved. Scrapers, the
//! HTTP API and discovery are separate tasks talking to it over a bounded channel; the solver
//! runs on a blocking thread so a long solve never holds up signal intake.
//!
//! A change of the engine set is applied to the fleet as a diff ([`Fleet::apply_config`]) and starts a
//! solve at once (or right after the one running), so the next published plan reflects it. A
//! solve that was started before a change is discarded: its plans index the old engine set.

use crate::api::{self, ApiState};
use crate::discovery::Discovery;
use crate::election::{self, Election, EtcdOptions, Leadership};
use crate::events::{ControlHandles, Event, Solved};
use crate::publish::Publisher;
use crate::scrape::{self, HttpClient};
use ilb_planning::config::{Engine, FleetConfig};
use ilb_planning::fleet::members::{Members, RegisterOutcome};
use ilb_planning::fleet::{Fleet, Now};
use ilb_planning::view::{self, View};
use ilb_planning::Planner;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// A running control plane.
pub struct ControlPlane {
    local_addr: SocketAddr,
    /// With etcd: whether this replica leads.
    leadership: Option<Arc<Leadership>>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    state: Arc<ApiState>,
}

/// Sends new configurations to a running control plane; cheap to clone.
#[derive(Clone)]
pub struct Reloader {
    events: mpsc::Sender<Event>,
}

impl Reloader {
    /// Applies `config` (validated again first) as a diff, or records why a file was refused
    /// (`Err`): the running configuration then stays, and `/v1/state` shows the reason. False
    /// if the control plane has stopped.
    pub async fn reload(&self, config: Result<FleetConfig, String>) -> bool {
        self.events.send(Event::Reload(Box::new(config))).await.is_ok()
    }
}

impl ControlPlane {
    /// Validates nothing: `config` must have passed [`FleetConfig::validate`]. Binds `listen`.
    pub async fn start(config: FleetConfig, listen: SocketAddr) -> std::io::Result<ControlPlane> {
        Self::start_with_tls(config, listen, api::ApiTls::default()).await
    }

    /// As [`ControlPlane::start`], with TLS on the API listener and/or for scrapes.
    pub async fn start_with_tls(
        config: FleetConfig,
        listen: SocketAddr,
        tls: api::ApiTls,
    ) -> std::io::Result<ControlPlane> {
        Self::start_elected(config, listen, tls, None).await
    }

    /// As [`ControlPlane::start_with_tls`]; with `etcd`, the replicas sharing its prefix elect
    /// one planner and all publish its plans (`election.rs`).
    pub async fn start_elected(
        config: FleetConfig,
        listen: SocketAddr,
        tls: api::ApiTls,
        etcd: Option<EtcdOptions>,
    ) -> std::io::Result<ControlPlane> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let local_addr = listener.local_addr()?;
        let (events, rx) = mpsc::channel(1024);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let state = Arc::new(ApiState {
            publisher: Publisher::default(),
            events: events.clone(),
            view: Mutex::new(Arc::new(View::default())),
            problems: Mutex::default(),
            token: Mutex::new(config.control_plane.token.clone()),
            holds: crate::guard::HoldsPublisher::new(crate::clock::unix_ms()),
            identities: Mutex::default(),
            https: tls.listener.is_some(),
            relay: Default::default(),
        });
        let mut tasks = JoinSet::new();
        let client = match &tls.scrape {
            Some(scrape_tls) => scrape::https_client(scrape_tls),
            None => scrape::http_client(),
        };
        tasks.spawn(api::serve_tls(listener, Arc::clone(&state), tls.listener, shutdown_rx.clone()));
        let (solve_every, solve_every_rx) =
            watch::channel(Duration::from_millis(config.control_plane.solve_interval_ms));
        tasks.spawn(ticker(solve_every_rx, events.clone(), shutdown_rx.clone()));
        let (solved_tx, solved_rx) = mpsc::channel::<Event>(1);
        let election = etcd.map(|options| {
            let leadership = Arc::new(Leadership::default());
            let (rounds, rounds_rx) = watch::channel(None);
            let (state, events, shutdown) = (Arc::clone(&state), events.clone(), shutdown_rx.clone());
            tasks.spawn(election::run(options, Arc::clone(&leadership), rounds_rx, state, events, shutdown));
            Election { leadership, rounds }
        });
        let leadership = election.as_ref().map(|e| Arc::clone(&e.leadership));
        let control = Control {
            fleet: Fleet::new(FleetConfig { engines: Vec::new(), ..config.clone() }),
            members: Members::new(config.clone(), crate::clock::unix_ms()),
            state: Arc::clone(&state),
            epoch: crate::clock::now(),
            planner: Some(Planner::for_config(&config)),
            generation: 0,
            solve_pending: false,
            solved_tx,
            scrapers: Scrapers::default(),
            discovery: Discovery::default(),
            client,
            events,
            shutdown: shutdown_rx.clone(),
            solve_every,
            listen: local_addr,
            solver_panics: 0,
            snapshots_refused: 0,
            election,
        };
        tasks.spawn(control.run(rx, solved_rx));
        Ok(ControlPlane { local_addr, leadership, shutdown, tasks, state })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `http://ip:port`, or `https://ip:port` with a TLS listener.
    pub fn url(&self) -> String {
        let scheme = if self.state.https { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr)
    }

    /// The latest plan and its explanation.
    pub fn view(&self) -> Arc<View> {
        self.state.view()
    }

    /// With etcd, the term this replica leads in (`None` while following); `None` without.
    pub fn leader_term(&self) -> Option<u64> {
        self.leadership.as_ref().and_then(|l| l.term())
    }

    /// A handle that applies new configurations.
    pub fn reloader(&self) -> Reloader {
        Reloader { events: self.state.events.clone() }
    }

    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// One scrape task per engine, keyed by id; aborted when the engine leaves or moves.
#[derive(Default)]
struct Scrapers {
    running: HashMap<String, (String, tokio::task::AbortHandle)>,
    every: Duration,
}

impl Scrapers {
    /// Starts scrapers for new engines (or new URLs, or a new period) and stops those of
    /// engines that left.
    fn sync(&mut self, control: &ControlHandles, engines: &[Engine], every: Duration) {
        if every != self.every {
            self.stop_all();
            self.every = every;
        }
        let mut keep = HashMap::with_capacity(engines.len());
        for e in engines {
            match self.running.remove(&e.id) {
                Some((url, handle)) if url == e.url => {
                    keep.insert(e.id.clone(), (url, handle));
                }
                previous => {
                    if let Some((_, handle)) = previous {
                        handle.abort();
                    }
                    let metrics = format!("{}/metrics", e.url.trim_end_matches('/'));
                    let task = tokio::spawn(scraper(
                        e.id.clone(),
                        e.url.clone(),
                        metrics,
                        every,
                        control.client.clone(),
                        control.events.clone(),
                        control.shutdown.clone(),
                    ));
                    keep.insert(e.id.clone(), (e.url.clone(), task.abort_handle()));
                }
            }
        }
        self.stop_all();
        self.running = keep;
    }

    fn stop_all(&mut self) {
        for (_, (_, handle)) in self.running.drain() {
            handle.abort();
        }
    }
}

impl Drop for Scrapers {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// The control loop's state.
struct Control {
    fleet: Fleet,
    members: Members,
    state: Arc<ApiState>,
    epoch: Instant,
    /// The planner, while no solve runs (a solve takes it to its thread). Its options follow
    /// the fleet's configuration; one coming back from a solve takes them again.
    planner: Option<Planner>,
    /// Bumped by every change of the engine set or the settings.
    generation: u64,
    /// A change arrived while a solve ran: solve again when it returns.
    solve_pending: bool,
    solved_tx: mpsc::Sender<Event>,
    scrapers: Scrapers,
    discovery: Discovery,
    client: HttpClient,
    events: mpsc::Sender<Event>,
    shutdown: watch::Receiver<bool>,
    solve_every: watch::Sender<Duration>,
    listen: SocketAddr,
    /// Solves that panicked since start (`ilb_controlplane_solver_panics_total`).
    solver_panics: u64,
    /// Planned snapshots not published because they failed validation
    /// (`ilb_controlplane_snapshots_refused_total`).
    snapshots_refused: u64,
    /// With etcd: whether this replica leads, and the channel of its rounds to etcd.
    election: Option<Election>,
}

impl Control {
    fn now(&self) -> Now {
        crate::clock::since(self.epoch)
    }

    fn handles(&self) -> ControlHandles {
        ControlHandles {
            client: self.client.clone(),
            events: self.events.clone(),
            shutdown: self.shutdown.clone(),
        }
    }

    async fn run(mut self, mut events: mpsc::Receiver<Event>, mut solved_rx: mpsc::Receiver<Event>) {
        self.apply("start");
        let mut shutdown = self.shutdown.clone();
        loop {
            let event = tokio::select! {
                Some(e) = events.recv() => e,
                Some(e) = solved_rx.recv() => e,
                _ = shutdown.changed() => return,
                else => return,
            };
            self.on_event(event);
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Scraped { engine, url, result } => {
                let Some(idx) = self.fleet.engine_idx(&engine) else { return };
                // A scrape that started before the engine moved to another URL is not its own.
                if self.fleet.config.engines[idx].url != url {
                    return;
                }
                if let Err(e) = &result {
                    tracing::debug!(%engine, error = %e, "scrape failed");
                }
                let now = self.now();
                let held_before = self.fleet.hold_reason(idx);
                self.fleet.on_scrape(idx, now, result);
                // The fast guard: held engines reach the data planes without waiting for a plan.
                if self.fleet.hold_reason(idx) != held_before {
                    self.state.holds.update(self.fleet.holds());
                }
            }
            Event::Report(report) => {
                if let Err(e) = self.fleet.on_report(self.now(), *report) {
                    tracing::warn!(error = %e, "report ignored");
                }
            }
            Event::Tick => {
                let now = self.now();
                let expired = self.members.expire(now);
                if !expired.is_empty() {
                    for id in &expired {
                        tracing::info!(engine = %id, "registration lease expired");
                    }
                    self.apply("lease expiry");
                }
                self.fleet.expire(now);
                self.fleet.update_penalties(now);
                // Also on every tick, for what changes without a scrape.
                self.state.holds.update(self.fleet.holds());
                // At most one solve at a time: a tick during a solve is skipped.
                self.solve();
            }
            Event::Solved(solved) => self.on_solved(*solved),
            Event::Reload(config) => self.on_reload(*config),
            Event::Register(registration, reply) => {
                let id = registration.id.clone();
                let outcome = self.members.register(self.now(), *registration);
                match &outcome {
                    Ok(RegisterOutcome::Renewed) => {}
                    Ok(outcome) => {
                        tracing::info!(engine = %id, ?outcome, "engine registered");
                        self.apply("registration");
                    }
                    Err(e) => tracing::warn!(engine = %id, error = %e, "registration refused"),
                }
                let _ = reply.send(outcome);
            }
            Event::Deregister(id, reply) => {
                let removed = self.members.deregister(&id);
                if removed {
                    tracing::info!(engine = %id, "engine deregistered");
                    self.apply("deregistration");
                }
                let _ = reply.send(removed);
            }
            Event::Discovered { group, engines } => {
                if self.members.set_discovered(&group, engines) {
                    self.apply("discovery");
                }
            }
            Event::Elected => self.solve(),
        }
    }

    fn on_reload(&mut self, config: Result<FleetConfig, String>) {
        let config = config.and_then(|c| c.validate().map(|()| c).map_err(|e| e.to_string()));
        let config = match config {
            Ok(config) => config,
            Err(reason) => {
                // The reason is shown unauthenticated (`/v1/state`): whatever wrote it, it must
                // not carry the running token (`ilb_core::redact`).
                let reason = ilb_core::redact::message(&reason, &[&self.members.file().control_plane.token]);
                tracing::warn!(%reason, "config reload refused; the running configuration stays");
                self.members.reject(reason, crate::clock::unix_ms());
                self.publish_membership();
                return;
            }
        };
        let mut needs_restart = Vec::new();
        if config.control_plane.listen != self.members.file().control_plane.listen {
            needs_restart
                .push(format!("control_plane.listen: still listening on {} until a restart", self.listen));
        }
        for dropped in self.members.set_file(config, crate::clock::unix_ms()) {
            tracing::warn!("{dropped}");
        }
        self.members.status.needs_restart = needs_restart;
        self.apply("reload");
    }

    /// Makes the fleet the members' effective configuration, restarts what depends on
    /// settings, and solves at once.
    fn apply(&mut self, why: &str) {
        let config = self.members.effective();
        let cp = &config.control_plane;
        let handles = self.handles();
        self.scrapers.sync(&handles, &config.engines, Duration::from_millis(cp.scrape_interval_ms));
        self.discovery.sync(&handles, &config.engine_groups);
        self.solve_every.send_if_modified(|every| {
            let new = Duration::from_millis(cp.solve_interval_ms);
            std::mem::replace(every, new) != new
        });
        *self.state.token.lock().unwrap_or_else(|p| p.into_inner()) = cp.token.clone();
        if let Some(planner) = &mut self.planner {
            planner.configure(&config);
        }
        let now = self.now();
        let diff = self.fleet.apply_config_at(config, Some(now));
        self.state.holds.update(self.fleet.holds());
        if !diff.is_empty() {
            tracing::info!(
                why,
                added = ?diff.added,
                removed = ?diff.removed,
                changed = ?diff.changed,
                engines = self.fleet.engines.len(),
                "engine set changed"
            );
        }
        self.generation += 1;
        self.publish_membership();
        self.solve();
    }

    /// Starts a solve if none runs, else one right after it.
    fn solve(&mut self) {
        let Some(mut planner) = self.planner.take() else {
            self.solve_pending = true;
            return;
        };
        self.solve_pending = false;
        let problems = planner.build(&self.fleet, self.now());
        let tx = self.solved_tx.clone();
        let generation = self.generation;
        let epoch = self.epoch;
        tokio::task::spawn_blocking(move || {
            // The planner reads no clock: it times each model's solve with ours.
            let round = planner.solve_timed(problems, || crate::clock::since(epoch));
            let _ = tx.blocking_send(Event::Solved(Box::new(Solved { round, planner, generation })));
        });
    }

    fn on_solved(&mut self, solved: Solved) {
        let Solved { round, mut planner, generation } = solved;
        self.solver_panics += round.panics;
        // The options may have changed while it solved.
        planner.configure(&self.fleet.config);
        self.planner = Some(planner);
        if generation != self.generation {
            // Built from an engine set that has changed since: its indices are not ours.
            self.solve();
            return;
        }
        let now = self.now();
        let unix_ms = crate::clock::unix_ms();
        // With etcd only the leader publishes, under its term's versions (`election.rs`); a
        // follower's round still updates its view.
        let version = match &self.election {
            None => Some(self.state.publisher.next_version(unix_ms)),
            Some(election) => election.leadership.next_version(crate::clock::now()),
        };
        if let Some(version) = version {
            let snapshots = round.snapshots(&self.fleet, version, unix_ms);
            self.snapshots_refused += self.state.publisher.publish(&snapshots) as u64;
            if let Some(election) = &self.election {
                election.share(version, snapshots);
            }
        }
        let version = version.unwrap_or(0);
        let mut view = view::build(&self.fleet, now, &round, version, unix_ms);
        view.membership = self.members.view(now);
        view.solver_panics = self.solver_panics;
        view.snapshots_refused = self.snapshots_refused;
        self.state.set_view(view);
        self.state.set_problems(round.plans.iter().map(|p| (p.model.clone(), p.problem.clone())).collect());
        if self.solve_pending {
            self.solve();
        }
    }

    /// Shows the membership now, without waiting for the next solve.
    fn publish_membership(&self) {
        let mut view = (*self.state.view()).clone();
        view.membership = self.members.view(self.now());
        self.state.set_view(view);
    }
}

async fn scraper(
    engine: String,
    base_url: String,
    url: String,
    every: Duration,
    client: HttpClient,
    events: mpsc::Sender<Event>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Ok(uri) = url.parse::<http::Uri>() else {
        tracing::error!(%url, "engine metrics url does not parse");
        return;
    };
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.changed() => return,
        }
        let result = scrape::scrape(&client, &uri, every.max(Duration::from_millis(500)))
            .await
            .map_err(|e| e.to_string());
        let event = Event::Scraped { engine: engine.clone(), url: base_url.clone(), result };
        if events.send(event).await.is_err() {
            return;
        }
    }
}

async fn ticker(
    mut every: watch::Receiver<Duration>,
    events: mpsc::Sender<Event>,
    mut shutdown: watch::Receiver<bool>,
) {
    // The first tick comes one period in: the start (and a reload that changes the period)
    // solves at once by itself, and an immediate tick would publish a second plan right after.
    let periodic = |period: Duration| {
        let mut interval = tokio::time::interval_at(crate::clock::now() + period, period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval
    };
    let mut interval = periodic(*every.borrow_and_update());
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            Ok(()) = every.changed() => {
                interval = periodic(*every.borrow_and_update());
                continue;
            }
            _ = shutdown.changed() => return,
        }
        if events.send(Event::Tick).await.is_err() {
            return;
        }
    }
}

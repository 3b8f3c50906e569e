//! The control loop. One task owns the [`Fleet`] and reacts to a closed set of events: a scrape
//! finished, a data-plane report arrived, the solve timer ticked, a solve finished. Scrapers
//! and the HTTP API are separate tasks talking to it over a bounded channel; the solver runs on
//! a blocking thread so a long solve never holds up signal intake.

use crate::api::{self, ApiState};
use crate::config::FleetConfig;
use crate::fleet::{Fleet, Now};
use crate::plan::{self, ModelPlan};
use crate::publish::Publisher;
use crate::scrape::{self, HttpClient};
use crate::signals::EngineSample;
use crate::view::{self, View};
use ilb_core::report::Report;
use ilb_core::ModelName;
use ilb_optimizer::{Solution, Solver, SolverOptions};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub enum Event {
    Scraped { engine: usize, result: Result<Vec<(ModelName, EngineSample)>, String> },
    Report(Box<Report>),
    Tick,
    Solved(Box<Solved>),
}

pub struct Solved {
    plans: Vec<ModelPlan>,
    results: Vec<(Result<Solution, String>, f64)>,
    solvers: BTreeMap<String, Solver>,
}

/// A running control plane.
pub struct ControlPlane {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    state: Arc<ApiState>,
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
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let local_addr = listener.local_addr()?;
        let (events, rx) = mpsc::channel(1024);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let state = Arc::new(ApiState {
            publisher: Publisher::default(),
            events: events.clone(),
            view: Mutex::new(Arc::new(View::default())),
            problems: Mutex::default(),
            token: config.control_plane.token.clone(),
            holds: crate::guard::HoldsPublisher::new(crate::clock::unix_ms()),
            identities: Mutex::default(),
            https: tls.listener.is_some(),
        });
        let mut tasks = JoinSet::new();
        let client = match &tls.scrape {
            Some(scrape_tls) => scrape::https_client(scrape_tls),
            None => scrape::http_client(),
        };
        tasks.spawn(api::serve_tls(listener, Arc::clone(&state), tls.listener, shutdown_rx.clone()));
        let scrape_every = Duration::from_millis(config.control_plane.scrape_interval_ms);
        for (idx, engine) in config.engines.iter().enumerate() {
            let url = format!("{}/metrics", engine.url.trim_end_matches('/'));
            tasks.spawn(scraper(idx, url, scrape_every, client.clone(), events.clone(), shutdown_rx.clone()));
        }
        let solve_every = Duration::from_millis(config.control_plane.solve_interval_ms);
        tasks.spawn(ticker(solve_every, events, shutdown_rx.clone()));
        tasks.spawn(control_loop(Fleet::new(config), rx, Arc::clone(&state), shutdown_rx));
        Ok(ControlPlane { local_addr, shutdown, tasks, state })
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

    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

async fn scraper(
    engine: usize,
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
        if events.send(Event::Scraped { engine, result }).await.is_err() {
            return;
        }
    }
}

async fn ticker(every: Duration, events: mpsc::Sender<Event>, mut shutdown: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.changed() => return,
        }
        if events.send(Event::Tick).await.is_err() {
            return;
        }
    }
}

async fn control_loop(
    mut fleet: Fleet,
    mut events: mpsc::Receiver<Event>,
    state: Arc<ApiState>,
    mut shutdown: watch::Receiver<bool>,
) {
    let epoch = Instant::now();
    let now = || -> Now { epoch.elapsed() };
    let mut solvers: Option<BTreeMap<String, Solver>> = Some(BTreeMap::new());
    let (solved_tx, mut solved_rx) = mpsc::channel::<Event>(1);
    loop {
        let event = tokio::select! {
            Some(e) = events.recv() => e,
            Some(e) = solved_rx.recv() => e,
            _ = shutdown.changed() => return,
            else => return,
        };
        match event {
            Event::Scraped { engine, result } => {
                if let Err(e) = &result {
                    tracing::debug!(engine = %fleet.config.engines[engine].id, error = %e, "scrape failed");
                }
                fleet.on_scrape(engine, now(), result);
                // The fast guard: held engines reach the data planes without waiting for a plan.
                state.holds.update(fleet.holds());
            }
            Event::Report(report) => {
                if let Err(e) = fleet.on_report(now(), *report) {
                    tracing::warn!(error = %e, "report ignored");
                }
            }
            Event::Tick => {
                fleet.expire(now());
                fleet.update_penalties(now());
                // At most one solve at a time: a tick during a solve is skipped.
                let Some(taken) = solvers.take() else { continue };
                let plans = plan::build(&fleet, now());
                let tx = solved_tx.clone();
                let options = plan::solver_options(&fleet.config);
                tokio::task::spawn_blocking(move || {
                    let solved = solve_all(plans, taken, &options);
                    let _ = tx.blocking_send(Event::Solved(Box::new(solved)));
                });
            }
            Event::Solved(solved) => {
                let Solved { plans, results, solvers: returned } = *solved;
                solvers = Some(returned);
                let unix_ms = crate::clock::unix_ms();
                let version = state.publisher.next_version(unix_ms);
                let solutions: Vec<Option<Solution>> =
                    results.iter().map(|(r, _)| r.as_ref().ok().cloned()).collect();
                let snapshots = plan::snapshots(&fleet, &plans, &solutions, version, unix_ms);
                state.publisher.publish(&snapshots);
                let view = view::build(&fleet, now(), &plans, &results, version, unix_ms);
                state.set_view(view);
                state.set_problems(plans.iter().map(|p| (p.model.clone(), p.problem.clone())).collect());
            }
        }
    }
}

/// Solves every model, warm-starting each from its previous solution. Runs on a blocking thread.
fn solve_all(
    plans: Vec<ModelPlan>,
    mut solvers: BTreeMap<String, Solver>,
    options: &SolverOptions,
) -> Solved {
    let results = plans
        .iter()
        .map(|plan| {
            let solver = solvers.entry(plan.model.clone()).or_insert_with(|| Solver::new(options.clone()));
            let started = Instant::now();
            let result = solver.solve(&plan.problem).map_err(|e| {
                tracing::error!(model = %plan.model, error = %e, "optimizer rejected the problem");
                e.to_string()
            });
            (result, started.elapsed().as_secs_f64() * 1000.0)
        })
        .collect();
    Solved { plans, results, solvers }
}

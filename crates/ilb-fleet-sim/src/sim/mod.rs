//! The discrete-event simulation of one policy over the whole fleet: sessions arrive, the
//! policy routes each turn, engine models run in virtual time (woken only at their next event
//! time, which jumps over runs of identical decode iterations), engines are scraped and data
//! planes report on their periods, the policy's control loop ticks, scenario events fire.
//! O(log n) per event; deterministic for a seed.

mod events;
mod transients;

pub use events::{nanos, seconds};

use crate::engines::SimEngine;
use crate::metrics::{Completion, PolicyResult, Recorder, TRANSIENT_WINDOW_S};
use crate::policy::{Arrival, Decision, Load, Policy, Topology, PEER_GAP_NS};
use crate::scenario::Sharing;
use crate::scenario::{EventKind, Scenario};
use crate::workload::{demand_rps, Session};
use crate::SimError;
use events::{Event, Queue};
use ilb_core::priority::Priority;
use ilb_core::report::{ClassDemand, PriorityRps, Report};
use ilb_core::{ClassId, ClusterId, ModelName};
use ilb_engine_sim::{Nanos, Outcome, Request};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::collections::HashMap;
use transients::{Reflects, Watch};

/// How long and with what seed one run goes.
#[derive(Clone, Copy, Debug)]
pub struct RunSpec {
    pub duration_s: f64,
    pub warmup_s: f64,
    pub seed: u64,
    pub sample_period_s: f64,
}

struct Live {
    session: Box<Session>,
    engine: usize,
    /// The data plane of its cluster that sent it.
    data_plane: usize,
    net_ms: f64,
}

struct Sim<'a> {
    scenario: &'a Scenario,
    topology: &'a Topology,
    policy: &'a mut dyn Policy,
    spec: RunSpec,
    end: Nanos,
    engines: Vec<SimEngine>,
    load: Load,
    queue: Queue,
    live: HashMap<u64, Live>,
    next_request: u64,
    arrival_rng: Vec<Pcg64Mcg>,
    policy_rng: Pcg64Mcg,
    /// Which of its cluster's data planes each request reaches (drawn only with several).
    data_plane_rng: Pcg64Mcg,
    sessions_started: Vec<u64>,
    period_requests: Vec<u64>,
    period_shed: Vec<u64>,
    demand_ewma: Vec<Option<f64>>,
    report_seq: u64,
    recorder: Recorder,
    outcomes: Vec<Outcome>,
    /// (failure time, engines, seconds until a plan excluded them).
    failures: Vec<(Nanos, Vec<usize>, Option<f64>)>,
    busy_before: Vec<u64>,
    last_sample: Nanos,
    /// Arrivals per stream after the warm-up.
    measured_arrivals: Vec<u64>,
    /// Per scenario event (policies with a control loop): its plan watch.
    watches: Vec<(usize, Watch)>,
}

/// Runs `policy` over `scenario` and returns what was measured.
pub fn run(
    scenario: &Scenario,
    topology: &Topology,
    policy: &mut dyn Policy,
    spec: RunSpec,
) -> Result<PolicyResult, SimError> {
    let engines = scenario
        .engines
        .iter()
        .map(|e| SimEngine::new(&e.profile).map_err(|err| SimError::Engine(format!("{}: {err}", e.id))))
        .collect::<Result<Vec<_>, _>>()?;
    let n_streams = scenario.streams.len();
    let priorities: Vec<String> = scenario.streams.iter().map(|s| s.priority.clone()).collect();
    let hardware: Vec<&str> = scenario.engines.iter().map(|e| e.hardware.as_str()).collect();
    let mut sim = Sim {
        scenario,
        topology,
        policy,
        spec,
        end: nanos(spec.duration_s),
        busy_before: vec![0; engines.len()],
        engines,
        load: Load::new(topology, n_streams),
        queue: Queue::default(),
        live: HashMap::new(),
        next_request: 0,
        arrival_rng: (0..n_streams)
            .map(|s| Pcg64Mcg::seed_from_u64(spec.seed ^ (s as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .collect(),
        policy_rng: Pcg64Mcg::seed_from_u64(spec.seed ^ 0x5eed_0f90_11c7),
        data_plane_rng: Pcg64Mcg::seed_from_u64(spec.seed ^ 0xda7a_0000_91a4_00e5),
        sessions_started: vec![0; n_streams],
        period_requests: vec![0; n_streams],
        period_shed: vec![0; n_streams],
        demand_ewma: vec![None; n_streams],
        report_seq: 0,
        recorder: Recorder::new(spec.warmup_s, scenario.file.slo_ttft_ms, &priorities, &hardware),
        outcomes: Vec::new(),
        failures: Vec::new(),
        last_sample: 0,
        measured_arrivals: vec![0; n_streams],
        watches: Vec::new(),
    };
    sim.start();
    sim.run_loop();
    let window = (spec.duration_s - spec.warmup_s).max(1e-9);
    let mean_rps: Vec<f64> = sim.measured_arrivals.iter().map(|&n| n as f64 / window).collect();
    let steady = sim.policy.steady_state_latency_ms(sim.end, topology, &mean_rps);
    sim.recorder.result.steady_state_e2e_ms = steady;
    let replan = sim
        .failures
        .iter()
        .map(|f| f.2.unwrap_or(f64::INFINITY))
        .fold(None, |acc: Option<f64>, x| Some(acc.map_or(x, |a| a.max(x))));
    let replan = if sim.policy.period_s().is_some() { replan } else { None };
    for (i, w) in std::mem::take(&mut sim.watches) {
        let since = |t: Option<Nanos>| t.map(|t| seconds(t - w.at));
        sim.recorder.transient_plan(i, since(w.replan), since(w.settled));
    }
    sim.recorder.result.plans = sim.policy.period_s().is_some();
    Ok(sim.recorder.finish(spec.duration_s, replan))
}

impl Sim<'_> {
    fn start(&mut self) {
        for s in 0..self.scenario.streams.len() {
            self.schedule_session(s, 0);
        }
        let control = &self.scenario.file.control;
        if self.policy.wants_signals() {
            self.queue.push(0, Event::Scrape);
            self.queue.push(nanos(control.report_period_s), Event::Report);
        }
        if let Some(period) = self.policy.period_s() {
            self.queue.push(nanos(period), Event::Tick);
        }
        let data_planes = self.topology.data_planes;
        if self.policy.has_data_planes() && data_planes > 1 {
            match self.topology.sharing {
                Sharing::None => {}
                Sharing::Peers => self.queue.push(PEER_GAP_NS, Event::Share(None)),
                // Each data plane reports on its own phase, evenly spread over the period.
                Sharing::ControlPlane => {
                    for r in 0..data_planes {
                        let at = control.report_period_s * (r + 1) as f64 / data_planes as f64;
                        self.queue.push(nanos(at), Event::Share(Some(r)));
                    }
                }
            }
        }
        self.queue.push(nanos(self.spec.sample_period_s), Event::Sample);
        for (i, e) in self.scenario.file.events.iter().enumerate() {
            self.queue.push(nanos(e.at_s), Event::Scenario(i));
            let window = e
                .window_s
                .or(if e.kind == EventKind::Surge { e.duration_s } else { None })
                .unwrap_or(TRANSIENT_WINDOW_S)
                .min(self.next_event_s(e.at_s) - e.at_s);
            self.recorder.add_transient(i, e.kind.name(), e.at_s, window);
        }
    }

    /// The time of the first scenario event after `t_s`, or the end of the run.
    fn next_event_s(&self, t_s: f64) -> f64 {
        let events = self.scenario.file.events.iter().map(|e| e.at_s).filter(|&at| at > t_s);
        events.fold(self.spec.duration_s, f64::min)
    }

    /// The current intended split, stream-major.
    fn plan(&self) -> Vec<f64> {
        let mut weights = vec![0.0; self.scenario.streams.len() * self.topology.n_engines];
        self.policy.weights(self.topology, &self.load, &mut weights);
        weights
    }

    fn demand_at(&self, t_s: f64) -> Vec<f64> {
        (0..self.scenario.streams.len()).map(|s| demand_rps(self.scenario, s, t_s)).collect()
    }

    /// A plan was installed at `now`: every watch still looking sees it.
    fn watch_plans(&mut self, now: Nanos) {
        if !self.watches.iter().any(|(_, w)| w.at <= now && now <= w.until && w.settled.is_none()) {
            return;
        }
        let (plan, demand) = (self.plan(), self.demand_at(seconds(now)));
        for (_, w) in &mut self.watches {
            w.observe(now, &plan, &demand);
        }
    }

    /// Starts watching the plans after scenario event `i` (before it takes effect).
    fn watch(&mut self, now: Nanos, i: usize, reflects: Reflects) {
        if self.policy.period_s().is_none() {
            return;
        }
        let t_s = seconds(now);
        let until = nanos(self.next_event_s(t_s));
        let before = self.demand_at((t_s - 1e-6).max(0.0));
        let watch = Watch::new(now, until, reflects, self.topology.n_engines, self.plan(), before);
        self.watches.push((i, watch));
    }

    fn run_loop(&mut self) {
        while let Some((now, event)) = self.queue.pop() {
            if now > self.end {
                break;
            }
            match event {
                Event::SessionStart(s) => self.session_start(now, s),
                Event::Turn(session) => self.turn(now, session),
                Event::Wake(j) => {
                    if self.engines[j].wake == Some(now) {
                        self.engines[j].wake = None;
                        self.advance(j, now);
                        self.reschedule(j, now);
                    }
                }
                Event::Scrape => self.scrape(now),
                Event::Report => self.report(now),
                Event::Tick => self.tick(now),
                Event::PolicyWake => {
                    self.policy.on_wake(now, self.topology);
                    self.watch_plans(now);
                }
                Event::Share(data_plane) => {
                    self.policy.on_share(now, self.topology, &self.load, data_plane);
                    let period = match data_plane {
                        None => PEER_GAP_NS,
                        Some(_) => nanos(self.scenario.file.control.report_period_s),
                    };
                    self.queue.push(now + period, Event::Share(data_plane));
                }
                Event::Sample => self.sample(now),
                Event::Scenario(i) => self.scenario_event(now, i),
            }
        }
    }

    /// Schedules the next session start of stream `s` after `now` (Poisson, with the rate
    /// evaluated at `now`; a zero rate is looked at again a second later).
    fn schedule_session(&mut self, s: usize, now: Nanos) {
        let rate = demand_rps(self.scenario, s, seconds(now)) / self.scenario.file.workload.turns_mean;
        let u: f64 = self.arrival_rng[s].gen();
        let gap = if rate > 0.0 { -(1.0 - u).ln() / rate } else { 1.0 };
        let at = now + nanos(gap).max(1);
        if at <= self.end {
            self.queue.push(at, Event::SessionStart(s));
        }
    }

    fn session_start(&mut self, now: Nanos, s: usize) {
        let id = ((s as u64) << 40) | self.sessions_started[s];
        self.sessions_started[s] += 1;
        let model = self.scenario.streams[s].model;
        let session = Session::start(self.spec.seed, id, s, model, &self.scenario.file.workload);
        self.turn(now, Box::new(session));
        self.schedule_session(s, now);
    }

    fn turn(&mut self, now: Nanos, mut session: Box<Session>) {
        let s = session.stream;
        let t_s = seconds(now);
        self.recorder.arrival(s, t_s);
        if t_s >= self.spec.warmup_s {
            self.measured_arrivals[s] += 1;
        }
        self.period_requests[s] += 1;
        // The Service in front of a cluster's data planes spreads requests uniformly.
        let data_planes = self.topology.data_planes;
        let data_plane = if data_planes > 1 { self.data_plane_rng.gen_range(0..data_planes) } else { 0 };
        let arrival = Arrival { stream: s, key_hash: session.key_hash, data_plane };
        let decision = self.policy.route(now, self.topology, &self.load, arrival, &mut self.policy_rng);
        let j = match decision {
            Decision::Engine(j) => j,
            Decision::Shed => {
                self.period_shed[s] += 1;
                self.recorder.shed(s, t_s);
                // A 429 with Retry-After does not end the conversation: the user goes on with
                // the next turn after thinking, so shedding does not lower the offered demand.
                if let Some((next, think_s)) = session.next_turn(&self.scenario.file.workload) {
                    let at = now + nanos(think_s).max(1);
                    if at <= self.end {
                        self.queue.push(at, Event::Turn(next));
                    }
                }
                return;
            }
            Decision::NoEngine => {
                self.recorder.no_engine(t_s);
                return;
            }
        };
        let cluster = self.topology.stream_cluster[s];
        let net_ms =
            self.scenario.region_ms(self.scenario.clusters[cluster].1, self.scenario.engines[j].region);
        self.advance(j, now);
        let id = self.next_request;
        self.next_request += 1;
        let request =
            Request { id, prompt: session.prompt.clone(), max_output_tokens: session.output_tokens };
        if self.engines[j].model.submit(now, request).is_err() {
            self.recorder.refused(t_s);
            return;
        }
        if let Some(zone) = &self.topology.stream_residency[s] {
            if !self.scenario.engines[j].residency.contains(zone) {
                self.recorder.residency_violation();
            }
        }
        self.load.count(data_plane, s, j, true);
        if let Some(previous) = session.last_engine {
            self.recorder.follow_up(t_s, previous != j);
        }
        session.last_engine = Some(j);
        self.live.insert(id, Live { session, engine: j, data_plane, net_ms });
        self.reschedule(j, now);
    }

    /// Runs engine `j` up to `now` and handles the requests that finished.
    fn advance(&mut self, j: usize, now: Nanos) {
        let mut outcomes = std::mem::take(&mut self.outcomes);
        self.engines[j].model.advance_until(now, &mut outcomes);
        for o in outcomes.drain(..) {
            self.complete(now, &o);
        }
        self.outcomes = outcomes;
    }

    fn complete(&mut self, now: Nanos, o: &Outcome) {
        let Some(live) = self.live.remove(&o.id) else { return };
        let s = live.session.stream;
        self.load.count(live.data_plane, s, live.engine, false);
        self.engines[live.engine].observe(o);
        let engine_ttft_ms = o.first_token_at.saturating_sub(o.arrival) as f64 / 1e6;
        let engine_e2e_ms = o.finished_at.saturating_sub(o.arrival) as f64 / 1e6;
        self.recorder.complete(&Completion {
            stream: s,
            engine: live.engine,
            finished_s: seconds(o.finished_at),
            ttft_ms: engine_ttft_ms + live.net_ms,
            e2e_ms: engine_e2e_ms + live.net_ms,
            engine_ttft_ms,
            decode_ns: o.finished_at.saturating_sub(o.first_token_at) as f64,
            output_tokens: o.output_tokens,
            prompt_tokens: o.prompt_tokens,
            cached_tokens: o.cached_tokens,
            arrived_s: seconds(o.arrival),
        });
        if let Some((next, think_s)) = live.session.next_turn(&self.scenario.file.workload) {
            let at = (o.finished_at + nanos(live.net_ms / 1e3 + think_s)).max(now);
            if at <= self.end {
                self.queue.push(at, Event::Turn(next));
            }
        }
    }

    fn reschedule(&mut self, j: usize, now: Nanos) {
        if !self.engines[j].up {
            self.engines[j].wake = None;
            return;
        }
        let next = self.engines[j].model.next_event_time().map(|t| t.max(now));
        if next != self.engines[j].wake {
            self.engines[j].wake = next;
            if let Some(at) = next {
                self.queue.push(at, Event::Wake(j));
            }
        }
    }

    fn scrape(&mut self, now: Nanos) {
        for j in 0..self.engines.len() {
            let result = if self.engines[j].up {
                self.advance(j, now);
                self.reschedule(j, now);
                let model = ModelName::new(&self.topology.engine_model[j]);
                Ok(vec![(model, self.engines[j].sample())])
            } else {
                Err("connection refused".to_owned())
            };
            self.policy.on_scrape(now, j, result);
        }
        self.queue.push(now + nanos(self.scenario.file.control.scrape_period_s), Event::Scrape);
    }

    /// Every data plane reports its classes' demand: arrivals in the period and a smoothed
    /// rate, as `ilb-dataplane`'s reporter computes it.
    fn report(&mut self, now: Nanos) {
        let control = &self.scenario.file.control;
        let period = control.report_period_s;
        let alpha = 1.0 - (-period / control.smoothing_s).exp();
        self.report_seq += 1;
        for (c, (cluster, _)) in self.scenario.clusters.iter().enumerate() {
            let mut demand = Vec::new();
            for s in (0..self.scenario.streams.len()).filter(|&s| self.topology.stream_cluster[s] == c) {
                let requests = std::mem::take(&mut self.period_requests[s]);
                let shed = std::mem::take(&mut self.period_shed[s]);
                let rate = requests as f64 / period;
                let rps = match self.demand_ewma[s] {
                    None => rate,
                    Some(previous) => previous + alpha * (rate - previous),
                };
                self.demand_ewma[s] = Some(rps);
                // A stream has one priority: its whole rate is that priority's.
                let priority = Priority::parse(&self.scenario.streams[s].priority).unwrap_or_default();
                let mut by_priority = [0.0; 4];
                by_priority[priority.index()] = rps;
                demand.push(ClassDemand {
                    model: ModelName::new(&self.topology.stream_model[s]),
                    class: ClassId::new(&self.topology.stream_class[s]),
                    requests,
                    shed,
                    rps,
                    by_priority: Some(PriorityRps::from_array(by_priority)),
                });
            }
            let report = Report {
                replica: None,
                cluster: ClusterId::new(cluster),
                instance: format!("{cluster}-sim"),
                sequence: self.report_seq,
                period_ms: (period * 1e3) as u64,
                snapshot_version: 0,
                demand,
                engines: Vec::new(),
            };
            self.policy.on_report(now, report);
        }
        self.queue.push(now + nanos(period), Event::Report);
    }

    fn tick(&mut self, now: Nanos) {
        if let Some(at) = self.policy.on_tick(now, self.topology) {
            self.queue.push(at, Event::PolicyWake);
        }
        for (at, engines, replanned) in &mut self.failures {
            if replanned.is_none() && self.policy.plan_excludes(engines) == Some(true) {
                *replanned = Some(seconds(now - *at));
            }
        }
        if let Some(period) = self.policy.period_s() {
            self.queue.push(now + nanos(period), Event::Tick);
        }
    }

    fn sample(&mut self, now: Nanos) {
        let n = self.topology.n_engines;
        let mut weights = vec![0.0; self.scenario.streams.len() * n];
        self.policy.weights(self.topology, &self.load, &mut weights);
        let t_s = seconds(now);
        let demand: Vec<f64> =
            (0..self.scenario.streams.len()).map(|s| demand_rps(self.scenario, s, t_s)).collect();
        let elapsed = seconds(now - self.last_sample).max(1e-9);
        let utilisation: Vec<f64> = self
            .engines
            .iter()
            .zip(&mut self.busy_before)
            .map(|(e, before)| {
                let busy = e.model.stats().counters.busy_ns;
                let delta = if busy >= *before { busy - *before } else { busy };
                *before = busy;
                (delta as f64 / 1e9 / elapsed / f64::from(e.profile.replicas)).min(1.0)
            })
            .collect();
        self.last_sample = now;
        let predicted = self.policy.predicted_latency_ms();
        let steady = crate::workload::steady(self.scenario, t_s);
        self.recorder.sample(t_s, &self.load.in_flight, weights, &demand, &utilisation, predicted, steady);
        self.queue.push(now + nanos(self.spec.sample_period_s), Event::Sample);
    }

    fn select(&self, group: Option<&str>, region: Option<&str>, count: Option<u32>) -> Vec<usize> {
        let matching = self.scenario.engines.iter().enumerate().filter(|(_, e)| {
            group.is_none_or(|g| self.scenario.file.engines[e.group].group == g)
                && region.is_none_or(|r| self.scenario.regions[e.region] == r)
        });
        matching.map(|(j, _)| j).take(count.map_or(usize::MAX, |c| c as usize)).collect()
    }

    fn scenario_event(&mut self, now: Nanos, i: usize) {
        let e = self.scenario.file.events[i].clone();
        let engines = self.select(e.group.as_deref(), e.region.as_deref(), e.count);
        match e.kind {
            EventKind::EngineFailure | EventKind::RegionOutage => {
                let failing: Vec<usize> = engines.into_iter().filter(|&j| self.engines[j].up).collect();
                if !failing.is_empty() {
                    self.watch(now, i, Reflects::Excludes(failing.clone()));
                }
                for &j in &failing {
                    self.advance(j, now);
                }
                let lost: Vec<u64> = self
                    .live
                    .iter()
                    .filter(|(_, l)| failing.contains(&l.engine))
                    .map(|(&id, _)| id)
                    .collect();
                self.recorder.failed_in_flight(lost.len() as u64);
                self.recorder.transient_lost(i, lost.len() as u64);
                for id in lost {
                    if let Some(l) = self.live.remove(&id) {
                        self.load.count(l.data_plane, l.session.stream, l.engine, false);
                    }
                }
                for &j in &failing {
                    // A profile that built once builds again; keep the old model if not.
                    if self.engines[j].crash().is_err() {
                        self.engines[j].up = false;
                    }
                    self.engines[j].wake = None;
                    self.load.up[j] = false;
                }
                if !failing.is_empty() {
                    self.failures.push((now, failing, None));
                }
            }
            EventKind::EngineRecovery | EventKind::RegionRecovery => {
                self.watch(now, i, Reflects::Includes(engines.clone()));
                for j in engines {
                    self.engines[j].up = true;
                    self.load.up[j] = true;
                }
            }
            EventKind::Slowdown => {
                let factor = e.factor.unwrap_or(1.0);
                if factor != 1.0 {
                    self.watch(now, i, Reflects::Share(engines.clone(), factor > 1.0));
                }
                for j in engines {
                    self.advance(j, now);
                    self.engines[j].model.set_slowdown(e.factor.unwrap_or(1.0));
                    self.reschedule(j, now);
                }
            }
            EventKind::Surge => {
                let streams: Vec<usize> = (0..self.scenario.streams.len())
                    .filter(|&s| {
                        let cluster = &self.scenario.clusters[self.topology.stream_cluster[s]].0;
                        e.cluster.as_ref().is_none_or(|c| c == cluster)
                    })
                    .collect();
                self.watch(now, i, Reflects::Moved(streams));
            }
        }
    }
}

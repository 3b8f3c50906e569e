//! The `ilb` policy: the control plane's planning path as the product runs it — [`Fleet`] fed
//! with synthesised scrapes and data-plane reports, and the control loop's [`Planner`] (the
//! same problems, warm-started solves, shed prices per priority and snapshots) — and the data
//! planes' weighted consistent hashing with bounded load on the compiled snapshots.

use super::dataplane::DataPlanes;
use super::{Arrival, Decision, Load, Policy, Topology};
use ilb_core::report::Report;
use ilb_core::ModelName;
use ilb_engine_sim::Nanos;
use ilb_planning::config::FleetConfig;
use ilb_planning::fleet::Fleet;
use ilb_planning::planner::Planner;
use ilb_planning::signals::EngineSample;
use rand_pcg::Pcg64Mcg;
use std::collections::HashMap;
use std::time::Duration;

pub struct Ilb {
    fleet: Fleet,
    planner: Planner,
    data_planes: DataPlanes,
    version: u64,
    period_s: f64,
    delay: Nanos,
    /// Planned load per simulator engine of the latest solve, requests/s.
    planned_load: Vec<f64>,
    predicted_ms: Option<f64>,
    /// Solves the optimizer rejected.
    pub solve_errors: u64,
}

impl Ilb {
    /// `config` lists the engines in the simulator's order. Solves once at time zero (with
    /// the demand floor, as a control plane starting up does) and installs the result at once
    /// so data planes start with a snapshot.
    pub fn new(config: FleetConfig, topology: &Topology, solve_period_s: f64, delay: Nanos) -> Ilb {
        let mut ilb = Ilb {
            planner: Planner::for_config(&config),
            fleet: Fleet::new(config),
            data_planes: DataPlanes::new(topology),
            version: 0,
            period_s: solve_period_s,
            delay,
            planned_load: vec![0.0; topology.n_engines],
            predicted_ms: None,
            solve_errors: 0,
        };
        ilb.solve(0);
        // The start-up plan is installed at once (not one pull later): data planes need a snapshot.
        ilb.data_planes.install_due(Nanos::MAX, topology);
        ilb
    }

    fn solve(&mut self, now: Nanos) -> Nanos {
        let at = Duration::from_nanos(now);
        // The control loop's tick, in its order: expire reports, judge outliers, plan.
        self.fleet.expire(at);
        self.fleet.update_penalties(at);
        let round = self.planner.plan(&self.fleet, at);
        self.solve_errors += round.results.iter().filter(|(r, _)| r.is_err()).count() as u64;
        self.planned_load = round.planned_load_rps(self.planned_load.len());
        self.predicted_ms = round.predicted_latency_ms();
        self.version += 1;
        let snapshots = round.snapshots(&self.fleet, self.version, 0);
        let install_at = now + self.delay;
        self.data_planes.publish(install_at, snapshots);
        install_at
    }

    /// The optimizer's prediction at the simulated steady state: the current fleet state (the
    /// fitted profiles, health) with each class's demand set to its mean measured rate
    /// `mean_rps[(cluster, model, class)]`, solved warm. Mean latency of admitted traffic, ms.
    fn steady_state(&mut self, now: Nanos, mean_rps: &HashMap<(String, String, String), f64>) -> Option<f64> {
        let mut problems = Planner::problems(&self.fleet, Duration::from_nanos(now));
        for plan in &mut problems.plans {
            for k in 0..plan.classes.len() {
                let key = &plan.classes[k].key;
                if let Some(&rps) = mean_rps.get(&(key.cluster.clone(), key.model.clone(), key.class.clone()))
                {
                    plan.set_demand(k, rps.max(1e-3));
                }
            }
        }
        let round = self.planner.solve(problems);
        if round.results.iter().any(|(r, _)| r.is_err()) {
            return None;
        }
        round.predicted_latency_ms()
    }
}

impl Policy for Ilb {
    fn route(
        &mut self,
        now: Nanos,
        topology: &Topology,
        load: &Load,
        arrival: Arrival,
        rng: &mut Pcg64Mcg,
    ) -> Decision {
        self.data_planes.route(now, topology, load, arrival, rng)
    }

    fn has_data_planes(&self) -> bool {
        true
    }

    fn on_share(&mut self, now: Nanos, topology: &Topology, load: &Load, data_plane: Option<usize>) {
        self.data_planes.share(now, topology, load, data_plane);
    }

    fn period_s(&self) -> Option<f64> {
        Some(self.period_s)
    }

    fn on_tick(&mut self, now: Nanos, _topology: &Topology) -> Option<Nanos> {
        Some(self.solve(now))
    }

    fn on_wake(&mut self, now: Nanos, topology: &Topology) {
        self.data_planes.install_due(now, topology);
    }

    fn wants_signals(&self) -> bool {
        true
    }

    fn on_scrape(
        &mut self,
        now: Nanos,
        engine: usize,
        result: Result<Vec<(ModelName, EngineSample)>, String>,
    ) {
        self.fleet.on_scrape(engine, Duration::from_nanos(now), result);
    }

    fn on_report(&mut self, now: Nanos, report: Report) {
        // Reports are generated in order by the simulator; an error would be a simulator bug
        // and only costs this one report.
        let _ = self.fleet.on_report(Duration::from_nanos(now), report);
    }

    fn weights(&self, topology: &Topology, _load: &Load, out: &mut [f64]) {
        self.data_planes.weights(topology, out);
    }

    fn plan_excludes(&self, engines: &[usize]) -> Option<bool> {
        Some(engines.iter().all(|&j| self.planned_load[j] <= 1e-6))
    }

    fn predicted_latency_ms(&self) -> Option<f64> {
        self.predicted_ms
    }

    fn steady_state_latency_ms(&mut self, now: Nanos, topology: &Topology, mean_rps: &[f64]) -> Option<f64> {
        let by_class = mean_rps
            .iter()
            .enumerate()
            .map(|(s, &rps)| {
                let key = (
                    topology.cluster_ids[topology.stream_cluster[s]].clone(),
                    topology.stream_model[s].clone(),
                    topology.stream_class[s].clone(),
                );
                (key, rps)
            })
            .collect();
        self.steady_state(now, &by_class)
    }
}

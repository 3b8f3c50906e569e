//! The `ilb` policy: the control plane's planning path exactly as the product runs it —
//! [`Fleet`] fed with synthesised scrapes and data-plane reports, [`plan::build`], one
//! warm-started [`Solver`] per model, [`plan::snapshots`] — and the data planes' weighted
//! consistent hashing with bounded load on the compiled snapshots.
//!
//! One addition: `plan::build` prices shedding at the `normal` priority for every class (the
//! control plane has no per-class priority yet), so the simulator sets each class's
//! `shed_penalty_ms` from its stream's priority before solving. That is what makes the
//! optimizer shed the lowest priority first.

use super::dataplane::DataPlanes;
use super::{Decision, Load, Policy, Topology};
use ilb_controlplane::config::FleetConfig;
use ilb_controlplane::fleet::Fleet;
use ilb_controlplane::plan;
use ilb_controlplane::signals::EngineSample;
use ilb_core::report::Report;
use ilb_core::ModelName;
use ilb_engine_sim::Nanos;
use ilb_optimizer::{Solution, Solver};
use rand_pcg::Pcg64Mcg;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

pub struct Ilb {
    fleet: Fleet,
    solvers: BTreeMap<String, Solver>,
    data_planes: DataPlanes,
    version: u64,
    period_s: f64,
    delay: Nanos,
    /// Shed penalty per (cluster, model, class), from the stream's priority.
    penalties: HashMap<(String, String, String), f64>,
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
    pub fn new(
        config: FleetConfig,
        topology: &Topology,
        priorities: &[(usize, f64)],
        solve_period_s: f64,
        delay: Nanos,
    ) -> Ilb {
        let penalties = priorities
            .iter()
            .map(|&(s, p)| {
                let key = (
                    topology.cluster_ids[topology.stream_cluster[s]].clone(),
                    topology.stream_model[s].clone(),
                    topology.stream_class[s].clone(),
                );
                (key, p)
            })
            .collect();
        let mut ilb = Ilb {
            fleet: Fleet::new(config),
            solvers: BTreeMap::new(),
            data_planes: DataPlanes::new(topology),
            version: 0,
            period_s: solve_period_s,
            delay,
            penalties,
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
        let mut plans = plan::build(&self.fleet, at);
        for plan in &mut plans {
            for (k, class) in plan.classes.iter().enumerate() {
                let key = (class.key.cluster.clone(), class.key.model.clone(), class.key.class.clone());
                if let Some(&penalty) = self.penalties.get(&key) {
                    plan.problem.classes[k].shed_penalty_ms = penalty;
                }
            }
        }
        let mut solutions: Vec<Option<Solution>> = Vec::with_capacity(plans.len());
        let (mut served_cost, mut served_rps) = (0.0, 0.0);
        self.planned_load.iter_mut().for_each(|l| *l = 0.0);
        for plan in &plans {
            let solver = self
                .solvers
                .entry(plan.model.clone())
                .or_insert_with(|| Solver::new(plan::solver_options(&self.fleet.config)));
            match solver.solve(&plan.problem) {
                Ok(solution) => {
                    let shed_cost: f64 = solution
                        .shed_rps
                        .iter()
                        .zip(&plan.problem.classes)
                        .map(|(s, c)| s * c.shed_penalty_ms)
                        .sum();
                    let demand: f64 = plan.problem.classes.iter().map(|c| c.demand_rps).sum();
                    served_cost += solution.objective - shed_cost;
                    served_rps += demand - solution.shed_rps.iter().sum::<f64>();
                    for (j, e) in solution.engines.iter().enumerate() {
                        self.planned_load[plan.engines[j]] = e.load_rps;
                    }
                    solutions.push(Some(solution));
                }
                Err(_) => {
                    self.solve_errors += 1;
                    solutions.push(None);
                }
            }
        }
        self.predicted_ms = (served_rps > 0.0).then(|| served_cost / served_rps);
        self.version += 1;
        let snapshots = plan::snapshots(&self.fleet, &plans, &solutions, self.version, 0);
        let install_at = now + self.delay;
        self.data_planes.publish(install_at, snapshots);
        install_at
    }
}

impl Ilb {
    /// The optimizer's prediction at the simulated steady state: the current fleet state (the
    /// fitted profiles, health) with each class's demand set to its mean measured rate
    /// `mean_rps[(cluster, model, class)]`, solved warm. Mean latency of admitted traffic, ms.
    fn steady_state(&mut self, now: Nanos, mean_rps: &HashMap<(String, String, String), f64>) -> Option<f64> {
        let mut plans = plan::build(&self.fleet, Duration::from_nanos(now));
        let (mut cost, mut served) = (0.0, 0.0);
        for plan in &mut plans {
            for (k, class) in plan.classes.iter().enumerate() {
                let key = (class.key.cluster.clone(), class.key.model.clone(), class.key.class.clone());
                if let Some(&rps) = mean_rps.get(&key) {
                    plan.problem.classes[k].demand_rps = rps.max(1e-3);
                }
                if let Some(&penalty) = self.penalties.get(&key) {
                    plan.problem.classes[k].shed_penalty_ms = penalty;
                }
            }
            let solution = self
                .solvers
                .entry(plan.model.clone())
                .or_insert_with(|| Solver::new(plan::solver_options(&self.fleet.config)))
                .solve(&plan.problem)
                .ok()?;
            let shed_cost: f64 =
                solution.shed_rps.iter().zip(&plan.problem.classes).map(|(s, c)| s * c.shed_penalty_ms).sum();
            let demand: f64 = plan.problem.classes.iter().map(|c| c.demand_rps).sum();
            cost += solution.objective - shed_cost;
            served += demand - solution.shed_rps.iter().sum::<f64>();
        }
        (served > 0.0).then(|| cost / served)
    }
}

impl Policy for Ilb {
    fn route(
        &mut self,
        now: Nanos,
        topology: &Topology,
        load: &Load,
        stream: usize,
        key_hash: u64,
        rng: &mut Pcg64Mcg,
    ) -> Decision {
        self.data_planes.route(now, topology, load, stream, key_hash, rng)
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

//! The planner: the fleet's state ([`Fleet::planning_inputs`]) → one problem per model
//! ([`plan::build`]) → warm-started solves → one snapshot per front-end cluster
//! ([`plan::snapshots`]). The control loop
//! (`run.rs`) plans through it, and so does the fleet simulator's `ilb` policy: what the
//! simulator measures is this code, not a copy of it.
//!
//! Building reads the fleet and is cheap; solving owns only the problems and the solvers, so
//! the control loop can move a [`Planner`] to a blocking thread while it keeps taking signals.
//!
//! Between the measured demand and the problem it solves, the planner applies four rules. Their
//! measured effects, and the variants tried instead, are in `docs/results.md`.
//!
//! **Demand within its noise.** A measured rate is an EWMA of arrivals: for a Poisson stream of
//! λ req/s smoothed with time constant τ its standard deviation is √(λ / 2τ), and conversations
//! make real traffic burstier than that. Re-planning on every wiggle would move traffic for
//! nothing, and where an engine's capacity binds every wiggle changes the spill. So each class
//! has a band around its demand, `control_plane.demand_band_sigmas` standard deviations wide on
//! each side (default 3), centred on a value (the band's centre) that moves only when the measurement leaves
//! the band:
//!
//! - above the band, the centre rises only as far as it takes to hold the measurement on the
//!   band's top edge (a deadband: the return of a noise excursion, inside the moved band, moves
//!   nothing);
//! - below the band, the centre is re-centred on the measurement, so a falling demand is planned
//!   one band above what is measured, not two;
//! - a class new to the planner starts centred on its measurement.
//!
//! **Planned at the band's top.** The weights hold while the demand moves within its band, and
//! an engine whose capacity binds pays for the top of the band in queueing (latency is convex in
//! load). So each class is planned at centre + one band. The part above the centre is the class's
//! headroom (`headroom_rps` in the problem): it takes at most three quarters of the slack the
//! centres leave under ρ × the engines' capacity (`HEADROOM_SHARE_OF_SLACK`), scaled down for all
//! classes of the model alike, so the optimizer keeps room to place load by latency and a model
//! near capacity gets none. The snapshots' shed fractions and `/v1/state` use the demand without
//! the headroom.
//!
//! **Real changes are planned at once.** The stability strength (`control_plane.stability_ms`)
//! makes a plan save that much latency per req/s it moves before traffic moves, so that refits and
//! noise do not move conversations off their caches. A round is a real change of its model when
//! some class's measurement is more than twice its band from the centre (`REAL_CHANGE_BANDS`;
//! that class's band is then re-centred on the measurement), when a class appears, or when an
//! engine joins, leaves or moves its effective capacity by more than 1 % (a penalty given or
//! lifted, replicas down or back). The model is then solved without the strength (the tolerance
//! still applies) for three smoothing time constants, while the measurement settles. So a surge
//! spills as soon as it is seen and a recovered engine gets its traffic back, while a demand that
//! drifts out of its band by a little keeps its weights.
//!
//! **Each model warm, each solve guarded.** Every model keeps its own solver, warm-started from
//! its previous solve. A solve that panics is caught and logged with its model, the snapshots
//! then route that model by capacity, and its solver starts afresh next round.
//!
//! Invariants: the planner reads no clock (`now` comes in as an argument, and a caller that
//! times the solves passes its clock to [`Planner::solve_timed`]); a class's planned demand is
//! never below its band's centre, nor above it by more than one band.

use crate::config::FleetConfig;
use crate::fleet::{Fleet, Now};
use crate::plan::{self, ModelPlan, Unplanned};
use crate::smoothing::SETTLING_TAUS;
use ilb_core::snapshot::Snapshot;
use ilb_optimizer::{Solution, Solver, SolverOptions};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// The solvers of every model (each warm-starts from its model's previous solve) and the
/// options they solve with.
#[derive(Debug)]
pub struct Planner {
    solvers: BTreeMap<String, Solver>,
    options: SolverOptions,
    /// The centre of each class's demand band, per (model, problem class id).
    band_centres: HashMap<(String, String), f64>,
    /// Per model: until when it is solved without the stability strength, after a real
    /// change of its demand or its engines.
    free_until: HashMap<String, Now>,
    /// Per model: the engines planned last round and their effective capacities.
    capacities: HashMap<String, (Vec<usize>, Vec<f64>)>,
}

/// The problems of one round, before solving.
#[derive(Clone, Debug)]
pub struct Problems {
    pub plans: Vec<ModelPlan>,
    /// Per plan: whether some class's demand jumped beyond twice its noise band (or is new), or
    /// an engine joined, left or changed its capacity, within the last three smoothing time
    /// constants, so the plan is solved without the stability strength.
    pub changed: Vec<bool>,
    /// Models that could not be planned, and why.
    pub unplanned: Vec<Unplanned>,
}

/// One planning round: the problems and what solving them gave.
#[derive(Debug)]
pub struct Round {
    pub plans: Vec<ModelPlan>,
    pub unplanned: Vec<Unplanned>,
    /// Per plan: its solution or why there is none, and the solve's wall time (ms; 0 when the
    /// caller did not time it, see [`Planner::solve_timed`]).
    pub results: Vec<(Result<Solution, String>, f64)>,
    /// Models whose solve panicked in this round.
    pub panics: u64,
}

impl Planner {
    pub fn new(options: SolverOptions) -> Planner {
        Planner {
            solvers: BTreeMap::new(),
            options,
            band_centres: HashMap::new(),
            free_until: HashMap::new(),
            capacities: HashMap::new(),
        }
    }

    /// A planner with the options `config` asks for.
    pub fn for_config(config: &FleetConfig) -> Planner {
        Planner::new(plan::solver_options(config))
    }

    pub fn options(&self) -> &SolverOptions {
        &self.options
    }

    /// Takes the options `config` asks for (see [`Planner::set_options`]).
    pub fn configure(&mut self, config: &FleetConfig) {
        self.set_options(plan::solver_options(config));
    }

    /// Takes new options. Solvers carry their options, so a change starts every model afresh
    /// (its warm start is lost); the same options again change nothing.
    pub fn set_options(&mut self, options: SolverOptions) {
        if options != self.options {
            self.options = options;
            self.solvers.clear();
        }
    }

    /// The problems for the fleet as it is at `now`, each class's demand as measured.
    pub fn problems(fleet: &Fleet, now: Now) -> Problems {
        let (plans, unplanned) = plan::build(&fleet.planning_inputs(now));
        let changed = vec![true; plans.len()];
        Problems { plans, unplanned, changed }
    }

    /// The problems for this round: as [`Planner::problems`], with each class planned at the
    /// top of its demand band (see the module's documentation).
    pub fn build(&mut self, fleet: &Fleet, now: Now) -> Problems {
        let mut problems = Planner::problems(fleet, now);
        let cp = &fleet.config.control_plane;
        let tau_s = (cp.smoothing_ms as f64 / 1000.0).max(1e-3);
        let band = |rps: f64| demand_band(rps, tau_s, cp.demand_band_sigmas);
        let mut band_centres = HashMap::with_capacity(self.band_centres.len());
        for (plan, changed) in problems.plans.iter_mut().zip(&mut problems.changed) {
            *changed = false;
            for class in &mut plan.problem.classes {
                let key = (plan.model.clone(), class.id.clone());
                let measured = class.demand_rps;
                let centre = match self.band_centres.get(&key) {
                    Some(&centre) => {
                        let (off, width) = (measured - centre, band(measured.max(centre)));
                        *changed |= off.abs() > REAL_CHANGE_BANDS * width;
                        if off.abs() <= width {
                            centre
                        } else {
                            // Up, only as far as it takes to hold the measurement on the top
                            // edge, so the plan (the top) is the measurement; down, re-centred
                            // on it, so the plan is one band above what is measured and not two.
                            let moved = if off > 0.0 && off <= REAL_CHANGE_BANDS * width {
                                measured - width
                            } else {
                                measured
                            };
                            tracing::debug!(model = %plan.model, class = %class.id, measured, from = centre, to = moved, "demand left its band");
                            moved
                        }
                    }
                    None => {
                        *changed = true;
                        measured
                    }
                };
                class.headroom_rps = band(centre);
                class.demand_rps = centre + class.headroom_rps;
                band_centres.insert(key, centre);
            }
            // Headroom is for bursts the fleet has room for: it takes at most a share of the
            // usable capacity the centres leave (shrinking smoothly as demand nears capacity),
            // and none from traffic the plan would otherwise admit.
            let headroom: f64 = plan.problem.classes.iter().map(|c| c.headroom_rps).sum();
            let centres: f64 = plan.problem.classes.iter().map(|c| c.demand_rps).sum::<f64>() - headroom;
            let usable: f64 = plan.capacity_rps.iter().sum::<f64>() * plan.problem.rho;
            if headroom > 0.0 {
                plan.scale_headroom(
                    (HEADROOM_SHARE_OF_SLACK * (usable - centres) / headroom).clamp(0.0, 1.0),
                );
            }
            // The fleet changed: an engine joined, left, or its effective capacity moved (a
            // penalty given or lifted, replicas down or back), so a recovered engine gets its
            // traffic back at once.
            let capacities = (plan.engines.clone(), plan.capacity_rps.clone());
            *changed |= self.capacities.get(&plan.model).is_none_or(|before| {
                before.0 != capacities.0
                    || before
                        .1
                        .iter()
                        .zip(&capacities.1)
                        .any(|(a, b)| (a - b).abs() > CAPACITY_CHANGE * a.max(*b))
            });
            self.capacities.insert(plan.model.clone(), capacities);
            // The measurement keeps moving for a few time constants after a jump (an EWMA
            // covers 95 % of a step in 3τ): the model stays free of the strength until then.
            if *changed {
                let settled = Duration::from_secs_f64(f64::from(SETTLING_TAUS) * tau_s);
                self.free_until.insert(plan.model.clone(), now + settled);
            } else {
                *changed = self.free_until.get(&plan.model).is_some_and(|&until| now < until);
            }
        }
        self.band_centres = band_centres;
        problems
    }

    /// Solves every model, each warm from its previous solve. A solve that panics is caught:
    /// its model gets the panic as its error (the snapshots then route it by capacity), it is
    /// logged with the model, and the model starts from a fresh solver next round. Solves are
    /// not timed (their wall times read 0; see [`Planner::solve_timed`]).
    pub fn solve(&mut self, problems: Problems) -> Round {
        self.solve_timed(problems, || Duration::ZERO)
    }

    /// As [`Planner::solve`], timing each model's solve with the caller's `clock` (read before
    /// and after it): the planner reads no clock itself, so the control loop passes its own and
    /// the fleet simulator, in virtual time, none.
    pub fn solve_timed(&mut self, problems: Problems, mut clock: impl FnMut() -> Now) -> Round {
        let Problems { plans, unplanned, changed } = problems;
        let mut panics = 0;
        let mut results = Vec::with_capacity(plans.len());
        for (plan, changed) in plans.iter().zip(changed) {
            let solver =
                self.solvers.entry(plan.model.clone()).or_insert_with(|| Solver::new(self.options.clone()));
            solver.options.stability_ms = if changed { 0.0 } else { self.options.stability_ms };
            let started = clock();
            let (mut result, panicked) = guarded(&plan.model, || solver.solve(&plan.problem));
            if let Ok(solution) = &mut result {
                plan.restate_latencies(solution);
            }
            if panicked {
                panics += 1;
                // A solver that panicked may hold half-updated state.
                self.solvers.remove(&plan.model);
            }
            let wall = clock().saturating_sub(started);
            results.push((result, wall.as_secs_f64() * 1000.0));
        }
        Round { plans, unplanned, results, panics }
    }

    /// Builds and solves, untimed.
    pub fn plan(&mut self, fleet: &Fleet, now: Now) -> Round {
        let problems = self.build(fleet, now);
        self.solve(problems)
    }
}

impl Round {
    /// Per plan, its solution if the solve succeeded.
    pub fn solutions(&self) -> Vec<Option<&Solution>> {
        self.results.iter().map(|(r, _)| r.as_ref().ok()).collect()
    }

    /// One snapshot per cluster (see [`plan::snapshots`]).
    pub fn snapshots(&self, fleet: &Fleet, version: u64, created_unix_ms: u64) -> BTreeMap<String, Snapshot> {
        plan::snapshots(&fleet.config, &self.plans, &self.solutions(), version, created_unix_ms)
    }

    /// The mean latency the solved plans expect for the traffic they admit, ms: each class's
    /// demand as measured, less the share the plan sheds, sent by the published weights, at
    /// the engines' loads that gives. Neither the solver's objective (it prices the demand
    /// with the headroom kept above the band's centre) nor the centre itself (it lags a
    /// rising measurement by up to a band) is what arrives. `None` when nothing is admitted.
    pub fn predicted_latency_ms(&self) -> Option<f64> {
        let (mut cost, mut admitted) = (0.0, 0.0);
        for (plan, solution) in self.plans.iter().zip(self.solutions()) {
            let Some(solution) = solution else { continue };
            let problem = &plan.problem;
            // The data planes shed each class's planned share of whatever arrives: scale every
            // part's admitted demand by the class's measured demand over its band's centre.
            let centre = |i: usize| {
                let c = &problem.classes[i];
                c.demand_rps - c.headroom_rps.clamp(0.0, c.demand_rps)
            };
            let sent: Vec<f64> = (0..problem.classes.len())
                .map(|i| {
                    let k = plan.parts[i].0;
                    let centres: f64 = plan.parts_of(k).map(centre).sum();
                    let scale =
                        if centres > 0.0 { plan.classes[k].measured_demand_rps / centres } else { 0.0 };
                    (centre(i) - solution.shed_rps[i]).max(0.0) * scale
                })
                .collect();
            let mut load = vec![0.0; problem.engines.len()];
            for r in &solution.routes {
                load[r.engine] += r.weight * sent[r.class];
            }
            let latency: Vec<f64> =
                load.iter().enumerate().map(|(j, &y)| plan.mean_curve(j).latency(y)).collect();
            for r in &solution.routes {
                let flow = r.weight * sent[r.class];
                if flow > 0.0 {
                    let network = problem.network_ms.get(r.class, r.engine).unwrap_or(0.0);
                    cost += flow * (network + latency[r.engine]);
                    admitted += flow;
                }
            }
        }
        (admitted > 0.0).then(|| cost / admitted)
    }

    /// Planned load of every fleet engine (req/s), zero for engines in no solved plan.
    pub fn planned_load_rps(&self, n_engines: usize) -> Vec<f64> {
        let mut load = vec![0.0; n_engines];
        for (plan, solution) in self.plans.iter().zip(self.solutions()) {
            let Some(solution) = solution else { continue };
            for (j, e) in solution.engines.iter().enumerate() {
                if let Some(slot) = load.get_mut(plan.engines[j]) {
                    *slot = e.load_rps;
                }
            }
        }
        load
    }
}

/// A class's demand that moves by more than this many band half-widths in one round (6 σ of
/// the measurement's noise with the default band) has really changed: noise alone does that
/// about once in 10^9 rounds, while a drifting demand leaves its band by a little.
const REAL_CHANGE_BANDS: f64 = 2.0;

/// The largest share of the slack under the usable capacity (ρ × the engines' capacity, less
/// the demand bands' centres) that the headroom may take. All of it would plan every engine at
/// ρ × its capacity whenever the bursts fill the slack: a split in proportion to capacity, whatever
/// the engines' latencies and distances (on the fleet simulator's `three-regions`, at 89 % of
/// capacity, that cost 3 % of the p99). Half or three quarters both avoid it; a quarter gave up
/// some of what the headroom is for (figures in docs/results.md, 2026-12-02).
const HEADROOM_SHARE_OF_SLACK: f64 = 0.75;

/// An engine whose effective capacity moves by more than this fraction between rounds counts
/// as a change of the fleet (penalties and health move it in steps; nothing moves it by noise).
const CAPACITY_CHANGE: f64 = 0.01;

/// The half-width of the band a demand of `rps` measured with an EWMA of time constant `tau_s`
/// moves within by noise alone: `sigmas` × √(rps / 2τ).
fn demand_band(rps: f64, tau_s: f64, sigmas: f64) -> f64 {
    sigmas * (rps.max(0.0) / (2.0 * tau_s)).sqrt()
}

/// Runs one model's solve, catching a panic: (the result, or the error or panic as text;
/// whether it panicked). Both are logged with the model.
fn guarded<T, E: std::fmt::Display>(
    model: &str,
    solve: impl FnOnce() -> Result<T, E>,
) -> (Result<T, String>, bool) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(solve)) {
        Ok(result) => (
            result.map_err(|e| {
                tracing::error!(%model, error = %e, "optimizer rejected the problem");
                e.to_string()
            }),
            false,
        ),
        Err(payload) => {
            let message = match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
                (Some(s), _) => (*s).to_owned(),
                (_, Some(s)) => s.clone(),
                _ => "a non-string panic payload".to_owned(),
            };
            tracing::error!(%model, panic = %message, "optimizer panicked; the model is solved again from a fresh solver next round");
            (Err(format!("optimizer panicked: {message}")), true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::guarded;

    #[test]
    fn a_panicking_solve_becomes_the_models_error() {
        let (result, panicked) = guarded::<(), String>("m", || panic!("index out of bounds"));
        assert!(panicked);
        assert_eq!(result.unwrap_err(), "optimizer panicked: index out of bounds");
        let (result, panicked) = guarded::<(), String>("m", || Err("no engines".to_owned()));
        assert!(!panicked);
        assert_eq!(result.unwrap_err(), "no engines");
        assert_eq!(guarded::<u8, String>("m", || Ok(7)), (Ok(7), false));
    }
}

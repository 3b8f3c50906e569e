//! One solve's working state, `Run`: Newton's method on the smoothed dual at a fixed ε, the
//! continuation in ε downwards until the repaired primal is certified within the gap target, and
//! the candidate lists' drift budget. The full solve (`solver`) and the coarse start (`coarse`)
//! both run it.

use std::sync::Arc;

use crate::certify::{repair, Repaired};
use crate::linalg::Cholesky;
use crate::options::SolverOptions;
use crate::pass::{Candidates, ListBounds, Model, Pass, PrevRoutes};

/// Relative demand residual to which a stage that only prepares the next ε is solved.
const STAGE_TOLERANCE: f64 = 1e-3;

/// Relative demand residual at which a stage is first certified.
const LOOSE_TOLERANCE: f64 = 1e-4;

/// The tightest residual a stage is driven to before ε shrinks instead.
const FINE_TOLERANCE: f64 = 1e-10;

/// The working state of one solve.
pub(crate) struct Run<'m, 'p> {
    model: &'m Model<'p>,
    options: &'m SolverOptions,
    scale: f64,
    prev: PrevRoutes,
    /// Group prices of the last iterate.
    pub u: Vec<f64>,
    /// After `solve`: the candidate lists and engine prices of the returned routing.
    pub cand: Candidates,
    spare: Candidates,
    pub pass: Pass,
    trial: Pass,
    hessian: Vec<f64>,
    cholesky: Cholesky,
    best: Option<(Repaired, Candidates, Vec<f64>)>,
    /// Step length (ms) the damping aims at; grows while full steps succeed (trust region).
    radius: f64,
    /// No price needs to move further than the largest shed penalty plus the network span.
    max_radius: f64,
    /// Newton steps, dual passes and candidate-list rebuilds so far (the solution's statistics).
    pub steps: usize,
    pub passes: usize,
    pub rebuilds: usize,
    /// How far prices are expected to travel, which sets the candidate lists' drift budget
    /// (see `width`).
    pub travel: Travel,
    /// Cap, per unit of ε, of an idle class's smallest step (`IDLE_REACH_PER_EPS` in a fitted
    /// coarse problem, else none).
    pub idle_reach_per_eps: f64,
    /// Wider candidate lists (`KEPT_MARGIN` beyond the width asked for) built by a warm
    /// re-solve's rebuild, from which later rebuilds, in this solve or the next ones on the same
    /// matrix (the warm start keeps them), extract their lists while the prices stay within the
    /// margin (`Candidates::covers`), instead of scanning the matrix.
    pub kept: Option<Arc<Candidates>>,
    /// Whether a warm re-solve builds wider lists to keep (not when the matrix changed since the
    /// previous solve).
    pub keep_lists: bool,
    /// Bounds on clustered engines' columns that let a rebuild scan fewer classes (the full
    /// solve after a fitted coarse start).
    pub bounds: Option<ListBounds>,
}

/// The kind of solve, as far as the candidate lists' drift budget is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Travel {
    /// A cold solve (or a coarse start): prices travel far.
    Cold,
    /// The first warm re-solve after a cold solve: its prices still move more than later ones'.
    FirstWarm,
    /// A warm re-solve after a warm one (the control loop's steady state).
    SteadyWarm,
    /// The full solve after a coarse start, which starts like a warm re-solve (the coarse
    /// prices, split and ε) and takes the first warm re-solve's drift budget (see `width`).
    Coarse,
}

/// Drift budget per unit of ε of a cold solve, whose prices travel far.
const COLD_DRIFT_PER_EPS: f64 = 2.0;

/// Smallest drift budget per unit of ε of a warm re-solve, whose budget is the cold one capped at
/// twice the floor: prices move little after a small change, and under overload (where ε stays
/// large because the shed penalties dominate the objective) the cold budget made the lists five
/// times longer than needed (100 × 5,000 noisy at 108 %: 97 k entries; 0.5ε alone: 55 k, warm
/// 77.1 M → 60 M instructions, the same single rebuild), while 0.5ε alone made 200 × 20,000
/// chained warm re-solves rebuild twice (225 M → 247 M; with the cap 209 M). Used by the first
/// re-solve after a cold solve, whose prices still move more; later ones use the floor alone
/// (see `width`).
const WARM_DRIFT_PER_EPS: f64 = 0.5;

/// How much wider than asked, relative to the price scale, a warm re-solve builds the lists it
/// keeps (`Run::kept`): the next re-solves extract theirs from them while the prices stay within
/// this margin of where they were built.
const KEPT_MARGIN: f64 = 0.005;

/// Cap, per unit of ε, of the smallest step of an idle class in a fitted coarse problem (see
/// `newton_direction`). Over six 100 × 5,000 cold solves (fleet seeds 1, 3, 4, fleet 108 %, noisy,
/// noisy 108 %) 1,601 M instructions in total against 1,637 M uncapped (fleet seed 4 1.8 % more);
/// 200 × 20,000 fleet 1,467 → 1,346 M. 0.1 and 1.0 did worse. Not in other solves: where prices
/// must climb far under overload (a 7 × 23 instance at 153 %) the capped step left the
/// certificate at 1.8 %.
pub(crate) const IDLE_REACH_PER_EPS: f64 = 0.3;

impl<'m, 'p> Run<'m, 'p> {
    pub fn new(model: &'m Model<'p>, options: &'m SolverOptions, scale: f64, prev: PrevRoutes) -> Self {
        Run {
            model,
            options,
            scale,
            prev,
            u: Vec::new(),
            cand: Candidates::default(),
            spare: Candidates::default(),
            pass: Pass::default(),
            trial: Pass::default(),
            hessian: Vec::new(),
            cholesky: Cholesky::default(),
            best: None,
            radius: 0.05 * scale,
            max_radius: model.penalty.iter().fold(scale, |a, &p| a.max(p)) + 200.0,
            steps: 0,
            passes: 0,
            rebuilds: 0,
            travel: Travel::Cold,
            idle_reach_per_eps: f64::INFINITY,
            kept: None,
            keep_lists: true,
            bounds: None,
        }
    }

    /// Builds the candidate lists of width `width` at prices `u` into `cand` (or `spare`):
    /// in a warm re-solve extracted from the kept wider lists when they cover `u` (bit for bit
    /// the lists a rebuild builds), else rebuilt (and, in a warm re-solve, first rebuilt wider
    /// and kept, then extracted).
    fn build_lists(&mut self, u: &[f64], width: f64, into_spare: bool) {
        let target = if into_spare { &mut self.spare } else { &mut self.cand };
        if matches!(self.travel, Travel::Cold | Travel::Coarse) || !self.keep_lists {
            target.rebuild(self.model, u, width, &self.prev, self.bounds.as_mut());
            return;
        }
        if !self.kept.as_ref().is_some_and(|k| k.covers(u, width)) {
            let mut wide = Candidates::default();
            wide.rebuild(self.model, u, width + KEPT_MARGIN * self.scale, &self.prev, None);
            self.kept = Some(Arc::new(wide));
        }
        if let Some(kept) = &self.kept {
            target.extract(self.model, kept, u, width, &self.prev);
        }
    }

    /// Candidate window for smoothing `eps`: ερ (how far below an engine's best class a class
    /// without previous flow can still get flow) plus twice the drift budget: in a cold solve
    /// max(2ε, 0.0025·scale); in the first warm one after it, and in the full solve after a
    /// coarse start, max(min(2ε, 0.005·scale), 0.5ε, 0.0025·scale); in later warm ones
    /// 0.0025·scale.
    fn width(&self, eps: f64) -> f64 {
        let floor = 0.0025 * self.scale;
        let budget = match self.travel {
            Travel::Cold => COLD_DRIFT_PER_EPS * eps,
            // The cold budget capped at twice the floor, at least `WARM_DRIFT_PER_EPS`·ε.
            // After a coarse start too: its prices move by the fit's error, a few ms at most,
            // not by a multiple of ε, so under overload (where ε stays large) the cold budget
            // only lengthened the lists (200 × 20,000 fleet at 108 %: 1.0 M entries of 4 M pairs;
            // 2,343 → 1,774 M instructions, as many Newton steps).
            Travel::FirstWarm | Travel::Coarse => {
                (COLD_DRIFT_PER_EPS * eps).min(2.0 * floor).max(WARM_DRIFT_PER_EPS * eps)
            }
            // Prices move by less than the floor after a small change (δ ≤ 0.16–0.30 ms on
            // the noisy instances against the 0.5–0.55 ms the floor allows), so a budget growing
            // with ε only lengthens the lists, most under overload, where ε stays large
            // (100 × 5,000 noisy at 108 %: 36.4 → 32.4 M instructions).
            Travel::SteadyWarm => floor,
        };
        eps * self.model.rho + 2.0 * budget.max(floor)
    }

    /// The lists are exact while the largest price rise plus the largest price fall since they
    /// were built stay below their width less ερ (crate README).
    fn lists_valid(cand: &Candidates, u: &[f64], eps: f64, rho: f64) -> bool {
        !cand.start.is_empty() && cand.drift(u) < cand.width - eps * rho
    }

    /// Runs the continuation; returns the best certified routing and its ε.
    ///
    /// The smoothing term at the smoothed optimum predicts the gap it causes (it bounds the
    /// difference between the smoothed and the true objective), so while it is well above the
    /// target the stage is solved only loosely and ε shrinks by the predicted factor; once it is
    /// small the residual is driven down until the certificate passes.
    pub fn solve(&mut self, u: Vec<f64>, eps_start: f64) -> (Repaired, f64) {
        self.u = u;
        self.radius = (2.0 * eps_start).max(0.02 * self.scale);
        let rho = self.model.rho;
        let target = self.options.gap_target;
        let eps_min = 1e-6 * self.scale;
        let mut eps = eps_start;
        let mut best_eps = eps;
        let mut tolerance = STAGE_TOLERANCE;
        let mut pass_eps = f64::NAN;
        let u = std::mem::take(&mut self.u);
        self.build_lists(&u, self.width(eps), false);
        self.u = u;
        self.rebuilds += 1;
        loop {
            if !Self::lists_valid(&self.cand, &self.u, eps, rho) || self.cand.width > 4.0 * self.width(eps) {
                let u = std::mem::take(&mut self.u);
                self.build_lists(&u, self.width(eps), false);
                self.u = u;
                self.rebuilds += 1;
                pass_eps = f64::NAN;
            }
            // The pass is current unless ε or the lists changed (Newton keeps it in step with u).
            if pass_eps != eps {
                self.pass.run(self.model, &self.cand, &self.u, eps);
                self.passes += 1;
                pass_eps = eps;
            }
            let converged = self.newton(eps, tolerance);
            let out_of_steps = self.steps >= self.options.max_newton_steps;
            let smoothing = self.pass.smoothing / self.pass.dual.abs().max(1e-300);
            if smoothing > 2.0 * target && eps > eps_min && !out_of_steps && self.best.is_none() {
                eps = self.shrink(eps, smoothing / (0.5 * target), eps_min);
                tolerance = STAGE_TOLERANCE;
                continue;
            }
            if tolerance > LOOSE_TOLERANCE && !out_of_steps && converged {
                tolerance = LOOSE_TOLERANCE;
                continue;
            }
            let repaired =
                repair(self.model, &self.cand, &self.pass, &self.u, eps, self.options.min_route_fraction);
            let gap = repaired.gap();
            let residual_share = 2.0 * self.residual_value() / repaired.objective.max(1e-300);
            let better = match &self.best {
                None => true,
                Some((b, _, _)) => gap < b.gap(),
            };
            let done = gap <= target || eps <= eps_min || out_of_steps;
            if better && done {
                // Leaving with the current routing: its lists and prices are already in place
                // (copying the lists was a few per cent of a warm re-solve).
                self.best = None;
                return (repaired, eps);
            }
            if better {
                self.best = Some((repaired, clone_lists(&self.cand), self.pass.q.clone()));
                best_eps = eps;
            }
            if done {
                break;
            }
            if self.pass.residual > FINE_TOLERANCE
                && converged
                && smoothing < 0.5 * gap
                && smoothing < 0.5 * target
                && gap - residual_share <= target
            {
                // The smoothing explains less than half of the gap: the residual is what is
                // left, so tighten first (otherwise tightening would not help: shrink ε). Not
                // when the smoothing alone is above half the target: it under-states its share
                // of the gap, and a tighter residual cannot pass (fleet 100 × 5,000 cold went
                // 6.4e-4 → 5.3e-4 in two more steps, then shrank ε anyway). Nor when the
                // residual is worth too little to close the gap (`residual_value`): 200 × 20,000
                // fleet at 108 % tightened from 6.37e-4 to 6.25e-4 in one more step and
                // certificate, 100 × 5,000 noisy at 108 % twice from 5.97e-4 to 5.66e-4.
                tolerance = (self.pass.residual * 0.01).max(FINE_TOLERANCE);
            } else {
                eps = self.shrink(eps, smoothing / (0.5 * target), eps_min);
                tolerance = STAGE_TOLERANCE;
            }
        }
        let (repaired, cand, q) = self.best.take().expect("the loop stores a solution before leaving");
        self.cand = cand;
        self.pass.q = q;
        (repaired, best_eps)
    }

    /// What the demand residual can be worth in the gap: Σ_k |∇g_k|·|u_k|. The dual credits
    /// u_k per req/s of class k's demand it has not placed (or debits what it over-places), and
    /// the repair pays about that much per req/s to fix it, so tightening the residual can close
    /// about twice this much of the gap, and no more.
    fn residual_value(&self) -> f64 {
        (0..self.model.n_classes())
            .filter(|&k| self.model.class_on[k] && self.u[k].is_finite())
            .map(|k| self.pass.grad[k].abs() * self.u[k].abs())
            .sum()
    }

    /// The continuation's next ε: `eps` divided by `factor` clamped to [2, 50], at least `eps_min`,
    /// with the prices moved there by the predictor.
    fn shrink(&mut self, eps: f64, factor: f64, eps_min: f64) -> f64 {
        let next = (eps / factor.clamp(2.0, 50.0)).max(eps_min);
        self.predict(eps, next);
        next
    }

    /// Predictor of the continuation: moves the prices from the smoothed optimum at `eps` to the
    /// first-order estimate of the one at `next` (implicit function theorem: ∇g(u(ε), ε) = 0, so
    /// du/dε = H⁻¹·∂∇g/∂ε with H = −∇²g), so that Newton at `next` starts near its optimum
    /// instead of from prices whose spreads between an engine's classes are still sized for `eps`.
    fn predict(&mut self, eps: f64, next: f64) {
        let n = self.model.n_classes();
        let max_diag = self.newton_matrix(eps);
        let mut delta = self.pass.eps_derivative(self.model, &self.cand, &self.u, eps);
        for k in 0..n {
            let diag = self.hessian[k * n + k];
            if !self.model.class_on[k] || diag <= 1e-12 * max_diag.max(1e-300) {
                // No price, or the dual is linear in it: no first-order move.
                self.hessian[k * n + k] = 1.0;
                delta[k] = 0.0;
            } else {
                self.hessian[k * n + k] += 1e-10 * diag;
            }
        }
        self.cholesky.solve(&mut self.hessian, &mut delta, n, 1e-12);
        self.radius = self.radius.min((2.0 * next).max(0.02 * self.scale));
        let step = next - eps;
        for k in 0..n {
            if self.model.class_on[k] && delta[k].is_finite() {
                self.u[k] += step * delta[k];
            }
        }
    }

    /// Fills `hessian` with −∇²g at the current prices (n × n, row-major); returns its largest
    /// diagonal entry.
    fn newton_matrix(&mut self, eps: f64) -> f64 {
        let n = self.model.n_classes();
        if self.hessian.len() == n * n {
            // Every matrix filled here is factored (`Cholesky::solve`) before the next one.
            self.cholesky.clear(&mut self.hessian, n);
        } else {
            self.hessian.clear();
            self.hessian.resize(n * n, 0.0);
        }
        self.pass.add_hessian(self.model, &self.cand, &self.u, eps, &mut self.hessian);
        (0..n).fold(0.0f64, |a, k| a.max(self.hessian[k * n + k]))
    }

    /// Newton iterations at fixed ε until the demand residual is small.
    ///
    /// Returns false when it stalls instead (steps cut to 5 % or less twice in a row, as at a
    /// kink of the dual); the caller then certifies what it has, which is often good enough.
    fn newton(&mut self, eps: f64, tolerance: f64) -> bool {
        let n = self.model.n_classes();
        let mut delta = vec![0.0; n];
        let mut u_trial = vec![0.0; n];
        let mut short_steps = 0;
        while self.pass.residual > tolerance && self.steps < self.options.max_newton_steps {
            if short_steps >= 2 && self.pass.residual <= STAGE_TOLERANCE {
                return false;
            }
            self.steps += 1;
            self.newton_direction(eps, &mut delta);
            let Some(t) = self.line_search(eps, &delta, &mut u_trial) else {
                return false;
            };
            // A step the line search cut to its first floor (0.05) or below counts as short: at a
            // kink Newton otherwise creeps on by 5 % a step (the coarse problem of 100 × 5,000
            // noisy spent 18 of its 64 steps so, residual 4.5e-4 → 2.2e-4 at one ε).
            short_steps = if t < 0.06 { short_steps + 1 } else { 0 };
        }
        true
    }

    /// The Newton step at the current prices into `delta`: the damped Newton system, with idle
    /// classes' steps set to jump to where they start to be served or shed.
    fn newton_direction(&mut self, eps: f64, delta: &mut [f64]) {
        let n = self.model.n_classes();
        let max_diag = self.newton_matrix(eps);
        // Levenberg–Marquardt damping: where capacity binds on every engine a group of classes
        // shares, the matrix is singular along "raise all their prices"; the damping turns the
        // step there into one of about `radius` ms. It vanishes with the gradient, so the final
        // steps are pure Newton.
        let radius = self.radius.max(10.0 * eps);
        let max_grad =
            (0..n).filter(|&k| self.model.class_on[k]).fold(0.0f64, |a, k| a.max(self.pass.grad[k].abs()));
        let damping = max_grad / radius;
        let mut idle_classes = Vec::new();
        for k in 0..n {
            delta[k] = self.pass.grad[k];
            let diag = self.hessian[k * n + k];
            if !self.model.class_on[k] {
                self.hessian[k * n + k] = 1.0;
                delta[k] = 0.0;
            } else if diag <= 1e-12 * max_diag.max(1e-300) {
                // No flow and no shedding: the dual is linear in u_k here. Jump to where the
                // class starts to be served (or shed), found below.
                self.hessian[k * n + k] = 1.0;
                idle_classes.push(k);
            } else {
                self.hessian[k * n + k] += 1e-10 * diag + damping;
            }
        }
        if !idle_classes.is_empty() {
            let targets = self.jump_targets(&idle_classes);
            // The dual is linear in these prices up to the next event and concave beyond:
            // stepping at least a quarter of the trust radius lets a chain of small events
            // (a price climbing to its shed penalty) take few steps; the line search cuts
            // any overshoot. In a fitted coarse problem that minimum is capped at
            // `IDLE_REACH_PER_EPS`·ε (`idle_reach_per_eps`): an engine takes
            // c_j/ε req/s per ms a class's price passes its water level, so a jump many ε deep
            // into a large engine (a coarse problem's cluster) serves the class several times
            // over, and the line search then cut the whole step to t ≈ 0.1–0.4 while the
            // class flipped between idle and over-served (the coarse problem's stall).
            for (&k, target) in idle_classes.iter().zip(targets) {
                let step = target - self.u[k];
                let reach = (0.25 * self.radius).min(self.idle_reach_per_eps * eps);
                delta[k] = if step >= 0.0 { step.max(reach) } else { step.min(-reach) };
            }
        }
        self.cholesky.solve(&mut self.hessian, delta, n, 1e-12);
    }

    /// Backtracking line search along `delta` (`u_trial` its scratch): takes the first step
    /// length at which the dual went up, with the trust radius updated, and returns it; None
    /// when 60 cuts found none.
    fn line_search(&mut self, eps: f64, delta: &[f64], u_trial: &mut Vec<f64>) -> Option<f64> {
        let n = self.model.n_classes();
        let rho = self.model.rho;
        let slope: f64 =
            (0..n).filter(|&k| self.model.class_on[k]).map(|k| delta[k] * self.pass.grad[k]).sum();
        let mut t = 1.0;
        for _ in 0..60 {
            for k in 0..n {
                u_trial[k] = self.u[k] + t * delta[k];
            }
            let rebuilt = !Self::lists_valid(&self.cand, u_trial, eps, rho);
            if rebuilt && matches!(self.travel, Travel::FirstWarm | Travel::SteadyWarm) {
                // A warm re-solve's prices rarely leave the lists' budget; a trial that does is
                // usually an overshoot (one class's price several ε past a kink, or a common
                // shift along a nearly singular direction). The lists' pass drops the classes
                // outside them, which can only lower each engine's best response, so its dual
                // is at least the exact one: when even it fell, the exact dual fell too (and by
                // concavity the exact slope at t is negative), and the trial is rejected without
                // the rebuild. Its slope only chooses the next t.
                self.trial.start_from(&mut self.pass);
                self.trial.run(self.model, &self.cand, u_trial, eps);
                self.passes += 1;
                let noise = 1e-13 * (self.pass.dual.abs() + self.trial.dual.abs());
                if self.trial.dual < self.pass.dual - noise {
                    let slope_at_t: f64 = (0..n)
                        .filter(|&k| self.model.class_on[k])
                        .map(|k| delta[k] * self.trial.grad[k])
                        .sum();
                    t = next_t(t, slope, slope_at_t);
                    continue;
                }
            }
            if rebuilt {
                self.build_lists(u_trial, self.width(eps), true);
                self.rebuilds += 1;
            }
            let lists = if rebuilt { &self.spare } else { &self.cand };
            self.trial.start_from(&mut self.pass);
            self.trial.run(self.model, lists, u_trial, eps);
            self.passes += 1;
            let noise = 1e-13 * (self.pass.dual.abs() + self.trial.dual.abs());
            // Slope of the dual along the step at t; ≥ 0 means the maximum along the line is
            // not yet passed, so (concavity) the value went up: accept without trusting the
            // value difference, which is at rounding level near convergence.
            let slope_at_t: f64 =
                (0..n).filter(|&k| self.model.class_on[k]).map(|k| delta[k] * self.trial.grad[k]).sum();
            if slope_at_t >= 0.0 || self.trial.dual >= self.pass.dual + 1e-4 * t * slope.max(0.0) - noise {
                if rebuilt {
                    std::mem::swap(&mut self.cand, &mut self.spare);
                }
                std::mem::swap(&mut self.pass, &mut self.trial);
                std::mem::swap(&mut self.u, u_trial);
                // Trust-region update: widen after a full step, narrow after a cut one.
                self.radius = if t >= 1.0 {
                    (self.radius * 4.0).min(self.max_radius)
                } else {
                    (self.radius * t).max(2.0 * eps)
                };
                return Some(t);
            }
            t = next_t(t, slope, slope_at_t);
        }
        None
    }

    /// For classes where the dual is locally linear (no flow, or only flow to saturated engines
    /// where they are alone, and no shedding), the price at which the next change happens: when
    /// short of demand, the cheapest engine it does not use yet (n_kj + q_j above u_k) or its
    /// shed penalty; when over-served, the price at which a saturated engine it uses desaturates.
    fn jump_targets(&self, classes: &[usize]) -> Vec<f64> {
        let model = self.model;
        let mut targets = Vec::with_capacity(classes.len());
        let mut position = vec![usize::MAX; model.n_classes()];
        for (i, &k) in classes.iter().enumerate() {
            position[k] = i;
            let u = self.u[k];
            targets.push(if self.pass.grad[k] >= 0.0 { model.next_penalty(k, u) } else { f64::NEG_INFINITY });
        }
        for j in 0..model.n_engines() {
            if !model.engine_on[j] {
                continue;
            }
            let q = self.pass.q[j];
            let column = model.network.engine_column(j);
            for (i, &k) in classes.iter().enumerate() {
                if self.pass.grad[k] >= 0.0 && column[k] + q > self.u[k] {
                    targets[i] = targets[i].min(column[k] + q);
                }
            }
            if self.pass.load[j] >= model.curves[j].cap() {
                // Desaturation: q_j falls to the marginal cost just below the capacity.
                let drop = q - model.curves[j].marginal(model.curves[j].cap() * (1.0 - 1e-12));
                for e in self.cand.start[j]..self.cand.start[j + 1] {
                    let k = self.cand.class[e] as usize;
                    if position[k] != usize::MAX && self.pass.grad[k] < 0.0 && self.pass.x[e] > 0.0 {
                        let i = position[k];
                        targets[i] = targets[i].max(self.u[k] - drop.max(0.0));
                    }
                }
            }
        }
        let eps_push = 0.1 * self.radius.min(1.0);
        classes
            .iter()
            .zip(targets)
            .map(|(&k, t)| {
                let u = self.u[k];
                if self.pass.grad[k] >= 0.0 {
                    if t.is_finite() {
                        t + eps_push
                    } else {
                        u + self.radius
                    }
                } else if t.is_finite() {
                    t - eps_push
                } else {
                    u - self.radius
                }
            })
            .collect()
    }
}

/// The line search's next step length after an overshoot at `t`: the secant zero of the slope
/// (`slope` at 0, `slope_at_t` at t), kept within [0.05 t, 0.9 t].
fn next_t(t: f64, slope: f64, slope_at_t: f64) -> f64 {
    let secant = t * slope / (slope - slope_at_t);
    if secant.is_finite() {
        secant.clamp(0.05 * t, 0.9 * t)
    } else {
        0.5 * t
    }
}

fn clone_lists(c: &Candidates) -> Candidates {
    c.clone_lists()
}

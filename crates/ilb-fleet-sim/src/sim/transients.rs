//! Watching the plans after a scenario event: when the first plan that reflects the event
//! reached the data planes (`replan_s`), and when traffic settled (`settle_s`). Definitions and
//! thresholds are on [`TransientStats`](crate::metrics::TransientStats); the plans looked at are
//! the intended splits ([`Policy::weights`](crate::policy::Policy::weights)) right after each
//! installation, so the snapshot's pull delay is included.

use crate::metrics::{REFLECT_MOVE, REFLECT_SHARE_DROP, SETTLE_MOVE, SETTLE_PLANS};
use ilb_engine_sim::Nanos;

/// What makes a plan reflect an event.
#[derive(Clone, Debug)]
pub enum Reflects {
    /// These engines get no traffic from any stream.
    Excludes(Vec<usize>),
    /// These engines get traffic again.
    Includes(Vec<usize>),
    /// These engines' traffic share fell (slowdown, `true`) or rose (speed-up, `false`) by
    /// [`REFLECT_SHARE_DROP`] of itself.
    Share(Vec<usize>, bool),
    /// These streams' split moved by [`REFLECT_MOVE`].
    Moved(Vec<usize>),
}

/// One event's watch.
#[derive(Clone, Debug)]
pub struct Watch {
    pub at: Nanos,
    /// Plans are looked at until then (the next event or the end of the run).
    pub until: Nanos,
    reflects: Reflects,
    n_engines: usize,
    /// The plan in force at the event, and the demand per stream just before it.
    before: Vec<f64>,
    demand: Vec<f64>,
    previous: Option<Vec<f64>>,
    pub replan: Option<Nanos>,
    /// The candidate settling plan's time and how many quiet plans followed it.
    candidate: Option<(Nanos, usize)>,
    pub settled: Option<Nanos>,
}

impl Watch {
    pub fn new(
        at: Nanos,
        until: Nanos,
        reflects: Reflects,
        n_engines: usize,
        before: Vec<f64>,
        demand: Vec<f64>,
    ) -> Watch {
        Watch {
            at,
            until,
            reflects,
            n_engines,
            before,
            demand,
            previous: None,
            replan: None,
            candidate: None,
            settled: None,
        }
    }

    /// Demand-weighted share of traffic on `engines` under plan `w`.
    fn share(&self, w: &[f64], engines: &[usize]) -> f64 {
        let total: f64 = self.demand.iter().sum();
        if total <= 0.0 {
            return 0.0;
        }
        let n = self.n_engines;
        let on: f64 = (0..self.demand.len())
            .map(|s| self.demand[s] * engines.iter().map(|&j| w[s * n + j]).sum::<f64>())
            .sum();
        on / total
    }

    fn reflected(&self, w: &[f64]) -> bool {
        let n = self.n_engines;
        match &self.reflects {
            Reflects::Excludes(engines) => {
                (0..self.demand.len()).all(|s| engines.iter().all(|&j| w[s * n + j] <= 1e-9))
            }
            Reflects::Includes(engines) => {
                (0..self.demand.len()).any(|s| engines.iter().any(|&j| w[s * n + j] > 1e-9))
            }
            Reflects::Share(engines, down) => {
                let (now, before) = (self.share(w, engines), self.share(&self.before, engines));
                if *down {
                    now <= (1.0 - REFLECT_SHARE_DROP) * before
                } else {
                    now >= (1.0 + REFLECT_SHARE_DROP) * before
                }
            }
            Reflects::Moved(streams) => {
                moved(w, &self.before, streams.iter().map(|&s| (s, self.demand[s])), n) >= REFLECT_MOVE
            }
        }
    }

    /// A plan `w` (stream-major weights) reached the data planes at `now`; `demand` is the
    /// current demand per stream.
    pub fn observe(&mut self, now: Nanos, w: &[f64], demand: &[f64]) {
        if now < self.at || now > self.until || self.settled.is_some() {
            return;
        }
        if self.replan.is_none() {
            if self.reflected(w) {
                self.replan = Some(now);
                self.candidate = Some((now, 0));
            }
            self.previous = Some(w.to_vec());
            return;
        }
        let quiet = self
            .previous
            .as_ref()
            .is_some_and(|p| moved(w, p, demand.iter().copied().enumerate(), self.n_engines) < SETTLE_MOVE);
        self.candidate = match (quiet, self.candidate) {
            (true, Some((t, k))) => Some((t, k + 1)),
            _ => Some((now, 0)),
        };
        if let Some((t, k)) = self.candidate {
            if k >= SETTLE_PLANS {
                self.settled = Some(t);
            }
        }
        self.previous = Some(w.to_vec());
    }
}

/// Share of the `streams`' traffic (each with its demand) whose engine differs between plans.
fn moved(a: &[f64], b: &[f64], streams: impl Iterator<Item = (usize, f64)>, n: usize) -> f64 {
    let (mut moved, mut total) = (0.0, 0.0);
    for (s, d) in streams {
        let row = s * n..(s + 1) * n;
        moved += d * 0.5 * a[row.clone()].iter().zip(&b[row]).map(|(x, y)| (x - y).abs()).sum::<f64>();
        total += d;
    }
    if total > 0.0 {
        moved / total
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_reflected_by_the_first_plan_without_the_failed_engine_and_settles_when_quiet() {
        // Two engines, one stream; engine 1 fails at t = 10.
        let mut w = Watch::new(10, 1_000, Reflects::Excludes(vec![1]), 2, vec![0.5, 0.5], vec![1.0]);
        w.observe(12, &[0.7, 0.3], &[1.0]);
        assert_eq!(w.replan, None);
        w.observe(14, &[1.0, 0.0], &[1.0]);
        assert_eq!(w.replan, Some(14));
        // A move of 2 % restarts the quiet run; then five quiet plans settle it at t = 16.
        w.observe(16, &[0.98, 0.0], &[1.0]);
        for t in [18, 20, 22, 24] {
            w.observe(t, &[0.98, 0.0], &[1.0]);
            assert_eq!(w.settled, None);
        }
        w.observe(26, &[0.985, 0.0], &[1.0]);
        assert_eq!(w.settled, Some(16));
    }

    #[test]
    fn a_slowdown_needs_a_quarter_of_the_share_gone_and_a_surge_a_tenth_of_the_traffic_moved() {
        let mut slow = Watch::new(0, 100, Reflects::Share(vec![0], true), 2, vec![0.5, 0.5], vec![1.0]);
        slow.observe(1, &[0.4, 0.6], &[1.0]);
        assert_eq!(slow.replan, None);
        slow.observe(2, &[0.37, 0.63], &[1.0]);
        assert_eq!(slow.replan, Some(2));
        let mut surge = Watch::new(0, 100, Reflects::Moved(vec![0]), 2, vec![1.0, 0.0], vec![1.0]);
        surge.observe(1, &[0.95, 0.05], &[3.0]);
        assert_eq!(surge.replan, None);
        surge.observe(2, &[0.85, 0.15], &[3.0]);
        assert_eq!(surge.replan, Some(2));
        // Plans after `until` are not looked at.
        let mut late = Watch::new(0, 5, Reflects::Moved(vec![0]), 2, vec![1.0, 0.0], vec![1.0]);
        late.observe(6, &[0.0, 1.0], &[1.0]);
        assert_eq!(late.replan, None);
    }
}

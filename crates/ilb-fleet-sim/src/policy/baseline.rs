//! The four stateless baselines: `round-robin` and `random` over every allowed engine,
//! `nearest` (the cluster's own region only, least loaded there) and `least-loaded` (global
//! power of two choices). Load is requests in flight divided by nominal capacity, so a large
//! engine counts as less loaded than a small one with the same queue. These baselines read the
//! fleet-wide in-flight count (more than one data plane really knows), which flatters them.

use super::{uniform_row, Arrival, Decision, Load, Policy, Topology};
use ilb_engine_sim::Nanos;
use rand::Rng;
use rand_pcg::Pcg64Mcg;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    RoundRobin,
    Random,
    Nearest,
    LeastLoaded,
}

pub struct Baseline {
    kind: Kind,
    /// Round-robin position per stream.
    next: Vec<usize>,
}

impl Baseline {
    /// `name` is one of the four baseline names.
    pub fn new(name: &str, n_streams: usize) -> Option<Baseline> {
        let kind = match name {
            "round-robin" => Kind::RoundRobin,
            "random" => Kind::Random,
            "nearest" => Kind::Nearest,
            "least-loaded" => Kind::LeastLoaded,
            _ => return None,
        };
        Some(Baseline { kind, next: vec![0; n_streams] })
    }
}

fn load_of(load: &Load, topology: &Topology, j: usize) -> f64 {
    f64::from(load.in_flight[j]) / topology.capacity_rps[j].max(1e-9)
}

impl Policy for Baseline {
    fn route(
        &mut self,
        _now: Nanos,
        topology: &Topology,
        load: &Load,
        arrival: Arrival,
        rng: &mut Pcg64Mcg,
    ) -> Decision {
        let stream = arrival.stream;
        let allowed = &topology.allowed[stream];
        if allowed.is_empty() {
            return Decision::NoEngine;
        }
        let n = allowed.len();
        let pick = match self.kind {
            Kind::RoundRobin => {
                let start = self.next[stream];
                let found = (0..n).map(|i| (start + i) % n).find(|&i| load.up[allowed[i]]);
                if let Some(i) = found {
                    self.next[stream] = (i + 1) % n;
                }
                found.map(|i| allowed[i])
            }
            Kind::Random => {
                let start = rng.gen_range(0..n);
                (0..n).map(|i| allowed[(start + i) % n]).find(|&j| load.up[j])
            }
            Kind::Nearest => topology.local[stream]
                .iter()
                .copied()
                .filter(|&j| load.up[j])
                .min_by(|&a, &b| load_of(load, topology, a).total_cmp(&load_of(load, topology, b))),
            Kind::LeastLoaded => {
                let mut draw = || {
                    let start = rng.gen_range(0..n);
                    (0..n).map(|i| allowed[(start + i) % n]).find(|&j| load.up[j])
                };
                match (draw(), draw()) {
                    (Some(a), Some(b)) => {
                        Some(if load_of(load, topology, b) < load_of(load, topology, a) { b } else { a })
                    }
                    (a, b) => a.or(b),
                }
            }
        };
        pick.map_or(Decision::NoEngine, Decision::Engine)
    }

    fn weights(&self, topology: &Topology, load: &Load, out: &mut [f64]) {
        let n = topology.n_engines;
        for (stream, row) in out.chunks_mut(n).enumerate() {
            let engines =
                if self.kind == Kind::Nearest { &topology.local[stream] } else { &topology.allowed[stream] };
            uniform_row(engines, &load.up, row);
        }
    }
}

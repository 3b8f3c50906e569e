//! Class aggregation: classes whose network rows are identical (same front end, same allowed
//! engines) are interchangeable for routing, so they are merged into one group before solving and
//! split back afterwards.
//!
//! Why this is exact: for classes with identical rows the objective depends on their routes only
//! through the group's per-engine totals X_gj and its total shed s_g. Given those, the cheapest
//! way to share the shedding among the members is lowest shed penalty first, and any member
//! split with the right totals is feasible (the rows are identical, so there is nothing else to
//! respect). The group's shedding cost is therefore the convex piecewise-linear Φ_g(s) of
//! "shed the cheapest first", and the aggregated problem has the same optimum and, at any engine
//! prices, the same Lagrangian bound Σ_k d_k·min(P_k, min_j n_kj + p_j) − Σ_j f_j*(p_j). Members
//! may differ in demand and shed penalty; they must agree on every network entry bit for bit.
//!
//! Classes without demand are never merged (they stay singleton groups without a price).

use std::borrow::Cow;

use crate::problem::{NetworkMatrix, Problem};

/// The grouping of one problem's classes.
pub(crate) struct Aggregation<'a> {
    /// Group of each class.
    pub class_group: Vec<u32>,
    /// Members of each group (CSR), class indices ascending.
    pub member_start: Vec<usize>,
    pub members: Vec<u32>,
    /// Group × engine network matrix (the problem's own when nothing merges).
    pub network: Cow<'a, NetworkMatrix>,
}

impl<'a> Aggregation<'a> {
    /// Groups the classes of `problem`: one hashing pass over the network matrix, then one pass
    /// that builds the group matrix and checks every merged entry bit for bit (a hash collision
    /// falls back to no merging, so only truly identical rows are ever merged).
    ///
    /// `hint` is the previous solve's group of each class (same classes, same order). When it
    /// merges something, one pass checks it bit for bit and builds its group matrix; if it holds
    /// it is used (the steady state of warm re-solves: one pass instead of two). A hint that
    /// merges nothing is used as is (no pass at all). Only a failed hint falls through to hashing.
    pub fn new(problem: &'a Problem, hint: Option<&[u32]>) -> Self {
        let n = problem.classes.len();
        let network = &problem.network_ms;
        let m = network.n_engines();
        let on: Vec<bool> = problem.classes.iter().map(|c| c.demand_rps > 0.0).collect();
        let hinted: Option<Vec<usize>> = hint.filter(|h| h.len() == n).map(|h| {
            let mut order: Vec<usize> = (0..n).filter(|&k| on[k]).collect();
            order.sort_by_key(|&k| (h[k], k));
            representatives(&order, |a, b| h[a] == h[b], n)
        });
        let hinted_reps: Vec<usize> =
            hinted.as_ref().map_or(Vec::new(), |r| (0..n).filter(|&k| r[k] == k).collect());
        let hinted_followers: Vec<usize> =
            hinted.as_ref().map_or(Vec::new(), |r| (0..n).filter(|&k| r[k] != k).collect());
        if hinted.is_some() && hinted_followers.is_empty() {
            // The previous solve merged nothing (noisy measured rows): not merging is always
            // exact, so the hashing pass is skipped; a merge that became possible is found by
            // the next solve without a hint.
            return Self::identity(problem);
        }
        if let Some(rep) = hinted.as_deref().filter(|_| !hinted_followers.is_empty()) {
            // Check the hinted grouping alone: when it holds, it is used as is (exact, though a
            // merge that became possible since is only found by the next solve without a hint).
            let mut values = Vec::with_capacity(hinted_reps.len() * m);
            let mut ok = true;
            for j in 0..m {
                let column = network.engine_column(j);
                if hinted_followers.iter().any(|&k| column[k].to_bits() != column[rep[k]].to_bits()) {
                    ok = false;
                    break;
                }
                values.extend(hinted_reps.iter().map(|&k| column[k]));
            }
            if ok {
                return Self::from_reps(rep, m, values);
            }
        }
        let mut hash = vec![0x243F_6A88_85A3_08D3u64; n];
        for j in 0..m {
            let column = network.engine_column(j);
            for (h, v) in hash.iter_mut().zip(column) {
                *h = (h.rotate_left(23) ^ v.to_bits()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            }
        }
        let mut order: Vec<usize> = (0..n).filter(|&k| on[k]).collect();
        order.sort_unstable_by_key(|&k| (hash[k], k));
        let rep = representatives(&order, |a, b| hash[a] == hash[b], n);
        if (0..n).all(|k| rep[k] == k) {
            return Self::identity(problem);
        }
        let reps: Vec<usize> = (0..n).filter(|&k| rep[k] == k).collect();
        let followers: Vec<usize> = (0..n).filter(|&k| rep[k] != k).collect();
        let mut values = Vec::with_capacity(reps.len() * m);
        for j in 0..m {
            let column = network.engine_column(j);
            if followers.iter().any(|&k| column[k].to_bits() != column[rep[k]].to_bits()) {
                return Self::identity(problem);
            }
            values.extend(reps.iter().map(|&k| column[k]));
        }
        Self::from_reps(&rep, m, values)
    }

    /// The grouping where class k's group is that of its representative `rep[k]` (groups in the
    /// order of their representatives), with the group matrix `values` (engine-major).
    fn from_reps(rep: &[usize], m: usize, values: Vec<f64>) -> Self {
        let n = rep.len();
        let mut class_group = vec![u32::MAX; n];
        let mut g_count = 0u32;
        for k in 0..n {
            if rep[k] == k {
                class_group[k] = g_count;
                g_count += 1;
            }
        }
        for k in 0..n {
            class_group[k] = class_group[rep[k]];
        }
        let g_count = g_count as usize;
        let mut member_start = vec![0usize; g_count + 1];
        for &g in &class_group {
            member_start[g as usize + 1] += 1;
        }
        for g in 0..g_count {
            member_start[g + 1] += member_start[g];
        }
        let mut fill = member_start.clone();
        let mut members = vec![0u32; n];
        for (k, &g) in class_group.iter().enumerate() {
            members[fill[g as usize]] = k as u32;
            fill[g as usize] += 1;
        }
        Aggregation {
            class_group,
            member_start,
            members,
            network: Cow::Owned(NetworkMatrix::from_engine_major(g_count, m, values)),
        }
    }

    /// Every class its own group.
    fn identity(problem: &'a Problem) -> Self {
        let n = problem.classes.len();
        Aggregation {
            class_group: (0..n as u32).collect(),
            member_start: (0..=n).collect(),
            members: (0..n as u32).collect(),
            network: Cow::Borrowed(&problem.network_ms),
        }
    }

    pub fn n_groups(&self) -> usize {
        self.member_start.len() - 1
    }

    pub fn members(&self, g: usize) -> &[u32] {
        &self.members[self.member_start[g]..self.member_start[g + 1]]
    }
}

/// For classes in `order` (sorted so that equal ones are adjacent, then by index), the smallest
/// index of each class's run of equal ones; every other class is its own representative.
fn representatives(order: &[usize], equal: impl Fn(usize, usize) -> bool, n: usize) -> Vec<usize> {
    let mut rep: Vec<usize> = (0..n).collect();
    for w in 1..order.len() {
        if equal(order[w], order[w - 1]) {
            rep[order[w]] = rep[order[w - 1]];
        }
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{Class, Engine, Latency};

    fn problem(rows: &[Vec<Option<f64>>], demand: &[f64]) -> Problem {
        Problem {
            rho: 0.9,
            classes: demand
                .iter()
                .enumerate()
                .map(|(k, &d)| Class {
                    id: format!("c{k}"),
                    demand_rps: d,
                    shed_penalty_ms: 1000.0 * k as f64,
                })
                .collect(),
            engines: (0..rows[0].len())
                .map(|j| Engine {
                    id: format!("e{j}"),
                    capacity_rps: 10.0,
                    latency: Latency::Queueing { t0_ms: 50.0, b_ms: 10.0 },
                })
                .collect(),
            network_ms: NetworkMatrix::from_rows(rows).unwrap(),
        }
    }

    #[test]
    fn merges_only_identical_rows_with_demand() {
        let rows = vec![
            vec![Some(5.0), None, Some(7.0)],
            vec![Some(5.0), None, Some(7.0)],
            vec![Some(5.0), Some(1.0), Some(7.0)],
            vec![Some(5.0), None, Some(7.0)],
            vec![Some(5.0), None, Some(7.0)],
            vec![Some(5.0), None, Some(7.000000001)],
        ];
        let p = problem(&rows, &[1.0, 2.0, 3.0, 4.0, 0.0, 5.0]);
        let a = Aggregation::new(&p, None);
        assert_eq!(a.n_groups(), 4);
        assert_eq!(a.class_group, vec![0, 0, 1, 0, 2, 3]);
        assert_eq!(a.members(0), &[0, 1, 3]);
        assert_eq!(a.network.get(1, 1), Some(1.0));
        assert_eq!(a.network.get(0, 1), None);
        assert_eq!(a.network.get(3, 2), Some(7.000000001));
    }

    #[test]
    fn hints_are_checked_not_trusted() {
        let rows = vec![
            vec![Some(5.0), None],
            vec![Some(6.0), Some(1.0)],
            vec![Some(5.0), None],
            vec![Some(6.0), Some(1.0)],
        ];
        let p = problem(&rows, &[1.0, 2.0, 3.0, 4.0]);
        let plain = Aggregation::new(&p, None);
        assert_eq!(plain.class_group, vec![0, 1, 0, 1]);
        // The right hint, a wrong one (merges different rows), a short one.
        for hint in [vec![0, 1, 0, 1], vec![0, 0, 0, 0], vec![0]] {
            let a = Aggregation::new(&p, Some(&hint));
            assert_eq!(a.class_group, plain.class_group, "hint {hint:?}");
            assert_eq!(a.network.to_rows(), plain.network.to_rows(), "hint {hint:?}");
        }
        // A hint that merges nothing is exact and kept (no pass over the matrix).
        let a = Aggregation::new(&p, Some(&[0, 1, 2, 3]));
        assert_eq!(a.class_group, vec![0, 1, 2, 3]);
        assert!(matches!(a.network, Cow::Borrowed(_)));
        // A hint that merges less than possible, but only identical rows, is exact and kept.
        let rows = vec![vec![Some(5.0)], vec![Some(5.0)], vec![Some(5.0)]];
        let p = problem(&rows, &[1.0, 2.0, 3.0]);
        let a = Aggregation::new(&p, Some(&[0, 0, 1]));
        assert_eq!(a.class_group, vec![0, 0, 1]);
        assert_eq!(Aggregation::new(&p, None).class_group, vec![0, 0, 0]);
    }

    #[test]
    fn distinct_rows_borrow_the_matrix() {
        let rows = vec![vec![Some(5.0), Some(6.0)], vec![Some(6.0), Some(5.0)]];
        let p = problem(&rows, &[1.0, 1.0]);
        let a = Aggregation::new(&p, None);
        assert!(matches!(a.network, Cow::Borrowed(_)));
        assert_eq!(a.n_groups(), 2);
    }
}

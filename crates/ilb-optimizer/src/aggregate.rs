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
        let mut checkpoint = 16;
        for j in 0..m {
            let column = network.engine_column(j);
            for (h, v) in hash.iter_mut().zip(column) {
                *h = (h.rotate_left(23) ^ v.to_bits()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            }
            // Identical rows have identical prefixes, hence equal prefix hashes: once every class
            // with demand has a hash of its own, no two rows can be identical (measured, noisy
            // rows differ within the first few engines), and the rest of the pass is skipped.
            if j + 1 == checkpoint && j + 1 < m {
                checkpoint *= 8;
                let mut seen: Vec<u64> = (0..n).filter(|&k| on[k]).map(|k| hash[k]).collect();
                seen.sort_unstable();
                if seen.windows(2).all(|w| w[0] != w[1]) {
                    return Self::identity(problem);
                }
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
                    headroom_rps: 0.0,
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

    /// The grouping by definition: a class with demand joins the first earlier class with demand
    /// whose row is identical bit for bit; groups numbered in the order of their first member.
    fn naive_groups(p: &Problem) -> Vec<u32> {
        let (n, m) = (p.classes.len(), p.engines.len());
        let row = |k: usize| -> Vec<u64> {
            (0..m).map(|j| p.network_ms.get(k, j).unwrap_or(f64::INFINITY).to_bits()).collect()
        };
        let mut rep: Vec<usize> = (0..n).collect();
        for k in 0..n {
            if p.classes[k].demand_rps > 0.0 {
                if let Some(r) = (0..k).find(|&r| p.classes[r].demand_rps > 0.0 && row(r) == row(k)) {
                    rep[k] = rep[r];
                }
            }
        }
        let mut group = vec![u32::MAX; n];
        let mut next = 0;
        for k in 0..n {
            if rep[k] == k {
                group[k] = next;
                next += 1;
            }
        }
        (0..n).map(|k| group[rep[k]]).collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 96,
            rng_seed: proptest::test_runner::RngSeed::Fixed(11),
            ..proptest::test_runner::Config::default()
        })]

        /// Rows drawn from a few templates, some differing only after the first 16 or 128
        /// engines (where the hashing may stop early): the grouping is the definition's.
        #[test]
        fn grouping_matches_the_definition(
            (n, m, templates, late, demand_mask, seed) in
                (1usize..12, 1usize..300, 1usize..4, 0usize..300, proptest::prelude::any::<u16>(), proptest::prelude::any::<u64>())
        ) {
            let value = |t: usize, j: usize| ((t as u64 * 7919 + j as u64 * 104_729 + seed) % 97) as f64;
            let rows: Vec<Vec<Option<f64>>> = (0..n)
                .map(|k| {
                    let t = k % templates;
                    (0..m)
                        .map(|j| {
                            if (j + t) % 11 == 0 {
                                return None;
                            }
                            // Class k's row leaves its template at engine `late` when k is odd.
                            let v = value(t, j);
                            Some(if k % 2 == 1 && j == late { v + 0.5 } else { v })
                        })
                        .collect()
                })
                .collect();
            let demand: Vec<f64> = (0..n).map(|k| if demand_mask >> (k % 16) & 1 == 1 { 1.0 + k as f64 } else { 0.0 }).collect();
            let p = problem(&rows, &demand);
            let a = Aggregation::new(&p, None);
            proptest::prop_assert_eq!(&a.class_group, &naive_groups(&p));
            for g in 0..a.n_groups() {
                let k = a.members(g)[0] as usize;
                for j in 0..m {
                    proptest::prop_assert_eq!(a.network.get(g, j).map(f64::to_bits), p.network_ms.get(k, j).map(f64::to_bits));
                }
            }
        }
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

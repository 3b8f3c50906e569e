//! A compact shadow of the network matrix: each entry rounded to f32, so the candidate-list
//! rebuild can screen a column at half the bytes of the f64 matrix (and in f32 arithmetic, four
//! lanes per instruction) and read the exact values only for the few classes that can be inside
//! the window (issue 15, ninth round: the settled warm re-solves wait on the matrix).
//!
//! Why the screened scan finds exactly the exact scan's window (`screened_window`). Write f(x)
//! for rounding to f32 (|f(x) − x| ≤ 2⁻²⁴|x| + 2⁻¹⁴⁹; no overflow: the shadow exists only when
//! every finite entry is below `LIMIT`, and the caller checks the prices against it). For finite
//! u_k and n_k the exact scan compares r = u − n rounded to f64, the screen r̃ = f(f(u) − f(n));
//! they differ by at most m_true = 2⁻²²(S + hi) + 2⁻¹⁴⁰, S the largest finite |u_k| and hi the
//! column's largest finite entry. The margin `m` below is at least four times that (and covers the
//! rounding of the thresholds' own arithmetic). An entry with r or r̃ not finite is −∞ in both
//! (u = −∞ or n = +∞: f keeps infinities). Let B = max r (the exact scan's best) and B̃ = max r̃,
//! both finite. The k attaining B̃ has finite r ≥ B̃ − m_true, so B ≥ B̃ − m_true; every k with
//! r_k ≥ B − w (the window, w ≥ 0 the width) or attaining B has r̃_k ≥ B − w − m_true ≥
//! B̃ − w − 2m_true, which is above the screen's threshold (B̃ − w − 4m, rounded to f32). So the
//! candidates contain the window and the maximiser: B is the maximum of the candidates' exact r
//! (a maximum does not round, and ±0 give the same B − w), and the window is the candidates with
//! exact r ≥ B − w, compared exactly as the exact scan compares them.

/// Finite entries and prices at or above this (f32's largest is 3.4e38) are not screened.
pub(crate) const LIMIT: f64 = 1e30;

/// The shadow of one engine-major matrix.
#[derive(Clone, Debug)]
pub(crate) struct Shadow {
    /// Each entry rounded to f32 (+∞ stays +∞), engine-major like the matrix.
    pub values: Vec<f32>,
    /// Each column's largest finite entry (0 if none).
    pub hi: Vec<f64>,
}

impl Shadow {
    /// The shadow of `values` (engine-major, `n` classes per column; every value finite and
    /// ≥ 0 or +∞). `None` when `n` is 0 or a finite value is at or above `LIMIT`.
    pub fn build(n: usize, values: &[f64]) -> Option<Shadow> {
        if n == 0 {
            return None;
        }
        let hi: Vec<f64> = values
            .chunks_exact(n)
            .map(|column| column.iter().filter(|v| v.is_finite()).fold(0.0f64, |a, &v| a.max(v)))
            .collect();
        if hi.iter().any(|&h| h >= LIMIT) {
            return None;
        }
        Some(Shadow { values: values.iter().map(|&v| v as f32).collect(), hi })
    }

    /// The shadow of the matrix whose column j is rows `rows` of this one's column j (`n` the
    /// classes per column here); each column's largest entry is kept (a bound for any subset).
    pub fn select_rows(&self, n: usize, rows: &[usize]) -> Shadow {
        let mut values = Vec::with_capacity(rows.len() * self.hi.len());
        for column in self.values.chunks_exact(n) {
            values.extend(rows.iter().map(|&k| column[k]));
        }
        Shadow { values, hi: self.hi.clone() }
    }

    /// One column's shadow.
    pub fn column(&self, n: usize, j: usize) -> &[f32] {
        &self.values[j * n..(j + 1) * n]
    }
}

/// Scratch of the screened scan.
#[derive(Default)]
pub(crate) struct Screen {
    /// The prices rounded to f32, and the largest finite |u_k|, set by `prepare`.
    u: Vec<f32>,
    u_mag: f64,
    /// The largest r̃ of each full block of eight classes of one column.
    blocks: Vec<f32>,
    /// Per engine (CSR) the candidate classes the shadow admits, ascending; `ok[j]` false where
    /// the shadow cannot decide (no finite reduced cost): that column is scanned exactly.
    start: Vec<usize>,
    cand: Vec<u32>,
    ok: Vec<bool>,
    /// One engine's candidates' exact reduced costs.
    exact: Vec<f64>,
}

impl Screen {
    /// Rounds the prices for a rebuild; false when they cannot be screened (a NaN or +∞, or a
    /// finite price at or above `LIMIT` in magnitude), or `width` is not finite and ≥ 0.
    pub fn prepare(&mut self, u: &[f64], width: f64) -> bool {
        let ok = width.is_finite()
            && width >= 0.0
            && u.iter().all(|&x| (x.is_finite() && x.abs() < LIMIT) || x == f64::NEG_INFINITY);
        self.u.clear();
        if ok {
            self.u.extend(u.iter().map(|&x| x as f32));
            self.u_mag = u.iter().filter(|x| x.is_finite()).fold(0.0f64, |a, &x| a.max(x.abs()));
        }
        ok
    }

    /// Screens every column `on` (as `prepare`d): the candidates of each (see the module docs).
    /// All columns first, then the exact values engine by engine (`window`): the exact reads are
    /// scattered, and a loop doing little else between them keeps more of them in flight.
    pub fn screen_all(&mut self, shadow: &Shadow, n: usize, on: &[bool], width: f64) {
        self.start.clear();
        self.cand.clear();
        self.ok.clear();
        self.start.push(0);
        for (j, &on) in on.iter().enumerate() {
            let ok = on && n > 0 && self.screen_column(shadow.column(n, j), shadow.hi[j], width);
            self.ok.push(ok);
            self.start.push(self.cand.len());
        }
    }

    /// Appends one column's candidates; false when no reduced cost is finite.
    fn screen_column(&mut self, shadow: &[f32], hi: f64, width: f64) -> bool {
        let first = self.cand.len();
        let max = |x: f32, y: f32| if x > y { x } else { y };
        let (cu, cs) = (self.u.chunks_exact(8), shadow.chunks_exact(8));
        let (ru, rs) = (cu.remainder(), cs.remainder());
        self.blocks.resize(cu.len(), 0.0);
        let mut lanes = [f32::NEG_INFINITY; 4];
        for ((a, b), block) in cu.clone().zip(cs.clone()).zip(self.blocks.iter_mut()) {
            let mut pair = [0.0; 4];
            for i in 0..4 {
                pair[i] = max(a[i] - b[i], a[i + 4] - b[i + 4]);
                lanes[i] = max(pair[i], lanes[i]);
            }
            *block = max(max(pair[0], pair[2]), max(pair[1], pair[3]));
        }
        let mut best = max(max(lanes[0], lanes[1]), max(lanes[2], lanes[3]));
        for (&a, &b) in ru.iter().zip(rs) {
            best = max(best, a - b);
        }
        if !best.is_finite() {
            return false;
        }
        let best = f64::from(best);
        let m = (self.u_mag + hi + best.abs() + width + 1.0) * (1.0 / (1u64 << 20) as f64);
        let t = ((best - width) - 4.0 * m) as f32;
        for (chunk, ((a, b), &block)) in cu.zip(cs).zip(&self.blocks).enumerate() {
            if block < t {
                continue;
            }
            let mut mask = 0u32;
            for i in 0..8 {
                mask |= ((a[i] - b[i] >= t) as u32) << i;
            }
            while mask != 0 {
                self.cand.push((chunk * 8) as u32 + mask.trailing_zeros());
                mask &= mask - 1;
            }
        }
        let tail = self.u.len() - ru.len();
        for (i, (&a, &b)) in ru.iter().zip(rs).enumerate() {
            if a - b >= t {
                self.cand.push((tail + i) as u32);
            }
        }
        debug_assert!(self.cand.len() > first, "the maximiser is a candidate");
        true
    }

    /// The classes k with u_k − n_kj ≥ B − `width` (B the column's largest u_k − n_kj) of
    /// screened engine j, ascending, into `out`, from its candidates' exact values in `column`;
    /// false (`out` unspecified) when engine j was not screened: the caller scans it exactly.
    pub fn window(&mut self, j: usize, u: &[f64], column: &[f64], width: f64, out: &mut Vec<u32>) -> bool {
        out.clear();
        if !self.ok.get(j).copied().unwrap_or(false) {
            return false;
        }
        let cand = &self.cand[self.start[j]..self.start[j + 1]];
        self.exact.clear();
        self.exact.extend(cand.iter().map(|&k| u[k as usize] - column[k as usize]));
        let best = self.exact.iter().fold(f64::NEG_INFINITY, |b, &r| if r > b { r } else { b });
        let threshold = best - width;
        out.extend(cand.iter().zip(&self.exact).filter(|&(_, &r)| r >= threshold).map(|(&k, _)| k));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Aggregation;
    use crate::gen::{generate, GenConfig};
    use crate::pass::{Candidates, EngineCurves, Model, PrevRoutes};
    use crate::problem::NetworkMatrix;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    /// The exact scan's window: {k : u_k − n_k ≥ max(u − n) − width}, ascending.
    fn exact_window(u: &[f64], column: &[f64], width: f64) -> Vec<u32> {
        let best =
            (0..u.len()).map(|k| u[k] - column[k]).fold(f64::NEG_INFINITY, |a, b| if b > a { b } else { a });
        (0..u.len()).filter(|&k| u[k] - column[k] >= best - width).map(|k| k as u32).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, rng_seed: proptest::test_runner::RngSeed::Fixed(15), ..ProptestConfig::default() })]

        /// Screening one column through its shadow gives exactly the exact scan's window, with
        /// reduced costs placed within a few f32 rounding steps of the window's edge (where the
        /// shadow's rounding matters), forbidden pairs (+∞) and classes without a price (−∞).
        #[test]
        fn screened_window_is_the_exact_window(
            entries in proptest::collection::vec((0.0f64..150.0, -8.0f64..8.0, 0u8..12), 1..60),
            scale in prop_oneof![Just(0.0), 1e-9f64..1e-3, 1e-3f64..2.0],
            level in prop_oneof![-100.0f64..100.0, 100.0f64..6_000.0, 1e6f64..1e9],
            width_steps in prop_oneof![Just(0.0), 0.0f64..4.0, 0.0f64..400.0],
        ) {
            // Column values 5 ms + up to 150 × `scale` (0: all equal).
            let column: Vec<f64> = entries.iter().map(|e| if e.2 == 1 { f64::INFINITY } else { 5.0 + e.0 * scale }).collect();
            // Reduced costs u − n = level + a few f32 rounding steps of the prices either way.
            let step = (level.abs() + 150.0) * f64::from(f32::EPSILON);
            let u: Vec<f64> = entries.iter().zip(&column).map(|(e, &n)| {
                if e.2 == 0 { f64::NEG_INFINITY } else if n.is_finite() { n + level + e.1 * step } else { level }
            }).collect();
            let width = width_steps * step;
            let shadow = Shadow::build(column.len(), &column).expect("a column");
            let mut out = vec![3];
            let mut screen = Screen::default();
            prop_assert!(screen.prepare(&u, width));
            let expected = exact_window(&u, &column, width);
            screen.screen_all(&shadow, column.len(), &[true], width);
            if screen.window(0, &u, &column, width, &mut out) {
                prop_assert_eq!(out, expected);
            } else {
                // Only when no reduced cost is finite.
                prop_assert!((0..u.len()).all(|k| !(u[k] - column[k]).is_finite()));
            }
        }
    }

    /// Matrices or prices out of f32's range, NaN prices and bad widths are not screened.
    #[test]
    fn out_of_range_is_not_screened() {
        assert!(Shadow::build(0, &[]).is_none());
        assert!(Shadow::build(2, &[1.0, 2e30]).is_none());
        let s = Shadow::build(2, &[1.0, f64::INFINITY, 3.0, 4.0]).expect("in range");
        assert_eq!(s.values, vec![1.0, f32::INFINITY, 3.0, 4.0]);
        assert_eq!(s.hi, vec![1.0, 4.0]);
        let mut screen = Screen::default();
        assert!(screen.prepare(&[1.0, f64::NEG_INFINITY], 0.5));
        assert!(!screen.prepare(&[1.0, f64::NAN], 0.5));
        assert!(!screen.prepare(&[1.0, f64::INFINITY], 0.5));
        assert!(!screen.prepare(&[1.0, -2e30], 0.5));
        assert!(!screen.prepare(&[1.0], -0.5));
        assert!(!screen.prepare(&[1.0], f64::NAN));
    }

    /// A rebuild through the shadow gives the same lists, bit for bit, as one without it, on
    /// generated instances (noisy and clustered, several sizes) at random prices.
    #[test]
    fn screened_rebuild_gives_the_exact_lists() {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(9);
        for seed in 1..=6u64 {
            for (n, m, noisy) in [(12, 300, true), (40, 500, true), (9, 200, false), (33, 400, false)] {
                let config = if noisy { GenConfig::noisy(n, m, seed) } else { GenConfig::new(n, m, seed) };
                let p = generate(&config.with_load(0.7 + 0.1 * seed as f64));
                let groups = Aggregation::new(&p, None);
                let curves = EngineCurves::for_problem(&p, None);
                let with = Model::new(&p, &groups, &curves);
                assert!(with.network.shadow().is_some());
                let g = with.n_classes();
                let values: Vec<f64> = (0..m).flat_map(|j| with.network.engine_column(j).to_vec()).collect();
                let plain_matrix = NetworkMatrix::from_engine_major(g, m, values);
                let mut without = Model::new(&p, &groups, &curves);
                without.network = &plain_matrix;
                for trial in 0..8 {
                    // Prices around each class's nearest engine, a few without a price.
                    let u: Vec<f64> = (0..g)
                        .map(|k| {
                            if !with.class_on[k] || rng.gen_range(0..20) == 0 {
                                return f64::NEG_INFINITY;
                            }
                            let near = (0..m)
                                .map(|j| with.network.engine_column(j)[k])
                                .fold(f64::INFINITY, f64::min);
                            near + rng.gen_range(0.0..if trial % 2 == 0 { 5.0 } else { 200.0 })
                        })
                        .collect();
                    let width = [0.0, 1e-3, 0.5, 3.0, 40.0][trial % 5];
                    let (mut a, mut b) = (Candidates::default(), Candidates::default());
                    a.rebuild(&with, &u, width, &PrevRoutes::default());
                    b.rebuild(&without, &u, width, &PrevRoutes::default());
                    assert_eq!(a.start, b.start, "seed {seed} {n}x{m} trial {trial}");
                    assert_eq!(a.class, b.class);
                    assert_eq!(
                        a.net.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        b.net.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                    );
                    assert!(a.class.len() >= m / 2, "non-trivial lists");
                }
            }
        }
    }
}

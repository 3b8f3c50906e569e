use super::*;
use proptest::prelude::*;

fn ids(n: usize) -> Vec<EngineId> {
    (0..n).map(|i| EngineId::new(format!("e{i}"))).collect()
}

fn total_variation(a: &[f64], b: &[f64]) -> f64 {
    let (sa, sb): (f64, f64) = (a.iter().sum(), b.iter().sum());
    a.iter().zip(b).map(|(x, y)| (x / sa - y / sb).abs()).sum::<f64>() / 2.0
}

#[test]
fn quotas_sum_to_slots_and_follow_weights() {
    let q = quotas(&[1.0, 2.0, 0.0, 1.0], 1 << 16);
    assert_eq!(q.iter().sum::<usize>(), 1 << 16);
    assert_eq!(q, vec![16384, 32768, 0, 16384]);
    let q = quotas(&[1.0, 1.0, 1.0], 16);
    assert_eq!(q, vec![6, 5, 5]);
}

#[test]
fn key_shares_match_weights_within_two_percent() {
    // 100,000 seeded random keys over five engines of unequal weight.
    use rand::{RngCore, SeedableRng};
    let weights = [0.1, 0.15, 0.2, 0.25, 0.3];
    let table = SlotTable::build(&weights, &ids(5), None);
    let mut rng = rand_pcg::Pcg64::seed_from_u64(7);
    let mut hits = [0usize; 5];
    let n_keys = 100_000;
    for _ in 0..n_keys {
        let key = rng.next_u64().to_le_bytes();
        hits[table.owner(crate::stable_hash(&key))] += 1;
    }
    for (i, w) in weights.iter().enumerate() {
        let share = hits[i] as f64 / n_keys as f64;
        assert!((share - w).abs() / w <= 0.02, "engine {i}: share {share} vs weight {w}");
    }
}

#[test]
fn weight_change_moves_the_minimum() {
    let old = [0.25, 0.25, 0.25, 0.25];
    let new = [0.30, 0.20, 0.25, 0.25];
    let a = SlotTable::build(&old, &ids(4), None);
    let b = SlotTable::build(&new, &ids(4), Some((&a, &ids(4))));
    let moved = SlotTable::moved_fraction((&a, &ids(4)), (&b, &ids(4)));
    let tv = total_variation(&old, &new);
    assert!(moved <= 1.2 * tv + 1e-9, "moved {moved} vs minimum {tv}");
    assert!(moved >= tv - 1e-4);
}

#[test]
fn an_engine_leaving_moves_only_its_keys() {
    let a = SlotTable::build(&[1.0, 1.0, 1.0], &ids(3), None);
    let kept = vec![EngineId::new("e0"), EngineId::new("e2")];
    let b = SlotTable::build(&[1.0, 1.0], &kept, Some((&a, &ids(3))));
    let moved = SlotTable::moved_fraction((&a, &ids(3)), (&b, &kept));
    assert!((moved - 1.0 / 3.0).abs() < 1e-4, "moved {moved}");
}

#[test]
fn growing_past_a_power_of_two_keeps_layout() {
    // 1,100 candidates need a bigger table than 1,000 do; the nested layout carries over.
    let w_old = vec![1.0; 1000];
    let mut w_new = vec![1.0; 1100];
    w_new[1000..].iter_mut().for_each(|w| *w = 1.0);
    let a = SlotTable::build(&w_old, &ids(1000), None);
    let b = SlotTable::build(&w_new, &ids(1100), Some((&a, &ids(1000))));
    assert!(b.n_slots() > a.n_slots());
    let moved = SlotTable::moved_fraction((&a, &ids(1000)), (&b, &ids(1100)));
    let tv = 100.0 / 1100.0;
    assert!(moved <= 1.2 * tv, "moved {moved} vs minimum {tv}");
}

proptest! {
    #![proptest_config(ProptestConfig { rng_seed: proptest::test_runner::RngSeed::Fixed(1), ..ProptestConfig::default() })]

    #[test]
    fn slot_counts_match_quotas(weights in proptest::collection::vec(0.0..100.0f64, 1..40)) {
        prop_assume!(weights.iter().sum::<f64>() > 0.0);
        let t = SlotTable::build(&weights, &ids(weights.len()), None);
        let counts = t.counts(weights.len());
        let total: f64 = weights.iter().sum();
        for (c, w) in counts.iter().zip(&weights) {
            let exact = w / total * t.n_slots() as f64;
            prop_assert!((*c as f64 - exact).abs() <= 1.0 + 1e-9);
        }
    }

    /// Re-weighting moves at most 1.2 × the total-variation distance (plus one slot per
    /// candidate of rounding).
    #[test]
    fn movement_is_near_minimal(
        old in proptest::collection::vec(0.01..1.0f64, 2..30),
        noise in proptest::collection::vec(0.5..1.5f64, 30),
    ) {
        let n = old.len();
        let new: Vec<f64> = old.iter().zip(&noise).map(|(w, f)| w * f).collect();
        let a = SlotTable::build(&old, &ids(n), None);
        let b = SlotTable::build(&new, &ids(n), Some((&a, &ids(n))));
        let moved = SlotTable::moved_fraction((&a, &ids(n)), (&b, &ids(n)));
        let tv = total_variation(&old, &new);
        let rounding = n as f64 / b.n_slots() as f64;
        prop_assert!(moved <= 1.2 * tv + rounding, "moved {} tv {}", moved, tv);
    }

    /// Same inputs, same table: every data plane agrees.
    #[test]
    fn build_is_deterministic(weights in proptest::collection::vec(0.01..10.0f64, 1..20)) {
        let a = SlotTable::build(&weights, &ids(weights.len()), None);
        let b = SlotTable::build(&weights, &ids(weights.len()), None);
        prop_assert_eq!(a.slots, b.slots);
    }
}

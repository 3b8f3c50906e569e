use super::*;
use crate::affinity::AffinityTable;
use crate::snapshot::tests::example_json;

fn table() -> RoutingTable {
    RoutingTable::compile(&Snapshot::from_json(example_json().as_bytes()).unwrap(), None).unwrap()
}

#[test]
fn weights_are_normalised_and_models_listed() {
    let t = table();
    let m = t.model("m").unwrap();
    let c = &m.classes[m.default_class];
    assert_eq!(c.id.as_str(), "default");
    let w: Vec<f64> = c.candidates.iter().map(|c| c.weight).collect();
    assert_eq!(w, vec![0.75, 0.25]);
    assert_eq!(t.model_names(), &[ModelName::new("m")]);
    assert!(t.model("other").is_none());
}

#[test]
fn constraints_choose_the_exact_class_or_filter_the_default() {
    let t = table();
    let m = t.model("m").unwrap();
    let eu = Constraints { require: &[], residency: Some("eu") };
    assert_eq!(m.class_for(&eu).id.as_str(), "eu");
    let long = Constraints { require: &["long-context"], residency: None };
    let class = m.class_for(&long);
    assert_eq!(class.id.as_str(), "default");
    // Only e2 offers long-context: every key lands there.
    for key in 0..1000u64 {
        let p = class
            .pick(crate::slots::mix(key), |c| long.allow(&t.engines[class.candidates[c].engine_idx]))
            .unwrap();
        assert_eq!(class.candidates[p.candidate].engine_idx, 1);
    }
    let impossible = Constraints { require: &["tools"], residency: None };
    assert!(class.pick(1, |c| impossible.allow(&t.engines[class.candidates[c].engine_idx])).is_none());
}

#[test]
fn refused_candidates_are_walked_past_deterministically() {
    let t = table();
    let m = t.model("m").unwrap();
    let class = &m.classes[m.default_class];
    for key in 0..1000u64 {
        let h = crate::slots::mix(key);
        let first = class.pick(h, |_| true).unwrap();
        let other = class.pick(h, |c| c != first.candidate).unwrap();
        assert_ne!(other.candidate, first.candidate);
        assert_eq!(class.pick(h, |c| c != first.candidate), Some(other));
    }
}

#[test]
fn recompiling_carries_the_layout_over() {
    let mut s = Snapshot::from_json(example_json().as_bytes()).unwrap();
    let a = RoutingTable::compile(&s, None).unwrap();
    s.models[0].classes[0].weights[0].weight = 2.0; // 0.75 → 0.667
    let b = RoutingTable::compile(&s, Some(&a)).unwrap();
    let (ca, cb) = (&a.model("m").unwrap().classes[0], &b.model("m").unwrap().classes[0]);
    let moved = SlotTable::moved_fraction((&ca.slots, ca.candidate_ids()), (&cb.slots, cb.candidate_ids()));
    let tv = 0.75 - 2.0 / 3.0;
    assert!(moved <= 1.2 * tv, "moved {moved}, minimum {tv}");
}

#[test]
fn load_bound_is_relative_plus_noise_slack() {
    // A quarter of 99 + 1 in flight: e = 25, bound ⌈1.25·25 + 3·5⌉ = 47.
    assert!(within_load_bound(46.0, 0.25, 99.0));
    assert!(!within_load_bound(47.0, 0.25, 99.0));
    // A small share keeps room for chance: e = 1, bound ⌈1.25 + 3⌉ = 5.
    assert!(within_load_bound(4.0, 0.01, 99.0));
    assert!(!within_load_bound(5.0, 0.01, 99.0));
    // A zero weight admits nothing while others carry the class.
    assert!(!within_load_bound(0.0, 0.0, 10.0));
}

#[test]
fn remembered_engines_survive_a_weight_change_and_follow_the_engine_not_its_position() {
    let mut s = Snapshot::from_json(example_json().as_bytes()).unwrap();
    let a = RoutingTable::compile(&s, None).unwrap();
    let ca = &a.model("m").unwrap().classes[0];
    let affinity = AffinityTable::new(1 << 16, 600);
    let keys: Vec<u64> = (0..200u64).map(crate::slots::mix).collect();
    for &k in &keys {
        let p = ca.pick(k, |_| true).unwrap();
        ca.remember(&affinity, k, p.candidate, 100);
    }
    let engine_of = |t: &RoutingTable, c: usize| t.model("m").unwrap().classes[0].candidate_ids()[c].clone();
    let before: Vec<EngineId> =
        keys.iter().map(|&k| engine_of(&a, ca.pick(k, |_| true).unwrap().candidate)).collect();
    // Most weight moves to the second engine, and the candidates swap places in the snapshot.
    s.models[0].classes[0].weights[0].weight = 0.1;
    s.models[0].classes[0].weights.reverse();
    let b = RoutingTable::compile(&s, Some(&a)).unwrap();
    let cb = &b.model("m").unwrap().classes[0];
    let mut moved_by_hash = 0;
    for (&k, engine) in keys.iter().zip(&before) {
        let remembered = cb.remembered(&affinity, k, 130).expect("remembered");
        assert_eq!(&engine_of(&b, remembered), engine, "the same engine, at its new position");
        moved_by_hash += usize::from(engine_of(&b, cb.pick(k, |_| true).unwrap().candidate) != *engine);
    }
    assert!(moved_by_hash > 50, "the weight change moves keys by hash ({moved_by_hash})");
    // An engine whose weight went to zero is not remembered any more; expired entries neither.
    let zero = cb.candidate_ids().iter().position(|id| *id == before[0]).unwrap();
    s.models[0].classes[0].weights[zero].weight = 0.0;
    let c = RoutingTable::compile(&s, Some(&b)).unwrap();
    let cc = &c.model("m").unwrap().classes[0];
    assert_eq!(cc.remembered(&affinity, keys[0], 130), None);
    assert_eq!(cb.remembered(&affinity, keys[0], 100 + 601), None);
}

#[test]
fn new_keys_take_the_less_loaded_of_two_weighted_choices() {
    let t = table();
    let m = t.model("m").unwrap();
    let class = &m.classes[m.default_class];
    let n = class.candidates.len();
    // Nothing in flight: exactly the hash's pick, so shares follow the weights.
    for key in 0..2000u64 {
        let key = crate::slots::mix(key);
        let by_load = class.pick_by_load(key, |_| true, |_| 0.0);
        assert_eq!(by_load, class.pick(key, |_| true).map(|p| p.candidate));
    }
    // The 0.75 candidate loaded far past the other: new keys avoid it, except the few whose
    // probes reach no other candidate (0.75^23 of keys).
    let heavy = 0;
    let mut on_heavy = 0;
    for key in 0..2000u64 {
        let key = crate::slots::mix(key);
        let c = class.pick_by_load(key, |_| true, |c| if c == heavy { 100.0 } else { 0.0 }).unwrap();
        assert!(c < n);
        on_heavy += usize::from(c == heavy);
    }
    assert!(on_heavy <= 20, "{on_heavy} of 2000 new keys on the loaded engine");
}

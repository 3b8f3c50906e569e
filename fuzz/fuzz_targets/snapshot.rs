//! Fuzz target: routing snapshots, which a data plane reads from the network.
//!
//! `Snapshot::from_json` must reject bad input with an error, and (ARCHITECTURE.md's ilb-core
//! invariant) a snapshot it accepts must compile into a `RoutingTable` without panicking, also
//! on top of a previous table (the minimal-movement carry-over path). The compiled table is then
//! used as the request path uses it: every class gets picks with everything admitted, with only
//! one candidate admitted (the walk and the fallback scan), and with nothing admitted. Checks:
//! normalised weights sum to one, every slot has an owner, zero-weight candidates own no slot,
//! and the snapshot's own JSON parses back to an equal snapshot.

#![no_main]

use ilb_core::slots::mix;
use ilb_core::snapshot::Snapshot;
use ilb_core::table::{ClassTable, Constraints, RoutingTable};
use ilb_core::SnapshotVersion;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(snapshot) = Snapshot::from_json(data) else { return };
    let table = RoutingTable::compile(&snapshot, None).expect("a validated snapshot compiles");
    let seed = ilb_core::stable_hash(data);
    exercise(&table, seed);

    let json = serde_json::to_vec(&snapshot).expect("a snapshot serialises");
    let back = Snapshot::from_json(&json).expect("a snapshot's own json parses");
    // Equal up to float rounding: serde_json's default float parser is not correctly rounded
    // ("1e-30" reads as 9.999999999999999e-31), so a round trip may move a number by an ulp.
    let (a, b) = (serde_json::to_value(&snapshot).unwrap(), serde_json::to_value(&back).unwrap());
    assert!(close(&a, &b), "round trip changed the snapshot:\n{a}\n{b}");

    // The next version with every class's weights rotated by one: slot layouts carry over.
    let mut next = snapshot.clone();
    next.version = SnapshotVersion(snapshot.version.0.saturating_add(1));
    for model in &mut next.models {
        for class in &mut model.classes {
            let weights: Vec<f64> = class.weights.iter().map(|w| w.weight).collect();
            for (i, w) in class.weights.iter_mut().enumerate() {
                w.weight = weights[(i + 1) % weights.len()];
            }
        }
    }
    let next_table = RoutingTable::compile(&next, Some(&table)).expect("a rotated snapshot compiles");
    exercise(&next_table, seed ^ 1);
});

/// Equal JSON values, numbers within a relative 1e-12.
fn close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(f64::NAN));
            x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| close(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
        }
        _ => a == b,
    }
}

fn exercise(table: &RoutingTable, seed: u64) {
    assert_eq!(table.models().count(), table.model_names().len());
    for model in table.models() {
        assert!(model.default_class < model.classes.len());
        for class in &model.classes {
            assert!(class.seq < table.n_classes());
            check_class(table, class, seed);
            // The class a request with exactly this class's constraints lands in.
            let require: Vec<&str> = class.require.iter().map(String::as_str).collect();
            let constraints = Constraints { require: &require, residency: class.residency.as_deref() };
            let found = model.class_for(&constraints);
            assert_eq!((&found.require, &found.residency), (&class.require, &class.residency));
        }
    }
}

fn check_class(table: &RoutingTable, class: &ClassTable, seed: u64) {
    let n = class.candidates.len();
    assert!(n > 0, "class '{}' has no candidates", class.id);
    let total: f64 = class.candidates.iter().map(|c| c.weight).sum();
    assert!((total - 1.0).abs() < 1e-9, "class '{}' weights sum to {total}", class.id);
    for c in &class.candidates {
        assert!(c.engine_idx < table.engines.len());
        assert!(c.weight.is_finite() && c.weight >= 0.0);
    }
    // `counts` indexes by owner, so a slot left without one would panic here.
    let counts = class.slots.counts(n);
    assert_eq!(counts.iter().sum::<usize>(), class.slots.n_slots());
    for (c, count) in class.candidates.iter().zip(&counts) {
        if c.weight == 0.0 {
            assert_eq!(*count, 0, "a zero-weight candidate owns slots");
        }
    }
    for k in 0..4u64 {
        let key = mix(seed ^ k);
        let any = class.pick(key, |_| true).expect("with everything admitted a pick succeeds");
        assert!(any.candidate < n);
        let only = (key % n as u64) as usize;
        let picked = class.pick(key, |c| c == only).expect("the one admitted candidate is found");
        assert_eq!(picked.candidate, only);
        assert!(class.pick(key, |_| false).is_none());
    }
}

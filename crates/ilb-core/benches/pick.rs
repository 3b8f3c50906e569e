//! Pick latency at 10 / 1,000 / 5,000 candidates, and the time to compile a new snapshot
//! (weights changed, weights unchanged, the slot table alone).
//! Run: `cargo bench -p ilb-core --bench pick`.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use ilb_core::slots::{mix, SlotTable};
use ilb_core::snapshot::{ClassRoutes, EngineEntry, EngineWeight, ModelRoutes, Snapshot, FORMAT};
use ilb_core::table::{ClassTable, RoutingTable};
use ilb_core::{ClassId, ClusterId, EngineId, ModelName, SnapshotVersion};

fn snapshot(n: usize, skew: f64) -> Snapshot {
    let engines: Vec<EngineEntry> = (0..n)
        .map(|i| EngineEntry {
            id: EngineId::new(format!("e{i}")),
            url: format!("http://10.0.{}.{}:8000", i / 250, i % 250),
            region: format!("r{}", i % 7),
            capabilities: vec![],
            residency: vec![],
            max_in_flight: 0,
        })
        .collect();
    let weights = (0..n)
        .map(|i| EngineWeight {
            engine: EngineId::new(format!("e{i}")),
            weight: 1.0 + skew * ((i * 7919) % 13) as f64,
            expected_latency_ms: None,
            network_ms: None,
            in_flight_ms: None,
        })
        .collect();
    Snapshot {
        format: FORMAT,
        version: SnapshotVersion(1),
        created_unix_ms: 0,
        cluster: ClusterId::new("c"),
        utilisation: 0.5,
        engines,
        models: vec![ModelRoutes {
            model: ModelName::new("m"),
            classes: vec![ClassRoutes {
                id: ClassId::new("default"),
                require: vec![],
                residency: None,
                weights,
                shed_fraction: 0.0,
            }],
        }],
    }
}

fn class(t: &RoutingTable) -> &ClassTable {
    &t.model("m").unwrap().classes[0]
}

fn bench_pick(c: &mut Criterion) {
    let mut group = c.benchmark_group("pick");
    for n in [10usize, 1_000, 5_000] {
        let table = RoutingTable::compile(&snapshot(n, 0.3), None).unwrap();
        let in_flight = vec![0u32; n];
        let mut key = 0u64;
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                key = key.wrapping_add(1);
                let model = table.model(black_box("m")).unwrap();
                let class = &model.classes[model.default_class];
                class.pick(mix(key), |c| in_flight[c] < 100)
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("rebuild");
    for n in [10usize, 1_000, 5_000] {
        let old = RoutingTable::compile(&snapshot(n, 0.3), None).unwrap();
        let new = snapshot(n, 0.35);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| RoutingTable::compile(black_box(&new), Some(&old)).unwrap())
        });
        // A new version of the same plan: the slot table is shared, not rebuilt.
        let same = snapshot(n, 0.3);
        group.bench_with_input(BenchmarkId::new("unchanged", n), &n, |b, _| {
            b.iter(|| RoutingTable::compile(black_box(&same), Some(&old)).unwrap())
        });
        let ids: Vec<EngineId> = class(&old).candidate_ids().to_vec();
        let w: Vec<f64> = (0..n).map(|i| 1.0 + (i % 3) as f64).collect();
        group.bench_with_input(BenchmarkId::new("slots-only", n), &n, |b, _| {
            b.iter(|| SlotTable::build(black_box(&w), &ids, Some((&class(&old).slots, &ids))))
        });
    }
    group.finish();
}

/// Per-pick latency distribution at 5,000 candidates: each of 1,000,000 picks timed on its own
/// (the timer's own cost is included, so these are upper bounds).
#[allow(clippy::disallowed_methods)] // a benchmark reads the clock by design
fn pick_percentiles(_: &mut Criterion) {
    let table = RoutingTable::compile(&snapshot(5_000, 0.3), None).unwrap();
    let in_flight = vec![0u32; 5_000];
    let model = table.model("m").unwrap();
    let class = &model.classes[model.default_class];
    let mut samples: Vec<u64> = Vec::with_capacity(1_000_000);
    for key in 0..1_000_000u64 {
        let start = std::time::Instant::now();
        black_box(class.pick(mix(key), |c| in_flight[c] < 100));
        samples.push(start.elapsed().as_nanos() as u64);
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    println!(
        "pick at 5,000 candidates, 1,000,000 single timed picks: p50 {} ns, p99 {} ns, p99.9 {} ns, max {} ns",
        at(0.5),
        at(0.99),
        at(0.999),
        samples[samples.len() - 1]
    );
}

criterion_group!(benches, pick_percentiles, bench_pick);
criterion_main!(benches);

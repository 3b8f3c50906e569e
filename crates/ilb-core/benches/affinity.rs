//! What sharing decisions with other data-plane replicas costs the request path: one
//! `AffinityTable::put` without a journal (one store), with one when the entry is unchanged
//! (one swap), and with one when the key is new (a swap, an add and a store into the ring);
//! and 1,000 new keys put and read back by the sending task (`changes_since`, off the
//! request path).
//! Run: `cargo bench -p ilb-core --bench affinity`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use ilb_core::affinity::{AffinityTable, DEFAULT_ENTRIES, DEFAULT_TTL_S};
use ilb_core::slots::mix;

fn put(c: &mut Criterion) {
    let plain = AffinityTable::new(DEFAULT_ENTRIES, DEFAULT_TTL_S);
    let journal = AffinityTable::with_journal(DEFAULT_ENTRIES, DEFAULT_TTL_S, 1 << 14);
    let mut group = c.benchmark_group("affinity_put");
    group.bench_function("no_journal", |b| {
        let mut key = 0u64;
        b.iter(|| {
            key += 1;
            plain.put(black_box(mix(key)), 7, 100);
        })
    });
    group.bench_function("journal_unchanged", |b| {
        let key = mix(42);
        journal.put(key, 7, 100);
        b.iter(|| journal.put(black_box(key), 7, 100))
    });
    group.bench_function("journal_new_key", |b| {
        let mut key = 0u64;
        b.iter(|| {
            key += 1;
            journal.put(black_box(mix(key)), 7, 100);
        })
    });
    group.finish();
    c.bench_function("put_and_read_back_1000_new_keys", |b| {
        let table = AffinityTable::with_journal(DEFAULT_ENTRIES, DEFAULT_TTL_S, 1 << 14);
        let mut out = Vec::with_capacity(1000);
        let mut cursor = 0;
        b.iter(|| {
            let base = cursor * 1000;
            for key in 0..1000u64 {
                table.put(mix(base + key), 7, 100);
            }
            out.clear();
            table.changes_since(&mut cursor, 100, &mut out);
            black_box(out.len())
        })
    });
}

criterion_group!(benches, put);
criterion_main!(benches);

//! Session affinity across weight changes: which engine served an affinity key last.
//!
//! Weighted consistent hashing keeps a key on its engine only while the weights stand still.
//! When a new snapshot moves a slice of the key space, every conversation in that slice moves
//! with it, and its next turn pays the whole prefix's prefill again on an engine that has none
//! of its KV cache. In the fleet simulator's `global-day` scenario, plans that follow the
//! demand every two seconds moved 4.8 % of follow-up turns that way (weight churn of 0.85 % of
//! traffic per period adds up over a conversation's life). That cost 1.4 points of prefix-cache
//! hit rate (67.0 % against 68.4 % with this table) and, through the extra prefill in every
//! batch, 2 % of mean end-to-end latency.
//!
//! So a data plane remembers, per key, the engine that served it: a conversation stays there
//! as long as that engine is still one of its class's candidates with a positive weight and
//! within its load bound. The bound is what keeps the plan honest: an engine whose share fell
//! sheds the remembered keys it can no longer hold, and new keys follow the new weights at once.
//!
//! The table is a fixed array of atomic words, one entry per slot (no locks, no allocation on
//! the request path): 16 bits of the key as a tag, the engine's 32-bit [`affinity_tag`], and
//! the time in seconds (16 bits, wrapping). A slot taken by another key simply forgets the
//! older one, and a wrong match is harmless: it is only a preference, checked like any pick.
//!
//! Several data planes of one cluster share what they decide (`ilb_dataplane`'s `replicas`
//! module): a table built [`AffinityTable::with_journal`] also notes, in a fixed ring of
//! atomic words, the key of every entry that changed (a new key, a key that moved, or one
//! refreshed after a quarter of its lifetime). A background task reads the ring
//! ([`AffinityTable::changes_since`]) and looks each key's current engine up in the table, so
//! the ring holds keys only (one word, never torn) and the last writer wins. Entries learned
//! from another replica go in through [`AffinityTable::learn`], which notes nothing, so that
//! deltas do not echo between replicas.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Entries of a data plane's table by default: 2^18 (2 MiB), room for the conversations of
/// a few thousand requests per second with minutes between turns.
pub const DEFAULT_ENTRIES: usize = 1 << 18;

/// How long an entry is remembered by default, seconds: longer than a user thinks between turns.
pub const DEFAULT_TTL_S: u32 = 600;

/// The tag under which an engine is remembered: stable across snapshots (derived from its id,
/// not from its position in a table).
pub fn affinity_tag(engine_id: &str) -> u32 {
    let tag = crate::stable_hash(engine_id.as_bytes()) as u32;
    // 0 marks an empty slot.
    tag.max(1)
}

/// Remembers the last engine of each affinity key for a while. Shared by all requests.
#[derive(Debug)]
pub struct AffinityTable {
    entries: Box<[AtomicU64]>,
    mask: u64,
    ttl_s: u16,
    journal: Journal,
}

/// The keys of the latest changed entries, newest overwriting oldest (empty: no journal).
#[derive(Debug)]
struct Journal {
    keys: Box<[AtomicU64]>,
    /// Changes noted since the table was made; `head % keys.len()` is the next word written.
    head: AtomicU64,
}

/// One entry as another replica should learn it: the key and the engine tag it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub key_hash: u64,
    pub engine_tag: u32,
}

impl AffinityTable {
    /// A table of `entries` slots (rounded up to a power of two; 0 remembers nothing) whose
    /// entries expire after `ttl_s` seconds (at most 65,535).
    pub fn new(entries: usize, ttl_s: u32) -> AffinityTable {
        let len = if entries == 0 { 0 } else { entries.next_power_of_two() };
        AffinityTable {
            entries: (0..len).map(|_| AtomicU64::new(0)).collect(),
            mask: (len as u64).wrapping_sub(1),
            ttl_s: ttl_s.min(u32::from(u16::MAX)) as u16,
            journal: Journal { keys: Box::new([]), head: AtomicU64::new(0) },
        }
    }

    /// As [`AffinityTable::new`], also noting the keys of the last `journal_len` changes
    /// (rounded up to a power of two) for [`AffinityTable::changes_since`].
    pub fn with_journal(entries: usize, ttl_s: u32, journal_len: usize) -> AffinityTable {
        let mut table = AffinityTable::new(entries, ttl_s);
        let len =
            if journal_len == 0 || table.entries.is_empty() { 0 } else { journal_len.next_power_of_two() };
        table.journal.keys = (0..len).map(|_| AtomicU64::new(0)).collect();
        table
    }

    fn slot(&self, key_hash: u64) -> Option<&AtomicU64> {
        self.entries.get((key_hash & self.mask) as usize)
    }

    fn key_tag(key_hash: u64) -> u64 {
        (key_hash >> 48) | 1
    }

    /// The engine tag remembered for `key_hash`, if fresh at `now_s` (seconds on any clock that
    /// only moves forward). Hot path: one atomic load.
    #[inline]
    pub fn get(&self, key_hash: u64, now_s: u32) -> Option<u32> {
        let entry = self.slot(key_hash)?.load(Relaxed);
        if entry >> 48 != Self::key_tag(key_hash) {
            return None;
        }
        let at = entry as u16;
        let fresh = (now_s as u16).wrapping_sub(at) <= self.ttl_s;
        fresh.then_some((entry >> 16) as u32)
    }

    fn entry(key_hash: u64, engine_tag: u32, now_s: u32) -> u64 {
        (Self::key_tag(key_hash) << 48) | (u64::from(engine_tag) << 16) | u64::from(now_s as u16)
    }

    /// Remembers that `engine_tag` served `key_hash` at `now_s`. Hot path: one atomic store,
    /// or with a journal one swap, and for a changed entry one add and one store more.
    #[inline]
    pub fn put(&self, key_hash: u64, engine_tag: u32, now_s: u32) {
        let Some(slot) = self.slot(key_hash) else { return };
        let entry = Self::entry(key_hash, engine_tag, now_s);
        if self.journal.keys.is_empty() {
            slot.store(entry, Relaxed);
            return;
        }
        let old = slot.swap(entry, Relaxed);
        // The same key on the same engine, refreshed recently: the other replicas know it.
        let same = old >> 16 == entry >> 16;
        let age = (now_s as u16).wrapping_sub(old as u16);
        if !same || age > self.ttl_s / 4 {
            let at = self.journal.head.fetch_add(1, Relaxed);
            let word = at as usize & (self.journal.keys.len() - 1);
            self.journal.keys[word].store(key_hash, Relaxed);
        }
    }

    /// Takes in an entry another replica decided (last writer wins), without noting it in
    /// the journal. Not on the request path.
    pub fn learn(&self, change: Change, now_s: u32) {
        if change.engine_tag == 0 {
            return;
        }
        if let Some(slot) = self.slot(change.key_hash) {
            slot.store(Self::entry(change.key_hash, change.engine_tag, now_s), Relaxed);
        }
    }

    /// The entries changed since `cursor` (a count of changes; start at 0), as they stand now,
    /// appended to `out`; moves `cursor` on. When more than the journal holds changed, the
    /// oldest are lost (bounded memory: another replica then misses them once). A key noted
    /// twice is sent twice; a key whose entry another key took since is skipped.
    pub fn changes_since(&self, cursor: &mut u64, now_s: u32, out: &mut Vec<Change>) {
        let len = self.journal.keys.len() as u64;
        let head = self.journal.head.load(Relaxed);
        let from = (*cursor).max(head.saturating_sub(len));
        for at in from..head {
            let key_hash = self.journal.keys[(at % len.max(1)) as usize].load(Relaxed);
            if let Some(engine_tag) = self.get(key_hash, now_s) {
                out.push(Change { key_hash, engine_tag });
            }
        }
        *cursor = head;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_the_ttl_and_forgets_other_keys() {
        let table = AffinityTable::new(1000, 60);
        assert_eq!(table.entries.len(), 1024);
        let key = 0xdead_beef_1234_5678;
        assert_eq!(table.get(key, 10), None);
        table.put(key, 77, 10);
        assert_eq!(table.get(key, 10), Some(77));
        assert_eq!(table.get(key, 70), Some(77));
        assert_eq!(table.get(key, 71), None, "expired");
        // Same slot, another key: a tag mismatch, not a false memory.
        let other = key ^ (1 << 60);
        assert_eq!(table.get(other, 10), None);
        table.put(other, 5, 11);
        assert_eq!(table.get(key, 11), None, "the slot now belongs to the other key");
        assert_eq!(table.get(other, 11), Some(5));
    }

    #[test]
    fn time_wraps_without_losing_fresh_entries() {
        let table = AffinityTable::new(16, 30);
        table.put(3, 9, 65_530);
        assert_eq!(table.get(3, 65_536 + 10), Some(9), "16 s later across the wrap");
        assert_eq!(table.get(3, 65_536 + 40), None);
    }

    #[test]
    fn a_disabled_table_remembers_nothing() {
        let table = AffinityTable::new(0, 600);
        assert!(table.entries.is_empty());
        table.put(1, 2, 3);
        assert_eq!(table.get(1, 3), None);
    }

    #[test]
    fn the_journal_notes_new_and_moved_keys_not_repeats() {
        let table = AffinityTable::with_journal(1 << 10, 600, 4);
        let mut cursor = 0;
        let mut out = Vec::new();
        table.put(11, 1, 100);
        table.put(11, 1, 101); // a repeat within a quarter of the ttl: not noted
        table.put(22, 2, 101);
        table.put(11, 3, 102); // moved
        table.changes_since(&mut cursor, 102, &mut out);
        let expected = [Change { key_hash: 11, engine_tag: 3 }, Change { key_hash: 22, engine_tag: 2 }];
        assert_eq!(out, [expected[0], expected[1], expected[0]], "as they stand now, in order");
        out.clear();
        table.changes_since(&mut cursor, 102, &mut out);
        assert!(out.is_empty(), "the cursor moved on");
        table.put(11, 3, 102 + 151);
        table.changes_since(&mut cursor, 102 + 151, &mut out);
        assert_eq!(out, [Change { key_hash: 11, engine_tag: 3 }], "refreshed after a quarter of the ttl");
    }

    #[test]
    fn the_journal_keeps_only_its_newest_changes_and_learning_notes_nothing() {
        let table = AffinityTable::with_journal(1 << 10, 600, 4);
        for key in 1..=10u64 {
            table.put(key, key as u32, 5);
        }
        let (mut cursor, mut out) = (0, Vec::new());
        table.changes_since(&mut cursor, 5, &mut out);
        let keys: Vec<u64> = out.iter().map(|c| c.key_hash).collect();
        assert_eq!(keys, [7, 8, 9, 10]);
        out.clear();
        table.learn(Change { key_hash: 99, engine_tag: 4 }, 6);
        table.learn(Change { key_hash: 98, engine_tag: 0 }, 6);
        assert_eq!(table.get(99, 6), Some(4));
        assert_eq!(table.get(98, 6), None, "tag 0 is an empty slot, never learned");
        table.changes_since(&mut cursor, 6, &mut out);
        assert!(out.is_empty(), "learned entries do not echo");
    }

    #[test]
    fn engine_tags_are_stable_and_never_zero() {
        assert_eq!(affinity_tag("us-east/h100-1"), affinity_tag("us-east/h100-1"));
        assert_ne!(affinity_tag("us-east/h100-1"), affinity_tag("us-east/h100-2"));
        assert_ne!(affinity_tag(""), 0);
    }
}

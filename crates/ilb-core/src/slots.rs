//! Weighted consistent hashing with minimal movement: a slot table.
//!
//! The 64-bit key hash space is cut into `2^k` equal slots; each slot belongs to one candidate.
//! A candidate with weight `w` owns `round(w · 2^k)` slots (largest-remainder rounding), so its
//! share of uniformly hashed keys matches its weight to within one slot.
//!
//! **Minimal movement.** A new table is built *from the previous one*: every candidate that
//! lost weight releases only its surplus slots, and only those released slots (plus slots of
//! candidates that left) are handed to candidates that gained. The fraction of keys that move is
//! therefore the total-variation distance between the old and new (quantised) weights, which
//! is the least any scheme can move. A Maglev table rebuilt from scratch moves several times
//! more; weighted rendezvous hashing moves little but costs O(candidates) per pick.
//!
//! **Cost.** A pick is one multiply-shift and one array read: O(1) whatever the candidate count.
//! A rebuild is O(slots + candidates).
//!
//! The table size changes only when the candidate count crosses a power of two; slots nest
//! (the top bits of the hash pick the slot), so the previous layout carries over.

use crate::ids::EngineId;
use std::collections::HashMap;
use std::sync::Arc;

/// Smallest table: fine enough that a 1 % weight is 164 slots (±0.3 % quantisation).
pub const MIN_LOG2_SLOTS: u32 = 14;
/// Largest table: 4 Mi slots, 16 MiB.
pub const MAX_LOG2_SLOTS: u32 = 22;
/// Slots per weighted candidate when that exceeds the minimum.
const SLOTS_PER_CANDIDATE: usize = 64;
const FREE: u32 = u32::MAX;

/// Immutable slot → candidate-index table. Clones share the slots (up to 16 MiB), so a class
/// whose weights did not change keeps its table across snapshots for the price of a count.
#[derive(Clone, Debug)]
pub struct SlotTable {
    slots: Arc<[u32]>,
    log2: u32,
}

impl SlotTable {
    /// Builds the table for `weights` (one per candidate, candidates named by `ids`), moving as
    /// few slots as possible from `previous` (its table and the ids its indices referred to).
    ///
    /// Weights must be finite and non-negative with a positive sum (the snapshot validator
    /// guarantees it); candidates with weight zero own no slots.
    pub fn build(
        weights: &[f64],
        ids: &[EngineId],
        previous: Option<(&SlotTable, &[EngineId])>,
    ) -> SlotTable {
        debug_assert_eq!(weights.len(), ids.len());
        let log2 = log2_slots_for(weights.iter().filter(|w| **w > 0.0).count());
        let n_slots = 1usize << log2;
        let quotas = quotas(weights, n_slots);

        let mut slots = match previous {
            Some((prev, prev_ids)) => carry_over(prev, prev_ids, ids, log2),
            None => vec![FREE; n_slots],
        };

        // Release surplus: scanning in slot order, a candidate keeps its first `quota` slots.
        let mut held = vec![0usize; weights.len()];
        for slot in slots.iter_mut() {
            if *slot == FREE {
                continue;
            }
            let c = *slot as usize;
            if held[c] < quotas[c] {
                held[c] += 1;
            } else {
                *slot = FREE;
            }
        }
        // Hand the free slots to candidates below quota, in candidate order.
        let mut candidate = 0usize;
        for slot in slots.iter_mut() {
            if *slot != FREE {
                continue;
            }
            while candidate < quotas.len() && held[candidate] >= quotas[candidate] {
                candidate += 1;
            }
            // Quotas sum to n_slots, so a free slot always finds a candidate.
            debug_assert!(candidate < quotas.len());
            if candidate < quotas.len() {
                *slot = candidate as u32;
                held[candidate] += 1;
            }
        }
        SlotTable { slots: slots.into(), log2 }
    }

    /// Whether two tables are one (a clone, not merely equal).
    pub fn is_shared_with(&self, other: &SlotTable) -> bool {
        Arc::ptr_eq(&self.slots, &other.slots)
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// The candidate owning the slot of `hash`. Hot path.
    #[inline]
    pub fn owner(&self, hash: u64) -> usize {
        self.slots[(hash >> (64 - self.log2)) as usize] as usize
    }

    /// The `attempt`-th probe of a key: attempt 0 is the key's own slot; later attempts rehash,
    /// so the walk past an unusable candidate visits others in proportion to their weights.
    #[inline]
    pub fn probe(&self, key_hash: u64, attempt: u32) -> usize {
        let h = if attempt == 0 {
            key_hash
        } else {
            mix(key_hash ^ (attempt as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        };
        self.owner(h)
    }

    /// Slots owned by each of `n` candidates.
    pub fn counts(&self, n: usize) -> Vec<usize> {
        let mut counts = vec![0; n];
        for &s in self.slots.iter() {
            counts[s as usize] += 1;
        }
        counts
    }

    /// Fraction of slots whose owner (by engine id) differs between two tables.
    pub fn moved_fraction(old: (&SlotTable, &[EngineId]), new: (&SlotTable, &[EngineId])) -> f64 {
        let (a, a_ids) = old;
        let (b, b_ids) = new;
        let n = a.n_slots().max(b.n_slots());
        let moved = (0..n)
            .filter(|&i| {
                let ai = i >> (a.log2.max(b.log2) - a.log2);
                let bi = i >> (a.log2.max(b.log2) - b.log2);
                a_ids[a.slots[ai] as usize] != b_ids[b.slots[bi] as usize]
            })
            .count();
        moved as f64 / n as f64
    }
}

/// log2 of the table size for `n_weighted` candidates with positive weight.
pub fn log2_slots_for(n_weighted: usize) -> u32 {
    (n_weighted.max(1) * SLOTS_PER_CANDIDATE)
        .next_power_of_two()
        .trailing_zeros()
        .clamp(MIN_LOG2_SLOTS, MAX_LOG2_SLOTS)
}

/// SplitMix64 finaliser: a cheap bijective mixer.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Largest-remainder apportionment of `n_slots` by weight; ties go to the lower index.
fn quotas(weights: &[f64], n_slots: usize) -> Vec<usize> {
    let total: f64 = weights.iter().sum();
    if weights.is_empty() || total <= 0.0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<f64> = weights.iter().map(|w| w / total * n_slots as f64).collect();
    let mut quotas: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let assigned: usize = quotas.iter().sum();
    let mut order: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0.0).collect();
    order.sort_by(|&a, &b| {
        let fa = exact[a] - exact[a].floor();
        let fb = exact[b] - exact[b].floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(n_slots.saturating_sub(assigned)) {
        quotas[i] += 1;
    }
    quotas
}

/// Maps the previous table onto the new candidate indices and the new size.
fn carry_over(prev: &SlotTable, prev_ids: &[EngineId], ids: &[EngineId], log2: u32) -> Vec<u32> {
    let index: HashMap<&EngineId, u32> = ids.iter().enumerate().map(|(i, id)| (id, i as u32)).collect();
    let remap: Vec<u32> = prev_ids.iter().map(|id| index.get(id).copied().unwrap_or(FREE)).collect();
    let n_slots = 1usize << log2;
    (0..n_slots)
        .map(|i| {
            let prev_slot = if log2 >= prev.log2 { i >> (log2 - prev.log2) } else { i << (prev.log2 - log2) };
            remap[prev.slots[prev_slot] as usize]
        })
        .collect()
}

#[cfg(test)]
mod tests;

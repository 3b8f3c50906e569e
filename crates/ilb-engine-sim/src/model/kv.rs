//! KV-block accounting and the prefix cache of one replica.
//!
//! Blocks are counted, not named: a block is either *free* (holds nothing), *private* to one
//! sequence (counted by that sequence), or *cached* (holds a full prompt block identified by
//! its chained hash, possibly shared by several sequences). Cached blocks that no sequence
//! references stay in an LRU list and are evicted oldest first when an allocation finds no
//! free block. Allocation order (free first, then LRU oldest) depends only on the number of
//! blocks asked for, which is what lets the model jump over many decode iterations at once
//! and land in exactly the state iteration-by-iteration stepping reaches.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Tokens per KV block (vLLM's default block size).
pub const BLOCK_TOKENS: u32 = 16;

/// Blocks needed to hold `tokens` tokens.
#[inline]
pub fn blocks_for(tokens: u32) -> u32 {
    tokens.div_ceil(BLOCK_TOKENS)
}

/// Chained hashes of the full blocks of `prompt`: block `i`'s hash covers blocks `0..=i`, so
/// equal hashes mean equal prefixes.
pub fn block_hashes(prompt: &[u32]) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(prompt.len() / BLOCK_TOKENS as usize);
    let mut previous = 0x9e37_79b9_7f4a_7c15_u64;
    let mut bytes = [0u8; BLOCK_TOKENS as usize * 4];
    for block in prompt.chunks_exact(BLOCK_TOKENS as usize) {
        for (slot, token) in bytes.chunks_exact_mut(4).zip(block) {
            slot.copy_from_slice(&token.to_le_bytes());
        }
        previous = xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, previous);
        hashes.push(previous);
    }
    hashes
}

/// Keys are already xxh3 hashes: hashing them again would only cost time.
#[derive(Default)]
pub(crate) struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

pub(crate) type IdentityMap<V> = HashMap<u64, V, BuildHasherDefault<IdentityHasher>>;

#[derive(Clone, Copy, Debug)]
struct CachedBlock {
    refs: u32,
    /// Position in `lru` while `refs == 0`.
    lru_tick: u64,
}

/// Result of looking a prompt's block hashes up in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PrefixMatch {
    /// Leading blocks found in the cache.
    pub blocks: u32,
    /// How many of those are unreferenced (in the LRU list, so counted in `pool()`).
    pub in_lru: u32,
}

#[derive(Debug)]
pub(crate) struct KvCache {
    total: u32,
    free: u32,
    cached: IdentityMap<CachedBlock>,
    lru: BTreeMap<u64, u64>,
    next_tick: u64,
}

impl KvCache {
    pub fn new(total: u32) -> Self {
        Self { total, free: total, cached: IdentityMap::default(), lru: BTreeMap::new(), next_tick: 0 }
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    /// Blocks an allocation can obtain: free ones plus evictable cached ones.
    pub fn pool(&self) -> u32 {
        self.free + self.lru.len() as u32
    }

    /// Blocks referenced by sequences (private or cached), i.e. what vLLM reports as used.
    pub fn used(&self) -> u32 {
        self.total - self.pool()
    }

    /// Cached blocks, referenced or not.
    pub fn cached_blocks(&self) -> usize {
        self.cached.len()
    }

    pub fn match_prefix(&self, hashes: &[u64]) -> PrefixMatch {
        let mut found = PrefixMatch { blocks: 0, in_lru: 0 };
        for hash in hashes {
            match self.cached.get(hash) {
                Some(block) => {
                    found.blocks += 1;
                    found.in_lru += u32::from(block.refs == 0);
                }
                None => break,
            }
        }
        found
    }

    /// References the first `count` blocks of `hashes` (all present, see `match_prefix`) and
    /// appends them to `held`.
    pub fn acquire_prefix(&mut self, hashes: &[u64], count: u32, held: &mut Vec<u64>) {
        for hash in &hashes[..count as usize] {
            if let Some(block) = self.cached.get_mut(hash) {
                if block.refs == 0 {
                    self.lru.remove(&block.lru_tick);
                }
                block.refs += 1;
                held.push(*hash);
            } else {
                debug_assert!(false, "acquire_prefix on a block not in the cache");
            }
        }
    }

    /// Takes `count` blocks from the pool as private blocks: free blocks first, then evicting
    /// the least recently used cached blocks. Returns false (taking nothing) if the pool is
    /// too small.
    pub fn alloc(&mut self, count: u32) -> bool {
        if count > self.pool() {
            return false;
        }
        let from_free = count.min(self.free);
        self.free -= from_free;
        for _ in from_free..count {
            if let Some((_, hash)) = self.lru.pop_first() {
                self.cached.remove(&hash);
            }
        }
        true
    }

    /// Turns one private block of the caller into the cached block for `hash`, referenced once
    /// by the caller. Returns false if `hash` is already cached (the caller keeps its block).
    pub fn register(&mut self, hash: u64) -> bool {
        if self.cached.contains_key(&hash) {
            return false;
        }
        self.cached.insert(hash, CachedBlock { refs: 1, lru_tick: 0 });
        true
    }

    /// Returns a sequence's blocks: private ones become free, cached ones lose a reference.
    /// Unreferenced cached blocks enter the LRU list tail-block first, so a prompt's last
    /// blocks are evicted before its first ones (the head is what follow-ups share).
    pub fn release(&mut self, held: &[u64], private: u32) {
        self.free += private;
        for hash in held.iter().rev() {
            if let Some(block) = self.cached.get_mut(hash) {
                block.refs -= 1;
                if block.refs == 0 {
                    block.lru_tick = self.next_tick;
                    self.lru.insert(self.next_tick, *hash);
                    self.next_tick += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_hashes_share_prefixes_only() {
        let a: Vec<u32> = (0..48).collect();
        let mut b = a.clone();
        b[20] = 999;
        let (ha, hb) = (block_hashes(&a), block_hashes(&b));
        assert_eq!(ha.len(), 3);
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        assert_ne!(ha[2], hb[2], "a change in block 1 changes every later hash");
        assert_eq!(block_hashes(&a[..47]).len(), 2, "partial blocks are not hashed");
    }

    #[test]
    fn lru_evicts_oldest_unreferenced_and_spares_referenced() {
        let mut kv = KvCache::new(4);
        assert!(kv.alloc(4));
        for hash in [1, 2, 3] {
            assert!(kv.register(hash));
        }
        // One sequence held 1,2 (released first), another holds 3.
        kv.release(&[1, 2], 1);
        assert_eq!(kv.pool(), 3);
        assert_eq!(kv.match_prefix(&[1, 2, 3]), PrefixMatch { blocks: 3, in_lru: 2 });
        // Free block first, then block 2 (released tail-first, so older than 1).
        assert!(kv.alloc(2));
        assert_eq!(kv.match_prefix(&[1]), PrefixMatch { blocks: 1, in_lru: 1 });
        assert_eq!(kv.match_prefix(&[2]).blocks, 0);
        assert_eq!(kv.match_prefix(&[3]), PrefixMatch { blocks: 1, in_lru: 0 });
        assert!(!kv.alloc(2), "only block 1 is evictable");
        assert_eq!(kv.used(), 3);
    }
}

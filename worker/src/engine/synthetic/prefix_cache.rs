//! Prefix-cache accounting (`cached_prompt_tokens`).
//!
//! Like a paged KV cache, a prompt is cut into blocks of [`BLOCK_TOKENS`]
//! tokens. Block `i` is identified by a hash chained over the whole prefix up
//! to its end, so a hit on block `i` implies the prefix matched exactly. The
//! cache remembers the most recently used block hashes (LRU, bounded); a
//! prompt's cached tokens are the length of its longest remembered
//! block-aligned prefix. A whole prompt seen before (its own hash, over
//! every token) reports all but its last token, as llama.cpp does: the
//! last is decoded again for its logits.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// Tokens per cache block.
pub const BLOCK_TOKENS: usize = 64;

/// A bounded LRU of prefix-block hashes.
#[derive(Debug)]
pub struct PrefixCache {
    inner: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    capacity: usize,
    tick: u64,
    /// block hash -> last use tick
    last_use: HashMap<u64, u64>,
    /// last use tick -> block hash (oldest first)
    by_age: BTreeMap<u64, u64>,
}

impl Lru {
    fn touch(&mut self, hash: u64) {
        self.tick += 1;
        if let Some(old) = self.last_use.insert(hash, self.tick) {
            self.by_age.remove(&old);
        }
        self.by_age.insert(self.tick, hash);
        while self.last_use.len() > self.capacity {
            match self.by_age.pop_first() {
                Some((_, evicted)) => {
                    self.last_use.remove(&evicted);
                }
                None => break,
            }
        }
    }
}

impl PrefixCache {
    /// A cache remembering at most `capacity_blocks` blocks.
    pub fn new(capacity_blocks: usize) -> Self {
        Self {
            inner: Mutex::new(Lru {
                capacity: capacity_blocks.max(1),
                ..Lru::default()
            }),
        }
    }

    /// Returns how many leading tokens of `tokens` were cached, then
    /// remembers all of its full blocks (the prompt is now "in cache").
    pub fn lookup_and_insert(&self, tokens: &[u32]) -> u32 {
        let (blocks, whole) = prompt_hashes(tokens);
        let Ok(mut lru) = self.inner.lock() else {
            return 0;
        };
        let hits = blocks
            .iter()
            .take_while(|h| lru.last_use.contains_key(h))
            .count();
        let repeated = !tokens.is_empty() && lru.last_use.contains_key(&whole);
        for h in blocks.iter().chain([&whole]) {
            lru.touch(*h);
        }
        let cached = if repeated {
            tokens.len() - 1
        } else {
            hits * BLOCK_TOKENS
        };
        u32::try_from(cached).unwrap_or(u32::MAX)
    }

    /// Number of remembered blocks.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|l| l.last_use.len()).unwrap_or(0)
    }

    /// Share of the capacity in use, 0..=1.
    pub fn usage(&self) -> f64 {
        self.inner
            .lock()
            .map(|l| l.last_use.len() as f64 / l.capacity.max(1) as f64)
            .unwrap_or(0.0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Chained hashes of every full block of `tokens`, and the hash of the
/// whole prompt (kept apart from any block's).
fn prompt_hashes(tokens: &[u32]) -> (Vec<u64>, u64) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut blocks = Vec::with_capacity(tokens.len() / BLOCK_TOKENS);
    for (i, t) in tokens.iter().enumerate() {
        h ^= u64::from(*t);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
        if (i + 1) % BLOCK_TOKENS == 0 {
            blocks.push(h);
        }
    }
    let whole = (h ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xff51_afd7_ed55_8ccd);
    (blocks, whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(start: u32, n: usize) -> Vec<u32> {
        (start..start + n as u32).collect()
    }

    #[test]
    fn a_repeated_prefix_is_reported_block_aligned() {
        let cache = PrefixCache::new(1024);
        let first = seq(0, 200);
        assert_eq!(cache.lookup_and_insert(&first), 0);
        // Same first 150 tokens, different tail: two full blocks match.
        let mut second = seq(0, 150);
        second.extend(seq(10_000, 100));
        assert_eq!(cache.lookup_and_insert(&second), 128);
        // The identical prompt again: all but its last token.
        assert_eq!(cache.lookup_and_insert(&first), 199);
        // A different first token shares nothing.
        let other = seq(1, 200);
        assert_eq!(cache.lookup_and_insert(&other), 0);
    }

    #[test]
    fn a_short_prompt_hits_only_when_repeated_whole_and_the_lru_is_bounded() {
        let cache = PrefixCache::new(4);
        assert_eq!(cache.lookup_and_insert(&seq(0, 63)), 0);
        assert_eq!(cache.lookup_and_insert(&seq(0, 63)), 62);
        assert_eq!(cache.lookup_and_insert(&seq(0, 62)), 0, "no full block");
        cache.lookup_and_insert(&seq(0, 64 * 3));
        cache.lookup_and_insert(&seq(5000, 64 * 3));
        assert_eq!(cache.len(), 4);
        // The oldest blocks of the first prompt were evicted.
        assert_eq!(cache.lookup_and_insert(&seq(0, 64 * 3)), 0);
    }
}

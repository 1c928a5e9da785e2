//! What this worker's engine holds in its prefix cache, reported to the
//! gateway in `Info.prefix_cache` for cache-aware routing (the block hashes
//! of [`inference_proto::prefix`]).
//!
//! - `exact`: an engine with fixed slots (in-process llama, an upstream
//!   llama-server whose slots the worker pins) says which slot each
//!   sequence took, and a slot holds the prompt of the last sequence in
//!   it, so the report is the prompts of the slots.
//! - `estimated`: an engine that says nothing of its cache (other upstream
//!   servers, the simulator): the last `capacity` prompts this worker sent
//!   it, each forgotten after the TTL. A prompt that extends a remembered
//!   one (a conversation's next turn) replaces it, as the engine's slot
//!   would.
//!
//! The epoch changes whenever the engine's cache starts empty again (a new
//! worker process, an upstream engine that went away and came back), so
//! the gateway drops what it knew within one report.

use inference_proto::v1 as pb;
use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Prompts an estimated report remembers for an upstream engine server:
/// its slots keep a prompt until another takes the slot, but a server
/// shared with other clients (or under memory pressure) evicts sooner.
pub const UPSTREAM_TTL: Duration = Duration::from_secs(300);

/// Block hashes reported at most (32 KiB per report).
const MAX_REPORTED_BLOCKS: usize = 4096;

/// How the report knows what the engine holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The engine's own slots.
    Exact,
    /// What this worker sent recently, forgotten after `ttl` (`None`: kept
    /// until pushed out).
    Estimated { ttl: Option<Duration> },
}

/// One cached prompt.
struct Entry {
    blocks: Arc<[u64]>,
    /// The engine's slot, in exact mode.
    slot: Option<u32>,
    at: Instant,
}

/// The worker's view of its engine's prefix cache.
pub struct CacheReport {
    source: Source,
    /// A held prefix serves concurrent sequences too (`PrefixCache`).
    concurrent_reuse: bool,
    /// Prompts held at most: the engine's slots.
    capacity: usize,
    epoch: AtomicU64,
    /// Oldest first.
    entries: Mutex<VecDeque<Entry>>,
}

fn new_epoch() -> u64 {
    // A per-process random key: unique across restarts without a clock.
    RandomState::new().hash_one(std::process::id())
}

impl CacheReport {
    pub fn new(source: Source, capacity: u32, concurrent_reuse: bool) -> Self {
        Self {
            source,
            concurrent_reuse,
            capacity: capacity.max(1) as usize,
            epoch: AtomicU64::new(new_epoch()),
            entries: Mutex::new(VecDeque::new()),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        // A panic elsewhere cannot leave the queue inconsistent.
        match self.entries.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Whether the engine places prompts in known slots (then [`placed`]
    /// records them; otherwise [`sent`]).
    ///
    /// [`placed`]: CacheReport::placed
    /// [`sent`]: CacheReport::sent
    pub fn is_exact(&self) -> bool {
        self.source == Source::Exact
    }

    /// A prompt went to an engine that does not say where it keeps it.
    pub fn sent(&self, blocks: Arc<[u64]>) {
        if blocks.is_empty() {
            return;
        }
        let mut entries = self.entries();
        // The same conversation, grown by a turn: the engine reuses (and
        // overwrites) the slot holding its previous turn.
        entries.retain(|e| !blocks.starts_with(&e.blocks));
        entries.push_back(Entry {
            blocks,
            slot: None,
            at: Instant::now(),
        });
        while entries.len() > self.capacity {
            entries.pop_front();
        }
    }

    /// The engine placed a prompt in `slot`, replacing what it held.
    pub fn placed(&self, blocks: Arc<[u64]>, slot: u32) {
        let mut entries = self.entries();
        entries.retain(|e| e.slot != Some(slot));
        entries.push_back(Entry {
            blocks,
            slot: Some(slot),
            at: Instant::now(),
        });
        while entries.len() > self.capacity {
            entries.pop_front();
        }
    }

    /// The engine's cache is empty again (it restarted).
    pub fn reset(&self) {
        self.entries().clear();
        self.epoch.store(new_epoch(), Ordering::Relaxed);
    }

    /// The report for `Info`, newest prompts first when it must be cut.
    pub fn snapshot(&self) -> pb::PrefixCache {
        let mut entries = self.entries();
        if let Source::Estimated { ttl: Some(ttl) } = self.source {
            entries.retain(|e| e.at.elapsed() < ttl);
        }
        let mut seen = HashSet::new();
        let mut blocks = Vec::new();
        'entries: for e in entries.iter().rev() {
            for &h in e.blocks.iter() {
                if blocks.len() >= MAX_REPORTED_BLOCKS {
                    break 'entries;
                }
                if seen.insert(h) {
                    blocks.push(h);
                }
            }
        }
        pb::PrefixCache {
            epoch: self.epoch.load(Ordering::Relaxed),
            block_bytes: inference_proto::prefix::BLOCK_BYTES as u32,
            blocks,
            capacity: self.capacity as u32,
            used: entries.len() as u32,
            source: match self.source {
                Source::Exact => "exact",
                Source::Estimated { .. } => "estimated",
            }
            .to_owned(),
            concurrent_reuse: self.concurrent_reuse,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(v: &[u64]) -> Arc<[u64]> {
        v.to_vec().into()
    }

    #[test]
    fn a_slot_holds_the_last_prompt_placed_in_it() {
        let report = CacheReport::new(Source::Exact, 2, true);
        report.placed(blocks(&[1, 2, 3]), 0);
        report.placed(blocks(&[7, 8]), 1);
        report.placed(blocks(&[1, 2, 4]), 0);
        let mut held = report.snapshot().blocks;
        held.sort_unstable();
        assert_eq!(held, vec![1, 2, 4, 7, 8]);
        assert_eq!(report.snapshot().used, 2);
        assert_eq!(report.snapshot().source, "exact");
    }

    #[test]
    fn estimated_keeps_the_last_prompts_and_a_grown_conversation_once() {
        let report = CacheReport::new(Source::Estimated { ttl: None }, 2, true);
        report.sent(blocks(&[1, 2]));
        report.sent(blocks(&[5]));
        report.sent(blocks(&[1, 2, 3])); // the first conversation's next turn
        let snap = report.snapshot();
        assert_eq!(snap.used, 2);
        let mut held = snap.blocks;
        held.sort_unstable();
        assert_eq!(held, vec![1, 2, 3, 5]);
        report.sent(blocks(&[9]));
        report.sent(blocks(&[10]));
        let mut held = report.snapshot().blocks;
        held.sort_unstable();
        assert_eq!(held, vec![9, 10]);
    }

    #[test]
    fn estimated_prompts_expire_and_a_reset_changes_the_epoch() {
        let report = CacheReport::new(
            Source::Estimated {
                ttl: Some(Duration::from_millis(20)),
            },
            4,
            false,
        );
        report.sent(blocks(&[1]));
        assert_eq!(report.snapshot().blocks, vec![1]);
        std::thread::sleep(Duration::from_millis(30));
        assert!(report.snapshot().blocks.is_empty());
        let before = report.snapshot().epoch;
        report.sent(blocks(&[2]));
        report.reset();
        let after = report.snapshot();
        assert_ne!(after.epoch, before);
        assert!(after.blocks.is_empty());
    }
}

//! What one worker's engine holds in its prefix cache, as this gateway
//! knows it: the worker's last report (`Info.prefix_cache`, refreshed every
//! check interval, shared by every gateway replica since it comes from the
//! worker) plus the prompts this gateway sent it since, which the report
//! may not show yet. On an engine whose cached prefix serves one sequence
//! at a time (llama-server's slots), a prefix this gateway's running
//! requests hold is not reusable until they end.

use inference_proto::prefix::BLOCK_BYTES;
use inference_proto::v1 as pb;
use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// How long a prompt this gateway sent counts as held without the
/// worker's report confirming it: a few report intervals.
const SENT_TTL: Duration = Duration::from_secs(3);

/// Prompts remembered as sent when the worker reports no capacity.
const MAX_SENT: usize = 64;

#[derive(Default)]
pub struct CachedPrefixes {
    inner: RwLock<Held>,
}

struct Held {
    /// The engine's cache the report describes; a new one (a restart)
    /// forgets everything known of the old.
    epoch: Option<u64>,
    reported: HashSet<u64>,
    /// Prompts sent since, oldest first.
    sent: VecDeque<(Instant, Arc<[u64]>)>,
    /// Prompts the engine holds at most (0: not reported).
    capacity: usize,
    /// A held prefix serves concurrent sequences (as last reported).
    concurrent_reuse: bool,
    /// Prompts of this gateway's requests running on the worker, by id,
    /// with when they started.
    running: Vec<(u64, Arc<[u64]>, Instant)>,
    next_running: u64,
}

impl Default for Held {
    fn default() -> Self {
        Self {
            epoch: None,
            reported: HashSet::new(),
            sent: VecDeque::new(),
            capacity: 0,
            concurrent_reuse: true,
            running: Vec::new(),
            next_running: 0,
        }
    }
}

impl Held {
    /// The longest prefix of `blocks` reported or recently sent.
    fn held_blocks(&self, blocks: &[u64]) -> usize {
        let reported =
            inference_proto::prefix::matched_blocks(blocks, |h| self.reported.contains(&h));
        let sent = self
            .sent
            .iter()
            .filter(|(at, _)| at.elapsed() < SENT_TTL)
            .map(|(_, s)| shared_blocks(s, blocks))
            .max()
            .unwrap_or(0);
        reported.max(sent)
    }
}

fn shared_blocks(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl CachedPrefixes {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Held> {
        match self.inner.read() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Held> {
        match self.inner.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The worker's report replaces the last one. A report in another
    /// block size (a worker of another version) says nothing usable.
    pub fn record_report(&self, report: &pb::PrefixCache) {
        let usable = report.block_bytes as usize == BLOCK_BYTES;
        let mut held = self.write();
        if held.epoch != Some(report.epoch) {
            if held.epoch.is_some() {
                tracing::info!(epoch = report.epoch, "worker prefix cache restarted empty");
            }
            held.sent.clear();
            held.epoch = Some(report.epoch);
        }
        held.reported = if usable {
            report.blocks.iter().copied().collect()
        } else {
            HashSet::new()
        };
        held.capacity = report.capacity as usize;
        held.concurrent_reuse = report.concurrent_reuse;
        held.sent.retain(|(at, _)| at.elapsed() < SENT_TTL);
    }

    /// A request with this prompt starts running on the worker; the id
    /// ends it ([`CachedPrefixes::end_running`]).
    pub fn start_running(&self, blocks: Arc<[u64]>) -> Option<u64> {
        if blocks.is_empty() {
            return None;
        }
        let mut held = self.write();
        let id = held.next_running;
        held.next_running += 1;
        held.running.push((id, blocks, Instant::now()));
        Some(id)
    }

    pub fn end_running(&self, id: u64) {
        self.write().running.retain(|(i, _, _)| *i != id);
    }

    /// This gateway just sent a prompt to the worker.
    pub fn record_sent(&self, blocks: Arc<[u64]>) {
        if blocks.is_empty() {
            return;
        }
        let mut held = self.write();
        held.sent.retain(|(at, _)| at.elapsed() < SENT_TTL);
        held.sent.push_back((Instant::now(), blocks));
        let cap = if held.capacity == 0 {
            MAX_SENT
        } else {
            held.capacity
        };
        while held.sent.len() > cap {
            held.sent.pop_front();
        }
    }

    /// Leading blocks of `blocks` the engine holds and could reuse for
    /// this prompt now: on an engine with one sequence per cached prefix,
    /// not a prefix a running request holds.
    pub fn matched(&self, blocks: &[u64]) -> usize {
        let held = self.read();
        let matched = held.held_blocks(blocks);
        // One sequence per cached prefix: a running request holding it
        // keeps it from this one.
        let busy = !held.concurrent_reuse
            && matched > 0
            && held
                .running
                .iter()
                .any(|(_, r, _)| shared_blocks(r, blocks) >= matched);
        if busy {
            0
        } else {
            matched
        }
    }

    /// Leading blocks of `blocks` the engine holds, running requests'
    /// included: what a request waiting for the slot that holds them
    /// would reuse.
    pub fn matched_once_free(&self, blocks: &[u64]) -> usize {
        self.read().held_blocks(blocks)
    }

    /// On an engine with one sequence per cached prefix, the running
    /// request of this gateway whose prompt shares the most leading blocks
    /// with `blocks`: how many, and how long it has run. A request sent
    /// now for that slot waits for it, then reuses them.
    pub fn running_holder(&self, blocks: &[u64]) -> Option<(usize, Duration)> {
        let held = self.read();
        if held.concurrent_reuse {
            return None;
        }
        held.running
            .iter()
            .map(|(_, r, at)| (shared_blocks(r, blocks), at.elapsed()))
            .filter(|&(m, _)| m > 0)
            .max_by_key(|&(m, age)| (m, std::cmp::Reverse(age)))
    }

    /// How long each of this gateway's requests with a prompt of at
    /// least one block has been running on the worker.
    pub fn running_ages(&self) -> Vec<Duration> {
        let held = self.read();
        held.running.iter().map(|(_, _, at)| at.elapsed()).collect()
    }

    /// Block hashes the worker last reported.
    pub fn reported_blocks(&self) -> usize {
        self.read().reported.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(epoch: u64, blocks: &[u64]) -> pb::PrefixCache {
        pb::PrefixCache {
            epoch,
            block_bytes: BLOCK_BYTES as u32,
            blocks: blocks.to_vec(),
            capacity: 2,
            used: 1,
            source: "exact".into(),
            concurrent_reuse: true,
        }
    }

    #[test]
    fn a_prefix_held_by_a_running_request_is_busy_only_without_sharing() {
        let p = CachedPrefixes::default();
        p.record_report(&report(1, &[10, 11, 12]));
        let id = p.start_running(vec![10, 11, 12, 13].into()).unwrap();
        assert_eq!(p.matched(&[10, 11, 12]), 3, "a paged cache shares it");
        let mut slots = report(1, &[10, 11, 12]);
        slots.concurrent_reuse = false;
        p.record_report(&slots);
        assert_eq!(p.matched(&[10, 11, 12]), 0, "one sequence per slot: busy");
        assert_eq!(p.matched_once_free(&[10, 11, 12]), 3, "held once it ends");
        assert_eq!(p.running_holder(&[10, 11, 12, 14]).map(|h| h.0), Some(3));
        assert_eq!(p.running_holder(&[20]), None);
        assert_eq!(p.matched(&[20]), 0);
        p.end_running(id);
        assert_eq!(p.matched(&[10, 11, 12]), 3, "free again");
    }

    #[test]
    fn the_longest_reported_or_sent_prefix_counts() {
        let p = CachedPrefixes::default();
        p.record_report(&report(1, &[10, 11, 12]));
        assert_eq!(p.matched(&[10, 11, 99]), 2);
        assert_eq!(p.matched(&[99, 10]), 0);
        p.record_sent(vec![20, 21, 22, 23].into());
        assert_eq!(p.matched(&[20, 21, 22, 5]), 3);
    }

    #[test]
    fn a_new_epoch_forgets_the_old_cache_and_what_was_sent() {
        let p = CachedPrefixes::default();
        p.record_report(&report(1, &[10, 11]));
        p.record_sent(vec![20, 21].into());
        p.record_report(&report(2, &[]));
        assert_eq!(p.matched(&[10, 11]), 0);
        assert_eq!(p.matched(&[20, 21]), 0);
        assert_eq!(p.reported_blocks(), 0);
    }

    #[test]
    fn sent_prompts_are_bounded_by_the_reported_capacity() {
        let p = CachedPrefixes::default();
        p.record_report(&report(1, &[]));
        for i in 0..4u64 {
            p.record_sent(vec![i * 10, i * 10 + 1].into());
        }
        assert_eq!(p.matched(&[0, 1]), 0, "pushed out by later prompts");
        assert_eq!(p.matched(&[30, 31]), 2);
    }

    #[test]
    fn a_report_in_another_block_size_is_ignored() {
        let p = CachedPrefixes::default();
        let mut r = report(1, &[10]);
        r.block_bytes = 64;
        p.record_report(&r);
        assert_eq!(p.matched(&[10]), 0);
    }
}

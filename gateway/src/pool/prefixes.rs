//! What one worker's engine holds in its prefix cache, as this gateway
//! knows it: the worker's last report (`Info.prefix_cache`, refreshed every
//! check interval, shared by every gateway replica since it comes from the
//! worker) plus the prompts this gateway sent it since, which the report
//! may not show yet.

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

#[derive(Default)]
struct Held {
    /// The engine's cache the report describes; a new one (a restart)
    /// forgets everything known of the old.
    epoch: Option<u64>,
    reported: HashSet<u64>,
    /// Prompts sent since, oldest first.
    sent: VecDeque<(Instant, Arc<[u64]>)>,
    /// Prompts the engine holds at most (0: not reported).
    capacity: usize,
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
        held.sent.retain(|(at, _)| at.elapsed() < SENT_TTL);
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

    /// Leading blocks of `blocks` the engine holds: the prefix it would
    /// reuse for this prompt.
    pub fn matched(&self, blocks: &[u64]) -> usize {
        let held = self.read();
        let reported =
            inference_proto::prefix::matched_blocks(blocks, |h| held.reported.contains(&h));
        let sent = held
            .sent
            .iter()
            .filter(|(at, _)| at.elapsed() < SENT_TTL)
            .map(|(_, s)| s.iter().zip(blocks).take_while(|(a, b)| a == b).count())
            .max()
            .unwrap_or(0);
        reported.max(sent)
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
        }
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

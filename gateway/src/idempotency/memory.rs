//! Idempotency records in this process (the embedded mode): one
//! mutex-guarded map, each record with its deadline; the same semantics
//! as the Redis records, and a bound on their bytes
//! (`store.idempotency_max_memory_bytes`): past it the least recently used
//! finished records go first (a retry of an evicted key runs again).
//! Claims are never evicted: they are few (one per request running) and
//! small, and dropping one would run a request twice at once.

use super::{IdempotencyResult, IdempotencyStore, Record};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub struct MemoryIdempotency {
    state: Mutex<State>,
    /// The most bytes of records kept ([`super::record_bytes`]).
    max_bytes: usize,
}

struct Entry {
    record: Record,
    until: Instant,
    bytes: usize,
    /// Its place in [`State::finished`] (a finished record's last use).
    used: Option<u64>,
}

#[derive(Default)]
struct State {
    records: HashMap<String, Entry>,
    /// Finished records by last use, oldest first: the eviction order.
    finished: BTreeMap<u64, String>,
    /// The next use's number.
    clock: u64,
    /// [`super::record_bytes`] of every record held.
    bytes: usize,
    /// When lapsed records were last dropped.
    purged: Option<Instant>,
}

/// How often a claim drops lapsed records (a key nobody sends again would
/// otherwise stay for ever).
const PURGE_EVERY: Duration = Duration::from_secs(1);

impl MemoryIdempotency {
    /// Keeps at most `max_bytes` of records (claims aside).
    pub fn new(max_bytes: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bytes of the records held.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

impl State {
    fn remove(&mut self, key: &str) -> Option<Entry> {
        let entry = self.records.remove(key)?;
        self.bytes -= entry.bytes;
        if let Some(used) = entry.used {
            self.finished.remove(&used);
        }
        Some(entry)
    }

    fn insert(&mut self, key: &str, record: Record, until: Instant) {
        self.remove(key);
        let bytes = super::record_bytes(key, &record);
        let used = record.outcome.is_some().then(|| {
            self.clock += 1;
            self.finished.insert(self.clock, key.to_owned());
            self.clock
        });
        self.bytes += bytes;
        self.records.insert(
            key.to_owned(),
            Entry {
                record,
                until,
                bytes,
                used,
            },
        );
    }

    /// The live record of `key`, dropping it when its time ran out; a
    /// finished one counts as used now.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        if self.records.get(key).is_some_and(|e| e.until <= now) {
            self.remove(key);
        }
        let clock = self.clock + 1;
        let entry = self.records.get_mut(key)?;
        if let Some(used) = entry.used.as_mut() {
            let finished = self.finished.remove(&*used).unwrap_or_default();
            *used = clock;
            self.finished.insert(clock, finished);
            self.clock = clock;
        }
        Some(entry)
    }

    fn purge(&mut self, now: Instant) {
        if self.purged.is_some_and(|at| now < at + PURGE_EVERY) {
            return;
        }
        self.purged = Some(now);
        let lapsed: Vec<String> = self
            .records
            .iter()
            .filter(|(_, e)| e.until <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in lapsed {
            self.remove(&key);
        }
    }

    /// Drops the least recently used finished records while over `max`.
    fn evict(&mut self, max: usize) {
        while self.bytes > max {
            let Some((_, key)) = self.finished.pop_first() else {
                return;
            };
            if let Some(entry) = self.records.remove(&key) {
                self.bytes -= entry.bytes;
            }
        }
    }
}

#[async_trait::async_trait]
impl IdempotencyStore for MemoryIdempotency {
    async fn claim(
        &self,
        key: &str,
        record: &Record,
        lease: Duration,
    ) -> IdempotencyResult<Option<Record>> {
        let now = Instant::now();
        let mut state = self.lock();
        state.purge(now);
        if let Some(found) = state.live(key, now) {
            return Ok(Some(found.record.clone()));
        }
        state.insert(key, record.clone(), now + lease);
        Ok(None)
    }

    async fn renew(&self, key: &str, token: &str, lease: Duration) -> IdempotencyResult<bool> {
        let now = Instant::now();
        let mut state = self.lock();
        match state.live(key, now) {
            Some(e) if e.record.token == token && e.record.outcome.is_none() => {
                e.until = now + lease;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn complete(
        &self,
        key: &str,
        record: &Record,
        keep: Duration,
    ) -> IdempotencyResult<bool> {
        let now = Instant::now();
        let mut state = self.lock();
        let claimant = state
            .live(key, now)
            .is_some_and(|e| e.record.token == record.token);
        if claimant {
            state.insert(key, record.clone(), now + keep);
            state.evict(self.max_bytes);
        }
        Ok(claimant)
    }

    async fn release(&self, key: &str, token: &str) -> IdempotencyResult<()> {
        let now = Instant::now();
        let mut state = self.lock();
        if state
            .live(key, now)
            .is_some_and(|e| e.record.token == token && e.record.outcome.is_none())
        {
            state.remove(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{record_key, Outcome};
    use super::*;

    fn finished(token: &str, body: usize) -> Record {
        Record {
            token: token.into(),
            fingerprint: "fp".into(),
            outcome: Some(Outcome::Chat {
                body: "x".repeat(body),
                stream: false,
            }),
        }
    }

    async fn keep(store: &MemoryIdempotency, key: &str, record: &Record) {
        let claim = Record {
            outcome: None,
            ..record.clone()
        };
        let long = Duration::from_secs(60);
        assert_eq!(store.claim(key, &claim, long).await.unwrap(), None);
        assert!(store.complete(key, record, long).await.unwrap());
    }

    /// The audit's 100 records of about 1 MiB grew the gateway by 89 MiB:
    /// now the records stay within their bound, the least recently used
    /// finished ones going first, and a running claim is never evicted.
    #[tokio::test]
    async fn records_are_bounded_by_bytes_least_recently_used_first() {
        let mib = 1 << 20;
        let store = MemoryIdempotency::new(8 * mib);
        let running = record_key("org", "running");
        let claim = Record {
            token: "t".into(),
            fingerprint: "fp".into(),
            outcome: None,
        };
        let long = Duration::from_secs(60);
        assert_eq!(store.claim(&running, &claim, long).await.unwrap(), None);
        let keys: Vec<String> = (0..100)
            .map(|i| record_key("org", &format!("k{i}")))
            .collect();
        for (i, key) in keys.iter().enumerate() {
            keep(&store, key, &finished(&format!("t{i}"), mib - 1000)).await;
            // The first key is read again now and then: recently used.
            if i % 4 == 0 {
                let found = store.claim(&keys[0], &claim, long).await.unwrap();
                assert!(found.is_some_and(|r| r.outcome.is_some()));
            }
            assert!(store.bytes() <= 8 * mib, "{} bytes held", store.bytes());
        }
        // The recently read one and the newest stay; the older ones went.
        let found = |key: &str| {
            let state = store.lock();
            state.records.contains_key(key)
        };
        assert!(found(&keys[0]), "the recently used record stays");
        assert!(found(&keys[99]), "the newest stays");
        assert!(!found(&keys[1]), "an old, unused record is evicted");
        assert!(found(&running), "a claim is never evicted");
        // An evicted key is free: its retry runs again.
        assert_eq!(store.claim(&keys[1], &claim, long).await.unwrap(), None);
    }
}

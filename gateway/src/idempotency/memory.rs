//! Idempotency records in this process (the embedded mode): one
//! mutex-guarded map, each record with its deadline; the same semantics
//! as the Redis records.

use super::{IdempotencyResult, IdempotencyStore, Record};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct MemoryIdempotency {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    records: HashMap<String, (Record, Instant)>,
    /// When lapsed records were last dropped.
    purged: Option<Instant>,
}

/// How often a claim drops lapsed records (a key nobody sends again would
/// otherwise stay for ever).
const PURGE_EVERY: Duration = Duration::from_secs(1);

impl MemoryIdempotency {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    /// The live record of `key`, dropping it when its time ran out.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut (Record, Instant)> {
        if self
            .records
            .get(key)
            .is_some_and(|(_, until)| *until <= now)
        {
            self.records.remove(key);
        }
        self.records.get_mut(key)
    }

    fn purge(&mut self, now: Instant) {
        if self.purged.is_some_and(|at| now < at + PURGE_EVERY) {
            return;
        }
        self.purged = Some(now);
        self.records.retain(|_, (_, until)| *until > now);
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
        if let Some((found, _)) = state.live(key, now) {
            return Ok(Some(found.clone()));
        }
        state
            .records
            .insert(key.to_owned(), (record.clone(), now + lease));
        Ok(None)
    }

    async fn complete(
        &self,
        key: &str,
        record: &Record,
        keep: Duration,
    ) -> IdempotencyResult<bool> {
        let now = Instant::now();
        let mut state = self.lock();
        match state.live(key, now) {
            Some(entry) if entry.0.token == record.token => {
                *entry = (record.clone(), now + keep);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, key: &str, token: &str) -> IdempotencyResult<()> {
        let now = Instant::now();
        let mut state = self.lock();
        if state
            .live(key, now)
            .is_some_and(|(r, _)| r.token == token && r.outcome.is_none())
        {
            state.records.remove(key);
        }
        Ok(())
    }
}

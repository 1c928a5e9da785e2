//! The claims this replica holds while their requests run. A claim is a
//! short lease (the store's `lease_millis` and one heartbeat of slack, as
//! a run's lease), renewed while its request runs by the replica's lease
//! heartbeat (the runs' heartbeat, `runs::Runs::maintain`, drives
//! [`Claims::renew`] beside its own renewal), so a claim frees within one
//! lease of its holder's loss (a SIGKILL, a cut link) however long the
//! request could have run. A live holder renews a claim only until its
//! request's deadline plus a lease: a leaked claim lapses too.

use super::{IdempotencyStore, Record};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The idempotency store and the claims this replica renews in it.
pub struct Claims {
    pub store: Arc<dyn IdempotencyStore>,
    /// Live claims: record key → (claimant token, renew until).
    live: Mutex<HashMap<String, (String, Instant)>>,
    /// How long a claim written (or renewed) now holds.
    lease: Duration,
}

impl Claims {
    /// `lease`: how long a claim holds unrenewed (`runs::Runs::lease_span`).
    pub fn new(store: Arc<dyn IdempotencyStore>, lease: Duration) -> Self {
        Self {
            store,
            live: Mutex::new(HashMap::new()),
            lease,
        }
    }

    fn live(&self) -> MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long a claim holds without a renewal.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Claims `key` for `record` (see [`IdempotencyStore::claim`]); a claim
    /// won is renewed until `renew_until`, or until [`Self::let_go`].
    pub async fn claim(
        &self,
        key: &str,
        record: &Record,
        renew_until: Instant,
    ) -> super::IdempotencyResult<Option<Record>> {
        let found = self.store.claim(key, record, self.lease).await?;
        if found.is_none() {
            self.live()
                .insert(key.to_owned(), (record.token.clone(), renew_until));
        }
        Ok(found)
    }

    /// Stops renewing `token`'s claim of `key` (its outcome is recorded, or
    /// it was released, or its holder gave up on the store).
    pub fn let_go(&self, key: &str, token: &str) {
        let mut live = self.live();
        if live.get(key).is_some_and(|(t, _)| t == token) {
            live.remove(key);
        }
    }

    /// One heartbeat: every live claim's lease extended to one lease from
    /// now, all at once. A claim past its renewal deadline is left to lapse;
    /// a renewal that fails is tried again on the next beat, and a claim
    /// whose renewals fail for a whole lease lapses.
    pub async fn renew(&self) {
        let now = Instant::now();
        let due: Vec<(String, String)> = {
            let mut live = self.live();
            live.retain(|_, (_, until)| *until > now);
            live.iter()
                .map(|(key, (token, _))| (key.clone(), token.clone()))
                .collect()
        };
        if due.is_empty() {
            return;
        }
        let calls = due
            .iter()
            .map(|(key, token)| self.store.renew(key, token, self.lease));
        // A renewal later than a lease is of no use: never hold up the
        // next beat longer than that.
        let failed = match tokio::time::timeout(self.lease, futures::future::join_all(calls)).await
        {
            Ok(results) => results.iter().filter(|r| r.is_err()).count(),
            Err(_) => due.len(),
        };
        if failed > 0 {
            tracing::warn!(
                claims = due.len(),
                failed,
                "renewing idempotency claims failed"
            );
        }
    }

    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.live().len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{memory::MemoryIdempotency, record_key, Outcome};
    use super::*;

    fn record(token: &str) -> Record {
        Record {
            token: token.into(),
            fingerprint: "fp".into(),
            outcome: None,
        }
    }

    /// The heartbeat keeps a live claim for many leases; once its holder
    /// stops (nothing renews it, as after a SIGKILL) it frees within one
    /// lease. Without the renewal a claim would be either short (and lost
    /// while its request runs) or long (and held for minutes by the dead).
    #[tokio::test]
    async fn a_renewed_claim_holds_and_an_unrenewed_one_frees_within_a_lease() {
        let lease = Duration::from_millis(150);
        let claims = Claims::new(Arc::new(MemoryIdempotency::new(1 << 20)), lease);
        let key = record_key("org", "k");
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(claims.claim(&key, &record("t1"), far).await.unwrap(), None);
        for _ in 0..8 {
            tokio::time::sleep(lease / 3).await;
            claims.renew().await;
        }
        let found = claims.claim(&key, &record("t2"), far).await.unwrap();
        assert_eq!(found.map(|r| r.token), Some("t1".into()), "still held");

        // The holder is gone: no more renewals.
        tokio::time::sleep(lease + Duration::from_millis(30)).await;
        assert_eq!(claims.claim(&key, &record("t3"), far).await.unwrap(), None);
    }

    /// A renewal never shortens a completed record to a lease, and stops at
    /// the claim's deadline or when the holder lets go.
    #[tokio::test]
    async fn renewals_stop_at_the_deadline_and_spare_completed_records() {
        let lease = Duration::from_millis(100);
        let store = Arc::new(MemoryIdempotency::new(1 << 20));
        let claims = Claims::new(store.clone(), lease);
        let (done_key, late_key) = (record_key("org", "done"), record_key("org", "late"));
        let far = Instant::now() + Duration::from_secs(60);
        claims.claim(&done_key, &record("t1"), far).await.unwrap();
        let mut done = record("t1");
        done.outcome = Some(Outcome::NotKept);
        assert!(store
            .complete(&done_key, &done, Duration::from_secs(60))
            .await
            .unwrap());
        // Past its deadline at once: never renewed.
        claims
            .claim(&late_key, &record("t1"), Instant::now())
            .await
            .unwrap();
        for _ in 0..4 {
            tokio::time::sleep(lease / 2).await;
            claims.renew().await;
        }
        assert_eq!(claims.held(), 1, "the late claim is no longer renewed");
        let found = claims.claim(&done_key, &record("t9"), far).await.unwrap();
        assert_eq!(found, Some(done), "the outcome is kept for its window");
        assert_eq!(
            claims.claim(&late_key, &record("t9"), far).await.unwrap(),
            None
        );
        claims.let_go(&done_key, "t1");
        claims.let_go(&late_key, "t9");
        assert_eq!(claims.held(), 0);
    }
}

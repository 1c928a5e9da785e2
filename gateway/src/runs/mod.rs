//! Runs of stored responses: who owns them and what happens when an owner
//! dies.
//!
//! Every stored response that is still running is owned by the replica
//! running it, through a lease in the store. One task per replica
//! ([`Runs::maintain`]) renews the leases of all its runs in one write per
//! heartbeat, and sweeps: a run whose lease expired belongs to a replica
//! that died, so the sweeper writes its terminal `failed` status (a
//! compare-and-set, so exactly once even when several replicas sweep).
//!
//! Every owned run also has a hard deadline (its request deadline plus a
//! lease). Past it, the heartbeat stops renewing the run and the sweeper
//! fails it with `timeout`, whatever its owner's task is waiting on: a run
//! ends by its deadline even if its owner hangs.
//!
//! The background driver lives in [`background`].

pub mod background;

use crate::api::responses::ResponseError;
use crate::config::StoreConfig;
use crate::store::{now_ms, ResponseStore, WriteOutcome};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Error code of a run failed by the sweeper.
pub const RUN_LOST: &str = "run_lost";
/// The error code of a run its replica ended because its drain grace
/// period ran out first.
pub const REPLICA_SHUTDOWN: &str = "replica_shutdown";
/// The error code of a run that outlived its hard deadline (the request
/// deadline's own code).
pub const OVERDUE: &str = "timeout";

pub struct Runs {
    pub store: Arc<dyn ResponseStore>,
    /// Runs this replica owns, with their hard deadlines.
    local: Mutex<HashMap<String, Instant>>,
    pub lease: Duration,
    pub heartbeat: Duration,
    pub sweep_interval: Duration,
    pub cancel_poll: Duration,
}

impl Runs {
    pub fn new(store: Arc<dyn ResponseStore>, config: &StoreConfig) -> Self {
        Self {
            store,
            local: Mutex::new(HashMap::new()),
            lease: Duration::from_millis(config.lease_millis),
            heartbeat: Duration::from_millis(config.heartbeat_millis),
            sweep_interval: Duration::from_millis(config.sweep_interval_millis),
            cancel_poll: Duration::from_millis(config.cancel_poll_millis),
        }
    }

    /// The lease deadline of a run starting (or renewed) now.
    pub fn lease_until_ms(&self) -> u64 {
        now_ms() + self.lease.as_millis() as u64
    }

    fn local(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a run as owned here until the guard is dropped; its lease is
    /// then renewed by the heartbeat until `run_timeout` (the request
    /// deadline) plus one lease have passed. The store lease itself is
    /// created with the response.
    pub fn own(self: &Arc<Self>, id: &str, run_timeout: Duration) -> Ownership {
        let deadline = Instant::now() + run_timeout + self.lease;
        self.local().insert(id.to_owned(), deadline);
        crate::metrics::METRICS.runs_owned.inc();
        Ownership {
            runs: self.clone(),
            id: id.to_owned(),
        }
    }

    pub fn owned_count(&self) -> usize {
        self.local().len()
    }

    /// Heartbeat and sweeper, until the process ends.
    pub async fn maintain(&self) {
        let mut heartbeat = tokio::time::interval(self.heartbeat);
        let mut sweep = tokio::time::interval(self.sweep_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = heartbeat.tick() => self.renew().await,
                _ = sweep.tick() => { self.sweep().await; }
            }
        }
    }

    async fn renew(&self) {
        let now = Instant::now();
        let ids: Vec<String> = self
            .local()
            .iter()
            .filter(|(_, deadline)| **deadline > now)
            .map(|(id, _)| id.clone())
            .collect();
        if let Err(e) = self.store.renew_leases(&ids, self.lease_until_ms()).await {
            tracing::warn!(runs = ids.len(), "lease heartbeat failed: {}", e.message);
        }
    }

    /// Fails every run whose lease expired and that no replica owns any
    /// more, and every run of ours past its hard deadline. Returns how many
    /// this call ended.
    pub async fn sweep(&self) -> usize {
        let expired = match self.store.expired_leases(now_ms(), 100).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!("lease sweep failed: {}", e.message);
                return 0;
            }
        };
        let mut ended = 0;
        for id in expired {
            let ours = self.local().get(&id).copied();
            let failed = match ours {
                Some(deadline) if deadline > Instant::now() => {
                    // Ours: the heartbeat is late, not the replica dead.
                    let _ = self
                        .store
                        .renew_leases(std::slice::from_ref(&id), self.lease_until_ms())
                        .await;
                    continue;
                }
                Some(_) => self.fail_overdue(&id).await,
                None => self.fail_abandoned(&id).await,
            };
            match failed {
                Ok(true) => ended += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(response_id = %id, "could not end an abandoned run: {}", e.message);
                    continue;
                }
            }
            let _ = self.store.release_lease(&id).await;
        }
        ended
    }

    async fn fail_abandoned(&self, id: &str) -> Result<bool, crate::error::ApiError> {
        let written = self
            .fail(
                id,
                RUN_LOST,
                "The gateway replica running this response stopped before it finished. \
                 Create the response again.",
            )
            .await?;
        if written {
            crate::metrics::METRICS.runs_lost.inc();
            tracing::warn!(response_id = %id, "failed a run whose owner stopped renewing its lease");
        }
        Ok(written)
    }

    /// Ends a run of ours that outlived its hard deadline: its owner's task
    /// is stuck somewhere a deadline does not reach; the run still ends.
    pub async fn fail_overdue(&self, id: &str) -> Result<bool, crate::error::ApiError> {
        let written = self
            .fail(
                id,
                OVERDUE,
                "The response did not finish before its deadline. Create the response again.",
            )
            .await?;
        if written {
            crate::metrics::METRICS.runs_overdue.inc();
            tracing::warn!(response_id = %id, "failed a run past its deadline");
        }
        Ok(written)
    }

    /// Ends the runs this replica still owns, once its drain grace period
    /// is over: they fail at once with `replica_shutdown`, so a client
    /// polling or following one learns now rather than when the lease
    /// expires and a peer sweeps it. (A generation cannot move to another
    /// replica mid-stream; the client creates the response again.)
    pub async fn fail_owned(&self) -> usize {
        let owned: Vec<String> = self.local().keys().cloned().collect();
        let mut ended = 0;
        for id in owned {
            match self
                .fail(
                    &id,
                    REPLICA_SHUTDOWN,
                    "The gateway replica running this response shut down before it finished. \
                     Create the response again.",
                )
                .await
            {
                Ok(true) => {
                    ended += 1;
                    let _ = self.store.release_lease(&id).await;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(response_id = %id, "could not end a run at shutdown: {}", e.message)
                }
            }
        }
        if ended > 0 {
            tracing::warn!(
                runs = ended,
                "failed the runs still going when the grace period ended"
            );
        }
        ended
    }

    /// Writes `failed` with `code` unless the run already ended (compare
    /// and set: whoever ends a run first wins). True if this call ended it.
    async fn fail(
        &self,
        id: &str,
        code: &str,
        message: &str,
    ) -> Result<bool, crate::error::ApiError> {
        let Some(mut object) = self.store.object(id).await? else {
            return Ok(false);
        };
        if object.is_terminal() {
            return Ok(false);
        }
        object.status = "failed".into();
        object.error = Some(ResponseError {
            code: code.into(),
            message: message.into(),
        });
        let outcome = self.store.terminate(id, &object).await?;
        Ok(outcome == WriteOutcome::Written)
    }
}

/// A run owned by this replica; dropping it stops the lease heartbeat.
pub struct Ownership {
    runs: Arc<Runs>,
    id: String,
}

impl Ownership {
    /// Ends ownership: the run reached a terminal state, so its lease goes.
    pub async fn release(self) {
        let _ = self.runs.store.release_lease(&self.id).await;
    }
}

impl Drop for Ownership {
    fn drop(&mut self) {
        self.runs.local().remove(&self.id);
        crate::metrics::METRICS.runs_owned.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::suite::object;
    use crate::store::NewResponse;

    /// Stores running (queued) background responses with the given lease.
    async fn create_runs(store: &Arc<dyn ResponseStore>, ids: &[&str], lease_until_ms: u64) {
        for id in ids {
            store
                .create(NewResponse {
                    org: "o",
                    object: &object(id, true),
                    input_items: &[],
                    context: &[],
                    lease_until_ms: Some(lease_until_ms),
                })
                .await
                .unwrap();
        }
    }

    #[tokio::test]
    async fn sweeper_fails_abandoned_runs_once_and_spares_its_own() {
        let store: Arc<dyn ResponseStore> = Arc::new(MemoryStore::new(Duration::from_secs(60)));
        let runs = Arc::new(Runs::new(store.clone(), &StoreConfig::default()));
        let (lost, mine) = ("resp_lost", "resp_mine");
        create_runs(&store, &[lost, mine], now_ms() - 1).await;
        let _owned = runs.own(mine, Duration::from_secs(60));
        assert_eq!(runs.sweep().await, 1);
        let failed = store.get("o", lost).await.unwrap().unwrap();
        assert_eq!(failed.status, "failed");
        assert_eq!(failed.error.unwrap().code, RUN_LOST);
        let events = store.read_events(lost, None, 10).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].name, "response.failed");
        assert_eq!(store.status(mine).await.unwrap().as_deref(), Some("queued"));
        // Nothing left to end on a second sweep.
        assert_eq!(runs.sweep().await, 0);
    }

    #[tokio::test]
    async fn a_run_of_ours_past_its_deadline_is_no_longer_renewed_and_fails() {
        let store: Arc<dyn ResponseStore> = Arc::new(MemoryStore::new(Duration::from_secs(60)));
        let config = StoreConfig {
            lease_millis: 50,
            ..StoreConfig::default()
        };
        let runs = Arc::new(Runs::new(store.clone(), &config));
        let (stuck, fresh) = ("resp_stuck", "resp_fresh");
        create_runs(&store, &[stuck, fresh], runs.lease_until_ms()).await;
        // The stuck run's owner task never ends, so the guard stays alive.
        let _stuck = runs.own(stuck, Duration::ZERO);
        let _fresh = runs.own(fresh, Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(120)).await;
        runs.renew().await;
        assert_eq!(
            store.expired_leases(now_ms(), 10).await.unwrap(),
            vec![stuck.to_string()],
            "only the run past its deadline went unrenewed"
        );
        assert_eq!(runs.sweep().await, 1);
        let failed = store.get("o", stuck).await.unwrap().unwrap();
        assert_eq!(failed.status, "failed");
        assert_eq!(failed.error.unwrap().code, OVERDUE);
        let events = store.read_events(stuck, None, 10).await.unwrap();
        assert_eq!(
            events.last().map(|e| e.name.as_str()),
            Some("response.failed")
        );
        assert_eq!(
            store.status(fresh).await.unwrap().as_deref(),
            Some("queued")
        );
    }
}

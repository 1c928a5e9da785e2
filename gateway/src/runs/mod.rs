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
//! The background driver lives in [`background`].

pub mod background;

use crate::api::responses::ResponseError;
use crate::config::StoreConfig;
use crate::store::{now_ms, ResponseStore, WriteOutcome};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Error code of a run failed by the sweeper.
pub const RUN_LOST: &str = "run_lost";
/// The error code of a run its replica ended because its drain grace
/// period ran out first.
pub const REPLICA_SHUTDOWN: &str = "replica_shutdown";

pub struct Runs {
    pub store: Arc<dyn ResponseStore>,
    /// Runs this replica owns.
    local: Mutex<HashSet<String>>,
    pub lease: Duration,
    pub heartbeat: Duration,
    pub sweep_interval: Duration,
    pub cancel_poll: Duration,
}

impl Runs {
    pub fn new(store: Arc<dyn ResponseStore>, config: &StoreConfig) -> Self {
        Self {
            store,
            local: Mutex::new(HashSet::new()),
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

    fn local(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a run as owned here until the guard is dropped; its lease is
    /// then renewed by the heartbeat. The store lease itself is created with
    /// the response.
    pub fn own(self: &Arc<Self>, id: &str) -> Ownership {
        self.local().insert(id.to_owned());
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
        let ids: Vec<String> = self.local().iter().cloned().collect();
        if let Err(e) = self.store.renew_leases(&ids, self.lease_until_ms()).await {
            tracing::warn!(runs = ids.len(), "lease heartbeat failed: {}", e.message);
        }
    }

    /// Fails every run whose lease expired and that no replica owns any
    /// more. Returns how many this call ended.
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
            if self.local().contains(&id) {
                // Ours: the heartbeat is late, not the replica dead.
                let _ = self
                    .store
                    .renew_leases(std::slice::from_ref(&id), self.lease_until_ms())
                    .await;
                continue;
            }
            match self.fail_abandoned(&id).await {
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

    /// Ends the runs this replica still owns, once its drain grace period
    /// is over: they fail at once with `replica_shutdown`, so a client
    /// polling or following one learns now rather than when the lease
    /// expires and a peer sweeps it. (A generation cannot move to another
    /// replica mid-stream; the client creates the response again.)
    pub async fn fail_owned(&self) -> usize {
        let owned: Vec<String> = self.local().iter().cloned().collect();
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

    #[tokio::test]
    async fn sweeper_fails_abandoned_runs_once_and_spares_its_own() {
        let store: Arc<dyn ResponseStore> = Arc::new(MemoryStore::new(Duration::from_secs(60)));
        let runs = Arc::new(Runs::new(store.clone(), &StoreConfig::default()));
        let (lost, mine) = ("resp_lost", "resp_mine");
        for id in [lost, mine] {
            store
                .create(NewResponse {
                    org: "o",
                    object: &object(id, true),
                    input_items: &[],
                    context: &[],
                    lease_until_ms: Some(now_ms() - 1),
                })
                .await
                .unwrap();
        }
        let _owned = runs.own(mine);
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
}

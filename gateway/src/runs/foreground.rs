//! The end of a foreground stored response.
//!
//! Its client is told the outcome on the connection (the body, or the
//! stream's terminal event), so the store must come to say the same. The
//! owner's final write is tried once while the client waits; if the store
//! does not answer, the write goes on in the background with backoff until
//! it lands, however long the store is away (up to [`PATIENCE`]). The
//! heartbeat keeps the run's lease meanwhile; should the lease lapse anyway
//! (the replica is cut off from the store) and a sweeper fail the run, the
//! owner's write replaces the sweeper's guess once it gets through
//! ([`crate::store::ResponseStore::finish`]).

use super::{Ownership, Runs};
use crate::api::responses::ResponseObject;
use crate::lifecycle::InFlight;
use crate::metrics::METRICS;
use crate::store::WriteOutcome;
use std::sync::Arc;
use std::time::Duration;

/// How long a final write keeps being retried after the store stopped
/// answering. Past it the lease is let go, and the sweeper's record says
/// the outcome was not recorded.
pub const PATIENCE: Duration = Duration::from_secs(300);

const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);

impl Runs {
    /// Records `object`, the terminal state its client was told, as the
    /// stored response. Returns once it landed or was handed to a retry in
    /// the background (which holds `in_flight`, so a draining replica waits
    /// for it within its grace period).
    pub async fn record_foreground_end(
        self: &Arc<Self>,
        object: ResponseObject,
        ownership: Option<Ownership>,
        in_flight: InFlight,
    ) {
        if self.try_finish(&object).await {
            release(ownership).await;
            return;
        }
        METRICS.final_writes_deferred.inc();
        let runs = self.clone();
        tokio::spawn(async move {
            let give_up = tokio::time::Instant::now() + PATIENCE;
            tokio::time::sleep(RETRY_FIRST).await;
            let finished = super::retry_store(&object.id, give_up, RETRY_FIRST, RETRY_MAX, || {
                runs.store.finish(&object.id, &object)
            })
            .await;
            if finished.is_ok() {
                release(ownership).await;
            } else {
                METRICS.final_writes_lost.inc();
                tracing::error!(
                    response_id = %object.id,
                    "gave up storing a foreground response's final state; its lease lapses into a sweep"
                );
                // Dropped, not released: the lease left in the store lets
                // a sweeper end the run.
                drop(ownership);
            }
            drop(in_flight);
        });
    }

    /// One attempt; true when nothing is left to retry.
    async fn try_finish(&self, object: &ResponseObject) -> bool {
        match self.store.finish(&object.id, object).await {
            Ok(WriteOutcome::Written) => true,
            // Deleted meanwhile, or ended by a client: nothing to record.
            Ok(WriteOutcome::Gone | WriteOutcome::AlreadyTerminal) => true,
            Err(e) => {
                tracing::warn!(response_id = %object.id, "could not store the final response, retrying: {e}");
                false
            }
        }
    }
}

async fn release(ownership: Option<Ownership>) {
    if let Some(o) = ownership {
        o.release().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreConfig;
    use crate::lifecycle::Shutdown;
    use crate::store::memory::MemoryStore;
    use crate::store::suite::object;
    use crate::store::{now_ms, NewResponse, ResponseStore};

    #[tokio::test]
    async fn a_final_write_lands_and_the_lease_goes() {
        let store: Arc<dyn ResponseStore> = Arc::new(MemoryStore::new(Duration::from_secs(60)));
        let runs = Arc::new(Runs::new(store.clone(), &StoreConfig::default()));
        let running = object("resp_fg", false);
        store
            .create(NewResponse {
                org: "o",
                object: &running,
                input_items: &[],
                context: &[],
                lease_until_ms: Some(runs.lease_until_ms()),
            })
            .await
            .unwrap();
        let ownership = runs.own("resp_fg", Duration::from_secs(60));
        let mut done = running.clone();
        done.status = "completed".into();
        runs.record_foreground_end(
            done.clone(),
            Some(ownership),
            Arc::new(Shutdown::default()).begin(),
        )
        .await;
        assert_eq!(store.get("o", "resp_fg").await.unwrap(), Some(done));
        assert!(store
            .expired_leases(now_ms() + 3_600_000, 10)
            .await
            .unwrap()
            .is_empty());
    }
}

//! [`StoredRun`]: the one owner of a running stored response, on either
//! path. Created with its lease; the background path writes its event log
//! through it, the foreground path records how the reply ended; either way
//! it ends by letting go of the lease in the one way that is safe.
//!
//! Letting go: the owner that wrote the run's terminal status releases the
//! lease. An owner that did not (the run was cancelled, swept or deleted,
//! or the store was lost) only drops it: whoever ends the run may not have
//! yet (a canceller that closed the log and then died), so the lease is
//! left to lapse, and a sweeper either ends the run or finds it ended and
//! removes the lease.
//!
//! The end of a foreground response ([`StoredRun::finish`]): its client is
//! told the outcome on the connection (the body, or the stream's terminal
//! event), so the store must come to say the same. The final write is
//! tried once while the client waits; if the store does not answer, it
//! goes on in the background with backoff until it lands, however long the
//! store is away (up to [`PATIENCE`]). The heartbeat keeps the run's lease
//! meanwhile; should the lease lapse anyway (the replica is cut off from
//! the store) and a sweeper fail the run, the owner's write replaces the
//! sweeper's guess once it gets through ([`ResponseStore::finish`]).
//!
//! [`ResponseStore::finish`]: crate::store::ResponseStore::finish

use super::Runs;
use crate::api::responses::{EncodedEvent, InputItem, ResponseObject, ResponseStatus};
use crate::lifecycle::InFlight;
use crate::metrics::METRICS;
use crate::store::{NewResponse, StoreResult, WriteOutcome};
use std::sync::Arc;
use std::time::Duration;

/// How long a foreground final write keeps being retried after the store
/// stopped answering. Past it the lease is let go, and the sweeper's record
/// says the outcome was not recorded.
pub const PATIENCE: Duration = Duration::from_secs(300);

/// First and longest pause between retries of a foreground final write
/// (and of an `Idempotency-Key`'s outcome write).
pub(crate) const FINISH_RETRY_FIRST: Duration = Duration::from_millis(50);
pub(crate) const FINISH_RETRY_MAX: Duration = Duration::from_secs(2);

/// First and longest pause between retries of a background write.
const WRITE_RETRY_FIRST: Duration = Duration::from_millis(50);
const WRITE_RETRY_MAX: Duration = Duration::from_secs(1);

/// A new stored response, as its owner creates it.
pub struct NewRun<'a> {
    pub org: &'a str,
    pub object: &'a ResponseObject,
    /// This request's input items, with ids.
    pub input_items: &'a [InputItem],
    /// The conversation before this request's output.
    pub context: &'a [InputItem],
    /// The request deadline: the heartbeat renews the lease until it, plus
    /// one lease, has passed.
    pub run_timeout: Duration,
    /// The organisation's cap on stored bytes (its plan's; 0: none).
    pub max_stored_bytes: u64,
}

/// The run is over for its owner: it ended elsewhere (cancel, sweeper,
/// delete) or the store was lost. The owner stops generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOver;

/// A running stored response owned by this replica. While it lives the
/// heartbeat renews the run's lease; dropping it stops that (the lease
/// lapses into a sweep). [`Self::release`] or [`Self::finish`] end it.
pub struct StoredRun {
    runs: Arc<Runs>,
    id: String,
    /// This owner wrote the run's terminal status.
    ended_here: bool,
    /// The store kept failing for a whole lease and the owner gave up.
    store_lost: bool,
}

impl StoredRun {
    /// Stores the new response with its run lease and makes this replica
    /// its owner.
    pub async fn create(runs: &Arc<Runs>, new: NewRun<'_>) -> StoreResult<StoredRun> {
        runs.store
            .create(NewResponse {
                org: new.org,
                object: new.object,
                input_items: new.input_items,
                context: new.context,
                lease_until_ms: Some(runs.lease_until_ms()),
                max_stored_bytes: new.max_stored_bytes,
            })
            .await?;
        Ok(runs.own(&new.object.id, new.run_timeout))
    }

    /// Registers ownership of a run whose lease the store already holds.
    pub(super) fn owned(runs: Arc<Runs>, id: String) -> Self {
        Self {
            runs,
            id,
            ended_here: false,
            store_lost: false,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The owner's write of a background run: `events`, and `object` when
    /// given (a terminal one ends the run). A store failure is retried
    /// (writes are idempotent, so a retry of a write that landed is
    /// success) for as long as the run's lease may hold (one lease and a
    /// heartbeat, [`Runs::lease_span`]), so a store stall of up to one lease
    /// loses no run; then the owner gives up and leaves the run to the
    /// sweeper.
    pub async fn write(
        &mut self,
        object: Option<&ResponseObject>,
        events: &[EncodedEvent],
    ) -> Result<(), RunOver> {
        if events.is_empty() && object.is_none() {
            return Ok(());
        }
        let id = self.id.as_str();
        let store = &self.runs.store;
        let give_up = tokio::time::Instant::now() + self.runs.lease_span();
        let written = super::retry_store(id, give_up, WRITE_RETRY_FIRST, WRITE_RETRY_MAX, || {
            store.write(id, object, events)
        })
        .await;
        match written {
            Ok(WriteOutcome::Written) => {
                self.ended_here = object.is_some_and(ResponseObject::is_terminal);
                Ok(())
            }
            // Cancelled, failed by a sweeper, or deleted: someone else ended it.
            Ok(_) => Err(RunOver),
            Err(_) => {
                self.store_lost = true;
                Err(RunOver)
            }
        }
    }

    /// Fails the run with `timeout`: it outlived its hard deadline.
    pub async fn fail_overdue(&mut self) {
        match self.runs.fail_overdue(&self.id).await {
            Ok(ended) => self.ended_here = ended,
            // Left to the sweeper: the lease expires once we let go.
            Err(_) => self.store_lost = true,
        }
    }

    /// Resolves once the run was ended elsewhere (cancel, sweeper, delete):
    /// the owner polls the status while it has nothing to write.
    pub async fn ended_elsewhere(&self) {
        loop {
            tokio::time::sleep(self.runs.cancel_poll).await;
            match self.runs.store.status(&self.id).await {
                Ok(Some(s)) if !s.is_terminal() => {}
                Ok(_) => return,
                // A store blip is not a cancel.
                Err(_) => {}
            }
        }
    }

    /// Ends ownership of a background run: the lease is released if this
    /// owner ended the run, else left to lapse (see the module doc).
    pub async fn release(self) {
        if self.ended_here {
            let _ = self.runs.store.release_lease(&self.id).await;
        } else if self.store_lost {
            tracing::warn!(response_id = %self.id, "the store failed for a whole lease; the run is left to the sweeper");
        }
    }

    /// Hands a background run whose worker never started to a peer (this
    /// replica is draining): ownership ends here first, so the heartbeat no
    /// longer renews the lease, then the record goes beside the run and its
    /// lease ends, for a peer's sweeper to adopt it. Should the store not
    /// take it, the lease lapses on its own and a sweeper fails the run.
    pub async fn hand_over(self, record: &super::handover::HandOver) {
        let runs = self.runs.clone();
        let id = self.id.clone();
        drop(self);
        let handed = match record.encode() {
            Ok(record) => runs.store.hand_over(&id, &record).await,
            Err(_) => Err(crate::store::StoreError::Encode),
        };
        match handed {
            Ok(()) => {
                METRICS.runs_handed_over.inc();
                tracing::info!(response_id = %id, "handed a background run to the other replicas");
            }
            Err(e) => {
                tracing::warn!(response_id = %id, "could not hand a run over; its lease lapses into a sweep: {e}")
            }
        }
    }

    /// A foreground client went away: its generation stopped, so the run
    /// ends `cancelled` (recorded as [`Self::finish`] does).
    pub async fn cancel(self, mut object: ResponseObject, in_flight: InFlight) {
        object.end(ResponseStatus::Cancelled);
        self.finish(object, in_flight).await;
    }

    /// Records `object`, the terminal state a foreground client was told,
    /// as the stored response. Returns once it landed or was handed to a
    /// retry in the background (which holds `in_flight`, so a draining
    /// replica waits for it within its grace period).
    pub async fn finish(self, object: ResponseObject, in_flight: InFlight) {
        if self.try_finish(&object).await {
            self.release_lease().await;
            return;
        }
        METRICS.final_writes_deferred.inc();
        tokio::spawn(async move {
            let give_up = tokio::time::Instant::now() + PATIENCE;
            tokio::time::sleep(FINISH_RETRY_FIRST).await;
            let store = &self.runs.store;
            let finished = super::retry_store(
                &object.id,
                give_up,
                FINISH_RETRY_FIRST,
                FINISH_RETRY_MAX,
                || store.finish(&object.id, &object),
            )
            .await;
            if finished.is_ok() {
                self.release_lease().await;
            } else {
                METRICS.final_writes_lost.inc();
                tracing::error!(
                    response_id = %object.id,
                    "gave up storing a foreground response's final state; its lease lapses into a sweep"
                );
                // Dropped, not released: the lease left in the store lets
                // a sweeper end the run.
                drop(self);
            }
            drop(in_flight);
        });
    }

    /// One attempt at a foreground final write; true when nothing is left
    /// to retry.
    async fn try_finish(&self, object: &ResponseObject) -> bool {
        match self.runs.store.finish(&self.id, object).await {
            Ok(WriteOutcome::Written) => true,
            // Deleted meanwhile, or ended by a client: nothing to record.
            // (A foreground log is never closed to its owner, so a refusal
            // here means the run truly ended.)
            Ok(WriteOutcome::Gone | WriteOutcome::AlreadyTerminal) => true,
            Err(e) => {
                tracing::warn!(response_id = %self.id, "could not store the final response, retrying: {e}");
                false
            }
        }
    }

    async fn release_lease(self) {
        let _ = self.runs.store.release_lease(&self.id).await;
    }
}

impl Drop for StoredRun {
    fn drop(&mut self) {
        self.runs.disown(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreConfig;
    use crate::lifecycle::Shutdown;
    use crate::store::memory::MemoryStore;
    use crate::store::suite::object;
    use crate::store::{now_ms, ResponseStore};

    fn runs() -> (Arc<dyn ResponseStore>, Arc<Runs>) {
        let store: Arc<dyn ResponseStore> = Arc::new(MemoryStore::new(Duration::from_secs(60)));
        let runs = Arc::new(Runs::new(store.clone(), &StoreConfig::default()));
        (store, runs)
    }

    async fn create(runs: &Arc<Runs>, running: &ResponseObject) -> StoredRun {
        StoredRun::create(
            runs,
            NewRun {
                org: "o",
                object: running,
                input_items: &[],
                context: &[],
                run_timeout: Duration::from_secs(60),
                max_stored_bytes: 0,
            },
        )
        .await
        .unwrap()
    }

    async fn no_lease_left(store: &Arc<dyn ResponseStore>) -> bool {
        store
            .expired_leases(now_ms() + 3_600_000, 10)
            .await
            .unwrap()
            .is_empty()
    }

    #[tokio::test]
    async fn a_final_write_lands_and_the_lease_goes() {
        let (store, runs) = runs();
        let running = object("resp_fg", false);
        let run = create(&runs, &running).await;
        let mut done = running.clone();
        done.status = ResponseStatus::Completed;
        run.finish(done.clone(), Arc::new(Shutdown::default()).begin())
            .await;
        assert_eq!(store.get("o", "resp_fg").await.unwrap(), Some(done));
        assert!(no_lease_left(&store).await);
    }

    #[tokio::test]
    async fn a_foreground_client_gone_ends_the_run_cancelled() {
        let (store, runs) = runs();
        let running = object("resp_gone", false);
        let run = create(&runs, &running).await;
        run.cancel(running, Arc::new(Shutdown::default()).begin())
            .await;
        assert_eq!(
            store.status("resp_gone").await.unwrap(),
            Some(ResponseStatus::Cancelled)
        );
        assert!(no_lease_left(&store).await);
    }

    /// The background owner releases the lease only when it wrote the
    /// terminal status; refused a write, it leaves the lease to lapse.
    #[tokio::test]
    async fn a_background_owner_releases_only_a_run_it_ended() {
        let (store, runs) = runs();
        let mut running = object("resp_bg", true);
        let mut run = create(&runs, &running).await;
        running.status = ResponseStatus::Completed;
        run.write(Some(&running), &[]).await.unwrap();
        run.release().await;
        assert!(no_lease_left(&store).await);

        let running = object("resp_cancelled", true);
        let mut run = create(&runs, &running).await;
        let mut cancelled = running.clone();
        cancelled.status = ResponseStatus::Cancelled;
        store
            .terminate(run.id(), &mut cancelled, crate::store::EndedBy::Cancel)
            .await
            .unwrap();
        assert_eq!(run.write(Some(&running), &[]).await, Err(RunOver));
        run.release().await;
        assert_eq!(
            store
                .expired_leases(now_ms() + 3_600_000, 10)
                .await
                .unwrap(),
            vec!["resp_cancelled".to_string()],
            "the lease lapses into a sweep"
        );
    }
}

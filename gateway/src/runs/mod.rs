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
//! A run's owner holds it as a [`StoredRun`] ([`stored`]: create with the
//! lease, write, finish, cancel, fail, release), on the foreground and the
//! background path alike; the background driver lives in [`background`].
//! The ends from outside an owner are here: a client's cancel
//! ([`Runs::cancel`]), the sweeper's `failed`, and a shutdown's.
//!
//! A draining replica hands the background runs whose worker has not
//! started to its peers ([`handover`]): it ends their lease with a record
//! of what to run, and the first peer's sweeper to find the expired lease
//! takes the record and adopts the run ([`adopt`]) instead of failing it.
//! A draining replica sweeps nothing of others' (its peers do), so it never
//! adopts what it just handed over.

pub mod background;
pub mod handover;
pub mod stored;

pub use stored::{NewRun, RunOver, StoredRun};

use crate::api::responses::{ResponseError, ResponseObject, ResponseStatus};
use crate::config::StoreConfig;
use crate::store::{now_ms, EndedBy, ResponseStore, TakeHandover, WriteOutcome};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Expired runs a sweep ends at once.
const SWEEP_CONCURRENCY: usize = 16;

/// Error code of a run failed by the sweeper.
pub const RUN_LOST: &str = "run_lost";
/// The error code of a run its replica ended because its drain grace
/// period ran out first.
pub const REPLICA_SHUTDOWN: &str = "replica_shutdown";
/// The error code of a run that outlived its hard deadline (the request
/// deadline's own code).
pub const OVERDUE: &str = "timeout";

/// The record of a foreground response whose owner could not store how it
/// ended: its client may hold a complete reply, so it must not read as if
/// nothing came.
const UNRECORDED_FOREGROUND: &str = "The gateway replica serving this response stopped \
    renewing its lease before it recorded how the response ended. The reply may have \
    reached the client that created it in full.";

/// Another kind of lease this replica holds beside its runs' (the claims of
/// `Idempotency-Key`s), renewed on the runs' heartbeat: every lease of a
/// replica lives and lapses by one clock, `store.lease_millis`.
#[async_trait::async_trait]
pub trait Renewal: Send + Sync {
    /// One heartbeat's renewal of every lease it holds.
    async fn renew(&self);
}

/// The heartbeat renews the `Idempotency-Key` claims of requests running
/// here, as it renews their runs' leases (the claims know nothing of runs).
#[async_trait::async_trait]
impl Renewal for crate::idempotency::claims::Claims {
    async fn renew(&self) {
        crate::idempotency::claims::Claims::renew(self).await
    }
}

/// A handed-over run a sweeper took, for the adopter to run.
#[derive(Debug)]
pub struct Adoption {
    pub id: String,
    /// The hand-over record ([`handover::HandOver`], encoded).
    pub record: String,
}

pub struct Runs {
    pub store: Arc<dyn ResponseStore>,
    /// Runs this replica owns, with their hard deadlines.
    local: Mutex<HashMap<String, Instant>>,
    /// This replica is draining: it adopts nothing and leaves others'
    /// expired leases to its peers.
    draining: AtomicBool,
    /// Runs the sweeper took over, to the adopter ([`Self::adoptions`]).
    adopted: mpsc::UnboundedSender<Adoption>,
    adoptions: Mutex<Option<mpsc::UnboundedReceiver<Adoption>>>,
    /// Other leases renewed on this heartbeat ([`Self::renew_also`]).
    renewals: Mutex<Vec<Arc<dyn Renewal>>>,
    pub lease: Duration,
    pub heartbeat: Duration,
    pub sweep_interval: Duration,
    pub cancel_poll: Duration,
}

impl Runs {
    pub fn new(store: Arc<dyn ResponseStore>, config: &StoreConfig) -> Self {
        let (adopted, adoptions) = mpsc::unbounded_channel();
        Self {
            store,
            local: Mutex::new(HashMap::new()),
            draining: AtomicBool::new(false),
            adopted,
            adoptions: Mutex::new(Some(adoptions)),
            renewals: Mutex::default(),
            lease: Duration::from_millis(config.lease_millis),
            heartbeat: Duration::from_millis(config.heartbeat_millis),
            sweep_interval: Duration::from_millis(config.sweep_interval_millis),
            cancel_poll: Duration::from_millis(config.cancel_poll_millis),
        }
    }

    /// The runs this replica's sweeper adopts, for the one adopter
    /// (`responses::adopt::Adopter`); `None` once taken.
    pub fn adoptions(&self) -> Option<mpsc::UnboundedReceiver<Adoption>> {
        self.adoptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Renews `renewal`'s leases on this heartbeat too.
    pub fn renew_also(&self, renewal: Arc<dyn Renewal>) {
        self.renewals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(renewal);
    }

    /// This replica began draining: from now on its sweeper leaves other
    /// replicas' expired leases (and its own handed-over runs) to the peers.
    pub fn stop_adopting(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The lease deadline of a run starting (or renewed) now: one lease,
    /// plus one heartbeat of slack. The next renewal may come up to a
    /// heartbeat late (it was due just as the store stalled), so without the
    /// slack a stall shorter than a lease could still outlast it; with it,
    /// a run survives any store stall of up to `lease`.
    pub fn lease_until_ms(&self) -> u64 {
        now_ms() + self.lease_span().as_millis() as u64
    }

    /// How long a lease written now holds: one lease and one heartbeat.
    /// No lease renewed before now can hold past now plus this, so it is
    /// also how long an owner keeps retrying a write the store does not
    /// answer: past it the run may be another replica's to end.
    pub fn lease_span(&self) -> Duration {
        self.lease + self.heartbeat
    }

    fn local(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a run as owned here until the handle is dropped; its lease is
    /// then renewed by the heartbeat until `run_timeout` (the request
    /// deadline) plus one lease have passed. The store lease itself is
    /// created with the response ([`StoredRun::create`]).
    pub fn own(self: &Arc<Self>, id: &str, run_timeout: Duration) -> StoredRun {
        let deadline = Instant::now() + run_timeout + self.lease;
        self.local().insert(id.to_owned(), deadline);
        crate::metrics::METRICS.runs_owned.inc();
        StoredRun::owned(self.clone(), id.to_owned())
    }

    /// The heartbeat stops renewing a run (its [`StoredRun`] is gone).
    fn disown(&self, id: &str) {
        self.local().remove(id);
        crate::metrics::METRICS.runs_owned.dec();
    }

    /// A client's cancel of a stored response: a running background
    /// response ends `cancelled`, exactly once; its owner (on any replica)
    /// finds its next write refused, or notices the status, and stops. The
    /// lease stays: the owner lets it lapse and a sweeper removes it.
    pub async fn cancel(&self, org: &str, id: &str) -> crate::store::StoreResult<Cancel> {
        let Some(object) = self.store.get(org, id).await? else {
            return Ok(Cancel::NotFound);
        };
        if !object.background || object.is_terminal() {
            return Ok(Cancel::NotCancellable(object));
        }
        let mut cancelled = object;
        cancelled.end(ResponseStatus::Cancelled);
        match self
            .store
            .terminate(id, &mut cancelled, EndedBy::Cancel)
            .await?
        {
            WriteOutcome::Written => Ok(Cancel::Cancelled(cancelled)),
            WriteOutcome::AlreadyTerminal => {
                let now = self.store.get(org, id).await?;
                Ok(Cancel::NotCancellable(now.unwrap_or(cancelled)))
            }
            WriteOutcome::Gone => Ok(Cancel::NotFound),
        }
    }

    /// Deletes a stored response and its lease. False if there was nothing.
    pub async fn delete(&self, org: &str, id: &str) -> crate::store::StoreResult<bool> {
        if !self.store.delete(org, id).await? {
            return Ok(false);
        }
        let _ = self.store.release_lease(id).await;
        Ok(true)
    }

    /// Heartbeat and sweeper, until the process ends. Two loops side by
    /// side: a sweep slowed by a struggling store must not hold up the
    /// heartbeat, or this replica's own leases would lapse and a peer would
    /// fail runs that are alive.
    pub async fn maintain(&self) {
        let every = |period| {
            let mut interval = tokio::time::interval(period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval
        };
        let (mut heartbeat, mut sweep) = (every(self.heartbeat), every(self.sweep_interval));
        tokio::join!(
            async {
                loop {
                    heartbeat.tick().await;
                    let others: Vec<Arc<dyn Renewal>> = self
                        .renewals
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    let others = futures::future::join_all(others.iter().map(|r| r.renew()));
                    tokio::join!(self.renew(), others);
                }
            },
            async {
                loop {
                    sweep.tick().await;
                    self.sweep().await;
                }
            }
        );
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
            tracing::warn!(runs = ids.len(), "lease heartbeat failed: {e}");
        }
    }

    /// Fails every run whose lease expired and that no replica owns any
    /// more, and every run of ours past its hard deadline. Returns how many
    /// this call ended.
    pub async fn sweep(&self) -> usize {
        let expired = match self.store.expired_leases(now_ms(), 100).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!("lease sweep failed: {e}");
                return 0;
            }
        };
        // Concurrently: after an outage a backlog of runs waits here, and
        // three round trips each, one run at a time, would keep them
        // running long past their leases.
        futures::stream::iter(expired)
            .map(|id| self.end_expired(id))
            .buffer_unordered(SWEEP_CONCURRENCY)
            .filter(|ended| std::future::ready(*ended))
            .count()
            .await
    }

    /// Ends one run whose lease expired, unless it is ours and still within
    /// its deadline (then the heartbeat is late and the lease is renewed).
    /// True if this call ended it.
    async fn end_expired(&self, id: String) -> bool {
        let ours = self.local().get(&id).copied();
        let failed = match ours {
            Some(deadline) if deadline > Instant::now() => {
                let _ = self
                    .store
                    .renew_leases(std::slice::from_ref(&id), self.lease_until_ms())
                    .await;
                return false;
            }
            Some(_) => self.fail_overdue(&id).await,
            // With peers: a run handed over is adopted, not failed; and a
            // draining replica leaves others' runs to the peers that stay.
            None if self.store.shared() => {
                if self.draining.load(Ordering::Relaxed) {
                    return false;
                }
                match self
                    .store
                    .take_handover(&id, now_ms(), self.lease_until_ms())
                    .await
                {
                    Ok(TakeHandover::Taken(record)) => {
                        // No adopter (a test's `Runs`): the lease the take
                        // renewed lapses again and a later sweep fails it.
                        let _ = self.adopted.send(Adoption { id, record });
                        return false;
                    }
                    Ok(TakeHandover::Held) => return false,
                    Ok(TakeHandover::NotHandedOver) => self.fail_abandoned(&id).await,
                    Err(e) => Err(e),
                }
            }
            None => self.fail_abandoned(&id).await,
        };
        match failed {
            Ok(ended) => {
                let _ = self.store.release_lease(&id).await;
                ended
            }
            Err(e) => {
                tracing::warn!(response_id = %id, "could not end an abandoned run: {e}");
                false
            }
        }
    }

    async fn fail_abandoned(&self, id: &str) -> crate::store::StoreResult<bool> {
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
    pub async fn fail_overdue(&self, id: &str) -> crate::store::StoreResult<bool> {
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

    /// The last resort of a drain: runs this replica still owns after its
    /// grace period and the cut's tail (their owner could not even end them
    /// `incomplete`: a store that does not answer) fail at once with
    /// `replica_shutdown`, so a client polling one learns now rather than
    /// when the lease expires and a peer sweeps it.
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
                    tracing::warn!(response_id = %id, "could not end a run at shutdown: {e}")
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
    ///
    /// A foreground response's client may already hold the whole reply (its
    /// owner lost the store, not the client), so its record says the
    /// outcome is unknown rather than that nothing came; should the owner
    /// reach the store later, its own final write replaces this one.
    pub async fn fail(
        &self,
        id: &str,
        code: &str,
        message: &str,
    ) -> crate::store::StoreResult<bool> {
        let Some(mut object) = self.store.object(id).await? else {
            return Ok(false);
        };
        if object.is_terminal() {
            return Ok(false);
        }
        object.end(ResponseStatus::Failed);
        let message = if object.background {
            message
        } else {
            UNRECORDED_FOREGROUND
        };
        object.error = Some(ResponseError {
            code: code.into(),
            message: message.into(),
        });
        let outcome = self
            .store
            .terminate(id, &mut object, EndedBy::Sweeper)
            .await?;
        Ok(outcome == WriteOutcome::Written)
    }
}

/// Retries a store call of run `id` with pauses doubling from `first` to
/// `max` until the store answers (any outcome) or `give_up` has passed; the
/// last try is made at `give_up` itself (a pause is cut short to it), so a
/// store back by then is always tried. Then its last error. The owners'
/// writes are idempotent, so a retry of a write that landed is success.
/// (Also the retry of an `Idempotency-Key`'s outcome write, whose `id` is
/// its record's digest.)
pub(crate) async fn retry_store<T, E, F, Fut>(
    id: &str,
    give_up: tokio::time::Instant,
    first: Duration,
    max: Duration,
    mut attempt: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut backoff = first;
    loop {
        match attempt().await {
            Err(e) if tokio::time::Instant::now() < give_up => {
                tracing::warn!(id = %id, "store write failed, retrying: {e}");
                tokio::time::sleep_until(give_up.min(tokio::time::Instant::now() + backoff)).await;
                backoff = (backoff * 2).min(max);
            }
            answered => return answered,
        }
    }
}

/// How a client's cancel went ([`Runs::cancel`]).
#[derive(Debug)]
pub enum Cancel {
    /// The run was going and is now `cancelled`: the object as stored.
    Cancelled(ResponseObject),
    /// Not a background response, or it had already ended: the object as
    /// it is.
    NotCancellable(ResponseObject),
    /// No such response for this organisation.
    NotFound,
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
                    max_stored_bytes: 0,
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
        assert_eq!(failed.status, ResponseStatus::Failed);
        assert_eq!(failed.error.unwrap().code, RUN_LOST);
        let events = store.read_events(lost, None, 10).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].name, "response.failed");
        assert_eq!(
            store.status(mine).await.unwrap(),
            Some(ResponseStatus::Queued)
        );
        // Nothing left to end on a second sweep.
        assert_eq!(runs.sweep().await, 0);
    }

    #[tokio::test]
    async fn a_run_of_ours_past_its_deadline_is_no_longer_renewed_and_fails() {
        let store: Arc<dyn ResponseStore> = Arc::new(MemoryStore::new(Duration::from_secs(60)));
        let config = StoreConfig {
            lease_millis: 50,
            heartbeat_millis: 20,
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
        assert_eq!(failed.status, ResponseStatus::Failed);
        assert_eq!(failed.error.unwrap().code, OVERDUE);
        let events = store.read_events(stuck, None, 10).await.unwrap();
        assert_eq!(
            events.last().map(|e| e.name.as_str()),
            Some("response.failed")
        );
        assert_eq!(
            store.status(fresh).await.unwrap(),
            Some(ResponseStatus::Queued)
        );
    }

    /// A run handed over is adopted by the first sweeper to see its lease,
    /// not failed; a draining replica's sweeper leaves it alone.
    #[tokio::test]
    async fn a_handed_over_run_is_adopted_not_failed() {
        let store: Arc<dyn ResponseStore> =
            Arc::new(MemoryStore::new(Duration::from_secs(60)).as_if_shared());
        let leaving = Arc::new(Runs::new(store.clone(), &StoreConfig::default()));
        let staying = Arc::new(Runs::new(store.clone(), &StoreConfig::default()));
        let mut adoptions = staying.adoptions().expect("the adopter's end");
        let id = "resp_handed";
        create_runs(&store, &[id], leaving.lease_until_ms()).await;
        store.hand_over(id, "record").await.unwrap();
        leaving.stop_adopting();
        assert_eq!(
            leaving.sweep().await,
            0,
            "a draining replica adopts nothing"
        );
        assert_eq!(staying.sweep().await, 0, "adopted, not ended");
        let adopted = adoptions.try_recv().expect("an adoption");
        assert_eq!(
            (adopted.id.as_str(), adopted.record.as_str()),
            (id, "record")
        );
        assert_eq!(
            store.status(id).await.unwrap(),
            Some(ResponseStatus::Queued),
            "still running"
        );
        assert!(
            store.expired_leases(now_ms(), 10).await.unwrap().is_empty(),
            "the adopter holds the lease"
        );
        // A second sweep finds nothing more to take.
        assert_eq!(staying.sweep().await, 0);
        assert!(adoptions.try_recv().is_err());
    }

    /// A store that answers again exactly when the owner's patience ends
    /// is still tried: the last retry is made at `give_up`, not a backoff
    /// before it (the stall tolerance was 0.9 of a lease).
    #[tokio::test]
    async fn a_store_back_at_the_give_up_instant_is_tried() {
        let back_at = tokio::time::Instant::now() + Duration::from_millis(700);
        let tries = std::cell::Cell::new(0);
        let answered = retry_store(
            "resp_x",
            back_at,
            Duration::from_millis(50),
            Duration::from_millis(200),
            || {
                tries.set(tries.get() + 1);
                let up = tokio::time::Instant::now() >= back_at;
                async move {
                    if up {
                        Ok(())
                    } else {
                        Err(crate::store::StoreError::Unavailable { op: "write" })
                    }
                }
            },
        )
        .await;
        assert!(answered.is_ok(), "the try at the give-up instant");
        assert!(tries.get() > 3, "retried with backoff: {}", tries.get());
    }

    /// The memory store, with lease sweeps that take far longer than a
    /// lease (a store timing out on every call).
    struct SlowSweeps(MemoryStore);

    #[async_trait::async_trait]
    impl ResponseStore for SlowSweeps {
        async fn create(&self, new: NewResponse<'_>) -> crate::store::StoreResult<()> {
            self.0.create(new).await
        }
        async fn get(
            &self,
            org: &str,
            id: &str,
        ) -> crate::store::StoreResult<Option<ResponseObject>> {
            self.0.get(org, id).await
        }
        async fn object(&self, id: &str) -> crate::store::StoreResult<Option<ResponseObject>> {
            self.0.object(id).await
        }
        async fn conversation(
            &self,
            org: &str,
            id: &str,
        ) -> crate::store::StoreResult<Option<crate::store::StoredConversation>> {
            self.0.conversation(org, id).await
        }
        async fn input_items(
            &self,
            org: &str,
            id: &str,
        ) -> crate::store::StoreResult<Option<Vec<crate::api::responses::InputItem>>> {
            self.0.input_items(org, id).await
        }
        async fn delete(&self, org: &str, id: &str) -> crate::store::StoreResult<bool> {
            self.0.delete(org, id).await
        }
        async fn write(
            &self,
            id: &str,
            object: Option<&ResponseObject>,
            events: &[crate::api::responses::EncodedEvent],
        ) -> crate::store::StoreResult<WriteOutcome> {
            self.0.write(id, object, events).await
        }
        async fn finish(
            &self,
            id: &str,
            object: &ResponseObject,
        ) -> crate::store::StoreResult<WriteOutcome> {
            self.0.finish(id, object).await
        }
        async fn terminate(
            &self,
            id: &str,
            object: &mut ResponseObject,
            by: EndedBy,
        ) -> crate::store::StoreResult<WriteOutcome> {
            self.0.terminate(id, object, by).await
        }
        async fn read_events(
            &self,
            id: &str,
            after: Option<u64>,
            limit: usize,
        ) -> crate::store::StoreResult<Vec<crate::api::responses::EncodedEvent>> {
            self.0.read_events(id, after, limit).await
        }
        async fn follow(
            &self,
            id: &str,
            after: Option<u64>,
        ) -> crate::store::StoreResult<Box<dyn crate::store::EventFollower>> {
            self.0.follow(id, after).await
        }
        async fn status(&self, id: &str) -> crate::store::StoreResult<Option<ResponseStatus>> {
            self.0.status(id).await
        }
        async fn renew_leases(
            &self,
            ids: &[String],
            until_ms: u64,
        ) -> crate::store::StoreResult<()> {
            self.0.renew_leases(ids, until_ms).await
        }
        async fn release_lease(&self, id: &str) -> crate::store::StoreResult<()> {
            self.0.release_lease(id).await
        }
        async fn hand_over(&self, id: &str, record: &str) -> crate::store::StoreResult<()> {
            self.0.hand_over(id, record).await
        }
        async fn take_handover(
            &self,
            id: &str,
            now_ms: u64,
            until_ms: u64,
        ) -> crate::store::StoreResult<TakeHandover> {
            self.0.take_handover(id, now_ms, until_ms).await
        }
        fn shared(&self) -> bool {
            self.0.shared()
        }
        async fn charge_record(
            &self,
            org: &str,
            bytes: u64,
            cap: u64,
            keep: Duration,
        ) -> crate::store::StoreResult<()> {
            self.0.charge_record(org, bytes, cap, keep).await
        }
        async fn expired_leases(
            &self,
            now_ms: u64,
            limit: usize,
        ) -> crate::store::StoreResult<Vec<String>> {
            tokio::time::sleep(Duration::from_secs(30)).await;
            self.0.expired_leases(now_ms, limit).await
        }
    }

    #[tokio::test]
    async fn a_slow_sweep_does_not_hold_up_the_heartbeat() {
        let slow = Arc::new(SlowSweeps(MemoryStore::new(Duration::from_secs(60))));
        let store: Arc<dyn ResponseStore> = slow.clone();
        let config = StoreConfig {
            lease_millis: 200,
            heartbeat_millis: 50,
            sweep_interval_millis: 10,
            ..StoreConfig::default()
        };
        let runs = Arc::new(Runs::new(store.clone(), &config));
        create_runs(&store, &["resp_alive"], runs.lease_until_ms()).await;
        let _owned = runs.own("resp_alive", Duration::from_secs(60));
        let maintained = runs.clone();
        let maintain = tokio::spawn(async move { maintained.maintain().await });
        // Several leases later the run's lease is still ahead: renewed.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let lapsed = slow.0.expired_leases(now_ms(), 10).await.unwrap();
        maintain.abort();
        assert!(
            lapsed.is_empty(),
            "the heartbeat kept the lease: {lapsed:?}"
        );
    }
}

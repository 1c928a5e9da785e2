//! Drives one background response from `queued` to a terminal status,
//! detached from the request that created it.
//!
//! The generation itself goes through the one driver (`generation`); this
//! module is its sink into the store. Every batch of worker events that
//! is ready at once becomes one store write (one round trip), and the
//! write's answer tells the owner whether the run was cancelled or deleted
//! meanwhile; while the worker is quiet the owner polls the status every
//! `cancel_poll`. Either way the driver then drops the worker call, which
//! cancels the generation on the worker.

use super::{Ownership, Runs};
use crate::api::responses::EncodedEvent;
use crate::catalog::ModelSpec;
use crate::error::ApiError;
use crate::generation::{End, Generation, Gone, Sink};
use crate::lifecycle::InFlight;
use crate::limits::{Outcome, Reservation};
use crate::pool::Pools;
use crate::store::WriteOutcome;
use crate::translate::responses::ResponseEncoder;
use inference_proto::v1 as pb;
use std::sync::Arc;
use std::time::Duration;

/// Most events folded into one store write.
const MAX_BATCH: usize = 256;

/// First and longest pause between retries of a failed store write.
const WRITE_RETRY_FIRST: Duration = Duration::from_millis(50);
const WRITE_RETRY_MAX: Duration = Duration::from_secs(1);

pub struct BackgroundRun {
    pub runs: Arc<Runs>,
    pub pools: Arc<Pools>,
    pub model: &'static ModelSpec,
    pub work: pb::GenerateRequest,
    /// The creating request's trace context, sent to the worker.
    pub trace: telemetry::TraceParent,
    pub encoder: ResponseEncoder,
    pub ownership: Ownership,
    /// The request's hold on its plan's limits, settled when the run ends.
    pub reservation: Reservation,
    /// Upper bound on the whole generation.
    pub timeout: Duration,
    /// Counted as in-flight work, so a draining replica waits for the run
    /// within its grace period.
    pub in_flight: InFlight,
}

impl BackgroundRun {
    /// Runs to the end.
    pub async fn drive(self) {
        let BackgroundRun {
            runs,
            pools,
            model,
            work,
            trace,
            encoder,
            ownership,
            reservation,
            timeout,
            in_flight,
        } = self;
        let mut writer = RunWriter {
            id: encoder.object.id.clone(),
            runs: runs.clone(),
            encoder,
            frames: Vec::new(),
            store_lost: false,
            ended_here: false,
        };
        // Every step below has its own bound, but the run as a whole gets
        // one too: past it the generation is dropped (cancelling it on the
        // worker) and the run fails, whatever it was waiting on.
        let bound = timeout + runs.lease;
        let ran = tokio::time::timeout(
            bound,
            writer.run(&pools, model, work, trace, reservation, timeout),
        )
        .await;
        if ran.is_err() {
            match runs.fail_overdue(&writer.id).await {
                Ok(ended) => writer.ended_here = ended,
                // Left to the sweeper: the lease expires once we let go.
                Err(_) => writer.store_lost = true,
            }
        }
        if writer.ended_here {
            ownership.release().await;
        } else {
            if writer.store_lost {
                tracing::warn!(response_id = %writer.id, "the store failed for a whole lease; the run is left to the sweeper");
            }
            // Not ended by this owner (cancelled, swept, deleted, or the
            // store was lost): whoever ends it may not have yet, so the
            // lease is dropped, not released. It lapses, and a sweeper
            // either ends the run or finds it ended and removes the lease.
            drop(ownership);
        }
        drop(in_flight);
    }
}

/// The sink of a background run: Responses events into the run's
/// stored event log, one store write per delivered batch.
struct RunWriter {
    id: String,
    runs: Arc<Runs>,
    encoder: ResponseEncoder,
    frames: Vec<EncodedEvent>,
    /// The store kept failing and the owner gave up: its lease is kept, not
    /// released, so that once it expires a sweeper fails the run.
    store_lost: bool,
    /// This owner wrote the run's terminal status.
    ended_here: bool,
}

impl RunWriter {
    async fn run(
        &mut self,
        pools: &Pools,
        model: &'static ModelSpec,
        work: pb::GenerateRequest,
        trace: telemetry::TraceParent,
        reservation: Reservation,
        timeout: Duration,
    ) {
        self.encoder.start(&mut self.frames);
        let object = self.encoder.object.clone();
        if self.write(Some(&object)).await.is_err() {
            reservation.settle(Outcome::NotRun).await;
            return;
        }
        let generation = Generation {
            pools,
            model: model.id,
            work,
            trace,
            deadline: tokio::time::Instant::now() + timeout,
            timed_from: None,
        };
        if let End::NotStarted(e) = generation.run(reservation, self).await {
            self.fail_run(&e).await;
        }
    }

    /// Ends the run as `failed` (unless someone else ended it first).
    async fn fail_run(&mut self, e: &ApiError) {
        self.encoder.fail(e, &mut self.frames);
        let object = self.encoder.object.clone();
        let _ = self.write(Some(&object)).await;
    }

    /// Writes a batch. A store failure is retried (writes are idempotent,
    /// so a retry of a write that landed is success) for up to one lease,
    /// while the heartbeat keeps the lease alive; then the owner gives up
    /// and leaves the run to the sweeper (`store_lost`).
    async fn write(
        &mut self,
        object: Option<&crate::api::responses::ResponseObject>,
    ) -> Result<(), Gone> {
        let id = self.id.as_str();
        if self.frames.is_empty() && object.is_none() {
            return Ok(());
        }
        let give_up = tokio::time::Instant::now() + self.runs.lease;
        let frames = &self.frames;
        let written = super::retry_store(id, give_up, WRITE_RETRY_FIRST, WRITE_RETRY_MAX, || {
            self.runs.store.write(id, object, frames)
        })
        .await;
        match written {
            Ok(WriteOutcome::Written) => {
                self.frames.clear();
                self.ended_here = object.is_some_and(|o| o.is_terminal());
                Ok(())
            }
            // Cancelled, failed by a sweeper, or deleted: someone else ended it.
            Ok(_) => Err(Gone),
            Err(_) => {
                self.store_lost = true;
                Err(Gone)
            }
        }
    }

    /// Resolves once the run was ended elsewhere (cancel, sweeper, delete).
    async fn preempted(&self) {
        loop {
            tokio::time::sleep(self.runs.cancel_poll).await;
            match self.runs.store.status(&self.id).await {
                Ok(Some(s)) if !crate::api::responses::is_terminal_status(&s) => {}
                Ok(_) => return,
                // A store blip is not a cancel.
                Err(_) => {}
            }
        }
    }
}

impl Sink for RunWriter {
    fn event(&mut self, event: pb::GenerateEvent) {
        self.encoder.event(event, &mut self.frames);
    }

    fn batch_full(&self, _events: usize) -> bool {
        self.frames.len() >= MAX_BATCH
    }

    /// One store write; its answer says whether the run was cancelled or
    /// deleted meanwhile.
    async fn deliver(&mut self) -> Result<(), Gone> {
        let terminal = self.encoder.is_done().then(|| self.encoder.object.clone());
        self.write(terminal.as_ref()).await
    }

    async fn gone(&mut self) {
        self.preempted().await
    }

    async fn gone_while_starting(&mut self) {
        self.preempted().await
    }

    async fn fail(&mut self, e: &ApiError) {
        self.fail_run(e).await
    }
}

//! Drives one background response from `queued` to a terminal status,
//! detached from the request that created it.
//!
//! The generation itself goes through the one driver (`generation`); this
//! module is its sink into the store. Every batch of worker events that
//! is ready at once becomes one store write (one round trip), and the
//! write's answer tells the owner whether the run was cancelled or deleted
//! meanwhile; while the worker is quiet the owner polls the status every
//! `cancel_poll`. Either way the driver then drops the worker call, which
//! cancels the generation on the worker. Every store call goes through the
//! run's [`StoredRun`] handle.

use super::{Runs, StoredRun};
use crate::accounts::ServiceTier;
use crate::api::responses::EncodedEvent;
use crate::catalog::ModelSpec;
use crate::error::ApiError;
use crate::generation::{End, Generation, Gone, Sink};
use crate::lifecycle::InFlight;
use crate::limits::{Outcome, Reservation};
use crate::pool::Pools;
use crate::translate::responses::ResponseEncoder;
use inference_proto::v1 as pb;
use std::sync::Arc;
use std::time::Duration;

/// Most events folded into one store write.
const MAX_BATCH: usize = 256;

pub struct BackgroundRun {
    pub runs: Arc<Runs>,
    pub pools: Arc<Pools>,
    pub model: &'static ModelSpec,
    pub work: pb::GenerateRequest,
    /// The creating request's trace context, sent to the worker.
    pub trace: telemetry::TraceParent,
    pub encoder: ResponseEncoder,
    pub run: StoredRun,
    /// The request's hold on its plan's limits, settled when the run ends.
    pub reservation: Reservation,
    /// Upper bound on the whole generation.
    pub timeout: Duration,
    /// Its place in the order of a saturated pool.
    pub tier: ServiceTier,
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
            run,
            reservation,
            timeout,
            tier,
            in_flight,
        } = self;
        let mut writer = RunWriter {
            stored: run,
            encoder,
            frames: Vec::new(),
        };
        // Every step below has its own bound, but the run as a whole gets
        // one too: past it the generation is dropped (cancelling it on the
        // worker) and the run fails, whatever it was waiting on.
        let bound = timeout + runs.lease;
        let generation = Generation {
            pools: &pools,
            model: model.id,
            work,
            trace,
            deadline: tokio::time::Instant::now() + timeout,
            timed_from: None,
            tier,
        };
        let ran = tokio::time::timeout(bound, writer.run(generation, reservation)).await;
        if ran.is_err() {
            writer.stored.fail_overdue().await;
        }
        // Released if this owner ended the run, else left to lapse.
        writer.stored.release().await;
        drop(in_flight);
    }
}

/// The sink of a background run: Responses events into the run's
/// stored event log, one store write per delivered batch.
struct RunWriter {
    stored: StoredRun,
    encoder: ResponseEncoder,
    frames: Vec<EncodedEvent>,
}

impl RunWriter {
    /// Records the run's start, then drives its generation into the store.
    async fn run(&mut self, generation: Generation<'_>, reservation: Reservation) {
        self.encoder.start(&mut self.frames);
        let object = self.encoder.object.clone();
        if self.write(Some(&object)).await.is_err() {
            reservation.settle(Outcome::NotRun).await;
            return;
        }
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

    /// Writes the pending events (and `object`); the run's handle retries
    /// a failing store for up to one lease.
    async fn write(
        &mut self,
        object: Option<&crate::api::responses::ResponseObject>,
    ) -> Result<(), Gone> {
        self.stored
            .write(object, &self.frames)
            .await
            .map_err(|_| Gone)?;
        self.frames.clear();
        Ok(())
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
        self.stored.ended_elsewhere().await
    }

    async fn gone_while_starting(&mut self) {
        self.stored.ended_elsewhere().await
    }

    async fn fail(&mut self, e: &ApiError) {
        self.fail_run(e).await
    }
}

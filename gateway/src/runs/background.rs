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
//!
//! On a draining replica, when a peer shares the store (`handover.rs`): a
//! run whose worker has not started yet (queued in the pool, or waiting
//! for its first event) is handed over at once, and a peer's sweeper runs
//! it from the start; a run already generating keeps going through the
//! grace period, and if that runs out it is handed over with the output
//! stored so far, which the peer's worker continues (the way a generation
//! moves off a failed worker). With the in-process store, which no other
//! replica could adopt, a run cut by the grace period ends `incomplete`
//! with the output stored so far.

use super::handover::HandOver;
use super::{Runs, StoredRun, REPLICA_SHUTDOWN};
use crate::accounts::ServiceTier;
use crate::api::responses::EncodedEvent;
use crate::catalog::ModelSpec;
use crate::error::ApiError;
use crate::generation::{Delivered, End, Generation, Gone, Sink};
use crate::lifecycle::{InFlight, Shutdown};
use crate::limits::{Outcome, Reservation};
use crate::output_check::OutputFormat;
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
    /// The replica's drain: hand over or stop early.
    pub shutdown: Arc<Shutdown>,
    /// What a peer needs to take the run over.
    pub origin: Origin,
    /// Adopted from a replica that handed it over: its log already opened.
    pub resumed: bool,
}

/// Where a run came from, as a peer adopting it needs it
/// ([`HandOver`]): the rest is the run's own.
pub struct Origin {
    /// The creating key's sha256.
    pub key_digest: [u8; 32],
    pub format: OutputFormat,
    pub input_estimate: u64,
    pub max_output_tokens: u32,
}

/// What a run's hand-over record needs.
struct HandOverCopy {
    work: pb::GenerateRequest,
    origin: Origin,
    tier: ServiceTier,
    timeout: Duration,
    trace: telemetry::TraceParent,
}

impl HandOverCopy {
    fn record(&self) -> HandOver {
        HandOver::new(
            self.origin.key_digest,
            &self.work,
            &self.origin.format,
            self.origin.input_estimate,
            self.origin.max_output_tokens,
            self.tier,
            self.timeout,
            self.trace,
        )
    }
}

/// Why a run stopped on a draining replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Not stopped by the drain.
    No,
    /// Handed to a peer: before its worker started, or with the output
    /// delivered when the grace period ran out.
    HandOver,
    /// The grace period ran out while it was generating.
    Cut,
}

impl BackgroundRun {
    /// Runs to the end (here, or handed to a peer on a drain).
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
            shutdown,
            origin,
            resumed,
        } = self;
        // A run that a peer could adopt keeps a copy of its worker request
        // for the hand-over record; the in-process store has no peer to
        // hand it to.
        let handover = runs.store.shared().then(|| HandOverCopy {
            work: work.clone(),
            origin,
            tier,
            timeout,
            trace,
        });
        let mut writer = RunWriter {
            stored: run,
            encoder,
            frames: Vec::new(),
            shutdown,
            handover,
            delivered: None,
            stop: Stop::No,
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
        let ran = tokio::time::timeout(bound, writer.run(generation, reservation, resumed)).await;
        if ran.is_err() {
            writer.stored.fail_overdue().await;
        }
        match (writer.stop, writer.handover.take()) {
            (Stop::HandOver, Some(mut copy)) => {
                copy.work.resume = writer.delivered.take();
                writer.stored.hand_over(&copy.record()).await
            }
            // Released if this owner ended the run, else left to lapse.
            _ => writer.stored.release().await,
        }
        drop(in_flight);
    }
}

/// The sink of a background run: Responses events into the run's
/// stored event log, one store write per delivered batch.
struct RunWriter {
    stored: StoredRun,
    encoder: ResponseEncoder,
    frames: Vec<EncodedEvent>,
    shutdown: Arc<Shutdown>,
    /// Set when a peer could adopt the run: the store is shared.
    handover: Option<HandOverCopy>,
    /// What the run's log holds of the generation, once it stopped early.
    delivered: Option<pb::Resume>,
    stop: Stop,
}

impl RunWriter {
    /// Records the run's start (an adopted run's log is already open),
    /// then drives its generation into the store.
    async fn run(&mut self, generation: Generation<'_>, reservation: Reservation, resumed: bool) {
        if !resumed {
            self.encoder.start(&mut self.frames);
        }
        let object = self.encoder.object.clone();
        if self.write(Some(&object)).await.is_err() {
            reservation.settle(Outcome::NotRun).await;
            return;
        }
        match generation.run(reservation, self).await {
            End::NotStarted(e) => self.fail_run(&e).await,
            // A peer continues it from its log.
            End::Gone
                if self.stop == Stop::Cut
                    && self.handover.is_some()
                    && self.delivered.is_some() =>
            {
                self.stop = Stop::HandOver;
            }
            End::Gone if self.stop == Stop::Cut => self.stop_early().await,
            _ => {}
        }
    }

    /// The grace period ran out: the run ends `incomplete` with the output
    /// stored so far (what a follower was shown), unless it ended already.
    async fn stop_early(&mut self) {
        self.encoder.stop_early(REPLICA_SHUTDOWN, &mut self.frames);
        let object = self.encoder.object.clone();
        let _ = self.write(Some(&object)).await;
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
    /// Every event the generation relayed here was written before it left
    /// (the last batch in [`Sink::deliver`], or the worker was quiet).
    fn left(&mut self, delivered: &Delivered) {
        if self.handover.is_some() {
            self.delivered = Some(delivered.resume());
        }
    }

    fn event(&mut self, event: pb::GenerateEvent) {
        self.encoder.event(event, &mut self.frames);
    }

    fn batch_full(&self, _events: usize) -> bool {
        self.frames.len() >= MAX_BATCH
    }

    /// One store write; its answer says whether the run was cancelled or
    /// deleted meanwhile. Once the grace period ran out, the batch is the
    /// run's last (see [`RunWriter::stop_early`]).
    async fn deliver(&mut self) -> Result<(), Gone> {
        let terminal = self.encoder.is_done().then(|| self.encoder.object.clone());
        self.write(terminal.as_ref()).await?;
        if !self.encoder.is_done() && self.shutdown.is_cutting() {
            self.stop = Stop::Cut;
            return Err(Gone);
        }
        Ok(())
    }

    async fn gone(&mut self) {
        tokio::select! {
            _ = self.stored.ended_elsewhere() => {}
            _ = self.shutdown.cutting() => self.stop = Stop::Cut,
        }
    }

    fn cut_by_replica(&self) -> bool {
        self.stop == Stop::Cut
    }

    /// The pool's queue keeps it on a drain: [`Sink::gone_while_starting`]
    /// hands it over, or it waits when no peer could take it.
    fn hands_over_on_drain(&self) -> bool {
        true
    }

    /// Before its worker started, a run on a draining replica goes to a
    /// peer at once: nothing of it was generated, billed or stored yet.
    async fn gone_while_starting(&mut self) {
        let can_hand_over = self.handover.is_some();
        tokio::select! {
            _ = self.stored.ended_elsewhere() => {}
            _ = self.shutdown.draining(), if can_hand_over => self.stop = Stop::HandOver,
            _ = self.shutdown.cutting() => self.stop = Stop::Cut,
        }
    }

    async fn fail(&mut self, e: &ApiError) {
        self.fail_run(e).await
    }
}

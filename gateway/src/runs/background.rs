//! Drives one background response from `queued` to a terminal status,
//! detached from the request that created it.
//!
//! Every batch of worker events that is ready at once becomes one store
//! write (one round trip), and the write's answer tells the owner whether
//! the run was cancelled or deleted meanwhile; while the worker is quiet the
//! owner polls the status every `cancel_poll`. Either way it then drops the
//! worker call, which cancels the generation on the worker.

use super::{Ownership, Runs};
use crate::error::ApiError;
use crate::limits::{Outcome, Reservation};
use crate::pool::{classify, Pools};
use crate::store::WriteOutcome;
use crate::translate::responses::{Frame, ResponseEncoder};
use crate::{catalog::ModelSpec, lifecycle};
use futures::FutureExt;
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
    /// Output events relayed so far (billed if the run is abandoned).
    pub output_seen: u64,
    /// The store kept failing and the owner gave up: its lease is kept, not
    /// released, so that once it expires a sweeper fails the run.
    pub store_lost: bool,
}

/// How the owner's part of a run ended, for settling its limits.
enum RunEnd {
    /// The worker finished and reported usage.
    Finished(pb::Finished),
    /// No worker generated anything.
    NotRun,
    /// Stopped part way (cancelled, failed, deleted).
    Abandoned,
}

/// Why the owner stopped before writing a terminal status itself.
enum Stop {
    /// Cancelled, failed by a sweeper, or deleted: someone else ended it.
    Preempted,
    /// The store failed for longer than a lease.
    StoreLost,
}

impl BackgroundRun {
    /// Runs to the end. Counted as in-flight work, so a draining replica
    /// waits for it within its grace period.
    pub async fn drive(mut self) {
        let _in_flight = lifecycle::InFlight::begin();
        let id = self.encoder.object.id.clone();
        let end = self.run(&id).await;
        let BackgroundRun {
            ownership,
            mut reservation,
            output_seen,
            store_lost,
            ..
        } = self;
        reservation.observe_output(output_seen);
        match end {
            RunEnd::Finished(f) => {
                let u = f.usage.unwrap_or_default();
                reservation.settle(Outcome::Finished(&u)).await;
            }
            RunEnd::NotRun => reservation.settle(Outcome::NotRun).await,
            RunEnd::Abandoned => reservation.settle(Outcome::Abandoned).await,
        }
        if store_lost {
            // No terminal status could be written: dropping the ownership
            // stops the heartbeat, and the lease left in the store expires
            // into a sweep that fails the run.
            tracing::warn!(response_id = %id, "the store failed for a whole lease; the run is left to the sweeper");
            drop(ownership);
        } else {
            ownership.release().await;
        }
    }

    async fn run(&mut self, id: &str) -> RunEnd {
        let mut frames = Vec::new();
        self.encoder.start(&mut frames);
        let object = self.encoder.object.clone();
        if self.write(id, Some(&object), &mut frames).await.is_err() {
            return RunEnd::NotRun;
        }
        let deadline = tokio::time::Instant::now() + self.timeout;
        let Some(pool) = self.pools.get(self.model.id).cloned() else {
            let e = ApiError::overloaded(format!(
                "Model '{}' has no workers configured.",
                self.model.id
            ));
            self.fail(id, &e, &mut frames).await;
            return RunEnd::NotRun;
        };
        let call = tokio::select! {
            call = pool.generate(self.work.clone(), &self.trace) => call,
            _ = self.preempted(id) => return RunEnd::NotRun,
            _ = tokio::time::sleep_until(deadline) => Err(ApiError::timeout("No worker answered before the request deadline.")),
        };
        let call = match call {
            Ok(call) => call,
            Err(e) => {
                self.fail(id, &e, &mut frames).await;
                return RunEnd::NotRun;
            }
        };
        self.reservation.mark_started();
        let crate::pool::WorkerCall {
            first,
            mut rest,
            guard,
        } = call;
        let mut finished = finished_of(&first);
        self.output_seen += u64::from(is_output(&first));
        self.encoder.event(first, &mut frames);
        loop {
            // Fold whatever else is ready into this batch.
            while finished.is_none() && frames.len() < MAX_BATCH {
                match rest.message().now_or_never() {
                    None => break,
                    Some(next) => match self.take(next, &mut frames, &guard) {
                        Ok(f) => finished = f,
                        Err(e) => {
                            self.fail(id, &e, &mut frames).await;
                            return RunEnd::Abandoned;
                        }
                    },
                }
            }
            let terminal = self.encoder.is_done().then(|| self.encoder.object.clone());
            if self
                .write(id, terminal.as_ref(), &mut frames)
                .await
                .is_err()
            {
                return RunEnd::Abandoned;
            }
            if terminal.is_some() {
                return match finished {
                    Some(f) => {
                        guard.record_finished();
                        RunEnd::Finished(f)
                    }
                    // Ended by a failure the encoder recorded.
                    None => RunEnd::Abandoned,
                };
            }
            let next = tokio::select! {
                biased;
                next = rest.message() => next,
                _ = self.preempted(id) => return RunEnd::Abandoned,
                _ = tokio::time::sleep_until(deadline) => {
                    let e = ApiError::timeout("The generation exceeded the request deadline.");
                    self.fail(id, &e, &mut frames).await;
                    return RunEnd::Abandoned;
                }
            };
            match self.take(next, &mut frames, &guard) {
                Ok(f) => finished = f,
                Err(e) => {
                    self.fail(id, &e, &mut frames).await;
                    return RunEnd::Abandoned;
                }
            }
        }
    }

    /// Encodes one worker message; a worker failure becomes an error.
    fn take(
        &mut self,
        next: Result<Option<pb::GenerateEvent>, tonic::Status>,
        frames: &mut Vec<Frame>,
        guard: &crate::pool::CallGuard,
    ) -> Result<Option<pb::Finished>, ApiError> {
        match next {
            Ok(Some(event)) => {
                let finished = finished_of(&event);
                self.output_seen += u64::from(is_output(&event));
                self.encoder.event(event, frames);
                Ok(finished)
            }
            Ok(None) => {
                guard.record_stream_failure(None);
                Err(ApiError::upstream(
                    "The model worker ended the stream before finishing.",
                ))
            }
            Err(status) => {
                guard.record_stream_failure(Some(&status));
                tracing::warn!(response_id = %self.encoder.object.id, "worker failed mid-run: {status}");
                let mut e = classify(&status).error;
                if e.status < 500 {
                    e = ApiError::upstream(e.message);
                }
                Err(e)
            }
        }
    }

    /// Ends the run as `failed` (unless someone else ended it first).
    async fn fail(&mut self, id: &str, e: &ApiError, frames: &mut Vec<Frame>) {
        self.encoder.fail(e, frames);
        let object = self.encoder.object.clone();
        let _ = self.write(id, Some(&object), frames).await;
    }

    /// Writes a batch. A store failure is retried (writes are idempotent,
    /// so a retry of a write that landed is success) for up to one lease,
    /// while the heartbeat keeps the lease alive; then the owner gives up
    /// and leaves the run to the sweeper (`store_lost`).
    async fn write(
        &mut self,
        id: &str,
        object: Option<&crate::api::responses::ResponseObject>,
        frames: &mut Vec<Frame>,
    ) -> Result<(), Stop> {
        if frames.is_empty() && object.is_none() {
            return Ok(());
        }
        let give_up = tokio::time::Instant::now() + self.runs.lease;
        let mut backoff = WRITE_RETRY_FIRST;
        loop {
            match self.runs.store.write(id, object, frames).await {
                Ok(WriteOutcome::Written) => {
                    frames.clear();
                    return Ok(());
                }
                Ok(_) => return Err(Stop::Preempted),
                Err(e) if tokio::time::Instant::now() + backoff < give_up => {
                    tracing::warn!(response_id = %id, "store write failed, retrying: {}", e.message);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(WRITE_RETRY_MAX);
                }
                Err(_) => {
                    self.store_lost = true;
                    return Err(Stop::StoreLost);
                }
            }
        }
    }

    /// Resolves once the run was ended elsewhere (cancel, sweeper, delete).
    async fn preempted(&self, id: &str) {
        loop {
            tokio::time::sleep(self.runs.cancel_poll).await;
            match self.runs.store.status(id).await {
                Ok(Some(s)) if !crate::api::responses::is_terminal_status(&s) => {}
                Ok(_) => return,
                // A store blip is not a cancel.
                Err(_) => {}
            }
        }
    }
}

/// Whether a worker event carries generated output (about one token each).
fn is_output(event: &pb::GenerateEvent) -> bool {
    use pb::generate_event::Event;
    matches!(
        event.event,
        Some(Event::Text(_) | Event::Reasoning(_) | Event::ToolCall(_))
    )
}

fn finished_of(event: &pb::GenerateEvent) -> Option<pb::Finished> {
    match &event.event {
        Some(pb::generate_event::Event::Finished(f)) => Some(*f),
        _ => None,
    }
}

//! The one driver of a generation, from the worker pool to the end of the
//! reply, whatever the reply's wire format.
//!
//! Its stages, in order: find the model's pool; start the call before the
//! deadline (`pool::generate` retries on another worker until the first
//! event); time the first token; start the consumer's output; relay events
//! in batches (`relay.rs`), with a failure after the first token delivered
//! in band; read a finished call to its trailers; settle the reservation on
//! every ending. What differs between chat streams, chat bodies, Responses
//! events, background runs and planner model calls is only where the
//! events go: a [`Sink`] (`routes/sinks.rs` and `routes/sinks_messages.rs`
//! for HTTP replies, `routes/responses_ws.rs` for a WebSocket,
//! `runs::background` for the store, `planner_mode::calls` for a plan).
//! A sink that answers a client holds its reply's end ([`Sink::holds_end`]):
//! the batch carrying the worker's `Finished` event waits for the caller,
//! who delivers it once it has stored what the reply tells. This module
//! knows nothing of HTTP.

mod delivered;
mod relay;

use crate::accounts::ServiceTier;
use crate::error::ApiError;
use crate::limits::{Outcome, Reservation};
use crate::pool::{Pools, Stage, Ticket, WorkerCall, WorkerPool};
pub use delivered::Delivered;
use inference_proto::v1 as pb;
use relay::{Paused, Relayed, WorkerFailure};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use telemetry::TraceParent;
use tokio::time::Instant;

/// Most events folded into one delivery to a client.
const MAX_BATCH: usize = 64;

/// Workers a generation may move to after the one it started on failed.
pub const MAX_MOVES: usize = 2;

/// The consumer of a generation went away: the client disconnected, or a
/// background run was ended elsewhere (or its store was lost).
#[derive(Debug)]
pub struct Gone;

/// Where a generation's events go, in the consumer's wire format.
pub trait Sink {
    /// The call started on a worker: a stream's response head goes out
    /// here (its opening frames wait for the first delivery).
    fn started(&mut self) -> impl Future<Output = Result<(), Gone>> + Send {
        async { Ok(()) }
    }
    /// Encodes one worker event into the pending batch.
    fn event(&mut self, event: pb::GenerateEvent);
    /// Whether the pending batch (`events` events) is as large as one
    /// delivery should be.
    fn batch_full(&self, events: usize) -> bool {
        events >= MAX_BATCH
    }
    /// Delivers the pending batch (one write to the client or the store).
    fn deliver(&mut self) -> impl Future<Output = Result<(), Gone>> + Send;
    /// Whether the batch that carries the worker's `Finished` event stays
    /// pending for the caller, who delivers it ([`Sink::deliver`]) once it
    /// has stored what the reply tells (the stored response, an
    /// `Idempotency-Key`'s record): a client that reads the end and at once
    /// retrieves the response, chains to it or retries its key finds it.
    /// Every sink that answers a client holds its end; a background run's
    /// last write is the store's own.
    fn holds_end(&self) -> bool {
        false
    }
    /// Resolves when the consumer goes away while the worker is quiet.
    fn gone(&mut self) -> impl Future<Output = ()> + Send;
    /// How long the worker may be quiet mid-generation before the consumer
    /// is sent a keep-alive ([`Self::keep_alive`]); `None`: never. The
    /// relay keeps the time, so a keep-alive is never written into the
    /// middle of a delivery.
    fn keep_alive_period(&self) -> Option<Duration> {
        None
    }
    /// Sends a keep-alive into a silence of the worker (an Anthropic
    /// stream's `ping`).
    fn keep_alive(&mut self) -> impl Future<Output = Result<(), Gone>> + Send {
        async { Ok(()) }
    }
    /// Resolves when the consumer goes away before a worker answered (its
    /// request queued, or its prompt still being read): the call is
    /// dropped, which cancels it on the worker.
    fn gone_while_starting(&mut self) -> impl Future<Output = ()> + Send;
    /// Whether, on a draining replica, the consumer hands a generation
    /// still waiting for a worker to a peer itself (a background run):
    /// otherwise the pool's queue answers it (503 `replica_shutdown`).
    fn hands_over_on_drain(&self) -> bool {
        false
    }
    /// The generation failed after its first event: deliver what is
    /// pending, then the failure, in band.
    fn fail(&mut self, e: &ApiError) -> impl Future<Output = ()> + Send;
    /// Whether the generation stopped because this replica cut it (the
    /// drain's grace period ran out) rather than because its consumer
    /// left: the output its worker generated past the last delivery is
    /// then billed to nobody.
    fn cut_by_replica(&self) -> bool {
        false
    }
    /// Whether the consumer gets the output only at the end, in one body:
    /// cut by this replica before then, its client got nothing but an
    /// error to retry, and is billed nothing.
    fn answers_at_end(&self) -> bool {
        false
    }
    /// The consumer went away after the generation started; `delivered`
    /// is everything it was given, which a continuation elsewhere would
    /// resume from (a background run handed to another replica). Borrowed:
    /// only such a sink copies it.
    fn left(&mut self, delivered: &Delivered) {
        let _ = delivered;
    }
}

/// How a generation ended. The reservation is already settled.
#[derive(Debug)]
pub enum End {
    /// No worker started the call; nothing reached the consumer.
    NotStarted(ApiError),
    /// The worker finished; everything was delivered, but for a sink that
    /// holds its end ([`Sink::holds_end`]) the last batch, which the caller
    /// delivers.
    Finished(pb::Finished),
    /// The consumer went away; the worker's generation was cancelled.
    Gone,
    /// The worker failed after the first event; the sink delivered the
    /// failure in band.
    Failed(ApiError),
}

/// The tier as the worker protocol names it.
fn worker_tier(tier: ServiceTier) -> pb::ServiceTier {
    match tier {
        ServiceTier::Priority => pb::ServiceTier::Priority,
        ServiceTier::Default => pb::ServiceTier::Default,
        ServiceTier::Flex => pb::ServiceTier::Flex,
    }
}

/// One generation to drive.
pub struct Generation<'a> {
    pub pools: &'a Pools,
    pub model: &'static str,
    /// The worker request; with `resume` set, the generation continues
    /// output delivered (and billed) elsewhere, and bills only what it adds.
    pub work: pb::GenerateRequest,
    /// Sent to the worker as `traceparent`.
    pub trace: TraceParent,
    /// Upper bound on the whole generation, first event included.
    pub deadline: Instant,
    /// When the request started, for the time-to-first-token metric; `None`
    /// for replies without a first token to time (a non-streaming reply
    /// comes from the worker in one batch at its end).
    pub timed_from: Option<std::time::Instant>,
    /// Its place in the order of a saturated pool.
    pub tier: ServiceTier,
}

impl Generation<'_> {
    /// Drives the generation to its end through `sink`, and settles
    /// `reservation` however it ends.
    pub async fn run<S: Sink>(mut self, mut reservation: Reservation, sink: &mut S) -> End {
        self.work.service_tier = worker_tier(self.tier) as i32;
        let request_id = self.work.request_id.clone();
        let account = reservation.account();
        let ticket = Ticket {
            org: Arc::clone(&account.principal.org),
            tier: self.tier,
            weight: account.plan.weight,
            input_tokens: reservation.input_estimate(),
            stage: if sink.hands_over_on_drain() {
                Stage::Detached
            } else {
                Stage::New
            },
            preemptions: 0,
        };
        let started = tokio::select! {
            call = start(self.pools, self.model, &self.work, &self.trace, self.deadline, ticket.clone()) => call,
            _ = sink.gone_while_starting() => {
                reservation.settle(Outcome::NotRun).await;
                return End::Gone;
            }
        };
        let mut call = match started {
            Ok(call) => call,
            Err(e) => {
                reservation.settle(Outcome::NotRun).await;
                return End::NotStarted(e);
            }
        };
        reservation.mark_started();
        if let Some(from) = self.timed_from {
            if let Some(series) = crate::metrics::model_series(self.model) {
                series
                    .time_to_first_token()
                    .observe(from.elapsed().as_secs_f64());
            }
        }
        // Boxed, as the other once-only stages below: a stream's state
        // then holds only what its relay waits on.
        let head = Box::pin(sink.started());
        if head.await.is_err() {
            reservation.settle(Outcome::Abandoned).await;
            return End::Gone;
        }
        let stall_timeout =
            pool_of(self.pools, self.model).map_or(Duration::from_secs(30), |p| p.stall_timeout());
        let continued = self.work.resume.as_ref();
        let mut delivered = continued.map(Delivered::from_resume).unwrap_or_default();
        let delivered_before = continued.map_or(0, |r| u64::from(r.completion_tokens));
        let mut failed_on: Vec<String> = Vec::new();
        let constrained = !self.work.tools.is_empty() || self.work.response_format.is_some();
        let mut preemptions = 0;
        let end = loop {
            let relayed = relay::relay(
                call,
                self.deadline,
                stall_timeout,
                self.model,
                &request_id,
                constrained,
                sink,
                &mut delivered,
            )
            .await;
            let failure = match relayed {
                Relayed::Ended(end) => break end,
                Relayed::WorkerFailed(failure) => failure,
                Relayed::Preempted(paused) => {
                    preemptions += 1;
                    let ticket = Ticket {
                        preemptions,
                        ..ticket.clone()
                    };
                    // Boxed, as a move is: its state is needed only while
                    // paused, and inline it would be part of every stream's.
                    let resumed =
                        Box::pin(self.resume(&paused, &failed_on, &delivered, ticket, sink));
                    match resumed.await {
                        Resumed::Call(next) => {
                            call = *next;
                            continue;
                        }
                        Resumed::Gone => break End::Gone,
                        Resumed::Failed(e) => {
                            relay::count_stream_failure(self.model, &e);
                            let fail = Box::pin(sink.fail(&e));
                            fail.await;
                            break End::Failed(e);
                        }
                    }
                }
            };
            failed_on.push(failure.worker.clone());
            let moved = Box::pin(self.move_on(&failure, &failed_on, &delivered, &ticket));
            match moved.await {
                Some(next) => call = next,
                None => {
                    relay::count_stream_failure(self.model, &failure.error);
                    let fail = Box::pin(sink.fail(&failure.error));
                    fail.await;
                    break End::Failed(failure.error);
                }
            }
        };
        reservation.observe_output(delivered.billable_tokens().saturating_sub(delivered_before));
        let withdrawn = matches!(end, End::Gone) && sink.cut_by_replica() && sink.answers_at_end();
        match &end {
            End::Finished(f) => {
                let usage = billable(f.usage.unwrap_or_default(), continued);
                reservation.settle(Outcome::Finished(&usage)).await;
            }
            _ if withdrawn => reservation.settle(Outcome::NotRun).await,
            _ => reservation.settle(Outcome::Abandoned).await,
        }
        if matches!(end, End::Gone) {
            sink.left(&delivered);
        }
        end
    }

    /// Moves the generation off the worker that failed: starts it again on
    /// another worker of the pool that continues the delivered output
    /// (`failed_on`: every worker it failed on, skipped), within the
    /// deadline. `None` when it cannot move (the failure says it would fail
    /// anywhere, the moves are spent, no worker can take it, or it did not
    /// start in time): the failure is then delivered in band.
    async fn move_on(
        &self,
        failure: &WorkerFailure,
        failed_on: &[String],
        delivered: &Delivered,
        ticket: &Ticket,
    ) -> Option<WorkerCall> {
        let moves = crate::metrics::generation_moves(self.model, failure.reason);
        if !failure.movable || failed_on.len() > MAX_MOVES {
            moves.refused();
            return None;
        }
        let pool = pool_of(self.pools, self.model).ok()?;
        let mut work = self.work.clone();
        work.resume = Some(delivered.resume());
        let start = pool.continue_elsewhere(&work, &self.trace, ticket.clone(), failed_on);
        match tokio::time::timeout_at(self.deadline, start).await {
            Ok(Ok(call)) => {
                let since = failure.last_output.unwrap_or_else(std::time::Instant::now);
                moves.moved(since.elapsed());
                tracing::info!(
                    request_id = %work.request_id,
                    from = %failure.worker,
                    to = %call.guard.worker(),
                    reason = failure.reason,
                    delivered_tokens = delivered.tokens(),
                    "generation moved to another worker"
                );
                Some(call)
            }
            Ok(Err(e)) => {
                tracing::warn!(request_id = %work.request_id, reason = failure.reason, "generation could not move: {e:?}");
                moves.failed();
                None
            }
            Err(_) => {
                moves.failed();
                None
            }
        }
    }
}

/// How a preempted generation's wait to resume ended.
enum Resumed {
    /// Boxed: it is rare, and the driver's state stays small.
    Call(Box<WorkerCall>),
    /// Its consumer went away (or the drain cut it) while it waited.
    Gone,
    /// It could not resume (no worker took it, the deadline): the failure
    /// to deliver in band.
    Failed(ApiError),
}

impl Generation<'_> {
    /// Resumes a preempted generation: it waits in its pool's queue, first
    /// of its tier and past the queue's timeout (only its deadline holds),
    /// then continues what it delivered on whichever worker routing picks.
    /// Meanwhile its consumer gets its keep-alives and may leave (or the
    /// drain cut it: it then ends in band like a running stream).
    async fn resume<S: Sink>(
        &self,
        paused: &Paused,
        failed_on: &[String],
        delivered: &Delivered,
        ticket: Ticket,
        sink: &mut S,
    ) -> Resumed {
        let pool = match pool_of(self.pools, self.model) {
            Ok(pool) => pool,
            Err(e) => return Resumed::Failed(e),
        };
        crate::metrics::preempted(
            self.model,
            ticket.tier.as_str(),
            &ticket.org,
            ticket.input_tokens + delivered.tokens(),
        );
        let mut work = self.work.clone();
        work.resume = Some(delivered.resume());
        let start = tokio::time::timeout_at(
            self.deadline,
            pool.continue_elsewhere(&work, &self.trace, ticket, failed_on),
        );
        tokio::pin!(start);
        let every = sink.keep_alive_period();
        let moves = crate::metrics::generation_moves(self.model, "preempted");
        loop {
            let keep_alive = tokio::time::sleep(every.unwrap_or(Duration::MAX));
            tokio::select! {
                started = &mut start => {
                    return match started {
                        Ok(Ok(call)) => {
                            let since = paused.last_output.unwrap_or_else(std::time::Instant::now);
                            moves.count_moved();
                            crate::metrics::preemption_resumed(self.model, since.elapsed());
                            tracing::debug!(
                                request_id = %work.request_id,
                                to = %call.guard.worker(),
                                delivered_tokens = delivered.tokens(),
                                "preempted generation resumed"
                            );
                            Resumed::Call(Box::new(call))
                        }
                        Ok(Err(e)) => {
                            moves.failed();
                            tracing::warn!(request_id = %work.request_id, "preempted generation could not resume: {e:?}");
                            Resumed::Failed(relay::after_first_token(ApiError::from(e)))
                        }
                        Err(_) => {
                            moves.failed();
                            Resumed::Failed(ApiError::timeout(
                                "The generation exceeded the request deadline.",
                            ))
                        }
                    };
                }
                _ = sink.gone() => return Resumed::Gone,
                _ = keep_alive, if every.is_some() => {
                    if sink.keep_alive().await.is_err() {
                        return Resumed::Gone;
                    }
                }
            }
        }
    }
}

/// What a generation bills of the usage its worker reported: all of it,
/// or for a continuation only the output it added (the prompt and the
/// output it continues were billed where they were delivered).
fn billable(usage: pb::Usage, continued: Option<&pb::Resume>) -> pb::Usage {
    let Some(before) = continued else {
        return usage;
    };
    pb::Usage {
        prompt_tokens: 0,
        cached_prompt_tokens: 0,
        image_tokens: 0,
        completion_tokens: usage
            .completion_tokens
            .saturating_sub(before.completion_tokens),
        reasoning_tokens: usage
            .reasoning_tokens
            .saturating_sub(before.reasoning_tokens),
    }
}

/// The pool of `model`; a model without workers is a 503.
pub fn pool_of<'a>(pools: &'a Pools, model: &str) -> Result<&'a Arc<WorkerPool>, ApiError> {
    pools
        .get(model)
        .ok_or_else(|| ApiError::overloaded(format!("Model '{model}' has no workers configured.")))
}

/// Starts the call on a worker of the model's pool before the deadline.
async fn start(
    pools: &Pools,
    model: &str,
    work: &pb::GenerateRequest,
    trace: &TraceParent,
    deadline: Instant,
    ticket: Ticket,
) -> Result<WorkerCall, ApiError> {
    let pool = pool_of(pools, model)?;
    // A continuation goes only to a worker whose engine continues a reply.
    let call = if work.resume.is_some() {
        pool.continue_elsewhere(work, trace, ticket, &[])
    } else {
        pool.generate(work, trace, ticket)
    };
    tokio::time::timeout_at(deadline, call)
        .await
        .map_err(|_| ApiError::timeout("No worker answered before the request deadline."))?
        .map_err(ApiError::from)
}

/// Without an explicit `prompt_cache_key`, a session's turns (`x-session-id`)
/// share a prefix, so they stick to one worker through the session id.
pub fn session_affinity(work: &mut pb::GenerateRequest, session_id: Option<&str>) {
    if work.cache_key.is_empty() {
        if let Some(session) = session_id {
            work.cache_key = format!("session:{session}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continuation_bills_only_the_output_it_added() {
        let usage = pb::Usage {
            prompt_tokens: 100,
            cached_prompt_tokens: 90,
            completion_tokens: 50,
            reasoning_tokens: 10,
            image_tokens: 0,
        };
        assert_eq!(billable(usage, None), usage);
        let before = pb::Resume {
            completion_tokens: 30,
            reasoning_tokens: 10,
            ..Default::default()
        };
        let billed = billable(usage, Some(&before));
        assert_eq!(
            (billed.prompt_tokens, billed.cached_prompt_tokens),
            (0, 0),
            "the prompt was billed by the first owner"
        );
        assert_eq!((billed.completion_tokens, billed.reasoning_tokens), (20, 0));
    }
}

//! Relays a started call's events to a [`Sink`] until it ends.
//!
//! Events that are already buffered are encoded together and delivered in
//! one write, so a fast worker costs one write per batch rather than per
//! token. A consumer with a keep-alive (`Sink::keep_alive_period`) gets one
//! in each silence of that period, between deliveries. A consumer that goes away drops the gRPC stream, which cancels
//! the worker's generation at once; a finished call is read to its
//! trailers instead.

use super::delivered::Delivered;
use super::{End, Sink};
use crate::error::ApiError;
use crate::pool::{classify, CallGuard, PoolError, WorkerCall};
use futures::FutureExt;
use inference_proto::v1 as pb;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};
use tonic::{Status, Streaming};

/// How relaying one worker's call ended.
pub(super) enum Relayed {
    /// The generation ended: finished, its consumer gone, or failed in
    /// band (the deadline).
    Ended(End),
    /// The worker failed after the first event. Nothing of the failure
    /// reached the consumer; events not yet delivered stay in the sink's
    /// batch, so the generation may go on on another worker.
    WorkerFailed(WorkerFailure),
    /// A higher tier preempted the generation: it was stopped on its
    /// worker, whose slot went to the waiting request, and resumes from
    /// what it delivered once a slot frees. Not a failure.
    Preempted(Paused),
}

/// A generation a higher tier preempted.
pub(super) struct Paused {
    /// When its last output event arrived: the pause its client sees runs
    /// from there.
    pub last_output: Option<Instant>,
}

/// A worker that failed mid-generation.
pub(super) struct WorkerFailure {
    /// What the consumer is told if the generation cannot go on.
    pub error: ApiError,
    /// Why, as a metric label (`pool::Failure::reason`, or `ended` for a
    /// stream that ended unfinished).
    pub reason: &'static str,
    /// Another worker may take the generation over.
    pub movable: bool,
    /// The worker's address.
    pub worker: String,
    /// When its last output event arrived.
    pub last_output: Option<Instant>,
}

/// Relays `call` through `sink`, recording what it relayed in `delivered`.
/// `constrained`: the request's output is constrained (a JSON schema, tools),
/// which only some engines continue after a preemption.
#[allow(clippy::too_many_arguments)]
pub(super) async fn relay<S: Sink>(
    call: WorkerCall,
    deadline: tokio::time::Instant,
    stall_timeout: Duration,
    model: &str,
    request_id: &str,
    constrained: bool,
    sink: &mut S,
    delivered: &mut Delivered,
) -> Relayed {
    // The guard holds the worker's in-flight slot until the relay returns.
    let WorkerCall {
        first,
        rest,
        mut guard,
    } = call;
    let preemption = guard.preemptible().map(|lever| Preemption {
        lever,
        any_output: guard.resumes_any(),
        constrained,
    });
    let served_before = delivered.tokens();
    let end = relay_events(
        first,
        rest,
        &guard,
        (deadline, stall_timeout),
        model,
        request_id,
        sink,
        delivered,
        preemption.as_ref(),
    )
    .await;
    guard.record_served(delivered.tokens() - served_before);
    end
}

#[allow(clippy::too_many_arguments)]
async fn relay_events<S: Sink>(
    first: pb::GenerateEvent,
    mut rest: Streaming<pb::GenerateEvent>,
    guard: &CallGuard,
    (deadline, stall_timeout): (tokio::time::Instant, Duration),
    model: &str,
    request_id: &str,
    sink: &mut S,
    delivered: &mut Delivered,
    preemption: Option<&Preemption>,
) -> Relayed {
    let series = crate::metrics::model_series(model);
    let served_before = delivered.tokens();
    let mut decode = DecodeClock::default();
    if let Some(p) = preemption {
        p.note(delivered);
    }
    let mut take = |event: pb::GenerateEvent, sink: &mut S, decode: &mut DecodeClock| {
        if delivered.record(&event) {
            if let Some(gap) = decode.output(Instant::now()) {
                if let Some(s) = series {
                    s.inter_token_latency().observe(gap.as_secs_f64());
                }
            }
            if let Some(p) = preemption {
                p.note(delivered);
            }
        }
        let finished = finished_of(&event);
        sink.event(event);
        finished
    };
    let mut finished = take(first, sink, &mut decode);
    if preemption.is_some() && finished.is_none() {
        guard.offer_preemptible();
    }
    let mut batched = 1;
    // One timer for the whole relay rather than one registered per event;
    // the same for the stall timeout.
    let deadline = tokio::time::sleep_until(deadline);
    tokio::pin!(deadline);
    let mut last_event = tokio::time::Instant::now();
    let stall = tokio::time::sleep_until(last_event + stall_timeout);
    tokio::pin!(stall);
    // The consumer's keep-alive, if it has one, in each silence of its
    // period since the last event or keep-alive; armed lazily as the stall
    // timer is.
    let keep_alive_every = sink.keep_alive_period();
    let mut last_keep_alive = last_event;
    let keep_alive =
        tokio::time::sleep_until(last_event + keep_alive_every.unwrap_or(stall_timeout));
    tokio::pin!(keep_alive);
    loop {
        // Fold whatever else is ready into this batch.
        while finished.is_none() && !sink.batch_full(batched) {
            match rest.message().now_or_never() {
                None => break,
                Some(Ok(Some(event))) => {
                    finished = take(event, sink, &mut decode);
                    batched += 1;
                }
                Some(Ok(None)) => return failed(guard, None, request_id, decode.last),
                Some(Err(status)) => return failed(guard, Some(status), request_id, decode.last),
            }
        }
        // The end of a reply its caller stores first stays pending.
        let delivery = if finished.is_some() && sink.holds_end() {
            Ok(())
        } else {
            sink.deliver().await
        };
        if let Some(f) = finished {
            close_cleanly(rest);
            if delivery.is_err() {
                return Relayed::Ended(End::Gone);
            }
            guard.record_finished(f.usage.as_ref());
            let tokens = f.usage.map_or(0, |u| u.completion_tokens);
            if let (Some(per_token), Some(s)) = (decode.per_token(tokens), series) {
                s.time_per_output_token().observe(per_token.as_secs_f64());
            }
            return Relayed::Ended(End::Finished(f));
        }
        if delivery.is_err() {
            return left(
                guard,
                rest,
                request_id,
                delivered,
                served_before,
                sink.cut_by_replica(),
            )
            .await;
        }
        // The deadline first: with events always ready (a slow consumer
        // behind a fast worker) a later branch would never be polled.
        let next = loop {
            tokio::select! {
                biased;
                _ = &mut deadline => {
                    let e = ApiError::timeout("The generation exceeded the request deadline.");
                    count_stream_failure(model, &e);
                    let fail = Box::pin(sink.fail(&e));
                    fail.await;
                    return Relayed::Ended(End::Failed(e));
                }
                _ = &mut stall => {
                    // Armed lazily: re-armed from the last event when one
                    // came since, so an event costs a clock read, not a
                    // timer.
                    let quiet_until = last_event + stall_timeout;
                    if tokio::time::Instant::now() >= quiet_until {
                        return stalled(guard, stall_timeout, request_id, decode.last);
                    }
                    stall.as_mut().reset(quiet_until);
                }
                // After the worker's next event: an end already on its way
                // is taken, not thrown away.
                next = rest.message() => break next,
                _ = pulled(preemption) => {
                    return preempted(guard, rest, request_id, decode.last).await;
                }
                _ = sink.gone() => {
                    let cut = sink.cut_by_replica();
                    return left(guard, rest, request_id, delivered, served_before, cut).await;
                }
                _ = &mut keep_alive, if keep_alive_every.is_some() => {
                    let every = keep_alive_every.unwrap_or(stall_timeout);
                    let due = last_event.max(last_keep_alive) + every;
                    let now = tokio::time::Instant::now();
                    if now >= due {
                        let sent = Box::pin(sink.keep_alive());
                        if sent.await.is_err() {
                            let cut = sink.cut_by_replica();
                            return left(guard, rest, request_id, delivered, served_before, cut).await;
                        }
                        last_keep_alive = now;
                        keep_alive.as_mut().reset(now + every);
                    } else {
                        keep_alive.as_mut().reset(due);
                    }
                }
            }
        };
        last_event = tokio::time::Instant::now();
        match next {
            Ok(Some(event)) => {
                finished = take(event, sink, &mut decode);
                batched = 1;
            }
            Ok(None) => return failed(guard, None, request_id, decode.last),
            Err(status) => return failed(guard, Some(status), request_id, decode.last),
        }
    }
}

/// The consumer went away mid-generation. The worker is told to stop
/// while the stream is still open (dropped first, the worker would stop on
/// its own with nobody to tell), and says what it generated: the output it
/// held back or had in flight is billed too, not only what was relayed;
/// a generation this replica cut (its drain, `cut`) bills only what was
/// delivered: its client did not choose to forgo the rest. Boxed: the
/// `Cancel` call's state is needed once, at the end, and inline it would
/// be part of every open stream's relay.
fn left<'a>(
    guard: &'a CallGuard,
    rest: Streaming<pb::GenerateEvent>,
    request_id: &'a str,
    delivered: &'a mut Delivered,
    served_before: u64,
    cut: bool,
) -> Pin<Box<dyn Future<Output = Relayed> + Send + 'a>> {
    Box::pin(async move {
        let generated = guard.cancel(request_id).await;
        if let (Some(generated), false) = (generated, cut) {
            let relayed = delivered.tokens() - served_before;
            delivered.left_behind(u64::from(generated), relayed);
        }
        drop(rest);
        Relayed::Ended(End::Gone)
    })
}

/// A running call a higher tier may preempt.
pub(super) struct Preemption {
    lever: std::sync::Arc<crate::pool::Lever>,
    /// Its engine continues any generation, not only a text answer.
    any_output: bool,
    constrained: bool,
}

impl Preemption {
    /// Tells the queue what the generation delivered, and whether its
    /// engine could continue it from there.
    fn note(&self, delivered: &Delivered) {
        let resumable = self.any_output || (!self.constrained && delivered.continues_as_text());
        self.lever.note(delivered.tokens(), resumable);
    }
}

/// Resolves when the queue preempts the call; never without a lever.
async fn pulled(preemption: Option<&Preemption>) {
    match preemption {
        Some(p) => p.lever.pulled().await,
        None => std::future::pending().await,
    }
}

/// The call was preempted: stopped on its worker now (the slot it frees
/// goes to the request that preempted it), its stream dropped. What the
/// worker generated past the last delivery is discarded and generated
/// again where the generation resumes: billed to nobody. Boxed as
/// [`left`] is: the `Cancel` call's state is needed once.
fn preempted<'a>(
    guard: &'a CallGuard,
    rest: Streaming<pb::GenerateEvent>,
    request_id: &'a str,
    last_output: Option<Instant>,
) -> Pin<Box<dyn Future<Output = Relayed> + Send + 'a>> {
    Box::pin(async move {
        let _ = guard.cancel(request_id).await;
        drop(rest);
        Relayed::Preempted(Paused { last_output })
    })
}

/// When a generation's output events arrived, for its decode-time metrics.
#[derive(Debug, Default)]
struct DecodeClock {
    first: Option<Instant>,
    last: Option<Instant>,
}

impl DecodeClock {
    /// An output event arrived at `now`; the gap since the previous one.
    fn output(&mut self, now: Instant) -> Option<Duration> {
        let gap = self.last.map(|last| now.duration_since(last));
        self.first.get_or_insert(now);
        self.last = Some(now);
        gap
    }

    /// Time per output token after the first, for `tokens` output tokens:
    /// (last − first) / (tokens − 1). `None` below two tokens.
    fn per_token(&self, tokens: u32) -> Option<Duration> {
        let (first, last) = (self.first?, self.last?);
        (tokens >= 2).then(|| last.duration_since(first) / (tokens - 1))
    }
}

pub(super) fn count_stream_failure(model: &str, e: &ApiError) {
    crate::metrics::METRICS
        .stream_failures
        .with_label_values(&[model, e.code.as_ref()])
        .inc();
}

/// The worker failed after the first event (`None`: it ended the stream
/// unfinished): counted against its health; the driver decides whether
/// the generation moves or the failure is delivered in band.
fn failed(
    guard: &CallGuard,
    status: Option<Status>,
    request_id: &str,
    last_output: Option<Instant>,
) -> Relayed {
    guard.record_stream_failure(status.as_ref());
    let worker = guard.worker().to_owned();
    let failure = match status {
        None => WorkerFailure {
            error: ApiError::upstream("The model worker ended the stream before finishing."),
            reason: "ended",
            movable: true,
            worker,
            last_output,
        },
        Some(status) => {
            tracing::warn!(%request_id, "worker failed mid-stream: {status}");
            let class = classify(&status);
            WorkerFailure {
                error: mid_stream_error(&status),
                reason: class.reason,
                movable: class.try_elsewhere,
                worker,
                last_output,
            }
        }
    };
    Relayed::WorkerFailed(failure)
}

/// The worker sent nothing for `stall_timeout` after the first event (its
/// engine stuck while its link lives): a worker fault, and the generation
/// may move.
fn stalled(
    guard: &CallGuard,
    stall_timeout: Duration,
    request_id: &str,
    last_output: Option<Instant>,
) -> Relayed {
    tracing::warn!(%request_id, ?stall_timeout, "worker stalled mid-stream");
    guard.record_stream_failure(None);
    Relayed::WorkerFailed(WorkerFailure {
        error: ApiError::timeout("The model worker stopped sending output."),
        reason: "stalled",
        movable: true,
        worker: guard.worker().to_owned(),
        last_output,
    })
}

/// After the first token the consumer cannot be retried transparently:
/// whatever the worker's reason (overload, draining, a dropped
/// connection), it is a 502 upstream failure (or a 504 timeout), never a
/// 503 that invites a blind retry.
fn mid_stream_error(status: &Status) -> ApiError {
    let pool_error = classify(status).error;
    if pool_error == PoolError::Draining {
        // A drain outlasted its grace period: not a worker failure, and the
        // client should know its reply was cut by a restart.
        return ApiError::upstream(
            "The model worker was shut down for a restart before this reply finished; retry.",
        );
    }
    after_first_token(ApiError::from(pool_error))
}

/// A failure once the client has output: a 502 or 504 as it is, anything
/// else a 502 (never a 503 that invites a blind retry).
pub(super) fn after_first_token(classified: ApiError) -> ApiError {
    if classified.status == 502 || classified.status == 504 {
        classified
    } else {
        ApiError::upstream(classified.message)
    }
}

/// How long a finished call may take to deliver its trailers.
const TRAILERS_WAIT: Duration = Duration::from_secs(2);

/// Reads a finished call to its end (the trailers) instead of dropping it:
/// dropping an unfinished gRPC stream resets it (an RST_STREAM frame each
/// way, and frames that cross the reset count against the connection).
/// The trailers usually arrive with `Finished`; if not, a task waits.
fn close_cleanly(mut rest: Streaming<pb::GenerateEvent>) {
    if rest.message().now_or_never().is_none() {
        tokio::spawn(async move {
            let _ = tokio::time::timeout(TRAILERS_WAIT, rest.message()).await;
        });
    }
}

fn finished_of(event: &pb::GenerateEvent) -> Option<pb::Finished> {
    match &event.event {
        Some(pb::generate_event::Event::Finished(f)) => Some(*f),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn time_per_output_token_is_one_sample_of_the_whole_decode() {
        let t0 = Instant::now();
        let mut clock = DecodeClock::default();
        assert_eq!(clock.output(t0), None);
        assert_eq!(
            clock.output(t0 + Duration::from_millis(30)),
            Some(Duration::from_millis(30))
        );
        assert_eq!(
            clock.output(t0 + Duration::from_millis(100)),
            Some(Duration::from_millis(70))
        );
        // Five tokens in three coalesced events: 100 ms over four gaps.
        assert_eq!(clock.per_token(5), Some(Duration::from_millis(25)));
        assert_eq!(clock.per_token(1), None);
        assert_eq!(DecodeClock::default().per_token(9), None);
    }

    #[test]
    fn an_engine_server_resumes_only_an_unconstrained_text_answer() {
        let text = |t: &str| pb::GenerateEvent {
            event: Some(pb::generate_event::Event::Text(pb::TextDelta {
                text: t.into(),
            })),
            output_tokens: 1,
        };
        let resumable = |any_output, constrained, delivered: &Delivered| {
            let p = Preemption {
                lever: Default::default(),
                any_output,
                constrained,
            };
            p.note(delivered);
            p.lever.is_resumable()
        };
        let nothing = Delivered::default();
        let mut answer = Delivered::default();
        answer.record(&text("Once"));
        // A sequence engine continues anything, even before any output.
        assert!(resumable(true, true, &nothing));
        // An engine server: a text answer under way, without tools or a
        // JSON format.
        assert!(resumable(false, false, &answer));
        assert!(!resumable(false, false, &nothing));
        assert!(!resumable(false, true, &answer));
    }

    #[test]
    fn after_the_first_token_only_502_and_504_pass_through() {
        assert_eq!(mid_stream_error(&Status::unavailable("gone")).status, 502);
        assert_eq!(
            mid_stream_error(&Status::resource_exhausted("full")).status,
            502
        );
        assert_eq!(mid_stream_error(&Status::internal("boom")).status, 502);
        assert_eq!(
            mid_stream_error(&Status::new(Code::DeadlineExceeded, "slow")).status,
            504
        );
    }
}

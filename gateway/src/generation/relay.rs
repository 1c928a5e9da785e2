//! Relays a started call's events to a [`Sink`] until it ends.
//!
//! Events that are already buffered are encoded together and delivered in
//! one write, so a fast worker costs one write per batch rather than per
//! token. A consumer that goes away drops the gRPC stream, which cancels
//! the worker's generation at once; a finished call is read to its
//! trailers instead.

use super::{End, Sink};
use crate::error::ApiError;
use crate::pool::{classify, CallGuard, PoolError, WorkerCall};
use futures::FutureExt;
use inference_proto::v1 as pb;
use std::time::{Duration, Instant};
use tonic::{Status, Streaming};

/// Relays `call` through `sink`, counting the output it relayed in
/// `output_seen`.
pub(super) async fn relay<S: Sink>(
    call: WorkerCall,
    deadline: tokio::time::Instant,
    model: &str,
    request_id: &str,
    sink: &mut S,
    output_seen: &mut OutputSeen,
) -> End {
    // The guard holds the worker's in-flight slot until the relay returns.
    let WorkerCall { first, rest, guard } = call;
    let end = relay_events(
        first,
        rest,
        &guard,
        deadline,
        model,
        request_id,
        sink,
        output_seen,
    )
    .await;
    guard.record_served(output_seen.tokens());
    end
}

#[allow(clippy::too_many_arguments)]
async fn relay_events<S: Sink>(
    first: pb::GenerateEvent,
    mut rest: Streaming<pb::GenerateEvent>,
    guard: &CallGuard,
    deadline: tokio::time::Instant,
    model: &str,
    request_id: &str,
    sink: &mut S,
    output_seen: &mut OutputSeen,
) -> End {
    let series = crate::metrics::model_series(model);
    let mut decode = DecodeClock::default();
    let mut take = |event: pb::GenerateEvent, sink: &mut S| {
        if is_output(&event) {
            output_seen.add(event.output_tokens);
            if let Some(gap) = decode.output(Instant::now()) {
                if let Some(s) = series {
                    s.inter_token_latency().observe(gap.as_secs_f64());
                }
            }
        }
        let finished = finished_of(&event);
        sink.event(event);
        finished
    };
    let mut finished = take(first, sink);
    let mut batched = 1;
    // One timer for the whole relay rather than one registered per event.
    let deadline = tokio::time::sleep_until(deadline);
    tokio::pin!(deadline);
    loop {
        // Fold whatever else is ready into this batch.
        while finished.is_none() && !sink.batch_full(batched) {
            match rest.message().now_or_never() {
                None => break,
                Some(Ok(Some(event))) => {
                    finished = take(event, sink);
                    batched += 1;
                }
                Some(Ok(None)) => return failed(guard, None, model, request_id, sink).await,
                Some(Err(status)) => {
                    return failed(guard, Some(status), model, request_id, sink).await
                }
            }
        }
        let delivered = sink.deliver().await;
        if let Some(f) = finished {
            close_cleanly(rest);
            if delivered.is_err() {
                return End::Gone;
            }
            guard.record_finished(f.usage.as_ref());
            let tokens = f.usage.map_or(0, |u| u.completion_tokens);
            if let (Some(per_token), Some(s)) = (decode.per_token(tokens), series) {
                s.time_per_output_token().observe(per_token.as_secs_f64());
            }
            return End::Finished(f);
        }
        if delivered.is_err() {
            return End::Gone;
        }
        // The deadline first: with events always ready (a slow consumer
        // behind a fast worker) a later branch would never be polled.
        let next = tokio::select! {
            biased;
            _ = &mut deadline => {
                let e = ApiError::timeout("The generation exceeded the request deadline.");
                count_stream_failure(model, &e);
                sink.fail(&e).await;
                return End::Failed(e);
            }
            next = rest.message() => next,
            _ = sink.gone() => return End::Gone,
        };
        match next {
            Ok(Some(event)) => {
                finished = take(event, sink);
                batched = 1;
            }
            Ok(None) => return failed(guard, None, model, request_id, sink).await,
            Err(status) => return failed(guard, Some(status), model, request_id, sink).await,
        }
    }
}

/// The generated tokens a relayed generation delivered, for billing one
/// that never finishes. Workers that count tokens per event are summed;
/// events of a worker that does not (an engine server's deltas, about one
/// token each) count one each.
#[derive(Debug, Default, Clone, Copy)]
pub struct OutputSeen {
    counted: u64,
    events: u64,
}

impl OutputSeen {
    fn add(&mut self, output_tokens: u32) {
        self.counted += u64::from(output_tokens);
        self.events += 1;
    }

    pub fn tokens(self) -> u64 {
        if self.counted > 0 {
            self.counted
        } else {
            self.events
        }
    }
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

fn count_stream_failure(model: &str, e: &ApiError) {
    crate::metrics::METRICS
        .stream_failures
        .with_label_values(&[model, e.code.as_ref()])
        .inc();
}

/// The worker failed after the first event (`None`: it ended the stream
/// unfinished): counted against its health, and delivered in band.
async fn failed<S: Sink>(
    guard: &CallGuard,
    status: Option<Status>,
    model: &str,
    request_id: &str,
    sink: &mut S,
) -> End {
    guard.record_stream_failure(status.as_ref());
    let e = match status {
        None => ApiError::upstream("The model worker ended the stream before finishing."),
        Some(status) => {
            tracing::warn!(%request_id, "worker failed mid-stream: {status}");
            mid_stream_error(&status)
        }
    };
    count_stream_failure(model, &e);
    sink.fail(&e).await;
    End::Failed(e)
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
    let classified = ApiError::from(pool_error);
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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn output_is_counted_in_tokens_where_the_worker_counts_them() {
        let mut counted = OutputSeen::default();
        counted.add(1);
        counted.add(40);
        counted.add(0);
        assert_eq!(counted.tokens(), 41, "merged events carry their tokens");
        let mut uncounted = OutputSeen::default();
        uncounted.add(0);
        uncounted.add(0);
        assert_eq!(uncounted.tokens(), 2, "one token per event otherwise");
    }

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

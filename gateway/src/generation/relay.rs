//! Relays a started call's events to an [`Encoder`] until it ends.
//!
//! Events that are already buffered are encoded together and delivered in
//! one write, so a fast worker costs one write per batch rather than per
//! token. A consumer that goes away drops the gRPC stream, which cancels
//! the worker's generation at once; a finished call is read to its
//! trailers instead.

use super::{Encoder, End};
use crate::error::ApiError;
use crate::pool::{classify, CallGuard, WorkerCall};
use futures::FutureExt;
use inference_proto::v1 as pb;
use std::time::{Duration, Instant};
use tonic::{Status, Streaming};

/// Relays `call` through `encoder`, counting output events (about one token
/// each) in `output_seen`.
pub(super) async fn relay<E: Encoder>(
    call: WorkerCall,
    deadline: tokio::time::Instant,
    model: &str,
    request_id: &str,
    encoder: &mut E,
    output_seen: &mut u64,
) -> End {
    // The guard holds the worker's in-flight slot until the relay returns.
    let WorkerCall {
        first,
        mut rest,
        guard,
    } = call;
    let time_per_output_token =
        crate::metrics::model_series(model).map(|series| series.time_per_output_token());
    let mut last_token_at = Instant::now();
    let mut take = |event: pb::GenerateEvent, encoder: &mut E| {
        let now = Instant::now();
        if let Some(h) = time_per_output_token {
            h.observe(now.duration_since(last_token_at).as_secs_f64());
        }
        last_token_at = now;
        *output_seen += u64::from(is_output(&event));
        let finished = finished_of(&event);
        encoder.event(event);
        finished
    };
    let mut finished = take(first, encoder);
    let mut batched = 1;
    // One timer for the whole relay rather than one registered per event.
    let deadline = tokio::time::sleep_until(deadline);
    tokio::pin!(deadline);
    loop {
        // Fold whatever else is ready into this batch.
        while finished.is_none() && !encoder.batch_full(batched) {
            match rest.message().now_or_never() {
                None => break,
                Some(Ok(Some(event))) => {
                    finished = take(event, encoder);
                    batched += 1;
                }
                Some(Ok(None)) => return failed(&guard, None, request_id, encoder).await,
                Some(Err(status)) => {
                    return failed(&guard, Some(status), request_id, encoder).await
                }
            }
        }
        let delivered = encoder.deliver().await;
        if let Some(f) = finished {
            close_cleanly(rest);
            if delivered.is_err() {
                return End::Gone;
            }
            guard.record_finished();
            return End::Finished(f);
        }
        if delivered.is_err() {
            return End::Gone;
        }
        let next = tokio::select! {
            biased;
            next = rest.message() => next,
            _ = encoder.gone() => return End::Gone,
            _ = &mut deadline => {
                let e = ApiError::timeout("The generation exceeded the request deadline.");
                encoder.fail(&e).await;
                return End::Failed(e);
            }
        };
        match next {
            Ok(Some(event)) => {
                finished = take(event, encoder);
                batched = 1;
            }
            Ok(None) => return failed(&guard, None, request_id, encoder).await,
            Err(status) => return failed(&guard, Some(status), request_id, encoder).await,
        }
    }
}

/// The worker failed after the first event (`None`: it ended the stream
/// unfinished): counted against its health, and delivered in band.
async fn failed<E: Encoder>(
    guard: &CallGuard,
    status: Option<Status>,
    request_id: &str,
    encoder: &mut E,
) -> End {
    guard.record_stream_failure(status.as_ref());
    let e = match status {
        None => ApiError::upstream("The model worker ended the stream before finishing."),
        Some(status) => {
            tracing::warn!(%request_id, "worker failed mid-stream: {status}");
            mid_stream_error(&status)
        }
    };
    encoder.fail(&e).await;
    End::Failed(e)
}

/// After the first token the consumer cannot be retried transparently:
/// whatever the worker's reason (overload, draining, a dropped
/// connection), it is a 502 upstream failure (or a 504 timeout), never a
/// 503 that invites a blind retry.
fn mid_stream_error(status: &Status) -> ApiError {
    let classified = classify(status).error;
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

//! Drives a worker generation to its end while watching the client.
//!
//! Events that are already buffered are encoded together and written in one
//! chunk, so a fast worker costs one write per batch rather than per token.
//! A client that goes away drops the gRPC stream, which cancels the
//! worker's generation at once.

use super::exchange::Exchange;
use crate::error::ApiError;
use crate::pool::{classify, WorkerCall};
use bytes::BytesMut;
use futures::FutureExt;
use inference_proto::v1 as pb;
use std::time::Instant;
use tonic::Streaming;

/// How a relayed generation ended.
#[derive(Debug)]
pub enum RelayEnd {
    /// The worker sent `Finished`; everything was delivered.
    Finished(pb::Finished),
    /// The client disconnected; the worker's generation was cancelled.
    ClientGone,
    /// The worker failed after the first event.
    Failed(ApiError),
}

/// Most events folded into one write.
const MAX_BATCH: usize = 64;

/// Relays `call` through `encode`, writing what it produces to the client
/// when `ex` has a started stream. `encode` appends bytes to `out` (or just
/// accumulates, for non-streaming replies). `opening` (the stream's first
/// frames, or nothing) goes out in the same write as the first event: one
/// write fewer per stream than sending it on its own.
pub async fn relay(
    ex: &mut Exchange,
    call: WorkerCall,
    deadline: tokio::time::Instant,
    opening: BytesMut,
    mut encode: impl FnMut(pb::GenerateEvent, &mut BytesMut),
) -> RelayEnd {
    // The guard holds the worker's in-flight slot until the relay returns.
    let WorkerCall {
        first,
        mut rest,
        guard,
    } = call;
    let mut out = opening;
    let mut finished = finished_of(&first);
    encode(first, &mut out);
    let mut last_token_at = Instant::now();
    let time_per_output_token =
        crate::metrics::model_series(ex.model).map(|series| series.time_per_output_token());
    // One timer for the whole relay rather than one registered per event.
    let deadline = tokio::time::sleep_until(deadline);
    tokio::pin!(deadline);
    loop {
        if !out.is_empty()
            && ex.response_started()
            && ex.write_chunk(out.split().freeze()).await.is_err()
        {
            return RelayEnd::ClientGone;
        }
        if let Some(f) = finished {
            guard.record_finished();
            close_cleanly(rest);
            return RelayEnd::Finished(f);
        }
        let next = tokio::select! {
            biased;
            next = rest.message() => next,
            _ = ex.client_gone() => return RelayEnd::ClientGone,
            _ = &mut deadline => {
                return RelayEnd::Failed(ApiError::timeout("The generation exceeded the request deadline."));
            }
        };
        let mut next = next;
        for i in 0..MAX_BATCH {
            match next {
                Ok(Some(event)) => {
                    let now = Instant::now();
                    if let Some(h) = time_per_output_token {
                        h.observe(now.duration_since(last_token_at).as_secs_f64());
                    }
                    last_token_at = now;
                    finished = finished_of(&event);
                    encode(event, &mut out);
                    if finished.is_some() {
                        break;
                    }
                }
                Ok(None) => {
                    guard.record_stream_failure(None);
                    flush(ex, &mut out).await;
                    return RelayEnd::Failed(ApiError::upstream(
                        "The model worker ended the stream before finishing.",
                    ));
                }
                Err(status) => {
                    guard.record_stream_failure(Some(&status));
                    // What this batch already encoded precedes the failure.
                    flush(ex, &mut out).await;
                    // After the first token the client cannot be retried
                    // transparently: whatever the worker's reason (overload,
                    // draining, a dropped connection), it is a 502 upstream
                    // failure, never a 503 that invites a blind retry.
                    let classified = classify(&status).error;
                    let e = if classified.status == 502 || classified.status == 504 {
                        classified
                    } else {
                        ApiError::upstream(classified.message)
                    };
                    tracing::warn!(request_id = %ex.request_id, "worker failed mid-stream: {status}");
                    return RelayEnd::Failed(e);
                }
            }
            // The batch is full: fetching another event here would drop it.
            if i + 1 == MAX_BATCH {
                break;
            }
            match rest.message().now_or_never() {
                Some(n) => next = n,
                None => break,
            }
        }
    }
}

/// Writes what is buffered, if a stream is open (a write failure only means
/// the client is gone; the caller is already ending the relay).
async fn flush(ex: &mut Exchange, out: &mut BytesMut) {
    if !out.is_empty() && ex.response_started() {
        let _ = ex.write_chunk(out.split().freeze()).await;
    }
}

/// How long a finished call may take to deliver its trailers.
const TRAILERS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

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

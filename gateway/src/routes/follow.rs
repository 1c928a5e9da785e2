//! A background run's event log streamed to a client: the stored events
//! after a cursor, then live ones until the terminal event (retrieve with
//! `stream=true`, a streamed background create, and its idempotent retry).

use super::ending::{end_stream, error_event};
use crate::app::App;
use crate::error::ApiError;
use crate::http::{Exchange, SseReply};
use crate::sse;
use std::time::Duration;

/// How long a follower waits for new events before checking the run's status.
const FOLLOW_WAIT: Duration = Duration::from_secs(1);

/// Streams a background run's event log: the stored events after `after`,
/// then live ones until the terminal event.
pub async fn follow(
    app: &App,
    ex: &mut Exchange,
    id: &str,
    after: Option<u64>,
) -> Result<(), ApiError> {
    // A request body (normally empty) must be consumed before watching
    // the connection for a disconnect.
    ex.read_body(app.config.max_body_bytes, app.read_timeout())
        .await
        .ok();
    let mut follower = app.store.follow(id, after).await?;
    let mut reply = SseReply::new(ex, 0);
    if reply.start().await.is_err() {
        reply.left();
        return Ok(());
    }
    let mut status_was_terminal = false;
    // The sequence number an in-band error event takes: the last one this
    // stream showed (the client's own `starting_after` before any), so a
    // client that resumes after it misses nothing; the next number belongs
    // to the run's next real event.
    let mut last_seq = after.unwrap_or(0);
    loop {
        let batch = tokio::select! {
            batch = follower.next_batch(FOLLOW_WAIT) => batch,
            _ = reply.client_gone() => {
                reply.left();
                return Ok(());
            }
            // The run lives on in the store (on a peer, once handed over):
            // the follower is told where to pick it up again.
            _ = app.shutdown.cutting() => {
                let e = ApiError::replica_shutdown().with_message(format!(
                    "The gateway replica serving this stream is restarting; the response goes \
                     on. Resume it on another replica with starting_after={last_seq}."
                ));
                fail(reply, &e, last_seq).await;
                return Ok(());
            }
        };
        match batch {
            Ok(frames) if frames.is_empty() => {
                // Nothing new: stop once the run is over (or gone).
                if status_was_terminal {
                    break;
                }
                match app.store.status(id).await {
                    Ok(Some(s)) if !s.is_terminal() => {}
                    Ok(Some(_)) => status_was_terminal = true,
                    Ok(None) => {
                        // Deleted (or expired) under the follower: it would
                        // never see a terminal event, so say why it ends.
                        let e = not_found(id);
                        fail(reply, &e, last_seq).await;
                        return Ok(());
                    }
                    Err(_) => {}
                }
            }
            Ok(frames) => {
                let mut done = false;
                for f in &frames {
                    sse::event(reply.buf(), &f.name, &f.data);
                    last_seq = f.seq;
                    if f.is_terminal() {
                        done = true;
                        break;
                    }
                }
                if reply.write().await.is_err() {
                    reply.left();
                    return Ok(());
                }
                if done {
                    break;
                }
            }
            Err(e) => {
                let e = ApiError::from(e);
                fail(reply, &e, last_seq).await;
                return Ok(());
            }
        }
    }
    reply.end().await;
    Ok(())
}

/// Ends the stream with `event: error` ([`error_event`]): the HTTP status
/// travels in the body, as on every streamed failure (spec 6.1 rule 5);
/// the sequence number is the last one the stream showed, never one a
/// real event will take.
async fn fail(mut reply: SseReply<'_>, e: &ApiError, seq: u64) {
    sse::event(reply.buf(), "error", &error_event(e, Some(seq)));
    end_stream(reply, Some(e.status)).await;
}

/// 404 for a response id: missing, expired, deleted or another
/// organisation's, all alike.
pub(super) fn not_found(id: &str) -> ApiError {
    ApiError::new(
        404,
        "response_not_found",
        format!("Response with id '{id}' not found."),
    )
}

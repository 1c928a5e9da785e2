//! How the routes end what they send: a stream's last write and its end
//! ([`end_stream`]), and a Responses failure as its error event on either
//! transport ([`error_event`]).

use crate::api::responses::{StreamErrorEvent, WebSocketError, WebSocketErrorEvent};
use crate::error::ApiError;
use crate::http::SseReply;

/// Ends a stream: what is still buffered goes out, then the terminating
/// chunk. `failed`: the status of the in-band failure it carried, which
/// the request is recorded with (the response's was 200); a client gone
/// on that last write is recorded as 499.
pub(super) async fn end_stream(mut reply: SseReply<'_>, failed: Option<u16>) {
    if reply.write().await.is_err() {
        reply.left();
        return;
    }
    match failed {
        Some(status) => reply.end_failed(status).await,
        None => reply.end().await,
    }
}

/// A Responses failure as its error event: nested under `error` with its
/// HTTP status (Open Responses' `WebSocketErrorEvent`, what a WebSocket
/// sends). On an event stream (`seq`: the sequence number the event
/// takes there) it is also flat, for the OpenAI SDKs' error event, and
/// numbered (Open Responses' `ErrorStreamingEvent` reads the nested one).
pub(super) fn error_event(e: &ApiError, seq: Option<u64>) -> String {
    let error = WebSocketError {
        kind: e.error_type(),
        code: &e.code,
        message: &e.message,
        param: e.param.as_deref(),
    };
    let json = match seq {
        None => serde_json::to_string(&WebSocketErrorEvent {
            kind: "error",
            status: e.status,
            error,
        }),
        Some(sequence_number) => serde_json::to_string(&StreamErrorEvent {
            kind: "error",
            code: &e.code,
            message: &e.message,
            param: e.param.as_deref(),
            status: e.status,
            sequence_number,
            error,
        }),
    };
    // Plain strings and numbers: encoding cannot fail.
    json.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> ApiError {
        ApiError::new(404, "previous_response_not_found", "gone").with_param("previous_response_id")
    }

    /// The bytes a client reads, keys in order.
    #[test]
    fn a_websocket_error_event_is_open_responses_shape() {
        assert_eq!(
            error_event(&refused(), None),
            r#"{"type":"error","status":404,"error":{"type":"invalid_request_error","code":"previous_response_not_found","message":"gone","param":"previous_response_id"}}"#
        );
    }

    #[test]
    fn a_stream_error_event_is_also_flat_and_numbered() {
        let e = ApiError::new(503, "replica_shutdown", "restarting");
        assert_eq!(
            error_event(&e, Some(7)),
            r#"{"type":"error","code":"replica_shutdown","message":"restarting","param":null,"status":503,"sequence_number":7,"error":{"type":"server_error","code":"replica_shutdown","message":"restarting","param":null}}"#
        );
    }
}

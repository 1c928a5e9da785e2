//! gRPC statuses carrying a machine-readable `x-error-reason` (an
//! `ErrorReason` name), the one way the worker reports failures.

use inference_proto::v1::{ErrorReason, ERROR_REASON_METADATA};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

/// A status with `x-error-reason` set to `reason`'s proto name.
pub fn with_reason(code: Code, reason: ErrorReason, message: impl Into<String>) -> Status {
    let mut md = MetadataMap::new();
    md.insert(
        ERROR_REASON_METADATA,
        MetadataValue::from_static(reason.as_str_name()),
    );
    Status::with_metadata(code, message, md)
}

/// Prompt plus requested completion do not fit the context window.
pub fn context_length_exceeded(window: u32, prompt: u32, max_tokens: u32) -> Status {
    let message = if max_tokens == 0 {
        format!(
            "This model's maximum context length is {window} tokens. However, your messages \
             resulted in {prompt} tokens. Please reduce the length of the messages."
        )
    } else {
        let total = u64::from(prompt) + u64::from(max_tokens);
        format!(
            "This model's maximum context length is {window} tokens. However, you requested \
             {total} tokens ({prompt} in the messages, {max_tokens} in the completion). Please \
             reduce the length of the messages or completion."
        )
    };
    with_reason(
        Code::InvalidArgument,
        ErrorReason::ContextLengthExceeded,
        message,
    )
}

/// The request is invalid for this engine or model (not a worker fault).
pub fn invalid_request(message: impl Into<String>) -> Status {
    with_reason(Code::InvalidArgument, ErrorReason::InvalidRequest, message)
}

/// Concurrency and queue are full.
pub fn overloaded(running: u32, queued: u32) -> Status {
    with_reason(
        Code::ResourceExhausted,
        ErrorReason::Overloaded,
        format!("worker overloaded: {running} running, {queued} queued"),
    )
}

/// The worker is draining before shutdown.
pub fn draining() -> Status {
    with_reason(
        Code::Unavailable,
        ErrorReason::Draining,
        "worker is draining before shutdown",
    )
}

/// The worker shut down with this generation still open: its drain's grace
/// period ended first.
pub fn drained() -> Status {
    with_reason(
        Code::Unavailable,
        ErrorReason::Draining,
        "the worker shut down before this generation finished (its drain grace period ended)",
    )
}

/// The engine failed while generating.
pub fn engine_failure(message: impl Into<String>) -> Status {
    with_reason(Code::Internal, ErrorReason::EngineFailure, message)
}

/// The engine went silent: nothing within its first-byte or idle timeout.
/// `DEADLINE_EXCEEDED` (the gateway's 504 `timeout`, retried on another
/// worker before the first token), with the engine-failure reason: the
/// worker's engine, not the request, is at fault.
pub fn engine_timeout(message: impl Into<String>) -> Status {
    with_reason(Code::DeadlineExceeded, ErrorReason::EngineFailure, message)
}

/// The `x-error-reason` of a status, if any.
pub fn reason_of(status: &Status) -> Option<&str> {
    status
        .metadata()
        .get(ERROR_REASON_METADATA)
        .and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_their_reason_name() {
        let s = context_length_exceeded(100, 90, 20);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(reason_of(&s), Some("CONTEXT_LENGTH_EXCEEDED"));
        assert!(s.message().contains("maximum context length is 100 tokens"));
        assert!(s
            .message()
            .contains("110 tokens (90 in the messages, 20 in the completion)"));
        assert_eq!(reason_of(&overloaded(1, 2)), Some("OVERLOADED"));
        assert_eq!(overloaded(1, 2).code(), Code::ResourceExhausted);
        assert_eq!(reason_of(&draining()), Some("DRAINING"));
        assert_eq!(reason_of(&engine_failure("x")), Some("ENGINE_FAILURE"));
        assert_eq!(engine_timeout("x").code(), Code::DeadlineExceeded);
        assert_eq!(reason_of(&engine_timeout("x")), Some("ENGINE_FAILURE"));
    }
}

//! What a failed worker call means: the pool's error, whether another
//! worker may succeed, whether it counts against the worker's health.

use inference_proto::v1 as pb;
use tonic::{Code, Status};

use super::Shed;

/// Why the pool could not start a call, or why a worker call failed: the
/// pool's own error; `error/map.rs` gives each its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolError {
    /// The prompt is over the model's context window (the worker's message).
    ContextLengthExceeded { message: String },
    /// The worker refused the request as invalid (its message).
    InvalidRequest { message: String },
    /// The worker is at capacity.
    AtCapacity,
    /// The worker is draining for a restart.
    Draining,
    /// The worker could not be reached, or dropped the call.
    Unreachable,
    /// The worker did not answer within its deadline.
    WorkerTimeout,
    /// The worker failed for another reason.
    WorkerFailed,
    /// Every worker of the model was tried, busy, draining or unreachable.
    NoWorkerAvailable { model: String },
    /// Every worker was busy and the request could not wait (the pool's
    /// queue was full, or the wait ran out).
    Shed(Shed),
}

/// What a failed worker call means for the client and for the worker.
pub struct Failure {
    pub error: PoolError,
    /// Another worker may succeed (overload, draining, connection failure).
    pub try_elsewhere: bool,
    /// Counts against the worker's health. Client errors never do.
    pub worker_fault: bool,
    pub reason: &'static str,
}

impl Failure {
    /// The `class` label: the request's fault, the pool's capacity, or the
    /// worker's fault.
    pub fn class(&self) -> &'static str {
        if self.worker_fault {
            "fault"
        } else if self.try_elsewhere {
            "capacity"
        } else {
            "client"
        }
    }
}

/// Maps a worker's gRPC status to the public error and the retry decision.
pub fn classify(status: &Status) -> Failure {
    let reason = status
        .metadata()
        .get(pb::ERROR_REASON_METADATA)
        .and_then(|v| v.to_str().ok())
        .and_then(pb::ErrorReason::from_str_name);
    match (reason, status.code()) {
        (Some(pb::ErrorReason::ContextLengthExceeded), _) => Failure {
            error: PoolError::ContextLengthExceeded {
                message: status.message().to_owned(),
            },
            try_elsewhere: false,
            worker_fault: false,
            reason: "context_length_exceeded",
        },
        (Some(pb::ErrorReason::InvalidRequest), _) | (None, Code::InvalidArgument) => Failure {
            error: PoolError::InvalidRequest {
                message: status.message().to_owned(),
            },
            try_elsewhere: false,
            worker_fault: false,
            reason: "invalid_request",
        },
        (Some(pb::ErrorReason::Overloaded), _) | (None, Code::ResourceExhausted) => Failure {
            error: PoolError::AtCapacity,
            try_elsewhere: true,
            worker_fault: false,
            reason: "overloaded",
        },
        (Some(pb::ErrorReason::Draining), _) => Failure {
            error: PoolError::Draining,
            try_elsewhere: true,
            worker_fault: false,
            reason: "draining",
        },
        // Made by this side's transport, not sent by the worker: the
        // connection was reset (the worker process died) or its keepalive
        // went unanswered (the worker stopped). An operator tells a crash
        // from an engine's own error by this reason.
        (None, _) if lost_worker(status) => Failure {
            error: PoolError::Unreachable,
            try_elsewhere: true,
            worker_fault: true,
            reason: "worker_lost",
        },
        (_, Code::Unavailable) | (_, Code::Cancelled) => Failure {
            error: PoolError::Unreachable,
            try_elsewhere: true,
            worker_fault: true,
            reason: "unavailable",
        },
        (_, Code::DeadlineExceeded) => Failure {
            error: PoolError::WorkerTimeout,
            try_elsewhere: true,
            worker_fault: true,
            reason: "deadline",
        },
        _ => Failure {
            error: PoolError::WorkerFailed,
            try_elsewhere: true,
            worker_fault: true,
            reason: "engine_failure",
        },
    }
}

/// Whether a status without the worker's reason was made by tonic from a
/// transport error (a reset connection, an HTTP/2 keepalive timeout, a
/// refused stream) rather than decoded from the worker's trailers: only
/// the former carries a source error. A connect error before any call is
/// left to `unavailable`: no worker was lost, none was reached.
fn lost_worker(status: &Status) -> bool {
    use std::error::Error as _;
    let Some(source) = status.source() else {
        return false;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
    while let Some(err) = cause {
        if err.is::<tonic::ConnectError>() {
            return false;
        }
        cause = err.source();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn with_reason(code: Code, reason: &'static str) -> Status {
        let mut s = Status::new(code, "x");
        s.metadata_mut().insert(
            pb::ERROR_REASON_METADATA,
            MetadataValue::from_static(reason),
        );
        s
    }

    #[test]
    fn context_length_is_a_client_error_not_retried() {
        let f = classify(&with_reason(
            Code::InvalidArgument,
            "CONTEXT_LENGTH_EXCEEDED",
        ));
        assert_eq!(
            f.error,
            PoolError::ContextLengthExceeded {
                message: "x".into()
            }
        );
        assert!(!f.try_elsewhere && !f.worker_fault);
        assert_eq!(f.class(), "client");
    }

    #[test]
    fn overload_and_unreachable_try_elsewhere() {
        let f = classify(&with_reason(Code::ResourceExhausted, "OVERLOADED"));
        assert!(f.try_elsewhere && !f.worker_fault);
        assert_eq!(f.error, PoolError::AtCapacity);
        assert_eq!(f.class(), "capacity");
        let f = classify(&Status::unavailable("connection refused"));
        assert!(f.try_elsewhere && f.worker_fault);
        assert_eq!(f.class(), "fault");
        let f = classify(&Status::internal("boom"));
        assert_eq!(f.error, PoolError::WorkerFailed);
    }

    /// A worker's own error (its trailers) stays `engine_failure`; a status
    /// tonic made from a broken connection or a keepalive timeout (it has
    /// a source) is a lost worker; a connect error is `unavailable`.
    #[test]
    fn a_lost_worker_is_told_apart_from_an_engine_failure() {
        let engine = classify(&with_reason(Code::Internal, "ENGINE_FAILURE"));
        assert_eq!(engine.reason, "engine_failure");
        assert_eq!(classify(&Status::unknown("boom")).reason, "engine_failure");
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let lost = Status::from_error(Box::new(reset));
        assert_eq!(lost.code(), Code::Unknown);
        let f = classify(&lost);
        assert_eq!(f.reason, "worker_lost");
        assert!(f.try_elsewhere && f.worker_fault);
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let connect = Status::from_error(Box::new(tonic::ConnectError(Box::new(refused))));
        assert_eq!(classify(&connect).reason, "unavailable");
    }
}
